/* Runs argv[1..] under a seccomp filter that allows every call: a tracer
 * under a filter of its own may neither suspend nor read another
 * process's filters. */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    struct sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    struct sock_fprog prog = {.len = 1, .filter = allow};
    if (argc < 2 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("under_filter");
        return 2;
    }
    execvp(argv[1], argv + 1);
    perror("under_filter: exec");
    return 2;
}
