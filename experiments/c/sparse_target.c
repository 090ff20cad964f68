// A sparse process for `pagewise bench sparse`, one shape per run:
//   maps03       10 GiB mapped, 2 pages written (CRIU's maps03 test)
//   reservation  64 GiB reserved PROT_NONE, 1 GiB of it made writable,
//                2 pages of that written (as JVMs and Go reserve heaps)
//   floor        a 2-page mapping, both written: the same process with
//                nothing sparse, the commands' fixed cost
// Prints "ADDR LEN FIRST SECOND" (the writable part's address and length,
// hex, and the two written page indexes, decimal; byte 64 of page FIRST is
// 0x11, of page SECOND 0x22), then idles until stdin closes.
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GIB (1ull << 30)
#define PAGE 4096ull

int main(int argc, char **argv) {
    const char *shape = argc > 1 ? argv[1] : "maps03";
    unsigned long long len, first, second;
    unsigned char *m;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (!strcmp(shape, "maps03")) {
        len = 10 * GIB;
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    } else if (!strcmp(shape, "reservation")) {
        unsigned char *r = mmap(NULL, 64 * GIB, PROT_NONE, flags, -1, 0);
        if (r == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        len = GIB;
        m = r + 8 * GIB;
        if (mprotect(m, len, PROT_READ | PROT_WRITE)) {
            perror("mprotect");
            return 1;
        }
    } else if (!strcmp(shape, "floor")) {
        len = 2 * PAGE;
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    } else {
        fprintf(stderr, "unknown shape %s\n", shape);
        return 2;
    }
    if (m == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    first = 0;
    second = len / PAGE / 2 + 1;
    if (second >= len / PAGE)
        second = len / PAGE - 1;
    m[first * PAGE + 64] = 0x11;
    m[second * PAGE + 64] = 0x22;
    printf("%p %llx %llu %llu\n", (void *)m, len, first, second);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
