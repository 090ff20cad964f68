/* A child that does what git's run-command does between fork and exec:
 * every signal blocked across the fork, every handler reset to the
 * default, memory allocated and mapped meanwhile, then exec. Under
 * `pagewise farmem run` its trapped calls must still be served (the
 * shim's SIGSYS handler kept, SIGSYS never blocked): the output must be
 * that of a native run. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    char *p = malloc(1 << 20);
    memset(p, 1, 1 << 20);
    for (int round = 0; round < 3; round++) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pid_t c = fork();
        if (c == 0) {
            for (int s = 1; s < NSIG; s++)
                if (s != SIGKILL && s != SIGSTOP)
                    signal(s, SIG_DFL);
            char *q = malloc(4 << 20);
            memset(q, 2, 4 << 20);
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            char *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED)
                _exit(3);
            m[4096] = 1;
            munmap(m, 1 << 20);
            execl("/bin/echo", "echo", "child", "exec'd", (char *)NULL);
            _exit(127);
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        int st = 0;
        waitpid(c, &st, 0);
        printf("round %d: child exited %d, killed by signal %d\n", round,
               WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
    long sum = 0;
    for (int i = 0; i < 1 << 20; i += 4096)
        sum += p[i];
    printf("parent memory intact: %ld\n", sum);
    return 0;
}
