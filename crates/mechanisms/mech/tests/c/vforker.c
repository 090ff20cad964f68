/* A target whose main thread vforks a child that sleeps argv[1] seconds
 * before it exits: the parent waits, uninterruptibly, for the child's
 * whole life. A second thread writes memory meanwhile. Prints "ready"
 * once the child exists, "done" when the vfork returned. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile char mem[16 * 4096];

static void *spin(void *a) {
    (void)a;
    for (unsigned k = 0;; k++)
        mem[(k * 4096) % sizeof mem]++;
    return NULL;
}

int main(int argc, char **argv) {
    int secs = argc > 1 ? atoi(argv[1]) : 30;
    pthread_t t;
    pthread_create(&t, NULL, spin, NULL);
    printf("ready\n");
    fflush(stdout);
    pid_t c = vfork();
    if (c == 0) {
        struct timespec ts = {secs, 0};
        nanosleep(&ts, NULL);
        _exit(0);
    }
    printf("done %d\n", c > 0);
    fflush(stdout);
    return 0;
}
