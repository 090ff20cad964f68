/* A target for rollback tests. It reads commands on stdin, one per line,
 * and answers each with one line on stdout. Every byte is read by a
 * `read` made with callee-saved registers (rbx, r12-r15) and two vector
 * registers (xmm8, xmm9) loaded with values derived from the number of
 * lines read so far, and checked after the call: a rollback that puts
 * memory back but not the registers (or the other way round) is counted
 * in `bad`, as is a thread-local value that does not follow.
 *
 * Commands:
 *   w K S   write K pages of the big buffer, chosen and filled from seed S
 *   m       map 16 fresh pages and fill them
 *   u       unmap the `keep` mapping (8 pages at start)
 *   g / s   grow it to 16 pages / shrink it to 4 pages (mremap)
 *   v       move it (mremap to another address)
 *   p       make it read-only
 *   d       drop 64 pages of the big buffer (MADV_DONTNEED: they read as
 *           zero, with no write)
 *   b       grow the break by 1 MiB and fill it
 *   t       start a thread that waits for `x`
 *   x       end the threads `t` started
 *   n       sleep 300 ms in one nanosleep, and say how long it took
 *           ("slept=MS"; a rollback that catches the sleep must make it
 *           sleep in full again, not return at once)
 *   o PATH  open PATH read-write ("fd=N")
 *   r       read 8 bytes of it ("read=BYTES pos=OFFSET")
 *   k       close it
 *   P       make a pipe ("pipe=A,B")
 *   K       close it
 *   V MS    vfork a child that sleeps MS milliseconds and exits: the main
 *           thread waits uninterruptibly meanwhile ("vforked=1")
 *   c       print the state
 *   q       exit
 * The first line, "ready", gives the addresses of big, keep and the main
 * thread's rseq area.
 * Every answer is "<cmd> sum=<checksum of big, keep and the break's
 * growth> bad=<mismatches> line=<lines read>".
 *
 * With "seccomp" as the argument, it installs a seccomp filter that allows
 * everything. With "seccomp ACTION" (errno, kill, trap or notif), the filter
 * answers ACTION to the calls pagewise makes inside a process and this
 * program does not make once it runs (userfaultfd, munmap, mprotect,
 * madvise, mremap, sigaltstack, close: so "u", "g", "s", "v", "p", "d",
 * "k" and "K" are not used then); notif keeps the listener and never
 * answers, so such a call would wait for ever. With "seccomp uffd" the
 * filter answers ERRNO to userfaultfd alone.
 *
 * With "threads N" as arguments, N workers each extend a hash chain in
 * their own buffer for as long as they run; "c" then also checks every
 * chain (a rollback that puts a worker's memory back but not its
 * registers breaks it) and prints "chains=ok" or "chains=broken".
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/prctl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define BIG_PAGES 4096
#define CHAIN 4096

static unsigned char *big;
static unsigned char *keep;
static size_t keep_pages = 8;
static unsigned char *grown;
static size_t grown_len;
static unsigned char *extra;
static long bad;
static uint64_t lines;
static __thread uint64_t tls_lines;

struct worker {
    volatile uint64_t n;
    uint64_t chain[CHAIN];
};
static struct worker *workers;
static int nworkers;
static volatile int pause_workers;
static volatile int paused;
static int waiters[2] = {-1, -1};
static int started;
static int file_fd = -1;
static int pipe_fds[2] = {-1, -1};

static void *wait_for_x(void *arg)
{
    char c;
    (void)arg;
    (void)!read(waiters[0], &c, 1);
    return NULL;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x + 1;
}

/* One byte from stdin, with registers checked across the call. */
static long checked_read(char *c, uint64_t seed)
{
    uint64_t out[7];
    long ret;
    __asm__ volatile(
        "mov %[seed], %%rbx\n\t"
        "lea 1(%%rbx), %%r12\n\t"
        "lea 2(%%rbx), %%r13\n\t"
        "lea 3(%%rbx), %%r14\n\t"
        "lea 4(%%rbx), %%r15\n\t"
        "movq %%r13, %%xmm8\n\t"
        "movq %%r14, %%xmm9\n\t"
        "xor %%eax, %%eax\n\t"
        "xor %%edi, %%edi\n\t"
        "mov %[buf], %%rsi\n\t"
        "mov $1, %%edx\n\t"
        "syscall\n\t"
        "mov %%rbx, 0(%[out])\n\t"
        "mov %%r12, 8(%[out])\n\t"
        "mov %%r13, 16(%[out])\n\t"
        "mov %%r14, 24(%[out])\n\t"
        "mov %%r15, 32(%[out])\n\t"
        "movq %%xmm8, %%rdx\n\t"
        "mov %%rdx, 40(%[out])\n\t"
        "movq %%xmm9, %%rdx\n\t"
        "mov %%rdx, 48(%[out])\n\t"
        : "=a"(ret)
        : [seed] "m"(seed), [buf] "m"(c), [out] "r"(out)
        : "rbx", "r12", "r13", "r14", "r15", "rcx", "r11", "rdx", "rdi", "rsi",
          "xmm8", "xmm9", "memory");
    uint64_t want[7] = {seed, seed + 1, seed + 2, seed + 3, seed + 4, seed + 2, seed + 3};
    if (memcmp(out, want, sizeof want) != 0)
        bad++;
    return ret;
}

