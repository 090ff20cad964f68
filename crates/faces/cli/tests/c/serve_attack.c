/* Attacks on `pagewise farmem serve` by an instance's own member, and the
 * helpers the tests of them need. Each answer read is printed as
 * "answer VALUE WHY"; a line of the program's own state follows where it
 * says. Usage:
 *   serve_attack exec-setuid SOCKET CONTRACT SETUID_COPY
 *       says "ready PID", waits for a line, connects, then execs
 *       SETUID_COPY (this program, setuid root), which asks for a
 *       userfaultfd on the connection it inherited
 *   serve_attack fork-setuid SOCKET CONTRACT SETUID_COPY
 *       says "ready PID", waits for a line, connects and forks; the parent
 *       execs SETUID_COPY, which holds; the child waits until its parent
 *       runs as root, then asks
 *   serve_attack ask-exit SOCKET CONTRACT
 *       says "ready", waits for a line, connects, asks and ends at once
 *   serve_attack slow SOCKET CONTRACT
 *       connects, sends the first byte of a request, says "slow", and
 *       holds the connection until its input ends
 *   serve_attack try-uffd
 *       as fast as it can, until its input ends (at most 120 s): tries a
 *       userfaultfd that serves the kernel's faults too, and says at the
 *       end "made N of M"
 *   serve_attack impostor PATH
 *       binds a socket at PATH (anyone may connect), says "listening",
 *       and answers every request with the value 1
 *   serve_attack at-pid PID UID PROGRAM ARGS...
 *       (root) starts PROGRAM as uid UID under pid PID exactly (clone3's
 *       set_tid), says "placed PID", and waits for it
 *   (as SETUID_COPY) ask FD CONTRACT, hold */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <linux/sched.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int connect_to(const char *path) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0); /* inherited across exec */
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (s < 0 || strlen(path) >= sizeof a.sun_path) exit(2);
    strcpy(a.sun_path, path);
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("connect");
        exit(2);
    }
    return s;
}

static void request(unsigned char *r, unsigned contract) {
    uint32_t w[4] = {0x55574750u, contract, 2 /* USERFAULTFD */, 02000000 /* O_CLOEXEC */};
    memcpy(r, w, sizeof w);
}

static void ask(int s, unsigned contract) {
    unsigned char r[16];
    request(r, contract);
    if (write(s, r, sizeof r) != (ssize_t)sizeof r) exit(3);
    unsigned char b[12];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = read(s, b + got, sizeof b - got);
        if (n <= 0) {
            printf("answer none %s\n", n == 0 ? "closed" : strerror(errno));
            fflush(stdout);
            return;
        }
        got += n;
    }
    int64_t value;
    uint32_t len;
    memcpy(&value, b, 8);
    memcpy(&len, b + 8, 4);
    char why[1025] = {0};
    if (len > 1024) len = 1024;
    for (got = 0; got < len;) {
        ssize_t n = read(s, why + got, len - got);
        if (n <= 0) break;
        got += n;
    }
    for (char *c = why; *c; c++)
        if (*c == '\n') *c = ' ';
    printf("answer %lld %s\n", (long long)value, why);
    fflush(stdout);
}

/* Userfaultfds and /dev/userfaultfd descriptors this process holds. */
static void say_fds(void) {
    int ufds = 0, devs = 0;
    for (int fd = 0; fd < 1024; fd++) {
        char p[64], l[256];
        snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(p, l, sizeof l - 1);
        if (n <= 0) continue;
        l[n] = 0;
        ufds += strcmp(l, "anon_inode:[userfaultfd]") == 0;
        devs += strcmp(l, "/dev/userfaultfd") == 0;
    }
    printf("euid %d ufds %d devs %d\n", (int)geteuid(), ufds, devs);
    fflush(stdout);
}

/* Says "ready PID" and waits for a line. */
static void ready(void) {
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) exit(6);
}

static void hold(void) {
    char c;
    while (read(0, &c, 1) > 0) {}
}

