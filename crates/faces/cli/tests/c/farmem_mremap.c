/* The mremap sequence that once lost pages under far-memory emulation:
 * grow with a move, shrink in place, move over a PROT_NONE reservation
 * (MREMAP_FIXED), grow after the move. Every page is checked.
 * Usage: farmem_mremap [MiB]   (default 17). Prints "ok: N pages checked". */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define P 4096

static int check(const unsigned char *m, size_t from, size_t to, int zero) {
    for (size_t i = from; i < to; i++) {
        unsigned char want = zero ? 0 : (unsigned char)(7 + i);
        for (size_t j = 0; j < P; j += 512)
            if (m[(i - from) * P + j] != want) {
                printf("FAIL: page %zu byte %zu reads %d, wrote %d\n", i, j, m[(i - from) * P + j], want);
                return 1;
            }
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t L = (argc > 1 ? strtoul(argv[1], 0, 0) : 17) << 20, n = L / P;
    unsigned char *a = mmap(0, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < n; i++) memset(a + i * P, (unsigned char)(7 + i), P);
    unsigned char *b = mremap(a, L, 2 * L, MREMAP_MAYMOVE);
    if (b == MAP_FAILED) { perror("mremap grow"); return 2; }
    for (size_t i = n; i < 2 * n; i++) memset(b + i * P, (unsigned char)(7 + i), P);
    if (check(b, 0, 2 * n, 0)) return 1;
    unsigned char *c = mremap(b, 2 * L, L / 2, 0);
    if (c == MAP_FAILED) { perror("mremap shrink"); return 2; }
    unsigned char *res = mmap(0, L, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *d = mremap(c, L / 2, L / 2, MREMAP_MAYMOVE | MREMAP_FIXED, res);
    if (d == MAP_FAILED) { perror("mremap fixed"); return 2; }
    unsigned char *e = mremap(d, L / 2, L, MREMAP_MAYMOVE);
    if (e == MAP_FAILED) { perror("mremap grow after move"); return 2; }
    if (check(e, 0, n / 2, 0) || check(e + n / 2 * P, n / 2, n, 1)) return 1;
    printf("ok: %zu pages checked\n", 2 * n + n);
    return 0;
}
