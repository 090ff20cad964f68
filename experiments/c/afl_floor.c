/*
 * The kernel's costs that bound a reset made inside the program, on this
 * machine, measured beside the AFL++ benchmark: for a state of MIB MiB
 * (argument 1) of which K pages (argument 2) are written per input,
 *
 *   walk_us     one PAGEMAP_SCAN of the state for its written pages
 *               (uffd-wp, asynchronous mode), median of ROUNDS;
 *   protect_us  write-protecting K written pages again, one ioctl each;
 *   fault_us    the program's K writes to protected pages (each a fault
 *               the kernel resolves);
 *   copy_us     copying K pages back from a copy of the state;
 *   trap_us     one system call turned into SIGSYS by a seccomp filter
 *               and made by the handler (a run makes two: its exit and
 *               the read that finds the input's end).
 *
 * Prints one JSON object. The state is written before the walk, so every
 * page table of it is filled, as in the benchmark's target.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define ROUNDS 401
#define PAGE 4096ul

struct page_region {
    uint64_t start, end, categories;
};
struct pm_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted,
        category_mask, category_anyof_mask, return_mask;
};
#define PAGEMAP_SCAN_IOCTL 0xC0606610ul
#define PAGE_IS_WRITTEN 2ul
#define FEATURE_WP_ASYNC (1ul << 15)
#define FEATURE_WP_UNPOPULATED (1ul << 13)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp);
    return v[n / 2];
}

static void on_sigsys(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)info;
    ((ucontext_t *)ctx)->uc_mcontext.gregs[REG_RAX] = 0;
}

/* A SIGSYS round trip, in a child (a filter cannot be taken off). */
static double trap_ns(void)
{
    int p[2];
    if (pipe(p))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction sa = {0};
        sa.sa_sigaction = on_sigsys;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigaction(SIGSYS, &sa, 0);
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getppid, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = {4, f};
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
            _exit(1);
        double v[ROUNDS];
        for (int r = 0; r < ROUNDS; r++) {
            double t = now();
            for (int i = 0; i < 100; i++)
                syscall(SYS_getppid);
            v[r] = (now() - t) / 100;
        }
        double m = median(v, ROUNDS);
        if (write(p[1], &m, sizeof m) != sizeof m)
            _exit(2);
        _exit(0);
    }
    close(p[1]);
    double m = -1;
    if (read(p[0], &m, sizeof m) != sizeof m)
        m = -1;
    waitpid(pid, 0, 0);
    close(p[0]);
    return m;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    unsigned k = argc > 2 ? (unsigned)strtoul(argv[2], 0, 10) : 16;
    size_t len = mib << 20, pages = len / PAGE;
    char *s = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *copy = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED || copy == MAP_FAILED)
        return 1;
    memset(s, 7, len);
    memcpy(copy, s, len);
    int u = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api = {.api = UFFD_API, .features = FEATURE_WP_ASYNC | FEATURE_WP_UNPOPULATED};
    struct uffdio_register reg = {.range = {(uint64_t)s, len}, .mode = UFFDIO_REGISTER_MODE_WP};
    struct uffdio_writeprotect wp = {.range = {(uint64_t)s, len}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    if (u < 0 || ioctl(u, UFFDIO_API, &api) || ioctl(u, UFFDIO_REGISTER, &reg) ||
        ioctl(u, UFFDIO_WRITEPROTECT, &wp)) {
        perror("userfaultfd");
        return 2;
    }
    int pm = open("/proc/self/pagemap", O_RDONLY);
    struct page_region v[512];
    static double walk[ROUNDS], protect[ROUNDS], fault[ROUNDS], cp[ROUNDS];
    uint64_t x = 88172645463325252ull;
    for (int r = 0; r < ROUNDS; r++) {
        size_t at[64];
        double t = now();
        for (unsigned i = 0; i < k && i < 64; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            at[i] = (x % pages) * PAGE;
            s[at[i]]++;
        }
        fault[r] = (now() - t) / 1e3;
        struct pm_scan_arg a = {.size = sizeof a, .start = (uint64_t)s, .end = (uint64_t)s + len,
                                .vec = (uint64_t)v, .vec_len = 512,
                                .category_mask = PAGE_IS_WRITTEN, .return_mask = PAGE_IS_WRITTEN};
        t = now();
        int n = ioctl(pm, PAGEMAP_SCAN_IOCTL, &a);
        walk[r] = (now() - t) / 1e3;
        if (n < 0) {
            perror("PAGEMAP_SCAN");
            return 3;
        }
        t = now();
        for (int j = 0; j < n; j++)
            memcpy((void *)v[j].start, copy + (v[j].start - (uint64_t)s), v[j].end - v[j].start);
        cp[r] = (now() - t) / 1e3;
        t = now();
        for (int j = 0; j < n; j++) {
            struct uffdio_writeprotect w = {.range = {v[j].start, v[j].end - v[j].start},
                                            .mode = UFFDIO_WRITEPROTECT_MODE_WP};
            ioctl(u, UFFDIO_WRITEPROTECT, &w);
        }
        protect[r] = (now() - t) / 1e3;
    }
    printf("{\"mib\": %zu, \"k\": %u, \"walk_us\": %.2f, \"protect_us\": %.2f, \"fault_us\": %.2f, "
           "\"copy_us\": %.2f, \"trap_us\": %.2f}\n",
           mib, k, median(walk, ROUNDS), median(protect, ROUNDS), median(fault, ROUNDS),
           median(cp, ROUNDS), trap_ns() / 1e3);
    return 0;
}