static int read_line(char *buf, int n)
{
    int i = 0;
    for (;;) {
        uint64_t seed = mix(lines * 1000 + (uint64_t)i);
        char c;
        long r = checked_read(&c, seed);
        if (r <= 0)
            return -1;
        if (c == '\n' || i == n - 1)
            break;
        buf[i++] = c;
    }
    buf[i] = 0;
    lines++;
    if (tls_lines + 1 != lines)
        bad++;
    tls_lines = lines;
    return i;
}

static uint64_t sum(const unsigned char *p, size_t len, uint64_t h)
{
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        h = mix(h ^ v);
    }
    return h;
}

static void *work(void *arg)
{
    struct worker *w = arg;
    uint64_t n = w->n, last = w->chain[(n + CHAIN - 1) % CHAIN];
    for (;;) {
        if (pause_workers) {
            __atomic_add_fetch(&paused, 1, __ATOMIC_SEQ_CST);
            while (pause_workers)
                ;
            __atomic_sub_fetch(&paused, 1, __ATOMIC_SEQ_CST);
        }
        last = mix(last ^ n);
        w->chain[n % CHAIN] = last;
        n++;
        w->n = n;
    }
    return NULL;
}

/* Whether every worker's chain follows from its predecessor. */
static int chains_ok(void)
{
    pause_workers = 1;
    while (paused != nworkers)
        ;
    int ok = 1;
    for (int t = 0; t < nworkers; t++) {
        struct worker *w = &workers[t];
        uint64_t n = w->n;
        uint64_t from = n > CHAIN ? n - CHAIN + 1 : 1;
        for (uint64_t k = from; k < n; k++)
            if (w->chain[k % CHAIN] != mix(w->chain[(k - 1) % CHAIN] ^ k))
                ok = 0;
    }
    pause_workers = 0;
    return ok;
}

