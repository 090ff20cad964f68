/* Runs argv[2..] under a seccomp filter that answers ERRNO(EPERM) to the
 * system calls numbered in argv[1] (comma-separated) and allows every
 * other: a sandbox that refuses what pagewise would make, e.g.
 * userfaultfd (323). */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    struct sock_filter f[64];
    unsigned n = 0;
    if (argc < 3) {
        fprintf(stderr, "usage: refuse_calls NR[,NR...] PROGRAM [ARGS...]\n");
        return 2;
    }
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    for (char *s = argv[1]; *s && n < 60;) {
        long nr = strtol(s, &s, 10);
        f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1);
        f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
        if (*s == ',')
            s++;
    }
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {.len = (unsigned short)n, .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("refuse_calls");
        return 2;
    }
    execvp(argv[2], argv + 2);
    perror("refuse_calls: exec");
    return 2;
}
