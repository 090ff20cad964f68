/* Threads that keep their state on their own stacks and in thread-local
 * data, and check it all the time, for memory-only rollbacks (which put
 * back memory but leave every thread running from where it is).
 *
 * Usage: mt_selfcheck N
 * N workers each loop: a counter on the stack and one in thread-local
 * data go up together and must stay equal, and a block on the stack keeps
 * the pattern the thread wrote. Failures and rounds are counted in shared
 * memory (which a rollback leaves as it is). Commands on stdin:
 *   c   print "bad=B rounds=R"
 *   q   stop the workers, join them ("joined" if every join worked), exit
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct shared {
    atomic_long bad, rounds;
    atomic_int stop;
};
static struct shared *sh;
static __thread volatile long tls_count;

static void *work(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    /* In a register (the compiler keeps it there): what the thread knows
     * regardless of its memory. */
    long reg = 0;
    volatile long count = 0;
    volatile unsigned char block[2048];
    for (int i = 0; i < 2048; i++)
        block[i] = (unsigned char)(id * 31 + i);
    while (!atomic_load(&sh->stop)) {
        reg++;
        count = reg;
        tls_count = reg;
        /* A while between writing and checking: a rollback of the stack
         * or thread-local data lands here more often than not. */
        for (int i = 0; i < 2048; i += 7)
            if (block[i] != (unsigned char)(id * 31 + i))
                atomic_fetch_add(&sh->bad, 1), block[i] = (unsigned char)(id * 31 + i);
        if (count != reg || tls_count != reg)
            atomic_fetch_add(&sh->bad, 1);
        atomic_fetch_add(&sh->rounds, 1);
        if ((reg & 1023) == 0)
            usleep(100);
    }
    return (void *)(id + 1);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 5;
    sh = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pthread_t *t = calloc((size_t)n, sizeof *t);
    setvbuf(stdout, NULL, _IONBF, 0);
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, work, (void *)(uintptr_t)i) != 0)
            return 2;
    printf("ready\n");
    char line[16];
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 'c')
            printf("bad=%ld rounds=%ld\n", atomic_load(&sh->bad), atomic_load(&sh->rounds));
        if (line[0] == 'q')
            break;
    }
    atomic_store(&sh->stop, 1);
    int joined = 1;
    for (int i = 0; i < n; i++) {
        void *r;
        if (pthread_join(t[i], &r) != 0 || r != (void *)(uintptr_t)(i + 1))
            joined = 0;
    }
    printf("%s bad=%ld\n", joined ? "joined" : "join-failed", atomic_load(&sh->bad));
    return joined && atomic_load(&sh->bad) == 0 ? 0 : 1;
}
