/* A process that sits in vfork: prints its pid, then its child sleeps
 * for SECONDS (default 30) before it exits, the parent waiting all along
 * (uninterruptibly, as vfork does). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    unsigned s = argc > 1 ? (unsigned)atoi(argv[1]) : 30;
    printf("%d\n", (int)getpid());
    fflush(stdout);
    if (vfork() == 0) {
        sleep(s);
        _exit(0);
    }
    return 0;
}
