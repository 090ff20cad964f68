/* Which thread takes a signal sent to the whole process.
 *
 * A single-threaded program that blocks SIGUSR1, sends it to its own
 * process (kill, not raise), waits, then unblocks it: the signal must stay
 * pending until it is unblocked and run its handler on the main thread,
 * since the program has no other thread. A preloaded library whose own
 * threads leave SIGUSR1 unblocked takes it there instead, while the
 * program believes it blocked (a shell in vfork drops a SIGTERM so).
 *
 * It also lists every thread with SIGTERM, SIGINT or SIGUSR1 unblocked
 * that is not the main thread.
 *
 * Prints "ok" and exits 0, or says what went wrong and exits 1.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <time.h>

static volatile sig_atomic_t taken_by;
static volatile sig_atomic_t count;

static void on_usr1(int sig) {
    (void)sig;
    taken_by = (sig_atomic_t)syscall(SYS_gettid);
    count++;
}

/* Threads other than the main one that take SIGTERM, SIGINT or SIGUSR1. */
static int foreign_takers(void) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int bad = 0;
    pid_t me = getpid();
    if (!d) {
        perror("opendir");
        return 1;
    }
    while ((e = readdir(d))) {
        char path[64], line[256], comm[64] = "?";
        pid_t tid = atoi(e->d_name);
        FILE *f;
        if (tid <= 0 || tid == me)
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%d/comm", tid);
        if ((f = fopen(path, "r"))) {
            if (fgets(comm, sizeof comm, f))
                comm[strcspn(comm, "\n")] = 0;
            fclose(f);
        }
        snprintf(path, sizeof path, "/proc/self/task/%d/status", tid);
        if (!(f = fopen(path, "r")))
            continue;
        while (fgets(line, sizeof line, f)) {
            unsigned long long blk;
            if (sscanf(line, "SigBlk: %llx", &blk) == 1) {
                unsigned long long want = (1ULL << (SIGTERM - 1)) | (1ULL << (SIGINT - 1)) |
                                          (1ULL << (SIGUSR1 - 1));
                if ((blk & want) != want) {
                    printf("thread %d (%s) takes the program's signals: SigBlk %llx\n", tid, comm,
                           blk);
                    bad = 1;
                }
            }
        }
        fclose(f);
    }
    closedir(d);
    return bad;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    struct sigaction sa;
    sigset_t usr1, old;
    pid_t me = getpid();
    int bad = foreign_takers();

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);

    for (int i = 0; i < rounds; i++) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        taken_by = 0;
        count = 0;
        sigprocmask(SIG_BLOCK, &usr1, &old);
        kill(me, SIGUSR1);
        nanosleep(&ts, NULL);
        if (count != 0) {
            printf("round %d: SIGUSR1, blocked by the program, was taken by thread %d\n", i,
                   (int)taken_by);
            bad = 1;
        }
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (count != 1 || taken_by != me) {
            printf("round %d: after unblocking, %d handler runs, on thread %d (main %d)\n", i,
                   (int)count, (int)taken_by, (int)me);
            bad = 1;
        }
        if (bad)
            break;
    }
    puts(bad ? "failed" : "ok");
    return bad;
}
