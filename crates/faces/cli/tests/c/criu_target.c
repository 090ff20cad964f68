/* A process for CRIU to dump: two regions of known contents, then idle.
 * Region A (MIB_A MiB) holds page i filled with (i * 7 + 1) and its index
 * in its first word; region B (MIB_B MiB) a pseudo-random stream. It says
 * "ready PID A_ADDR A_LEN B_ADDR B_LEN" on standard output and waits for
 * signals: each SIGUSR1 (round R) rewrites every 100th page of A with R + 0x80
 * behind a tag of (0xc0ffee00 + R, page index), and says "changed N round R
 * (last at P)" (N pages, P the last one) when done. The round is main's
 * local: a restore that puts back memory but not registers can get it
 * wrong. With the argument "keep-pointer", main's frame also holds (in a
 * volatile local) a pointer to the last page it rewrote. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MIB_A 8
#define MIB_B 4
#define PAGE 4096

static unsigned char *a, *b;
static volatile sig_atomic_t asked;

static void on_usr1(int sig) { (void)sig; asked++; }

int main(int argc, char **argv) {
    int keep = argc > 1 && strcmp(argv[1], "keep-pointer") == 0;
    size_t la = (size_t)MIB_A << 20, lb = (size_t)MIB_B << 20;
    a = mmap(0, la, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    b = mmap(0, lb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED || b == MAP_FAILED) return 1;
    for (size_t i = 0; i < la / PAGE; i++) {
        memset(a + i * PAGE, (int)(i * 7 + 1), PAGE);
        memcpy(a + i * PAGE, &i, sizeof i);
    }
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < lb / 8; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        memcpy(b + i * 8, &x, 8);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, 0);
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &old);
    printf("ready %d %lu %lu %lu %lu\n", getpid(), (unsigned long)a, (unsigned long)la,
           (unsigned long)b, (unsigned long)lb);
    fflush(stdout);
    unsigned char *volatile last = a;
    uint64_t round = 0;
    for (;;) {
        while (!asked) sigsuspend(&old);
        asked = 0;
        round++;
        size_t n = 0;
        for (size_t i = 0; i < la / PAGE; i += 100, n++) {
            uint64_t tag[2] = {0xc0ffee00ull + round, i};
            memset(a + i * PAGE, (int)(round + 0x80), PAGE);
            memcpy(a + i * PAGE, tag, sizeof tag);
            if (keep) last = a + i * PAGE;
        }
        printf("changed %zu round %lu (last at %p)\n", n, (unsigned long)round, (void *)last);
        fflush(stdout);
    }
}
