/* A target with a sibling process sharing its memory: clone(CLONE_VM)
 * without CLONE_THREAD. The main thread increments counts[0], the sibling
 * counts[1], as fast as they can. Prints "ready ADDR SIBLING" (the counts'
 * address and the sibling's pid). */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

static volatile unsigned long counts[2];

static int sibling(void *a) {
    (void)a;
    for (;;)
        counts[1]++;
    return 0;
}

int main(void) {
    size_t len = 256 * 1024;
    char *stack = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stack == MAP_FAILED)
        return 1;
    int pid = clone(sibling, stack + len, CLONE_VM | SIGCHLD, NULL);
    if (pid < 0)
        return 1;
    printf("ready %p %d\n", (void *)counts, pid);
    fflush(stdout);
    for (;;)
        counts[0]++;
}
