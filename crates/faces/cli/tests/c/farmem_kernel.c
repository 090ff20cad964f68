/* Memory handed to the kernel, in every way the far-memory engine must
 * serve: each case puts its buffers, structures and strings in heap
 * memory that a sweep over 1 MiB has just pushed out of a small budget,
 * then lets the kernel read or write them, and prints what came back.
 * The output must be the same natively and under `pagewise farmem run`
 * (both fault paths). Usage: farmem_kernel DIR [self-vm] (a scratch
 * directory; self-vm adds process_vm_readv/writev on itself). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096
#define SWEEP (1 << 20)

static char *sweep_area;
static uint64_t sweep_sum;

/* Touches 1 MiB of heap: everything else of the heap leaves a small budget. */
static void sweep(void) {
    for (long i = 0; i < SWEEP; i += PAGE) {
        sweep_area[i] += 1;
        sweep_sum += (unsigned char)sweep_area[i];
    }
}

static uint64_t sum(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* A buffer of n bytes across page boundaries, filled with a pattern. */
static char *buffer(size_t n, int seed) {
    char *p = malloc(n + 3 * PAGE);
    p += PAGE - 100; /* misaligned: the buffer straddles pages */
    for (size_t i = 0; i < n; i++) p[i] = (char)(i * 31 + seed);
    return p;
}

static int failures;
#define CHECK(c, what) do { if (!(c)) { printf("FAIL %s: %s\n", what, strerror(errno)); failures++; } } while (0)

static void files(const char *dir) {
    char *path = malloc(4096);
    snprintf(path, 4096, "%s/data", dir);
    size_t n = 5 * PAGE + 123;
    char *out = buffer(n, 1);
    sweep();
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600); /* path in the heap */
    CHECK(fd >= 0, "open");
    CHECK(write(fd, out, n) == (ssize_t)n, "write");
    char *in = buffer(n, 2);
    sweep();
    CHECK(pread(fd, in, n, 0) == (ssize_t)n, "pread");
    printf("read/write/pread %zu bytes: %s\n", n, memcmp(in, out, n) ? "DIFFER" : "same");
    /* readv / writev with the iovec array itself in the heap */
    struct iovec *iov = malloc(3 * sizeof *iov);
    char *a = buffer(3000, 3), *b = buffer(9000, 4), *c = buffer(100, 5);
    iov[0] = (struct iovec){ a, 3000 }; iov[1] = (struct iovec){ b, 9000 }; iov[2] = (struct iovec){ c, 100 };
    sweep();
    CHECK(pwritev(fd, iov, 3, 0) == 12100, "pwritev");
    uint64_t before = sum(a, 3000) ^ sum(b, 9000) ^ sum(c, 100);
    memset(a, 0, 3000); memset(b, 0, 9000); memset(c, 0, 100);
    sweep();
    CHECK(preadv(fd, iov, 3, 0) == 12100, "preadv");
    printf("readv/writev 3 buffers: %s\n", (sum(a, 3000) ^ sum(b, 9000) ^ sum(c, 100)) == before ? "same" : "DIFFER");
    /* fstat and stat into a heap struct */
    struct stat *st = malloc(sizeof *st);
    sweep();
    CHECK(fstat(fd, st) == 0, "fstat");
    long size1 = st->st_size;
    sweep();
    CHECK(stat(path, st) == 0, "stat");
    printf("stat sizes %ld %ld\n", size1, (long)st->st_size);
    close(fd);
    /* getdents64 into a heap buffer, a directory of known names */
    for (int i = 0; i < 20; i++) {
        snprintf(path, 4096, "%s/entry-%02d", dir, i);
        close(open(path, O_CREAT | O_WRONLY, 0600));
    }
    char *dents = malloc(3 * PAGE);
    sweep();
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    long got, names = 0;
    while ((got = syscall(SYS_getdents64, dfd, dents, 3 * PAGE)) > 0) {
        for (long off = 0; off < got;) {
            unsigned short reclen = *(unsigned short *)(dents + off + 16);
            if (!strncmp(dents + off + 19, "entry-", 6)) names++;
            off += reclen;
        }
        sweep();
    }
    CHECK(got == 0, "getdents64");
    printf("getdents64: %ld entries named entry-*\n", names);
    close(dfd);
    /* getcwd and getrandom into heap buffers straddling pages (their
     * buffer is the first argument, not the second as for read) */
    char *here = buffer(2 * PAGE, 9), *cwd = getcwd(NULL, 0);
    sweep();
    CHECK(syscall(SYS_getcwd, here, 2 * PAGE) > 0, "getcwd");
    printf("getcwd into the heap: %s\n", cwd && !strcmp(here, cwd) ? "same" : "DIFFER");
    free(cwd);
    char *rnd = buffer(3 * PAGE, 10);
    sweep();
    long r = syscall(SYS_getrandom, rnd, 3 * PAGE, 0);
    CHECK(r == 3 * PAGE, "getrandom");
    printf("getrandom into the heap: %ld bytes\n", r);
}

