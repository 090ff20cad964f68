/* A target with a userfaultfd of its own: a region of 64 pages it
 * registered itself (missing mode, pages populated first, so its writes
 * never fault) beside a plain region of 64 pages. Prints
 * "ready OWN PLAIN" (the regions' addresses); on each line N from stdin
 * it writes a byte in each of the first N pages of both, then prints
 * "ok". Exits on end of input. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGES 64

int main(void) {
    long page = sysconf(_SC_PAGESIZE);
    char *own = mmap(NULL, PAGES * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *plain = mmap(NULL, PAGES * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (own == MAP_FAILED || plain == MAP_FAILED)
        return 1;
    memset(own, 1, PAGES * page);
    memset(plain, 1, PAGES * page);
    int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | 1 /* UFFD_USER_MODE_ONLY */);
    if (uffd < 0) {
        perror("userfaultfd");
        return 2;
    }
    struct uffdio_api api = {.api = UFFD_API};
    if (ioctl(uffd, UFFDIO_API, &api)) {
        perror("UFFDIO_API");
        return 2;
    }
    struct uffdio_register reg = {
        .range = {.start = (unsigned long)own, .len = PAGES * page},
        .mode = UFFDIO_REGISTER_MODE_MISSING,
    };
    if (ioctl(uffd, UFFDIO_REGISTER, &reg)) {
        perror("UFFDIO_REGISTER");
        return 2;
    }
    printf("ready %p %p\n", (void *)own, (void *)plain);
    fflush(stdout);
    char line[32];
    while (fgets(line, sizeof line, stdin)) {
        int n = atoi(line);
        for (int i = 0; i < n && i < PAGES; i++) {
            own[i * page]++;
            plain[i * page]++;
        }
        printf("ok\n");
        fflush(stdout);
    }
    return 0;
}
