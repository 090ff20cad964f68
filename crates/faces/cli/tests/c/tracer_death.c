/* A program that notices a tracer that dies and leaves it damaged.
 *
 * Three workers and the main thread, each with a signal mask of its own:
 *  - two sleepers: known values in r12-r15 across a raw nanosleep (100 us),
 *    checked after each; the call must answer 0 (EINTR is counted apart:
 *    a restarted sleep may end so, see the book);
 *  - a spinner in user code only: a floating-point sum checked every
 *    100,000 additions (the x87/SSE state must survive);
 *  - the main thread, blocked in read() on stdin until it ends: any answer
 *    but 0 bytes at the end is damage (an interrupted read must restart).
 * Every thread checks its mask after each round.
 *
 * Prints "ready", then on stdin's end:
 * "done rounds=R bad=B eintr=E" and exits 0 when B = 0, 1 otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_long rounds, bad, eintr;
static atomic_int stopping;

static void own_mask(int k, sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGRTMIN + 2 + k);
    if (k & 1)
        sigaddset(set, SIGWINCH);
}

static void check_mask(int k)
{
    sigset_t want, now;
    own_mask(k, &want);
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    for (int s = 1; s < 64; s++)
        if (sigismember(&want, s) != sigismember(&now, s)) {
            atomic_fetch_add(&bad, 1);
            fprintf(stderr, "thread %d: signal %d's mask bit changed\n", k, s);
            return;
        }
}

static void *sleeper(void *p)
{
    int k = (int)(intptr_t)p;
    sigset_t set;
    own_mask(k, &set);
    pthread_sigmask(SIG_SETMASK, &set, NULL);
    struct timespec ts = {0, 100 * 1000};
    for (uint64_t i = 0; !atomic_load(&stopping); i++) {
        uint64_t base = 0x5057000000000000ULL ^ ((uint64_t)k << 40) ^ i;
        register uint64_t r12 __asm__("r12") = base + 12;
        register uint64_t r13 __asm__("r13") = base + 13;
        register uint64_t r14 __asm__("r14") = base + 14;
        register uint64_t r15 __asm__("r15") = base + 15;
        long rax = 35; /* nanosleep */
        __asm__ volatile("syscall"
                         : "+a"(rax), "+r"(r12), "+r"(r13), "+r"(r14), "+r"(r15)
                         : "D"(&ts), "S"(0)
                         : "rcx", "r11", "memory");
        if (r12 != base + 12 || r13 != base + 13 || r14 != base + 14 || r15 != base + 15) {
            atomic_fetch_add(&bad, 1);
            fprintf(stderr, "thread %d: registers changed across a call\n", k);
        }
        if (rax == -4)
            atomic_fetch_add(&eintr, 1);
        else if (rax != 0) {
            atomic_fetch_add(&bad, 1);
            fprintf(stderr, "thread %d: nanosleep answered %ld\n", k, rax);
        }
        check_mask(k);
        atomic_fetch_add(&rounds, 1);
    }
    return NULL;
}

static void *spinner(void *p)
{
    int k = (int)(intptr_t)p;
    sigset_t set;
    own_mask(k, &set);
    pthread_sigmask(SIG_SETMASK, &set, NULL);
    while (!atomic_load(&stopping)) {
        static volatile double one = 1.0;
        double acc = 0.5;
        for (int i = 0; i < 100000; i++)
            acc += one;
        if (acc != 100000.5) {
            atomic_fetch_add(&bad, 1);
            fprintf(stderr, "thread %d: sum %f\n", k, acc);
        }
        check_mask(k);
    }
    return NULL;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    pthread_t t[3];
    pthread_create(&t[0], NULL, sleeper, (void *)1);
    pthread_create(&t[1], NULL, sleeper, (void *)2);
    pthread_create(&t[2], NULL, spinner, (void *)3);
    sigset_t set;
    own_mask(0, &set);
    pthread_sigmask(SIG_SETMASK, &set, NULL);
    printf("ready\n");
    char c;
    ssize_t n = read(0, &c, 1);
    if (n != 0) {
        atomic_fetch_add(&bad, 1);
        fprintf(stderr, "main: read answered %zd (%s)\n", n, n < 0 ? strerror(errno) : "data");
    }
    check_mask(0);
    atomic_store(&stopping, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    printf("done rounds=%ld bad=%ld eintr=%ld\n", (long)atomic_load(&rounds),
           (long)atomic_load(&bad), (long)atomic_load(&eintr));
    return atomic_load(&bad) == 0 ? 0 : 1;
}
