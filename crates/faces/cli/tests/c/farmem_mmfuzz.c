/* Random sequences of mmap, munmap, mremap (grow in place or moving, shrink,
 * moved over a reservation or over another buffer with MREMAP_FIXED),
 * MADV_DONTNEED, realloc and writes, every page checked against the tags
 * kept in .bss: the buffer changed and one other after every step, all at
 * the end. The output depends only on the seed, so a
 * run under far-memory emulation must print what a plain run prints.
 * Usage: farmem_mmfuzz SEED STEPS [HELPERS]
 * HELPERS threads (default 0) each write and check a buffer of their own
 * all the while, so that faults in other threads race the remap, unmap
 * and remove events of the main thread's steps; they report only wrong
 * reads, so that the output still depends only on the seed.
 * After about one step in six, part of the buffer is made read-only for
 * the check (drawn from a second generator: the steps themselves are
 * those of the seed without it).
 * With MMFUZZ_TRACE set, each step is also written to stderr with its
 * buffer's address and pages (for a failure found by the debug mode of
 * the far-memory engine, PAGEWISE_FARMEM_CHECK). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define P 4096
#define NB 6
#define MAXP 1024

static unsigned char *buf[NB];
static size_t npg[NB];
static uint32_t tag[NB][MAXP]; /* 0: the page must read as zeros */
static unsigned char *heap;
static size_t heap_len;
static uint32_t heap_tag;
static uint64_t rng, prot_rng;
static unsigned long checked, bad;

static atomic_int helpers_stop;
static atomic_ulong helpers_bad;

/* A helper: its own buffer of 256 pages, a tag per page written and read
 * back at random until the main thread is done. */
