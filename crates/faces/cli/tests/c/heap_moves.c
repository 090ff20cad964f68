/*
 * A fuzz target whose every input moves its heap, for resets that must
 * put back a layout the run changed. Argument 1 says how:
 *
 *   brk    about 1 MiB of small mallocs, written from the input, then
 *          freed in reverse: the C library grows the break for them and
 *          trims it back when they are freed.
 *   arena  a 1 MiB anonymous mapping grown to 2 MiB by mremap (moved if
 *          it must be), written, then unmapped; and a 512 KiB malloc (an
 *          mmap of the C library's own) freed again.
 *
 * Argument 2, if given, is the descriptor the input is read from (0 by
 * default).
 *
 * The exit code is made of the input's hash and what the run read back,
 * with bit 5 set when the run saw its heap move (the break above where it
 * started, or the arena mapped) and bit 6 when the run is the program's
 * first (a counter written before the input is read): a reset that did
 * not put the program back answers differently.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SMALL 1000

static int runs;

static unsigned long long grow_break(const unsigned char *in, size_t len, int *moved)
{
    static unsigned char *chunk[SMALL];
    char *start = sbrk(0);
    unsigned long long sum = 0;
    for (int i = 0; i < SMALL; i++) {
        size_t n = 1000 + (len ? in[i % len] : 7) % 97;
        chunk[i] = malloc(n);
        if (!chunk[i])
            _exit(100);
        memset(chunk[i], (int)(i + n), n);
    }
    if ((char *)sbrk(0) > start)
        *moved = 1;
    for (int i = SMALL - 1; i >= 0; i--) {
        sum += chunk[i][i % 1000];
        free(chunk[i]);
    }
    return sum;
}

static unsigned long long map_arena(const unsigned char *in, size_t len, int *moved)
{
    size_t mib = 1 << 20;
    unsigned char *a = mmap(NULL, mib, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED)
        _exit(101);
    memset(a, len ? in[0] : 1, mib);
    unsigned char *b = mremap(a, mib, 2 * mib, MREMAP_MAYMOVE);
    if (b == MAP_FAILED)
        _exit(102);
    memset(b + mib, 3, mib);
    unsigned long long sum = b[0] + b[mib + 5];
    munmap(b, 2 * mib);
    unsigned char *big = malloc(512 << 10);
    if (!big)
        _exit(103);
    memset(big, 5, 512 << 10);
    sum += big[77];
    free(big);
    *moved = 1;
    return sum;
}

int main(int argc, char **argv)
{
    int arena = argc > 1 && strcmp(argv[1], "arena") == 0;
    int fd = argc > 2 ? atoi(argv[2]) : 0;
    static unsigned char in[4096];
    runs++;
    size_t len = 0;
    ssize_t n;
    while (len < sizeof in && (n = read(fd, in + len, sizeof in - len)) > 0)
        len += (size_t)n;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ in[i]) * 1099511628211ull;
    int moved = 0;
    unsigned long long sum = arena ? map_arena(in, len, &moved) : grow_break(in, len, &moved);
    return (int)((h ^ sum) % 32) | moved << 5 | (runs == 1) << 6;
}
