/* realloc cycles: a buffer grows from 4 KiB to 48 MiB by x1.5, filled and
 * checked at every step, then halves back to 4 KiB; twice. (glibc moves
 * large blocks with mremap.) Prints "ok: N bytes checked". */
#include <stdio.h>
#include <stdlib.h>

static unsigned char pat(size_t i, int round) { return (unsigned char)(i * 13 + round + (i >> 12)); }

int main(void) {
    unsigned long checked = 0;
    for (int round = 0; round < 2; round++) {
        size_t n = 4096;
        unsigned char *p = malloc(n);
        for (size_t i = 0; i < n; i++) p[i] = pat(i, round);
        while (n < (48u << 20)) {
            size_t m = n * 3 / 2;
            p = realloc(p, m);
            if (!p) return 2;
            for (size_t i = 0; i < n; i += 512, checked += 512)
                if (p[i] != pat(i, round)) { printf("FAIL: grow to %zu: byte %zu\n", m, i); return 1; }
            for (size_t i = n; i < m; i++) p[i] = pat(i, round);
            n = m;
        }
        while (n > 4096) {
            n /= 2;
            p = realloc(p, n);
            for (size_t i = 0; i < n; i += 512, checked += 512)
                if (p[i] != pat(i, round)) { printf("FAIL: shrink to %zu: byte %zu\n", n, i); return 1; }
        }
        free(p);
    }
    printf("ok: %lu bytes checked\n", checked);
    return 0;
}
