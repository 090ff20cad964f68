/* Writes PAGES pages (default 100) of a fresh mapping, one byte each, and
 * exits at once: a program that ends before a tracker's first collection. */
#include <stdlib.h>
#include <sys/mman.h>

int main(int argc, char **argv)
{
    long pages = argc > 1 ? atol(argv[1]) : 100;
    char *m = mmap(NULL, (size_t)pages * 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return 2;
    for (long i = 0; i < pages; i++)
        m[i * 4096] = 1;
    return 0;
}