/* Reads into the part of a buffer realloc has just grown (mremap): that
 * part is registered with the engine before the engine has adopted it,
 * and nothing touches it before the kernel writes it. From a memfd
 * (shared memory: the kernel's copy into a missing page fails the read
 * there, where a disk file's read comes back short). */
static void grown(void) {
    int fd = memfd_create("grown", 0);
    CHECK(fd >= 0, "memfd_create");
    size_t big = 1 << 20;
    char *pat = buffer(big, 11);
    CHECK(write(fd, pat, big) == (ssize_t)big, "write to the memfd");
    uint64_t want = sum(pat, big), got_sum = 0;
    int bad = 0;
    for (int i = 0; i < 100; i++) {
        size_t small = (256 << 10) + (size_t)i * PAGE;
        char *p = malloc(small);
        memset(p, i, small);
        p = realloc(p, small + big);
        ssize_t got = pread(fd, p + small, big, 0);
        if (got != (ssize_t)big || sum(p + small, big) != want) bad++;
        got_sum += (unsigned char)p[small - 1];
        free(p);
    }
    close(fd);
    printf("reads into memory realloc just grew: %d of 100 short, failed or wrong (%llu)\n", bad,
           (unsigned long long)got_sum);
}

static void sockets(void) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    size_t n = 3 * PAGE + 77;
    char *out = buffer(n, 6), *in = buffer(n, 7);
    sweep();
    CHECK(send(sv[0], out, n, 0) == (ssize_t)n, "send");
    sweep();
    size_t have = 0;
    while (have < n) {
        ssize_t r = recv(sv[1], in + have, n - have, 0);
        CHECK(r > 0, "recv");
        if (r <= 0) break;
        have += r;
    }
    printf("send/recv %zu bytes: %s\n", n, memcmp(in, out, n) ? "DIFFER" : "same");
    /* sendmsg / recvmsg: msghdr and iovec in the heap */
    struct msghdr *m = calloc(1, sizeof *m);
    struct iovec *iov = malloc(2 * sizeof *iov);
    char *a = buffer(5000, 8), *b = buffer(700, 9);
    iov[0] = (struct iovec){ a, 5000 }; iov[1] = (struct iovec){ b, 700 };
    m->msg_iov = iov; m->msg_iovlen = 2;
    uint64_t before = sum(a, 5000) ^ sum(b, 700);
    sweep();
    CHECK(sendmsg(sv[0], m, 0) == 5700, "sendmsg");
    memset(a, 0, 5000); memset(b, 0, 700);
    sweep();
    have = 0;
    while (have < 5700) {
        ssize_t r = recvmsg(sv[1], m, MSG_WAITALL);
        CHECK(r > 0, "recvmsg");
        if (r <= 0) break;
        have += r;
    }
    printf("sendmsg/recvmsg 2 buffers: %s\n", (sum(a, 5000) ^ sum(b, 700)) == before ? "same" : "DIFFER");
    /* poll and epoll_wait with their arrays in the heap */
    struct pollfd *pfd = malloc(2 * sizeof *pfd);
    pfd[0] = (struct pollfd){ sv[0], POLLOUT, 0 };
    pfd[1] = (struct pollfd){ sv[1], POLLIN, 0 };
    CHECK(write(sv[0], "x", 1) == 1, "write x");
    sweep();
    int ready = poll(pfd, 2, 1000);
    printf("poll: %d ready, revents %d %d\n", ready, pfd[0].revents & POLLOUT, pfd[1].revents & POLLIN);
    int ep = epoll_create1(0);
    struct epoll_event *ev = malloc(4 * sizeof *ev);
    ev[0] = (struct epoll_event){ .events = EPOLLIN, .data.u64 = 4242 };
    sweep();
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, sv[1], ev) == 0, "epoll_ctl");
    memset(ev, 0, 4 * sizeof *ev);
    sweep();
    int k = epoll_wait(ep, ev, 4, 1000);
    printf("epoll_wait: %d ready, data %llu\n", k, k > 0 ? (unsigned long long)ev[0].data.u64 : 0ULL);
    close(ep); close(sv[0]); close(sv[1]);
}

