// A sparse process under change: 10 GiB mapped (CRIU's maps03 shape), of
// which only SLOTS pages, SPACING apart, are ever written. Two threads
// write random bytes of random slots and give a slot back
// (MADV_DONTNEED) one time in eight, counting their operations in `ops`.
// Prints "MAP OPS" (the mapping's and the counter's addresses, hex), then
// runs until stdin closes.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#define LEN (10ull << 30)
#define SLOTS 8192ull
#define SPACING (LEN / SLOTS)
#define PAGE 4096ull

static unsigned char *map;
static volatile uint64_t ops;

static void *writer(void *arg) {
    uint64_t x = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    for (;;) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        unsigned char *page = map + (x % SLOTS) * SPACING;
        if ((x >> 20) % 8 == 0)
            madvise(page, PAGE, MADV_DONTNEED);
        else
            page[(x >> 24) % PAGE] = (unsigned char)(x >> 40) | 1;
        __atomic_fetch_add(&ops, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(void) {
    map = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    for (uint64_t s = 0; s < SLOTS; s += 2)
        map[s * SPACING] = 1;
    pthread_t t[2];
    for (uintptr_t i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, writer, (void *)(i + 1));
    printf("%p %p\n", (void *)map, (void *)&ops);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
