/* Writes one byte into each of N fresh pages, then leaves through exit(3)
 * or, with "_exit", through _exit(2) (no atexit handlers, as after a crash
 * or in a child after fork). Usage: farmem_touch N [_exit] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], 0, 0) : 1;
    char *m = mmap(0, n * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 2;
    for (size_t i = 0; i < n; i++) m[i * 4096] = 1;
    if (argc > 2 && strcmp(argv[2], "_exit") == 0) _exit(0);
    printf("touched %zu\n", n);
    return 0;
}
