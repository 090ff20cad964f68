/* A target flooded with signals: an interval timer (SIGALRM every
 * argv[1] microseconds) and queued real-time signals from the test, each
 * carrying a sequence number. It writes its memory until SIGUSR2, then
 * prints "RT_COUNT RT_SUM ALARMS": a queued signal lost or doubled by
 * pagewise shows in the count or the sum. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t rt_count, alarms, done;
static volatile uint64_t rt_sum;
static char mem[64 * 4096];

static void on_rt(int s, siginfo_t *si, void *u) {
    (void)s; (void)u;
    rt_count++;
    rt_sum += (uint64_t)(unsigned)si->si_value.sival_int;
}
static void on_alrm(int s) { (void)s; alarms++; }
static void on_usr2(int s) { (void)s; done = 1; }

int main(int argc, char **argv) {
    long usec = argc > 1 ? atol(argv[1]) : 100;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sa.sa_sigaction = on_rt;
    sigaction(SIGRTMIN, &sa, NULL);
    memset(&sa, 0, sizeof sa);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_alrm;
    sigaction(SIGALRM, &sa, NULL);
    sa.sa_handler = on_usr2;
    sigaction(SIGUSR2, &sa, NULL);
    struct itimerval it = {{0, usec}, {0, usec}};
    setitimer(ITIMER_REAL, &it, NULL);
    printf("ready\n");
    fflush(stdout);
    unsigned k = 0;
    while (!done) {
        mem[(k * 4096) % sizeof mem]++;
        k++;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("%d %llu %d\n", (int)rt_count, (unsigned long long)rt_sum, (int)alarms);
    return 0;
}
