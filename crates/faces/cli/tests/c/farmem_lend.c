/* Instructions that need several pages at once, under budgets of one to
 * three pages: 300 copies of 4,096 bytes between heap buffers, source and
 * destination each crossing a page boundary (one `rep movsb`, or vector
 * loads and stores that each span two pages), then alternating reads of
 * two pages (DiME's two-page test). Prints a digest of the destination
 * and of what was read: a run under far-memory emulation must print what
 * a plain run prints. Usage: farmem_lend */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P 4096
#define PAGES 64

int main(void) {
    size_t n = PAGES * P;
    unsigned char *a = malloc(n), *b = malloc(n);
    if (!a || !b) return 2;
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 131 + 7);
    memset(b, 0, n);
    for (int r = 0; r < 300; r++) {
        size_t s = (r * 4099u) % (n - 2 * P) + 100, d = (r * 7919u) % (n - 2 * P) + 2000;
        memcpy(b + d, a + s, P);
    }
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i += 61) h = (h ^ b[i]) * 1099511628211ull;
    /* Two pages read in turn. */
    volatile unsigned char *x = a + 10 * P, *y = a + 40 * P;
    unsigned long sum = 0;
    for (int r = 0; r < 1000; r++) sum += x[r % P] + y[(r * 7) % P];
    printf("digest %016llx sum %lu\n", (unsigned long long)h, sum);
    return 0;
}
