/*
 * The reset benchmark's target for resets made inside it (`pagewise
 * snapshot afl`): MIB MiB of state (argument 1) in a mapping of its own,
 * word w of page p set to pattern(p, w) at start-up, then one read of a
 * 40-byte input from standard input, where the point is taken:
 *
 *   seed, k, prev, nonce, check   (five 64-bit words)
 *
 * A run first checks what the reset put back: the counter of runs in its
 * data is 0, the words the last run wrote (those of seed `prev`, k of
 * them; prev = ~0: none) hold their pattern, and so do `check` whole pages
 * chosen by `nonce` (~0: every page). Anything found otherwise ends it
 * with status 1. It then reads and changes one word in each of k pages
 * chosen by `seed` and exits with status 2 + (a hash of the seed and of
 * what it read) % 250: the same answer for every run of a seed when every
 * run starts from the point.
 */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096u
#define WORDS (PAGE / 8)

static uint64_t *state;
static uint64_t pages;
static uint64_t runs; /* in the data: 0 at every run's start */

static uint64_t pattern(uint64_t p, uint64_t w)
{
    return (p * 0x9e3779b97f4a7c15ull) ^ (w * 0xbf58476d1ce4e5b9ull) ^ 0x5a5a;
}

static uint64_t next(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

/* The i-th word the run of `seed` writes: its page and word. */
static void spot(uint64_t *h, uint64_t *p, uint64_t *w)
{
    *h = next(*h);
    *p = *h % pages;
    *w = (*h >> 40) % WORDS;
}

static int page_ok(uint64_t p)
{
    for (uint64_t w = 0; w < WORDS; w++)
        if (state[p * WORDS + w] != pattern(p, w))
            return 0;
    return 1;
}

int main(int argc, char **argv)
{
    uint64_t mib = argc > 1 ? strtoull(argv[1], 0, 10) : 64;
    pages = (mib ? mib : 1) * 256;
    state = mmap(0, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (state == MAP_FAILED)
        return 120;
    for (uint64_t p = 0; p < pages; p++)
        for (uint64_t w = 0; w < WORDS; w++)
            state[p * WORDS + w] = pattern(p, w);
    uint64_t in[5];
    size_t got = 0;
    while (got < sizeof in) {
        ssize_t r = read(0, (char *)in + got, sizeof in - got);
        if (r <= 0)
            return 121;
        got += (size_t)r;
    }
    uint64_t seed = in[0], k = in[1], prev = in[2], nonce = in[3], check = in[4];
    if (runs++ != 0)
        _exit(1);
    if (prev != ~0ull) {
        uint64_t h = prev + 0x9e3779b97f4a7c15ull, p, w;
        for (uint64_t i = 0; i < k; i++) {
            spot(&h, &p, &w);
            if (state[p * WORDS + w] != pattern(p, w))
                _exit(1);
        }
    }
    if (check == ~0ull) {
        for (uint64_t p = 0; p < pages; p++)
            if (!page_ok(p))
                _exit(1);
    } else {
        uint64_t h = nonce ^ 0x1234567;
        for (uint64_t i = 0; i < check; i++) {
            h = next(h);
            if (!page_ok(h % pages))
                _exit(1);
        }
    }
    uint64_t h = seed + 0x9e3779b97f4a7c15ull, sum = seed, p, w;
    for (uint64_t i = 0; i < k; i++) {
        spot(&h, &p, &w);
        sum = next(sum ^ state[p * WORDS + w]);
        state[p * WORDS + w] ^= h | 1;
    }
    _exit(2 + (int)(sum % 250));
}
