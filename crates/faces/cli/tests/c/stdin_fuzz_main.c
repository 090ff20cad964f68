/*
 * A libFuzzer target (LLVMFuzzerTestOneInput) run as a program that reads
 * its input from standard input, as `pagewise snapshot afl` serves it:
 * the target's own code is not changed. The exit code is made of the
 * input's hash, with bit 5 set when the run left the program's break
 * elsewhere than where it was as the input was read (the C library grew
 * its heap and did not trim it back whole) and bit 6 when the run is the
 * program's first (a counter written before the input is read): a reset
 * that did not put the program back answers differently.
 */
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int runs;

int main(void)
{
    runs++;
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    /* The break as the input is read: where a reset puts it back. */
    char *before = sbrk(0);
    ssize_t n;
    while (buf && (n = read(0, buf + len, cap - len)) > 0) {
        len += (size_t)n;
        if (len == cap)
            buf = realloc(buf, cap *= 2);
    }
    if (!buf)
        return 100;
    LLVMFuzzerTestOneInput(buf, len);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ buf[i]) * 1099511628211ull;
    free(buf);
    int moved = (char *)sbrk(0) != before;
    return (int)(h % 32) | moved << 5 | (runs == 1) << 6;
}
