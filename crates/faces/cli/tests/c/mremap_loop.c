/* A program that grows, shrinks and moves its 16 MiB buffer with mremap
 * over and over, checking every page after each move against what it
 * wrote, until its input ends. Says "ready PID", then at the end
 * "mremaps N failed F bad B" (F: mremap calls refused, with the first
 * errno said; B: pages that read back wrong). With "unaligned", the
 * buffer is a page longer (16 MiB + 4 KiB, then 24 MiB + 4 KiB), so the
 * kernel does not place it on a 2 MiB boundary and its 2 MiB regions do
 * not cover it whole. Usage: mremap_loop [unaligned] */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MIB (1ul << 20)
#define P 4096ul

int main(int argc, char **argv) {
    size_t extra = argc > 1 && strcmp(argv[1], "unaligned") == 0 ? P : 0;
    size_t small = 16 * MIB + extra, big = 24 * MIB + extra, len = small;
    unsigned char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return 2;
    unsigned char gen = 1;
    for (size_t i = 0; i < len; i += P) b[i] = gen;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    unsigned long n = 0, failed = 0, bad = 0;
    int first = 0;
    struct pollfd in = {.fd = 0, .events = POLLIN};
    for (;;) {
        if (poll(&in, 1, 0) > 0) break;
        /* Grow (it may move), write, shrink in place, move. */
        unsigned char *g = mremap(b, len, big, MREMAP_MAYMOVE);
        n++;
        if (g == MAP_FAILED) {
            failed++;
            if (!first) first = errno;
            usleep(1000);
            continue;
        }
        gen++;
        for (size_t i = 0; i < big; i += P) g[i] = gen;
        unsigned char *s = mremap(g, big, small, 0);
        n++;
        if (s == MAP_FAILED) {
            failed++;
            if (!first) first = errno;
            b = g;
            len = big;
            continue;
        }
        len = small;
        for (size_t i = 0; i < len; i += P) bad += s[i] != gen;
        b = s;
    }
    printf("mremaps %lu failed %lu bad %lu errno %d\n", n, failed, bad, first);
    return 0;
}
