/* Drops the pages of the far-memory engine's staging behind its back, then reads its
 * memory: the engine must stop the program loudly. The staging of a region
 * is an anonymous mapping exactly the region's size (an unusual 301 pages
 * here), like the region itself. Prints "staging dropped:
 * N" and, if it ever gets there, "read back". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define N 301

int main(void) {
    unsigned char *m = mmap(0, N * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (size_t i = 0; i < N; i++) memset(m + i * 4096, (int)(i + 1), 4096);
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int gone = 0;
    unsigned long a[16], b[16];
    while (f && fgets(line, sizeof line, f) && gone < 16) {
        unsigned long s, e, inode;
        char perms[8];
        int path = -1;
        if (sscanf(line, "%lx-%lx %7s %*s %*s %lu %n", &s, &e, perms, &inode, &path) >= 4 && inode == 0 &&
            e - s == N * 4096 && s != (unsigned long)m && strncmp(perms, "rw", 2) == 0 &&
            (path < 0 || line[path] == '\0' || line[path] == '\n')) {
            a[gone] = s;
            b[gone++] = e;
        }
    }
    if (f) fclose(f);
    /* Its pages dropped (the mapping stays, so that nothing else lands there). */
    for (int i = 0; i < gone; i++) madvise((void *)a[i], b[i] - a[i], MADV_DONTNEED);
    printf("staging dropped: %d\n", gone);
    fflush(stdout);
    unsigned long sum = 0;
    for (size_t i = 0; i < N; i++) sum += m[i * 4096];
    printf("read back %lu\n", sum);
    return 0;
}