/* The effective uid of process `pid`, or -1. */
static int euid_of(pid_t pid) {
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    int r = -1, a, e;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Uid: %d %d", &a, &e) == 2) r = e;
    if (f) fclose(f);
    return r;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *mode = argv[1];
    if (!strcmp(mode, "ask") && argc == 4) {
        ask(atoi(argv[2]), (unsigned)atoi(argv[3]));
        say_fds();
        hold();
        return 0;
    }
    if (!strcmp(mode, "hold")) {
        printf("held euid %d\n", (int)geteuid());
        fflush(stdout);
        hold();
        return 0;
    }
    if (!strcmp(mode, "exec-setuid") && argc == 5) {
        ready();
        int s = connect_to(argv[2]);
        char fd[16];
        snprintf(fd, sizeof fd, "%d", s);
        execl(argv[4], argv[4], "ask", fd, argv[3], (char *)NULL);
        perror("exec");
        return 4;
    }
    if (!strcmp(mode, "fork-setuid") && argc == 5) {
        ready();
        int s = connect_to(argv[2]);
        pid_t parent = getpid(), child = fork();
        if (child == 0) {
            /* Until the parent runs the setuid program: at most 20 s. */
            for (int i = 0; i < 2000 && euid_of(parent) != 0; i++) usleep(10000);
            if (euid_of(parent) != 0) {
                printf("answer none the parent never ran as root\n");
                return 5;
            }
            ask(s, (unsigned)atoi(argv[3]));
            return 0;
        }
        execl(argv[4], argv[4], "hold", (char *)NULL);
        perror("exec");
        return 4;
    }
    if (!strcmp(mode, "ask-exit") && argc == 4) {
        ready();
        int s = connect_to(argv[2]);
        unsigned char r[16];
        request(r, (unsigned)atoi(argv[3]));
        if (write(s, r, sizeof r) != (ssize_t)sizeof r) return 3;
        _exit(0);
    }
    if (!strcmp(mode, "slow") && argc == 4) {
        int s = connect_to(argv[2]);
        unsigned char r[16];
        request(r, (unsigned)atoi(argv[3]));
        if (write(s, r, 1) != 1) return 3;
        printf("slow\n");
        fflush(stdout);
        hold();
        return 0;
    }
    if (!strcmp(mode, "try-uffd")) {
        long made = 0, tried = 0;
        time_t end = time(NULL) + 120;
        struct pollfd in = {.fd = 0, .events = POLLIN};
        printf("trying\n");
        fflush(stdout);
        while (time(NULL) < end) {
            long fd = syscall(SYS_userfaultfd, 02000000 /* O_CLOEXEC, no USER_MODE_ONLY */);
            tried++;
            if (fd >= 0) {
                made++;
                close((int)fd);
            }
            if ((tried & 255) == 0 && poll(&in, 1, 0) > 0) break;
        }
        printf("made %ld of %ld\n", made, tried);
        return 0;
    }
    if (!strcmp(mode, "impostor") && argc == 3) {
        int l = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if (l < 0 || strlen(argv[2]) >= sizeof a.sun_path) return 2;
        strcpy(a.sun_path, argv[2]);
        if (bind(l, (struct sockaddr *)&a, sizeof a) || chmod(argv[2], 0777) || listen(l, 16)) {
            perror("impostor");
            return 2;
        }
        printf("listening\n");
        fflush(stdout);
        for (;;) {
            int c = accept(l, NULL, NULL);
            if (c < 0) continue;
            unsigned char r[16], b[12] = {1};
            if (read(c, r, sizeof r) > 0 && write(c, b, sizeof b) != (ssize_t)sizeof b) {}
            close(c);
        }
    }
    if (!strcmp(mode, "at-pid") && argc >= 5) {
        pid_t want = atoi(argv[2]);
        uid_t uid = (uid_t)atoi(argv[3]);
        struct clone_args ca = {0};
        ca.exit_signal = SIGCHLD;
        ca.set_tid = (uint64_t)(uintptr_t)&want;
        ca.set_tid_size = 1;
        long pid = syscall(SYS_clone3, &ca, sizeof ca);
        if (pid < 0) {
            printf("not placed %s\n", strerror(errno));
            return 7;
        }
        if (pid == 0) {
            if (setgroups(0, NULL) || setgid(uid) || setuid(uid)) _exit(8);
            execv(argv[4], argv + 4);
            _exit(9);
        }
        /* Said once it runs as that user: at most 10 s. */
        for (int i = 0; i < 1000 && euid_of((pid_t)pid) != (int)uid; i++) usleep(10000);
        printf("placed %ld\n", pid);
        fflush(stdout);
        int st;
        waitpid((pid_t)pid, &st, 0);
        return 0;
    }
    fprintf(stderr, "usage: see the source\n");
    return 2;
}
