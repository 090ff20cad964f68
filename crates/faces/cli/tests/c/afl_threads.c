/*
 * A fuzz target that, on an input starting with 'T', leaves a thread of
 * its own running when it exits: the next reset finds a thread the point
 * did not have. It exits with the sum of its input's bytes (mod 128) plus
 * a counter it keeps in memory (0 at the point: 1 after a right reset).
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
    unsigned char buf[256];
    ssize_t n = read(0, buf, sizeof buf);
    unsigned sum = 0;
    for (ssize_t i = 0; i < n; i++)
        sum += buf[i];
    counter++;
    if (n > 0 && buf[0] == 'T') {
        pthread_t t;
        pthread_create(&t, 0, sleeper, 0);
    }
    return (int)((sum + counter) % 128);
}