int main(int argc, char **argv)
{
    big = mmap(NULL, (size_t)BIG_PAGES * PAGE, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    keep = mmap(NULL, keep_pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                -1, 0);
    if (big == MAP_FAILED || keep == MAP_FAILED)
        return 2;
    for (size_t i = 0; i < (size_t)BIG_PAGES * PAGE; i += 64)
        big[i] = (unsigned char)(i >> 12);
    memset(keep, 0x5a, keep_pages * PAGE);
    if (pipe(waiters) != 0)
        return 2;
    if (argc == 2 && strcmp(argv[1], "seccomp") == 0) {
        struct sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
        struct sock_fprog prog = {.len = 1, .filter = allow};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
            return 2;
    }
    if (argc == 3 && strcmp(argv[1], "seccomp") == 0 && strcmp(argv[2], "uffd") == 0) {
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 323 /* userfaultfd */, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
            return 2;
    } else if (argc == 3 && strcmp(argv[1], "seccomp") == 0) {
        unsigned ret;
        unsigned flags = 0;
        if (strcmp(argv[2], "errno") == 0)
            ret = SECCOMP_RET_ERRNO | 1;
        else if (strcmp(argv[2], "kill") == 0)
            ret = SECCOMP_RET_KILL_PROCESS;
        else if (strcmp(argv[2], "trap") == 0)
            ret = SECCOMP_RET_TRAP;
        else if (strcmp(argv[2], "notif") == 0) {
            ret = SECCOMP_RET_USER_NOTIF;
            flags = SECCOMP_FILTER_FLAG_NEW_LISTENER;
        } else
            return 2;
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xc000003e, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 323 /* userfaultfd */, 7, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 11 /* munmap */, 6, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 10 /* mprotect */, 5, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 28 /* madvise */, 4, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 25 /* mremap */, 3, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 131 /* sigaltstack */, 2, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 3 /* close */, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_RET | BPF_K, ret),
        };
        struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
            syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog) < 0)
            return 2;
    }
    if (argc == 3 && strcmp(argv[1], "threads") == 0) {
        nworkers = atoi(argv[2]);
        workers = calloc((size_t)nworkers, sizeof *workers);
        for (int t = 0; t < nworkers; t++) {
            workers[t].n = 1;
            workers[t].chain[0] = (uint64_t)t + 7;
            pthread_t th;
            if (pthread_create(&th, NULL, work, &workers[t]) != 0)
                return 2;
        }
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    /* The kernel writes the running CPU into the thread's rseq area
     * whenever it runs: that area is the kernel's, not the program's. */
    void *rseq = __rseq_size ? (char *)__builtin_thread_pointer() + __rseq_offset : NULL;
    printf("ready big=%p keep=%p rseq=%p\n", (void *)big, (void *)keep, rseq);
    char cmd[128];
    while (read_line(cmd, sizeof cmd) >= 0) {
        unsigned long k = 0, s = 0;
        switch (cmd[0]) {
        case 'w':
            if (sscanf(cmd + 1, "%lu %lu", &k, &s) != 2)
                return 3;
            for (unsigned long i = 0; i < k; i++) {
                s = mix(s);
                unsigned char *p = big + (s % BIG_PAGES) * PAGE;
                memset(p, (int)(s >> 8), PAGE);
            }
            break;
        case 'm':
            extra = mmap(NULL, 16 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
            memset(extra, 0x11, 16 * PAGE);
            break;
        case 'u':
            munmap(keep, keep_pages * PAGE);
            keep = NULL;
            break;
        case 'g':
        case 's':
            keep_pages = cmd[0] == 'g' ? 16 : 4;
            keep = mremap(keep, 8 * PAGE, keep_pages * PAGE, MREMAP_MAYMOVE);
            if (keep == MAP_FAILED)
                return 4;
            memset(keep, 0x77, keep_pages * PAGE);
            break;
        case 'v': {
            unsigned char *to = mmap(NULL, keep_pages * PAGE, PROT_NONE,
                                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            keep = mremap(keep, keep_pages * PAGE, keep_pages * PAGE,
                          MREMAP_MAYMOVE | MREMAP_FIXED, to);
            if (keep == MAP_FAILED)
                return 4;
            keep[0] = 0x33;
            break;
        }
        case 'p':
            mprotect(keep, keep_pages * PAGE, PROT_READ);
            break;
        case 'd':
            madvise(big + 100 * PAGE, 64 * PAGE, MADV_DONTNEED);
            break;
        case 'b':
            grown = sbrk(1 << 20);
            grown_len = 1 << 20;
            memset(grown, 0x42, grown_len);
            break;
        case 't': {
            pthread_t th;
            if (pthread_create(&th, NULL, wait_for_x, NULL) != 0)
                return 6;
            pthread_detach(th);
            started++;
            break;
        }
        case 'x':
            for (; started > 0; started--)
                (void)!write(waiters[1], "x", 1);
            usleep(20000);
            break;
        case 'n': {
            struct timespec t0, t1, d = {0, 300 * 1000 * 1000};
            clock_gettime(CLOCK_MONOTONIC, &t0);
            if (nanosleep(&d, NULL) != 0)
                return 7;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            printf("slept=%ld ", (long)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000));
            break;
        }
        case 'o':
            file_fd = open(cmd + 2, O_RDWR);
            printf("fd=%d ", file_fd);
            break;
        case 'r': {
            char b[9] = {0};
            ssize_t n = read(file_fd, b, 8);
            printf("read=%s pos=%ld ", n == 8 ? b : "short", (long)lseek(file_fd, 0, SEEK_CUR));
            break;
        }
        case 'k':
            close(file_fd);
            break;
        case 'P':
            if (pipe(pipe_fds) != 0)
                return 8;
            printf("pipe=%d,%d ", pipe_fds[0], pipe_fds[1]);
            break;
        case 'K':
            close(pipe_fds[0]);
            close(pipe_fds[1]);
            break;
        case 'V': {
            long ms = atol(cmd + 2);
            pid_t c = vfork();
            if (c == 0) {
                struct timespec d = {ms / 1000, (ms % 1000) * 1000000L};
                nanosleep(&d, NULL);
                _exit(0);
            }
            printf("vforked=%d ", c > 0 && waitpid(c, NULL, 0) == c);
            break;
        }
        case 'c':
            break;
        case 'q':
            return 0;
        default:
            return 5;
        }
        uint64_t h = sum(big, (size_t)BIG_PAGES * PAGE, 1);
        if (keep)
            h = sum(keep, keep_pages * PAGE, h);
        if (grown)
            h = sum(grown, grown_len, h);
        printf("%c sum=%016llx bad=%ld line=%llu", cmd[0], (unsigned long long)h, bad,
               (unsigned long long)lines);
        if (nworkers && cmd[0] == 'c')
            printf(" chains=%s", chains_ok() ? "ok" : "broken");
        printf("\n");
    }
    return 0;
}
