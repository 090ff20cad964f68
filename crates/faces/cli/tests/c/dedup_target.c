/* A self-checking program for the deduplication agent: eight 2 MiB huge
 * pages — 0-3 hold the same pages (cold), 4-5 the same pages too but every
 * 64th page is written all the time (hot), 6-7 pages of their own (cold).
 * Runs for argv[1] seconds, then checks every byte and prints one line
 * that does not depend on timing. Its base address goes to stderr. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define H (2UL << 20)
#define P 4096UL
#define N 8
#define K 0x5a5a12349876abcdULL

static void fill(int r, unsigned p, uint64_t *w) {
    uint64_t x = (r >= 6 ? 1000003 + r * 512 : 1) + p;
    for (unsigned i = 0; i < P / 8; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w[i] = x;
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 3;
    char *raw = mmap(NULL, (N + 1) * H, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return 2;
    char *m = (char *)(((uintptr_t)raw + H - 1) & ~(H - 1));
    madvise(m, N * H, MADV_HUGEPAGE);
    for (int r = 0; r < N; r++)
        for (unsigned p = 0; p < H / P; p++) fill(r, p, (uint64_t *)(m + r * H + p * P));
    int huge = madvise(m, N * H, 25 /* MADV_COLLAPSE */) == 0;
    fprintf(stderr, "base %p huge %d\n", (void *)m, huge);
    uint64_t pass = 0;
    double end = now() + secs;
    while (now() < end) {
        pass++;
        for (int r = 4; r < 6; r++)
            for (unsigned p = 0; p < H / P; p += 64) {
                volatile uint64_t *w = (uint64_t *)(m + r * H + p * P);
                uint64_t v = ((uint64_t)r << 48) | ((uint64_t)p << 32) | pass;
                w[0] = v;
                w[1] = v ^ K;
            }
        usleep(2000);
    }
    static uint64_t want[P / 8];
    unsigned bad = 0;
    for (int r = 0; r < N; r++)
        for (unsigned p = 0; p < H / P; p++) {
            uint64_t *w = (uint64_t *)(m + r * H + p * P);
            fill(r, p, want);
            unsigned from = 0;
            if (r >= 4 && r < 6 && p % 64 == 0) {
                uint64_t v = ((uint64_t)r << 48) | ((uint64_t)p << 32) | pass;
                if (w[0] != v || w[1] != (v ^ K)) bad++;
                from = 2;
            }
            if (memcmp(w + from, want + from, P - from * 8)) bad++;
        }
    printf("%s: %d regions of %lu pages checked\n", bad ? "WRONG" : "ok", N, H / P);
    return bad ? 1 : 0;
}
