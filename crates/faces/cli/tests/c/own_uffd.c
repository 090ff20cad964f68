/* A program that serves the faults of part of its own memory with a
 * userfaultfd of its own (as a garbage collector or a VM monitor does):
 * 64 pages, the last 32 registered in MISSING mode; its handler thread
 * expects write faults only and fails the program on any other event
 * ("FAIL: ..."). Says "ready"; for each line read, writes one more page
 * of the registered half and says "ok N". Usage: own_uffd */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define P 4096ul
static int uffd;

static void *serve(void *arg) {
    (void)arg;
    static char page[4096] __attribute__((aligned(4096)));
    for (;;) {
        struct pollfd p = {.fd = uffd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0) continue;
        struct uffd_msg m;
        if (read(uffd, &m, sizeof m) != sizeof m) continue;
        if (m.event != UFFD_EVENT_PAGEFAULT || !(m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE)) {
            printf("FAIL: msg event %d flags %llx: not a write page fault event\n", m.event,
                   (unsigned long long)m.arg.pagefault.flags);
            fflush(stdout);
            exit(3);
        }
        memset(page, 0x5a, P);
        struct uffdio_copy c = {.dst = m.arg.pagefault.address & ~(P - 1), .src = (unsigned long)page, .len = P};
        ioctl(uffd, UFFDIO_COPY, &c);
    }
    return NULL;
}

int main(void) {
    unsigned char *b = mmap(NULL, 64 * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return 2;
    memset(b, 1, 32 * P);
    uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (uffd < 0) { perror("userfaultfd"); return 2; }
    struct uffdio_api api = {.api = UFFD_API};
    struct uffdio_register r = {.range = {.start = (unsigned long)b + 32 * P, .len = 32 * P}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(uffd, UFFDIO_API, &api) || ioctl(uffd, UFFDIO_REGISTER, &r)) { perror("uffd"); return 2; }
    pthread_t t;
    pthread_create(&t, NULL, serve, NULL);
    /* A few pages of the served half made resident by writes. */
    for (int i = 0; i < 4; i++) b[(32 + i) * P] = 7;
    printf("ready\n");
    fflush(stdout);
    char line[64];
    int n = 4;
    while (fgets(line, sizeof line, stdin) && n < 32) {
        b[(32 + n) * P] = 9;
        n++;
        printf("ok %d\n", n);
        fflush(stdout);
    }
    return 0;
}