/* Mutex and condition variable in the heap: two threads take turns. */
struct turn { pthread_mutex_t mu; pthread_cond_t cv; int whose; long count; };

static void *other(void *a) {
    struct turn *t = a;
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&t->mu);
        while (t->whose != 1) pthread_cond_wait(&t->cv, &t->mu);
        t->count++;
        t->whose = 0;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        if (i % 8 == 0) sweep();
    }
    return NULL;
}

static void futexes(void) {
    struct turn *t = malloc(sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->whose = 0; t->count = 0;
    pthread_t th;
    pthread_create(&th, NULL, other, t);
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&t->mu);
        while (t->whose != 0) pthread_cond_wait(&t->cv, &t->mu);
        t->count++;
        t->whose = 1;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        if (i % 8 == 4) sweep();
    }
    pthread_join(th, NULL);
    printf("mutex and condition variable in the heap: %ld turns\n", t->count);
}

/* Memory the program makes read-only, inaccessible, or locked after
 * writing it (a move of a page goes only between mappings alike: the
 * engine copies into such a mapping and leaves its pages local). */
static void protections(void) {
    size_t n = 256 * PAGE;
    unsigned char *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(a != MAP_FAILED, "mmap");
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 7 + i / PAGE);
    uint64_t want = sum(a, n);
    sweep();
    CHECK(mprotect(a, n / 2, PROT_READ) == 0, "mprotect read-only");
    CHECK(mprotect(a + n / 2, n / 2, PROT_NONE) == 0, "mprotect none");
    uint64_t ro = sum(a, n / 2);
    sweep();
    CHECK(mprotect(a + n / 2, n / 2, PROT_READ | PROT_WRITE) == 0, "mprotect back");
    uint64_t all = sum(a, n);
    sweep();
    int locked = mlock(a + n / 2, n / 4) == 0;
    for (size_t i = n / 2; i < n; i += PAGE) a[i] ^= 0x5a;
    sweep();
    for (size_t i = n / 2; i < n; i += PAGE) a[i] ^= 0x5a;
    if (locked) munlock(a + n / 2, n / 4);
    sweep();
    printf("read-only, inaccessible and locked memory: %s, %s, %s\n", ro == sum(a, n / 2) ? "same" : "DIFFER",
           all == want ? "same" : "DIFFER", sum(a, n) == want ? "same" : "DIFFER");
    munmap(a, n);
}

/* The program's own signals. */
static volatile sig_atomic_t bus_seen, usr_seen;
static char *alt_base;
static volatile long alt_used;

static sigjmp_buf past_end;
static volatile sig_atomic_t fault_seen;

static void on_bus(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    if (sig == SIGBUS && si->si_code == BUS_ADRERR) {
        fault_seen = 1;
        siglongjmp(past_end, 1);
    }
    bus_seen = sig == SIGBUS && si->si_code == SI_TKILL;
}

static void on_usr(int sig) {
    char here;
    alt_used = (&here > alt_base && &here < alt_base + 64 * 1024);
    usr_seen = sig;
    sweep_area[12345] ^= 1; /* the handler touches the heap */
}

