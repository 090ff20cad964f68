/* A program with one MAP_SHARED anonymous page beside 16 private ones.
 * With argument "strict" it enters seccomp's strict mode once ready (read,
 * write and exit alone: no call can be made inside it). Says "ready"; for
 * each byte read from stdin: 'w' writes the next value into the shared
 * page and every private one, then either says "shared S private P" (the
 * first byte of each; the private pages' must all agree, else "FAIL"). */
#include <linux/seccomp.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#define P 4096

static void say(const char *s) { (void)!write(1, s, strlen(s)); }

static char *num(char *at, unsigned v) {
    char d[12];
    int n = 0;
    do { d[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (n) *at++ = d[--n];
    return at;
}

int main(int argc, char **argv) {
    unsigned char *shared = mmap(0, P, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    /* The private pages a mapping of their own, a page of hole each side:
     * not merged with the C library's thread block beside them, which a
     * memory-only restore leaves as it is. */
    unsigned char *raw = mmap(0, 18 * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED || raw == MAP_FAILED) return 2;
    munmap(raw, P);
    munmap(raw + 17 * P, P);
    unsigned char *priv = raw + P;
    memset(shared, 1, P);
    memset(priv, 1, 16 * P);
    say("ready\n");
    if (argc > 1 && strcmp(argv[1], "strict") == 0) prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT);
    char c;
    while (read(0, &c, 1) == 1) {
        if (c == '\n') continue;
        if (c == 'w') {
            shared[0]++;
            for (int i = 0; i < 16; i++) priv[i * P]++;
        }
        for (int i = 1; i < 16; i++)
            if (priv[i * P] != priv[0]) { say("FAIL: private pages disagree\n"); return 3; }
        char b[64] = "shared ";
        char *at = num(b + 7, shared[0]);
        memcpy(at, " private ", 9);
        at = num(at + 9, priv[0]);
        *at++ = '\n';
        (void)!write(1, b, (size_t)(at - b));
    }
    return 0;
}
