/* A parent and its forked child sharing MIB MiB of anonymous memory
 * copy-on-write: the parent fills it, forks, and both wait on stdin
 * without writing it.
 *
 * Usage: cow_share MIB
 * Prints "ready ADDR LEN CHILD" once the child runs; both exit at the end
 * of stdin.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    size_t len = (size_t)(argc > 1 ? atoi(argv[1]) : 256) << 20;
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 2;
    /* No huge pages: the sharing is counted page by page. */
    madvise(p, len, MADV_NOHUGEPAGE);
    for (size_t i = 0; i < len; i += 4096)
        memset(p + i, (int)(i / 4096 % 251) + 1, 4096);
    int ready[2];
    if (pipe(ready) != 0)
        return 3;
    pid_t child = fork();
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(ready[0]);
        (void)!write(ready[1], "x", 1);
        char c;
        while (read(0, &c, 1) > 0)
            ;
        _exit(0);
    }
    char c;
    (void)!read(ready[0], &c, 1);
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("ready %p %zu %d\n", (void *)p, len, (int)child);
    while (read(0, &c, 1) > 0)
        ;
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return 0;
}
