/* Grows the heap with sbrk and gives it back at once, many times (as the C
 * library does when it trims its heap), checking what it wrote each time.
 * Under far-memory emulation the engine learns of each growth after the
 * fact: it must neither complain about ranges gone since nor lose a byte.
 * Prints "ok: N rounds". */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    int rounds = 300;
    for (int i = 0; i < rounds; i++) {
        size_t n = 4096 * (1 + i % 16);
        /* A growth given back before it is touched, then one that is used. */
        if (sbrk((long)n) == (char *)-1 || sbrk(-(long)n) == (char *)-1) { perror("sbrk"); return 2; }
        char *p = sbrk((long)n);
        if (p == (char *)-1) { perror("sbrk"); return 2; }
        memset(p, i & 0xff, n);
        for (size_t j = 0; j < n; j += 512)
            if (p[j] != (char)(i & 0xff)) { printf("FAIL: round %d byte %zu\n", i, j); return 1; }
        if (sbrk(-(long)n) == (char *)-1) { perror("sbrk back"); return 2; }
    }
    printf("ok: %d rounds\n", rounds);
    return 0;
}
