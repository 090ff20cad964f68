/* Four processes counting together: a counter shared by all of them (a
 * MAP_SHARED page) and one of each process's own (in its private memory),
 * raised in a fixed order by every process, without a system call:
 *
 *   shared->total += 1; mine += 1; shared->slot[i] = mine;
 *
 * (a fifth process, the first, waits for commands)
 *
 * so that, at any one instant, mine - slot[i] is 0 or 1 for every
 * process and total - (slot[0] + ... + slot[3]) is between 0 and 4. A
 * snapshot of the four taken at one instant holds the same shared page in
 * each process's snapshot, and those relations between them; one taken a
 * process at a time does not.
 *
 * Prints `ready shared=ADDR mine=ADDR` (`mine`: its page, the count then
 * the index) once the four run; then, for each
 * line `check` on stdin, stops the four, checks the relations and prints
 * `ok total=N` or `bad ...`. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define N 4

struct shared {
    volatile unsigned long total;
    volatile unsigned long slot[N];
    volatile int pause;
    volatile int paused[N];
};

/* Each process's own page: its count, and which counter it is (1 to N; 0
 * in the process that reads commands). */
static volatile struct {
    unsigned long mine;
    long index;
} me __attribute__((aligned(4096)));

static void work(struct shared *s, int i)
{
    me.index = i + 1;
    for (;;) {
        if (s->pause) {
            s->paused[i] = 1;
            while (s->pause)
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
            s->paused[i] = 0;
        }
        __atomic_fetch_add(&s->total, 1, __ATOMIC_SEQ_CST);
        me.mine = me.mine + 1;
        __atomic_store_n(&s->slot[i], me.mine, __ATOMIC_SEQ_CST);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    /* Without glibc's rseq area, which the kernel writes whenever it
     * resumes a thread: the counting processes write their own page and
     * the shared one, nothing else. */
    if (!getenv("GLIBC_TUNABLES")) {
        setenv("GLIBC_TUNABLES", "glibc.pthread.rseq=0", 1);
        execv("/proc/self/exe", argv);
        perror("execv");
        return 1;
    }
    struct shared *s = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset((void *)s, 0, sizeof *s);
    pid_t kids[N - 1];
    for (int i = 1; i < N; i++) {
        kids[i - 1] = fork();
        if (kids[i - 1] == 0) {
            work(s, i);
            _exit(0);
        }
    }
    /* The parent counts in a thread of its own, and reads stdin. */
    pid_t self = fork();
    if (self == 0) {
        /* The parent's own share is counted by a fourth child, so that
         * the parent can wait in read(2) for commands. */
        work(s, 0);
        _exit(0);
    }
    printf("ready shared=%p mine=%p\n", (void *)s, (void *)&me);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "check", 5) != 0)
            continue;
        s->pause = 1;
        for (int i = 0; i < N; i++)
            while (!s->paused[i])
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
        unsigned long sum = 0;
        for (int i = 0; i < N; i++)
            sum += s->slot[i];
        unsigned long total = s->total;
        if (total == sum)
            printf("ok total=%lu\n", total);
        else
            printf("bad total=%lu sum=%lu\n", total, sum);
        fflush(stdout);
        s->pause = 0;
    }
    for (int i = 0; i < N - 1; i++)
        kill(kids[i], SIGKILL);
    kill(self, SIGKILL);
    while (wait(NULL) > 0)
        ;
    return 0;
}
