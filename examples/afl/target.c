/*
 * A fuzz target holding real state: STATE_MIB MiB (argument 1, 64 by
 * default) written at start-up, before it reads its input from standard
 * input; each input then reads and writes TOUCHES pages of it (argument 2,
 * 16 by default) chosen by the input's hash, and walks a small parser of
 * the input's first bytes (coverage for the fuzzer to find: "PW!!"
 * aborts). It exits with a code made of the input's hash and the state it
 * read, so that a run that found the state other than after start-up
 * answers differently.
 *
 * Built three ways for the AFL++ benchmark: plain (for pagewise's reset,
 * afl-cc's coverage only), -DDEFERRED (AFL++'s fork server started after
 * the state is written: __AFL_INIT) and -DPERSISTENT (AFL++'s recommended
 * persistent form: __AFL_LOOP over inputs in shared memory,
 * __AFL_FUZZ_TESTCASE_BUF; the state is not put back between inputs).
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if (defined(DEFERRED) || defined(PERSISTENT)) && !defined(__AFL_HAVE_MANUAL_CONTROL)
#error "DEFERRED and PERSISTENT need afl-cc"
#endif

#define PAGE 4096u

#ifdef PERSISTENT
__AFL_FUZZ_INIT();
#endif

static unsigned char *state;
static size_t pages;

static int run_one(const unsigned char *buf, size_t len, unsigned touches)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ buf[i]) * 1099511628211ull;
    uint32_t seen = 0;
    for (unsigned k = 0; k < touches; k++) {
        unsigned char *p = state + (size_t)((h >> 7) % pages) * PAGE;
        uint32_t s = 0;
        for (unsigned j = 0; j < PAGE; j += 64)
            s += p[j];
        p[(h >> 3) % PAGE] ^= (unsigned char)(s + k + 1);
        seen += s;
        h = h * 6364136223846793005ull + 1442695040888963407ull + s;
    }
    /* A branch on the state: always taken the same way after start-up. */
    if (state[(h >> 11) % (pages * PAGE)] == 0xa5)
        seen ^= 0x55;
    if (len >= 1 && buf[0] == 'P') {
        seen += 1;
        if (len >= 2 && buf[1] == 'W') {
            seen += 2;
            if (len >= 3 && buf[2] == '!') {
                seen += 3;
                if (len >= 4 && buf[3] == '!')
                    abort();
            }
        }
    }
    if (len >= 14 && memcmp(buf, "pagewise-hang!", 14) == 0)
        for (;;)
            pause();
    return (int)((h ^ seen) & 0x7f);
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    unsigned touches = argc > 2 ? (unsigned)strtoul(argv[2], 0, 10) : 16;
    if (mib == 0)
        mib = 1;
    pages = mib * 256;
    state = malloc(pages * PAGE);
    if (!state)
        return 120;
    for (size_t i = 0; i < pages * PAGE; i++)
        state[i] = (unsigned char)((i * 2654435761u) >> 24);
    int code = 0;
#if defined(DEFERRED) || defined(PERSISTENT)
    __AFL_INIT();
#endif
#ifdef PERSISTENT
    /* AFL++'s recommended form: inputs in shared memory, 10000 a process. */
    unsigned char *tc = __AFL_FUZZ_TESTCASE_BUF;
    while (__AFL_LOOP(10000)) {
        size_t len = (size_t)__AFL_FUZZ_TESTCASE_LEN;
        code = run_one(tc, len < PAGE ? len : PAGE, touches);
    }
#else
    static unsigned char buf[PAGE];
    size_t len = 0;
    ssize_t n;
    while (len < sizeof buf && (n = read(0, buf + len, sizeof buf - len)) > 0)
        len += (size_t)n;
    code = run_one(buf, len, touches);
#endif
    return code;
}
