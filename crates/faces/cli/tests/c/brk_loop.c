/* A worker that grows its heap by 1 MiB with sbrk, writes every page of
 * it, and gives it back, in a tight loop. Says "ready"; on SIGUSR1 says
 * "moves N", the number of times its break has moved so far. Usage:
 * brk_loop */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile unsigned long moves;

static void said(int sig) {
    (void)sig;
    char b[32] = "moves ";
    char d[24];
    int n = 0;
    unsigned long v = moves;
    do { d[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    int at = 6;
    while (n) b[at++] = d[--n];
    b[at++] = '\n';
    (void)!write(1, b, (size_t)at);
}

int main(void) {
    signal(SIGUSR1, said);
    printf("ready\n");
    fflush(stdout);
    for (unsigned long i = 0;; i++) {
        char *p = sbrk(1 << 20);
        if (p == (void *)-1) return 2;
        moves++;
        for (int k = 0; k < 256; k++) p[k * 4096] = (char)i;
        sbrk(-(1 << 20));
        moves++;
    }
}
