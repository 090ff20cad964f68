/* Mappings userfaultfd cannot register, beside ordinary memory: a
 * droppable mapping (MAP_DROPPABLE, Linux 6.11; glibc 2.41 keeps its
 * getrandom state in one) and a native AIO ring (io_setup: /[aio]).
 *
 * Usage: special_maps
 * Prints "ready DROP AIO HEAP" (the droppable mapping's address or 0 where
 * the kernel refuses one, whether the AIO ring was made, an ordinary
 * buffer's address); then for each line on stdin "w S" fills the buffer
 * from seed S and the droppable mapping with its own pattern, "c" prints
 * "sum=X drop=Y" (checksums of the buffer and the droppable mapping) and
 * "aio=ok" if the AIO context still answers (io_getevents).
 */
#define _GNU_SOURCE
#include <linux/aio_abi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MAP_DROPPABLE
#define MAP_DROPPABLE 0x08
#endif
#define PAGES 64

static uint64_t sum(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    unsigned char *drop = mmap(NULL, PAGES * 4096, PROT_READ | PROT_WRITE,
                               MAP_DROPPABLE | MAP_ANONYMOUS, -1, 0);
    if (drop == MAP_FAILED)
        drop = NULL;
    aio_context_t ctx = 0;
    int aio = syscall(SYS_io_setup, 8, &ctx) == 0;
    unsigned char *buf = mmap(NULL, PAGES * 4096, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(buf, 1, PAGES * 4096);
    if (drop)
        memset(drop, 2, PAGES * 4096);
    printf("ready %p %d %p\n", (void *)drop, aio, (void *)buf);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 'w') {
            unsigned s = (unsigned)atoi(line + 2);
            for (int i = 0; i < PAGES * 4096; i++)
                buf[i] = (unsigned char)(s + i / 4096);
            if (drop)
                memset(drop, (int)s, PAGES * 4096);
            printf("w\n");
        } else if (line[0] == 'c') {
            struct io_event ev;
            struct timespec z = {0, 0};
            int ok = aio && syscall(SYS_io_getevents, ctx, 0, 1, &ev, &z) == 0;
            printf("sum=%016llx drop=%016llx aio=%s\n", (unsigned long long)sum(buf, PAGES * 4096),
                   (unsigned long long)(drop ? sum(drop, PAGES * 4096) : 0), ok ? "ok" : "no");
        }
    }
    return 0;
}
