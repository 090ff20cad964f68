/*
 * A fuzz target that starts a thread of its own before it reads its
 * input: a reset inside the program (which needs one thread) is refused,
 * and the program is reset from outside instead. The exit code is made of
 * the input and a counter written at each run (a reset that missed it
 * answers differently).
 */
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

static unsigned counter;

static void *sleeper(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return 0;
}

int main(void)
{
    pthread_t t;
    if (pthread_create(&t, 0, sleeper, 0))
        return 120;
    unsigned char buf[256];
    ssize_t n = read(0, buf, sizeof buf);
    unsigned sum = 0;
    for (ssize_t i = 0; i < n; i++)
        sum += buf[i];
    counter++;
    return (int)((sum + counter * 7) % 128);
}
