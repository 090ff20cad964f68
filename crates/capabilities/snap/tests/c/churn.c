/* A thread pool that never stands still: N threads, each of which checks
 * its own work, starts its successor and ends, for as long as the program
 * runs (pthread_create, that is clone3, and thread exit all the time).
 *
 * Usage: churn N SECONDS
 * Prints "ready" once N threads run, then on stdin's end or after SECONDS:
 * "done threads=T bad=B" and exits 0 if no thread found its work wrong
 * (B = 0), 1 otherwise. A thread started with a wrong argument or
 * register, or a stack not its own, counts as bad or crashes the program.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct arg {
    uint64_t magic;
    uint64_t seed;
};

#define MAGIC 0x70616765776973ULL

static atomic_long created, ended, bad, live;
static atomic_int stopping;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static void *work(void *p)
{
    struct arg *a = p;
    if (a == NULL || a->magic != MAGIC) {
        atomic_fetch_add(&bad, 1);
        atomic_fetch_sub(&live, 1);
        return NULL;
    }
    uint64_t seed = a->seed;
    free(a);
    /* Some work on the thread's own stack, checked. */
    uint64_t buf[512];
    for (int i = 0; i < 512; i++)
        buf[i] = mix(seed + (uint64_t)i);
    for (int i = 0; i < 512; i++)
        if (buf[i] != mix(seed + (uint64_t)i))
            atomic_fetch_add(&bad, 1);
    atomic_fetch_add(&ended, 1);
    if (!atomic_load(&stopping)) {
        struct arg *next = malloc(sizeof *next);
        next->magic = MAGIC;
        next->seed = mix(seed);
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 64 << 10);
        if (pthread_create(&t, &at, work, next) == 0) {
            atomic_fetch_add(&created, 1);
            pthread_attr_destroy(&at);
            return NULL;
        }
        pthread_attr_destroy(&at);
        free(next);
    }
    atomic_fetch_sub(&live, 1);
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 5;
    int seconds = argc > 2 ? atoi(argv[2]) : 10;
    setvbuf(stdout, NULL, _IONBF, 0);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 64 << 10);
    for (int i = 0; i < n; i++) {
        struct arg *a = malloc(sizeof *a);
        a->magic = MAGIC;
        a->seed = (uint64_t)i * 7919;
        pthread_t t;
        atomic_fetch_add(&live, 1);
        while (pthread_create(&t, &at, work, a) != 0)
            usleep(1000);
        atomic_fetch_add(&created, 1);
    }
    printf("ready\n");
    /* Until stdin ends (or a line comes) or the time is up. */
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        fd_set r;
        FD_ZERO(&r);
        FD_SET(0, &r);
        struct timeval tv = {0, 100 * 1000};
        if (select(1, &r, NULL, NULL, &tv) > 0)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec >= seconds)
            break;
    }
    atomic_store(&stopping, 1);
    for (int i = 0; i < 5000 && atomic_load(&live) > 0; i++)
        usleep(1000);
    printf("done threads=%ld bad=%ld live=%ld\n", (long)atomic_load(&created),
           (long)atomic_load(&bad), (long)atomic_load(&live));
    return atomic_load(&bad) == 0 ? 0 : 1;
}
