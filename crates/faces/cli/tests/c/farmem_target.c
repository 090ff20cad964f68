/* A self-checking program for `pagewise farmem run` tests. Every mode checks
 * its own memory against what it wrote and prints what the test compares. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096L

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33;
    return x;
}

static char *aligned_pages(long n) {
    char *b = malloc((n + 1) * PAGE);
    if (!b) { perror("malloc"); exit(2); }
    return (char *)(((uintptr_t)b + PAGE - 1) & ~(uintptr_t)(PAGE - 1));
}

/* DiME's Table 5.1: touch 2000 pages in order, then the last x. */
static int table(long x) {
    long n = 2000;
    char *p = aligned_pages(n);
    for (long i = 0; i < n; i++) p[i * PAGE] = (char)i;
    long sum = 0;
    for (long i = n - x; i < n; i++) sum += p[i * PAGE];
    printf("buffer %p %p sum %ld\n", (void *)p, (void *)(p + n * PAGE), sum);
    return 0;
}

/* Fill n pages with a pattern, then check it: returns mismatching pages. */
static long fill(char *p, long n, uint64_t seed) {
    for (long i = 0; i < n; i++)
        for (long w = 0; w < PAGE / 8; w += 64) ((uint64_t *)(p + i * PAGE))[w] = mix(seed + i * 1000 + w);
    return 0;
}
static long check(const char *p, long n, uint64_t seed) {
    long bad = 0;
    for (long i = 0; i < n; i++)
        for (long w = 0; w < PAGE / 8; w += 64)
            if (((const uint64_t *)(p + i * PAGE))[w] != mix(seed + i * 1000 + w)) { bad++; break; }
    return bad;
}

/* read() into a buffer whose pages are remote. */
static int readinto(const char *path) {
    long n = 256;
    char *buf = aligned_pages(n);
    memset(buf, 1, n * PAGE);          /* local, then pushed out: */
    char *other = aligned_pages(4 * n);
    fill(other, 4 * n, 7);
    int fd = open(path, O_RDONLY);
    if (fd < 0) { perror(path); return 2; }
    long got = 0, r;
    while (got < n * PAGE && (r = read(fd, buf + got, n * PAGE - got)) > 0) got += r;
    uint64_t h = 1469598103934665603ULL;
    for (long i = 0; i < got; i++) h = (h ^ (unsigned char)buf[i]) * 1099511628211ULL;
    printf("read %ld fnv %016llx other_bad %ld\n", got, (unsigned long long)h, check(other, 4 * n, 7));
    return 0;
}

/* realloc growing a block (glibc moves it with mremap). */
static int grow(void) {
    long n = 64;
    char *p = malloc(n * PAGE);
    fill(p, n, 11);
    long bad = 0;
    for (int round = 0; round < 6; round++) {
        p = realloc(p, 2 * n * PAGE);
        bad += check(p, n, 11);
        fill(p + n * PAGE, n, 11 + n * 1000);  /* keep one pattern across the block */
        for (long i = 0; i < n; i++)
            for (long w = 0; w < PAGE / 8; w += 64) ((uint64_t *)(p + (n + i) * PAGE))[w] = mix(11 + (n + i) * 1000 + w);
        n *= 2;
    }
    bad += check(p, n, 11);
    printf("grow %ld pages bad %ld\n", n, bad);
    return 0;
}

struct job { long n; uint64_t seed; long bad; };
static void *worker(void *a) {
    struct job *j = a;
    char *p = aligned_pages(j->n);
    for (int r = 0; r < 3; r++) {
        fill(p, j->n, j->seed + r);
        j->bad += check(p, j->n, j->seed + r);
    }
    return NULL;
}

/* Threads writing and checking their own buffers. */
static int threads(void) {
    pthread_t t[4];
    struct job j[4];
    for (int i = 0; i < 4; i++) { j[i] = (struct job){ 512, 1000 + i * 77, 0 }; pthread_create(&t[i], NULL, worker, &j[i]); }
    long bad = 0;
    for (int i = 0; i < 4; i++) { pthread_join(t[i], NULL); bad += j[i].bad; }
    printf("threads bad %ld\n", bad);
    return 0;
}

/* Threads that sleep while the main thread pushes the whole heap out
 * (their C library thread-local tables included: they sit in the heap),
 * then fault on their own pages first thing. */