static void *helper(void *arg) {
    uint64_t x = (uintptr_t)arg * 0x9E3779B97F4A7C15ull + 7;
    enum { HP = 256 };
    uint32_t mine[HP] = {0};
    unsigned char *m = mmap(0, HP * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { atomic_fetch_add(&helpers_bad, 1); return 0; }
    while (!atomic_load(&helpers_stop)) {
        x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
        size_t p = (x >> 8) % HP, q = (x >> 24) % HP;
        uint32_t t = (uint32_t)(x >> 32) | 1, got;
        memcpy(m + p * P, &t, 4);
        mine[p] = t;
        memcpy(&got, m + q * P, 4);
        if (got != mine[q]) atomic_fetch_add(&helpers_bad, 1);
    }
    for (size_t p = 0; p < HP; p++) {
        uint32_t got;
        memcpy(&got, m + p * P, 4);
        if (got != mine[p]) atomic_fetch_add(&helpers_bad, 1);
    }
    munmap(m, HP * P);
    return 0;
}

static uint64_t rnd(void) {
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}
static size_t below(size_t n) { return n ? rnd() % n : 0; }
static uint64_t prot_rnd(void) {
    prot_rng ^= prot_rng >> 12; prot_rng ^= prot_rng << 25; prot_rng ^= prot_rng >> 27;
    return prot_rng * 2685821657736338717ull;
}

static void put(int b, size_t p, uint32_t t) {
    unsigned char *m = buf[b] + p * P;
    tag[b][p] = t;
    memcpy(m, &t, 4);
    memcpy(m + P / 2, &t, 4);
    memcpy(m + P - 4, &t, 4);
}

static void check(int b, const char *after) {
    for (size_t p = 0; p < npg[b]; p++) {
        const unsigned char *m = buf[b] + p * P;
        uint32_t x, y, z;
        memcpy(&x, m, 4); memcpy(&y, m + P / 2, 4); memcpy(&z, m + P - 4, 4);
        checked++;
        if (x != tag[b][p] || y != tag[b][p] || z != tag[b][p]) {
            if (bad++ < 5)
                printf("FAIL after %s: buffer %d page %zu reads %08x %08x %08x, wrote %08x\n",
                       after, b, p, x, y, z, tag[b][p]);
        }
    }
}

static void heap_check(const char *after) {
    for (size_t i = 0; i < heap_len; i += 256) {
        checked++;
        if (heap[i] != (unsigned char)(heap_tag + i / 256) && bad++ < 5)
            printf("FAIL after %s: heap byte %zu\n", after, i);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: farmem_mmfuzz SEED STEPS\n"); return 2; }
    rng = strtoull(argv[1], 0, 0) * 0x9E3779B97F4A7C15ull + 1;
    prot_rng = strtoull(argv[1], 0, 0) * 0xD1B54A32D192ED03ull + 3;
    long protected = 0;
    long steps = strtol(argv[2], 0, 0);
    int nhelpers = argc > 3 ? atoi(argv[3]) : 0;
    pthread_t helpers[8];
    if (nhelpers > 8) nhelpers = 8;
    for (int i = 0; i < nhelpers; i++) pthread_create(&helpers[i], 0, helper, (void *)(uintptr_t)(i + 1));
    long counts[9] = {0};
    int trace = getenv("MMFUZZ_TRACE") != 0;
    for (long s = 0; s < steps; s++) {
        int b = below(NB), op = below(9);
        if (!buf[b]) op = 0;
        const char *name = "?";
        switch (op) {
        case 0: /* map */
            if (buf[b]) { munmap(buf[b], npg[b] * P); buf[b] = 0; }
            npg[b] = 1 + below(MAXP / 2);
            buf[b] = mmap(0, npg[b] * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (buf[b] == MAP_FAILED) { perror("mmap"); return 2; }
            memset(tag[b], 0, sizeof tag[b]);
            for (size_t k = below(npg[b]); k > 0; k--) put(b, below(npg[b]), (uint32_t)rnd() | 1);
            name = "mmap";
            break;
        case 1: /* writes */
            for (size_t k = 1 + below(256); k > 0; k--) put(b, below(npg[b]), (uint32_t)rnd() | 1);
            name = "writes";
            break;
        case 2: { /* munmap the tail */
            size_t keep = below(npg[b]);
            munmap(buf[b] + keep * P, (npg[b] - keep) * P);
            npg[b] = keep;
            if (!keep) buf[b] = 0;
            name = "munmap";
            break;
        }
        case 3: { /* grow, moving if it must */
            size_t n2 = npg[b] + 1 + below(MAXP - npg[b]);
            if (n2 > MAXP) n2 = MAXP;
            unsigned char *m = mremap(buf[b], npg[b] * P, n2 * P, MREMAP_MAYMOVE);
            if (m == MAP_FAILED) { perror("mremap grow"); return 2; }
            buf[b] = m;
            for (size_t p = npg[b]; p < n2; p++) tag[b][p] = 0;
            npg[b] = n2;
            for (size_t k = below(64); k > 0; k--) put(b, below(n2), (uint32_t)rnd() | 1);
            name = "mremap grow";
            break;
        }
        case 4: { /* shrink in place */
            size_t n2 = 1 + below(npg[b]);
            unsigned char *m = mremap(buf[b], npg[b] * P, n2 * P, 0);
            if (m == MAP_FAILED) { perror("mremap shrink"); return 2; }
            npg[b] = n2;
            name = "mremap shrink";
            break;
        }
        case 5: { /* move over a reservation, maybe growing after */
            size_t r = npg[b] + below(npg[b] + 1);
            unsigned char *res = mmap(0, r * P, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            unsigned char *m = mremap(buf[b], npg[b] * P, npg[b] * P, MREMAP_MAYMOVE | MREMAP_FIXED, res);
            if (m == MAP_FAILED) { perror("mremap fixed"); return 2; }
            if (r > npg[b]) munmap(res + npg[b] * P, (r - npg[b]) * P);
            buf[b] = m;
            name = "mremap fixed";
            break;
        }
        case 6: { /* move over another buffer, which is gone then */
            int o = (b + 1 + below(NB - 1)) % NB;
            if (!buf[o] || npg[o] < npg[b]) { name = "skip"; break; }
            unsigned char *m = mremap(buf[b], npg[b] * P, npg[b] * P, MREMAP_MAYMOVE | MREMAP_FIXED, buf[o]);
            if (m == MAP_FAILED) { perror("mremap over"); return 2; }
            if (npg[o] > npg[b]) munmap(buf[o] + npg[b] * P, (npg[o] - npg[b]) * P);
            buf[b] = m; buf[o] = 0; npg[o] = 0;
            name = "mremap over";
            break;
        }
        case 7: { /* drop a range */
            size_t a = below(npg[b]), n = 1 + below(npg[b] - a);
            madvise(buf[b] + a * P, n * P, MADV_DONTNEED);
            for (size_t p = a; p < a + n; p++) tag[b][p] = 0;
            name = "madvise";
            break;
        }
        case 8: { /* realloc the heap buffer */
            size_t n2 = 1 + below(8u << 20);
            size_t keep = n2 < heap_len ? n2 : heap_len;
            heap = realloc(heap, n2);
            if (!heap) return 2;
            heap_len = keep;
            heap_check("realloc");
            heap_tag = (uint32_t)rnd();
            for (size_t i = 0; i < n2; i += 256) heap[i] = (unsigned char)(heap_tag + i / 256);
            heap_len = n2;
            name = "realloc";
            break;
        }
        }
        counts[op]++;
        if (trace)
            fprintf(stderr, "step %ld: %s buffer %d at %p, %zu pages; heap at %p, %zu bytes\n", s, name, b,
                    (void *)buf[b], npg[b], (void *)heap, heap_len);
        /* The buffer just changed, and one other; now and then part of it
         * read-only while it is checked. */
        if (buf[b] && prot_rnd() % 6 == 0) {
            size_t a = prot_rnd() % npg[b], n = 1 + prot_rnd() % (npg[b] - a);
            if (mprotect(buf[b] + a * P, n * P, PROT_READ)) { perror("mprotect"); return 2; }
            check(b, "mprotect");
            if (mprotect(buf[b] + a * P, n * P, PROT_READ | PROT_WRITE)) { perror("mprotect back"); return 2; }
            protected++;
        } else if (buf[b]) {
            check(b, name);
        }
        int o = below(NB);
        if (o != b && buf[o]) check(o, name);
    }
    for (int k = 0; k < NB; k++)
        if (buf[k]) check(k, "the last step");
    heap_check("end");
    atomic_store(&helpers_stop, 1);
    for (int i = 0; i < nhelpers; i++) pthread_join(helpers[i], 0);
    if (atomic_load(&helpers_bad)) {
        printf("FAIL: the helper threads read %lu wrong values\n", atomic_load(&helpers_bad));
        bad++;
    }
    printf("seed %s: %ld steps (map %ld, write %ld, munmap %ld, grow %ld, shrink %ld, fixed %ld, over %ld, "
           "dontneed %ld, realloc %ld; %ld checked read-only), %lu checks, %lu wrong\n",
           argv[1], steps, counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], counts[6],
           counts[7], counts[8], protected, checked, bad);
    return bad != 0;
}
