/* A mapping split by mprotect and put back whole is one mapping again:
 * its mremap over the whole works. Natively the reads below map the zero
 * page and leave the mapping without a reverse-map root; under far-memory
 * emulation each first touch is a userfaultfd fill that gives one to the
 * part it lands in, and parts given different ones never merged: the
 * mremap met EFAULT (a seed of farmem_mmfuzz, one run in about a hundred,
 * by where the mapping's neighbours lay). Here the parts are the two ends
 * of a 3-page mapping between two guard pages, first touched (read) while
 * the middle page is read-only: the failure every run, without the fix.
 * Usage: farmem_split_merge ROUNDS */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define P 4096

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20, bad = 0;
    for (int r = 0; r < rounds; r++) {
        unsigned char *g = mmap(0, 5 * P, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (g == MAP_FAILED) { perror("mmap guard"); return 2; }
        unsigned char *m = mmap(g + P, 3 * P, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (m == MAP_FAILED) { perror("mmap"); return 2; }
        if (mprotect(m + P, P, PROT_READ)) { perror("mprotect"); return 2; }
        /* Reads only: natively they map the zero page. */
        volatile unsigned char sum = m[0] + m[2 * P] + m[P];
        (void)sum;
        if (mprotect(m + P, P, PROT_READ | PROT_WRITE)) { perror("mprotect back"); return 2; }
        m[0] = (unsigned char)(r + 1);
        m[P + 3] = (unsigned char)(r + 3);
        m[2 * P + 7] = (unsigned char)(r + 2);
        unsigned char *n = mremap(m, 3 * P, 6 * P, MREMAP_MAYMOVE);
        if (n == MAP_FAILED) {
            if (bad++ < 3) printf("round %d: mremap of the whole: %s\n", r, strerror(errno));
            munmap(g, 5 * P);
            continue;
        }
        if (n[0] != (unsigned char)(r + 1) || n[P + 3] != (unsigned char)(r + 3) ||
            n[2 * P + 7] != (unsigned char)(r + 2) || n[5 * P] != 0)
            if (bad++ < 3) printf("round %d: the moved mapping lost a write\n", r);
        munmap(n, 6 * P);
        munmap(g, 5 * P);
    }
    printf("%d rounds, %d failed\n", rounds, bad);
    return bad != 0;
}