static pthread_barrier_t gate;
static void *sleeper(void *a) {
    struct job *j = a;
    j->bad = 0;
    pthread_barrier_wait(&gate);
    pthread_barrier_wait(&gate);
    worker(j);
    return NULL;
}
static int parked(void) {
    pthread_t t[4];
    struct job j[4];
    pthread_barrier_init(&gate, NULL, 5);
    for (int i = 0; i < 4; i++) { j[i] = (struct job){ 64, 3000 + i * 31, 0 }; pthread_create(&t[i], NULL, sleeper, &j[i]); }
    pthread_barrier_wait(&gate);
    long n = 2048;
    char *p = aligned_pages(n);
    fill(p, n, 21);
    long bad = check(p, n, 21);
    pthread_barrier_wait(&gate);
    for (int i = 0; i < 4; i++) { pthread_join(t[i], NULL); bad += j[i].bad; }
    printf("parked threads bad %ld\n", bad);
    return 0;
}

/* fork: the child checks the parent's data (much of it remote), writes its
 * own, and exits with the number of bad pages; then the parent checks. */
static int forked(void) {
    long n = 1024;
    char *p = aligned_pages(n);
    fill(p, n, 5);
    pid_t c = fork();
    if (c == 0) {
        long bad = check(p, n, 5);
        char *q = aligned_pages(n);
        fill(q, n, 6);
        fill(p, n / 2, 8);
        bad += check(q, n, 6) + check(p, n / 2, 8) + check(p + n / 2 * PAGE, n / 2, 5 + n / 2 * 1000);
        _exit(bad > 100 ? 100 : (int)bad);
    }
    int st = 0;
    waitpid(c, &st, 0);
    long bad = check(p, n, 5);
    printf("fork child_bad %d parent_bad %ld\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1, bad);
    return 0;
}

/* Hold n pages and keep touching them for s seconds (for ls and set). */
static int hold(long n, long s) {
    char *p = aligned_pages(n);
    fill(p, n, 3);
    printf("holding %ld\n", n);
    fflush(stdout);
    time_t end = time(NULL) + s;
    long bad = 0;
    while (time(NULL) < end) bad += check(p, n, 3);
    printf("hold bad %ld\n", bad);
    return 0;
}

/* io_uring and Linux AIO set-up, made as a library making its own system
 * calls would (liburing does): what each returns. */
static int uring(void) {
    char params[120];
    memset(params, 0, sizeof params);
    long fd = syscall(425 /* io_uring_setup */, 4, params);
    int e = errno;
    printf("io_uring_setup %s\n", fd >= 0 ? "ok" : strerror(e));
    if (fd >= 0) close((int)fd);
    unsigned long ctx = 0;
    long r = syscall(206 /* io_setup */, 4, &ctx);
    e = errno;
    printf("io_setup %s\n", r == 0 ? "ok" : strerror(e));
    if (r == 0) syscall(207 /* io_destroy */, ctx);
    return 0;
}

/* Registers two mappings of its own with a userfaultfd of its own (as a
 * garbage collector does), after writing them: under far memory the
 * kernel refuses both (EBUSY), since far memory holds them already. */
static int own_uffd(void) {
    int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | 1 /* UFFD_USER_MODE_ONLY */);
    struct uffdio_api api = {.api = UFFD_API};
    if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) { perror("userfaultfd"); return 2; }
    for (int i = 0; i < 2; i++) {
        char *m = mmap(0, 64 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 2;
        memset(m, 1, 64 * PAGE);
        struct uffdio_register r = {.range = {.start = (unsigned long)m, .len = 64 * PAGE},
                                    .mode = UFFDIO_REGISTER_MODE_MISSING};
        int ok = ioctl(uffd, UFFDIO_REGISTER, &r) == 0;
        printf("register: %s\n", ok ? "ok" : strerror(errno));
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: farmem_target MODE ...\n"); return 2; }
    const char *m = argv[1];
    if (!strcmp(m, "table")) return table(atol(argv[2]));
    if (!strcmp(m, "read")) return readinto(argv[2]);
    if (!strcmp(m, "grow")) return grow();
    if (!strcmp(m, "threads")) return threads();
    if (!strcmp(m, "parked")) return parked();
    if (!strcmp(m, "fork")) return forked();
    if (!strcmp(m, "hold")) return hold(atol(argv[2]), atol(argv[3]));
    if (!strcmp(m, "uring")) return uring();
    if (!strcmp(m, "own_uffd")) return own_uffd();
    return 2;
}
