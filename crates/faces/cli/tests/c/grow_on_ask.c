/* Answers each line of stdin with one line: "grow N" maps N MiB (no huge
 * pages) and writes one byte of each page, then says "grown"; any other
 * line is answered "?". Ends at the end of stdin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(void)
{
    char line[64];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        long mib;
        if (sscanf(line, "grow %ld", &mib) == 1 && mib > 0 && mib < 4096) {
            size_t len = (size_t)mib << 20;
            char *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED || madvise(m, len, MADV_NOHUGEPAGE) != 0)
                return 2;
            for (size_t off = 0; off < len; off += 4096)
                m[off] = 1;
            puts("grown");
        } else {
            puts("?");
        }
    }
    return 0;
}
