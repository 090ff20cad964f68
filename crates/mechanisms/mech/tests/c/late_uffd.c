/* A program that serves the faults of part of its memory with a
 * userfaultfd of its own and registers that memory late, as a garbage
 * collector or a VM monitor does. Two regions: PLAIN (64 pages, written
 * whole) and OWN (4 MiB on 2 MiB bounds, its first half written, its
 * second never touched). It makes its userfaultfd at start, or with
 * argument "later" only when told. Prints "ready PLAIN OWN"; then, for
 * each line from stdin:
 *   "make"     makes the userfaultfd (where "later"), says "made";
 *   "bare"     makes another without UFFDIO_API (as a pagewise killed
 *              while it made its own inside leaves one), says "bare";
 *   "register" registers OWN whole in missing mode and starts its handler,
 *              says "registered" (or "FAIL: register: ERRNO", exit 4: the
 *              memory was taken by another userfaultfd first);
 *   "evict"    drops the written half of OWN (MADV_DONTNEED), whose pages
 *              come back through its handler at the next writes, says
 *              "evicted";
 *   N          writes a byte in each of the first N pages of both regions,
 *              says "ok".
 * Its handler expects write faults only: any other event is a fault
 * someone else caused, "FAIL: event ..." and exit 3. Exits on end of
 * input. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define P 4096ul
#define PLAIN_PAGES 64
#define OWN_BYTES (4ul << 20)
#define HUGE (2ul << 20)

static int uffd = -1;

static void *serve(void *arg) {
    (void)arg;
    static char page[P] __attribute__((aligned(P)));
    for (;;) {
        struct pollfd p = {.fd = uffd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0) continue;
        struct uffd_msg m;
        if (read(uffd, &m, sizeof m) != sizeof m) continue;
        if (m.event != UFFD_EVENT_PAGEFAULT || !(m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE)) {
            printf("FAIL: event %d flags %llx at %llx: not a write fault of its own\n", m.event,
                   (unsigned long long)m.arg.pagefault.flags,
                   (unsigned long long)m.arg.pagefault.address);
            fflush(stdout);
            exit(3);
        }
        memset(page, 0x5a, P);
        struct uffdio_copy c = {.dst = m.arg.pagefault.address & ~(P - 1), .src = (unsigned long)page, .len = P};
        ioctl(uffd, UFFDIO_COPY, &c);
    }
    return NULL;
}

static int make(void) {
    uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | 1 /* UFFD_USER_MODE_ONLY */);
    if (uffd < 0) return -1;
    struct uffdio_api api = {.api = UFFD_API};
    return ioctl(uffd, UFFDIO_API, &api);
}

int main(int argc, char **argv) {
    int later = argc > 1 && strcmp(argv[1], "later") == 0;
    char *plain = mmap(NULL, PLAIN_PAGES * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *raw = mmap(NULL, OWN_BYTES + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (plain == MAP_FAILED || raw == MAP_FAILED) return 1;
    char *own = (char *)(((uintptr_t)raw + HUGE - 1) & ~(HUGE - 1));
    /* OWN a mapping of its own: the slack around it unmapped. */
    if (own > raw) munmap(raw, (size_t)(own - raw));
    size_t tail = (size_t)(raw + OWN_BYTES + HUGE - (own + OWN_BYTES));
    if (tail) munmap(own + OWN_BYTES, tail);
    memset(plain, 1, PLAIN_PAGES * P);
    memset(own, 1, OWN_BYTES / 2);
    if (!later && make()) { perror("userfaultfd"); return 2; }
    printf("ready %p %p\n", (void *)plain, (void *)own);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "make", 4) == 0) {
            if (uffd < 0 && make()) { perror("userfaultfd"); return 2; }
            printf("made\n");
        } else if (strncmp(line, "bare", 4) == 0) {
            if (syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | 1) < 0) { perror("userfaultfd"); return 2; }
            printf("bare\n");
        } else if (strncmp(line, "register", 8) == 0) {
            struct uffdio_register r = {.range = {.start = (unsigned long)own, .len = OWN_BYTES},
                                        .mode = UFFDIO_REGISTER_MODE_MISSING};
            if (ioctl(uffd, UFFDIO_REGISTER, &r)) {
                printf("FAIL: register: %d (%s)\n", errno, strerror(errno));
                fflush(stdout);
                return 4;
            }
            pthread_t t;
            pthread_create(&t, NULL, serve, NULL);
            printf("registered\n");
        } else if (strncmp(line, "evict", 5) == 0) {
            madvise(own, OWN_BYTES / 2, MADV_DONTNEED);
            printf("evicted\n");
        } else {
            int n = atoi(line);
            for (int i = 0; i < n && i < PLAIN_PAGES; i++) {
                plain[i * P]++;
                own[i * P]++;
            }
            printf("ok\n");
        }
        fflush(stdout);
    }
    return 0;
}