static void signals(void) {
    struct sigaction *sa = calloc(1, sizeof *sa);
    sa->sa_sigaction = on_bus;
    sa->sa_flags = SA_SIGINFO;
    sigfillset(&sa->sa_mask); /* blocks everything while it runs */
    CHECK(sigaction(SIGBUS, sa, NULL) == 0, "sigaction SIGBUS");
    sweep();
    raise(SIGBUS);
    printf("own SIGBUS handler: %s\n", bus_seen ? "called" : "NOT called");
    /* A real bus error: a file mapping read past the file's end. */
    char *tmpl = strdup("/tmp/farmem-kernel-XXXXXX");
    int fd = mkstemp(tmpl);
    CHECK(fd >= 0 && write(fd, "abc", 3) == 3, "mkstemp");
    char *m = mmap(NULL, 2 * PAGE, PROT_READ, MAP_SHARED, fd, 0);
    unlink(tmpl);
    volatile char got = 0;
    if (!sigsetjmp(past_end, 1)) got = m[PAGE + 1];
    printf("bus error past a file's end reached the program's handler: %s (%d)\n", fault_seen ? "yes" : "NO", got);
    munmap(m, 2 * PAGE);
    /* The same where emulated memory was: the file mapped over written
     * heap-like memory (MAP_FIXED), read past its end. */
    char *anon = mmap(NULL, 64 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(anon != MAP_FAILED, "mmap anonymous");
    memset(anon, 7, 64 * PAGE);
    sweep();
    m = mmap(anon, 2 * PAGE, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    CHECK(m == anon, "mmap MAP_FIXED over anonymous memory");
    fault_seen = 0;
    got = 0;
    if (!sigsetjmp(past_end, 1)) got = m[PAGE + 1];
    printf("bus error past a file's end mapped over emulated memory reached the program's handler: %s (%d, %d)\n",
           fault_seen ? "yes" : "NO", got, anon[10 * PAGE]);
    munmap(anon, 64 * PAGE);
    close(fd);
    /* Every signal blocked while the heap is swept. */
    sigset_t *all = malloc(sizeof *all), *old = malloc(sizeof *old);
    sigfillset(all);
    CHECK(sigprocmask(SIG_BLOCK, all, old) == 0, "sigprocmask");
    sweep();
    CHECK(sigprocmask(SIG_SETMASK, old, NULL) == 0, "sigprocmask restore");
    printf("sweep with every signal blocked: done\n");
    /* An alternate signal stack in the heap. */
    alt_base = malloc(64 * 1024);
    stack_t *ss = malloc(sizeof *ss);
    ss->ss_sp = alt_base; ss->ss_size = 64 * 1024; ss->ss_flags = 0;
    CHECK(sigaltstack(ss, NULL) == 0, "sigaltstack");
    memset(sa, 0, sizeof *sa);
    sa->sa_handler = on_usr;
    sa->sa_flags = SA_ONSTACK;
    sigfillset(&sa->sa_mask);
    CHECK(sigaction(SIGUSR1, sa, NULL) == 0, "sigaction SIGUSR1");
    for (int i = 0; i < 5; i++) {
        sweep();
        raise(SIGUSR1);
    }
    printf("handler on a heap sigaltstack: %s, on it: %s\n", usr_seen ? "called" : "NOT called", alt_used ? "yes" : "no");
}

/* posix_spawn with argv and envp in the heap. */
static void spawn(void) {
    char **argv = malloc(4 * sizeof *argv);
    argv[0] = strdup("/bin/echo");
    argv[1] = strdup("spawned");
    argv[2] = strdup("from-the-heap");
    argv[3] = NULL;
    char **envp = malloc(2 * sizeof *envp);
    envp[0] = strdup("A=1");
    envp[1] = NULL;
    sweep();
    fflush(stdout);
    pid_t pid;
    CHECK(posix_spawn(&pid, argv[0], NULL, NULL, argv, envp) == 0, "posix_spawn");
    int status = 0;
    waitpid(pid, &status, 0);
    printf("spawned child exited %d\n", WEXITSTATUS(status));
}

/* process_vm_readv and _writev on itself, with local and "remote"
 * buffers (both this process's) larger than a small budget. Run with a
 * second argument "self-vm": on the handler-thread path the kernel's pins
 * of the remote pages keep the engine from making room, and the call
 * waits for ever (a known gap of that path). */
static void self_vm(void) {
    size_t n = 1 << 20;
    char *src = buffer(n, 5), *dst = buffer(n, 6);
    memset(dst, 0, n);
    sweep();
    struct iovec l = {dst, n}, r = {src, n};
    ssize_t got = process_vm_readv(getpid(), &l, 1, &r, 1, 0);
    CHECK(got == (ssize_t)n, "process_vm_readv on itself");
    printf("process_vm_readv on itself: %zd bytes, sum %llx\n", got, (unsigned long long)sum(dst, n));
    memset(src, 0, n);
    sweep();
    got = process_vm_writev(getpid(), &l, 1, &r, 1, 0);
    CHECK(got == (ssize_t)n, "process_vm_writev on itself");
    printf("process_vm_writev on itself: %zd bytes, sum %llx\n", got, (unsigned long long)sum(src, n));
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    sweep_area = malloc(SWEEP);
    memset(sweep_area, 1, SWEEP);
    files(argv[1]);
    grown();
    protections();
    sockets();
    futexes();
    signals();
    spawn();
    if (argc > 2 && strcmp(argv[2], "self-vm") == 0) self_vm();
    printf("failures %d\n", failures);
    return failures != 0;
}
