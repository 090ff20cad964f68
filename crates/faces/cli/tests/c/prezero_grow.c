/*
 * Grows through 64 MiB with MADV_HUGEPAGE: touches the first 2 MiB, waits
 * 300 ms (time for a pre-zeroing thread to run ahead), prints how many
 * 2 MiB regions are resident then ("resident N"), then writes every page
 * and checks every page. Exits 0 when every check passed.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE (2UL << 20)
#define REGIONS 32

int main(void) {
    size_t len = REGIONS * HUGE;
    char *map = mmap(NULL, len + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return 2;
    char *p = (char *)(((uintptr_t)map + HUGE - 1) & ~(HUGE - 1));
    if (madvise(p, len, MADV_HUGEPAGE))
        return 3;
    p[0] = 1;
    usleep(300000);
    unsigned char vec[REGIONS * (HUGE / 4096)];
    if (mincore(p, len, vec))
        return 4;
    int resident = 0;
    for (int r = 0; r < REGIONS; r++)
        resident += vec[r * (HUGE / 4096)] & 1;
    printf("resident %d\n", resident);
    for (size_t i = 0; i < len; i += 4096)
        p[i + 9] = (char)(i / 4096 * 7 + 1);
    for (size_t i = 0; i < len; i += 4096) {
        if (p[i + 9] != (char)(i / 4096 * 7 + 1) || p[i + 100] != 0) {
            printf("page %zu wrong\n", i / 4096);
            return 1;
        }
    }
    printf("ok\n");
    return 0;
}
