/* A target with three threads blocked in calls that Linux ends with EINTR
 * after a stop (signal(7)): epoll_wait on a pipe, sigtimedwait for
 * SIGUSR1, semop on a semaphore. Prints "ready" once they are started;
 * on a line from stdin it wakes all three, and each prints its result:
 * "epoll 1 0", "sigtimedwait 10 0", "semop 0 0" when nothing interrupted
 * them. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/ipc.h>
#include <sys/sem.h>
#include <time.h>
#include <unistd.h>

static int pfd[2], ep, sem;
static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;

static void say(const char *what, int r) {
    pthread_mutex_lock(&out);
    printf("%s %d %d\n", what, r, r < 0 ? errno : 0);
    fflush(stdout);
    pthread_mutex_unlock(&out);
}

static void *t_epoll(void *a) {
    (void)a;
    struct epoll_event ev;
    say("epoll", epoll_wait(ep, &ev, 1, -1));
    return NULL;
}

static void *t_sigwait(void *a) {
    (void)a;
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    struct timespec ts = {120, 0};
    say("sigtimedwait", sigtimedwait(&s, NULL, &ts));
    return NULL;
}

static void *t_semop(void *a) {
    (void)a;
    struct sembuf b = {0, -1, 0};
    say("semop", semop(sem, &b, 1));
    return NULL;
}

int main(void) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    if (pipe(pfd) || (ep = epoll_create1(0)) < 0)
        return 1;
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(ep, EPOLL_CTL_ADD, pfd[0], &ev);
    sem = semget(IPC_PRIVATE, 1, 0600);
    if (sem < 0)
        return 1;
    pthread_t t[3];
    pthread_create(&t[0], NULL, t_epoll, NULL);
    pthread_create(&t[1], NULL, t_sigwait, NULL);
    pthread_create(&t[2], NULL, t_semop, NULL);
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    if (write(pfd[1], "x", 1) != 1)
        return 1;
    kill(getpid(), SIGUSR1);
    struct sembuf b = {0, 1, 0};
    semop(sem, &b, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    semctl(sem, 0, IPC_RMID);
    return 0;
}
