/*
 * A fuzz target that checks, at the start of every run, that it finds
 * itself as it was at its first read: its state against the pattern it
 * wrote (the shadow, computed again), its static data, its break, a
 * file's offset, its descriptors; then writes pages of the state chosen
 * by the input, moves its break, maps memory and leaves it mapped, opens
 * a file and leaves it open, reads the file, and writes to a stdio buffer.
 *
 * The exit code is the input's hash (low 4 bits) with bit 4 up to bit 6
 * set for a check that failed: a program started afresh (no pagewise)
 * always passes them, so a reset that missed anything answers otherwise.
 *
 * The input's first byte asks for what a reset inside the program cannot
 * put back (the program is then started again for the next run):
 *   'U' unmaps a page of the state, 'C' closes standard output,
 *   'T' leaves a thread, 'R' leaves a thread made with clone() (no
 *   set_robust_list call marks it), 'S' sets an alternate signal stack;
 * and for a crash: 'K' writes through a null pointer, 'A' aborts.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define STATE_MIB 8
#define PAGE 4096u

static uint64_t *state;
static size_t words;
static uint64_t statics[1 << 17]; /* 1 MiB of .bss */
static uint64_t table[512] = {1, 2, 3, 4, 5, 6, 7, 8}; /* .data */
static int file = -1;
static long start_brk;

static uint64_t pattern(size_t i)
{
    return (i * 0x9e3779b97f4a7c15ull) ^ (i >> 3);
}

static void *sleeper(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return 0;
}

static int raw_sleeper(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return 0;
}

static int checks(void)
{
    int bad = 0;
    for (size_t i = 0; i < words; i++)
        if (state[i] != pattern(i)) {
            bad |= 1;
            break;
        }
    for (size_t i = 0; i < sizeof statics / 8; i++)
        if (statics[i] != pattern(i + 7)) {
            bad |= 1;
            break;
        }
    for (size_t i = 0; i < 512; i++)
        if (table[i] != (i < 8 ? i + 1 : 0)) {
            bad |= 1;
            break;
        }
    if (lseek(file, 0, SEEK_CUR) != 0)
        bad |= 2;
    if (syscall(SYS_brk, 0) != start_brk)
        bad |= 2;
    /* The lowest free descriptor is the one after the file. */
    int probe = dup(0);
    if (probe != file + 1)
        bad |= 4;
    close(probe);
    return bad;
}

int main(void)
{
    words = (size_t)STATE_MIB << 17;
    state = malloc(words * 8);
    if (!state)
        return 120;
    for (size_t i = 0; i < words; i++)
        state[i] = pattern(i);
    for (size_t i = 0; i < sizeof statics / 8; i++)
        statics[i] = pattern(i + 7);
    file = open("/proc/self/exe", O_RDONLY);
    if (file < 0)
        return 121;
    /* A break the runs move around. */
    free(malloc(200 << 10));
    start_brk = syscall(SYS_brk, 0);

    static unsigned char in[1024];
    size_t len = fread(in, 1, sizeof in, stdin);
    int bad = checks();
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ in[i]) * 1099511628211ull;

    /* Pages of the state, the statics and the table, chosen by the input. */
    for (unsigned k = 0; k < 16; k++) {
        size_t w = (size_t)((h >> (k % 32)) * (k + 1)) % words;
        state[w] ^= h | 1;
        statics[(w * 7) % (sizeof statics / 8)] += k + 1;
    }
    table[h % 512] = h;
    /* The break moved up (and maybe down again), memory mapped and left,
     * a file opened and left, a file read, stdio written. */
    size_t grow = 4096 + (h % 64) * 8192;
    char *chunks[64];
    for (int i = 0; i < 64; i++) {
        chunks[i] = malloc(grow / 16 + i);
        memset(chunks[i], i, grow / 16 + i);
    }
    if (h & 1)
        for (int i = 63; i >= 0; i--)
            free(chunks[i]);
    char *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED)
        memset(m, 9, 1 << 20);
    (void)open("/proc/self/status", O_RDONLY);
    char head[16];
    if (read(file, head, sizeof head) != sizeof head)
        bad |= 2;
    printf("run %llx\n", (unsigned long long)h);

    if (len >= 1)
        switch (in[0]) {
        case 'U':
            munmap((char *)state + 2 * PAGE + (PAGE - ((uintptr_t)state % PAGE)), PAGE);
            break;
        case 'C':
            close(1);
            break;
        case 'T': {
            pthread_t t;
            pthread_create(&t, 0, sleeper, 0);
            break;
        }
        case 'R': {
            static char stack[1 << 16] __attribute__((aligned(16)));
            clone(raw_sleeper, stack + sizeof stack,
                  CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM, 0);
            break;
        }
        case 'S': {
            static char alt[1 << 16];
            stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
            sigaltstack(&ss, 0);
            break;
        }
        case 'K':
            *(volatile int *)(uintptr_t)(h & 1) = 1;
            break;
        case 'A':
            abort();
        }
    return (int)(h & 15) | bad << 4;
}
