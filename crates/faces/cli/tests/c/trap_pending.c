/* A program that keeps a SIGTRAP blocked and pending for its whole life
 * (as some debuggers' targets and sanitizer runtimes do), with 1 MiB of
 * its own memory. Says "ready"; for each line read, writes the buffer
 * and says its sum. Usage: trap_pending */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTRAP);
    sigprocmask(SIG_BLOCK, &s, NULL);
    raise(SIGTRAP);
    unsigned char *b = malloc(1 << 20);
    if (!b) return 2;
    memset(b, 1, 1 << 20);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    unsigned n = 0;
    while (fgets(line, sizeof line, stdin)) {
        n++;
        memset(b, (int)n, 1 << 20);
        unsigned long sum = 0;
        for (int i = 0; i < 1 << 20; i += 4096) sum += b[i];
        sigset_t p;
        sigpending(&p);
        printf("sum %lu pending %d\n", sum, sigismember(&p, SIGTRAP));
        fflush(stdout);
    }
    return 0;
}
