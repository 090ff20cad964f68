/*
 * A libFuzzer target (LLVMFuzzerTestOneInput, the form real parsers ship
 * their fuzz targets in) run the three ways AFL++'s benchmark compares,
 * the target's own code left as it is:
 *
 *   plain        reads its input from standard input (for pagewise's
 *                resets: `pagewise snapshot afl`);
 *   -DDEFERRED   the same, AFL++'s fork server started at main
 *                (`__AFL_INIT()`: nothing to set up before it here);
 *   -DPERSISTENT AFL++'s recommended persistent form: `__AFL_LOOP` over
 *                inputs in shared memory (`__AFL_FUZZ_TESTCASE_BUF`).
 */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#if (defined(DEFERRED) || defined(PERSISTENT)) && !defined(__AFL_HAVE_MANUAL_CONTROL)
#error "DEFERRED and PERSISTENT need afl-cc"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef PERSISTENT
__AFL_FUZZ_INIT();
#endif

int main(void)
{
#ifdef DEFERRED
    __AFL_INIT();
#endif
#ifdef PERSISTENT
    __AFL_INIT();
    unsigned char *buf = __AFL_FUZZ_TESTCASE_BUF;
    while (__AFL_LOOP(100000)) {
        int len = __AFL_FUZZ_TESTCASE_LEN;
        LLVMFuzzerTestOneInput(buf, (size_t)len);
    }
    return 0;
#else
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    ssize_t n;
    while (buf && (n = read(0, buf + len, cap - len)) > 0) {
        len += (size_t)n;
        if (len == cap)
            buf = realloc(buf, cap *= 2);
    }
    if (!buf)
        return 100;
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
#endif
}
