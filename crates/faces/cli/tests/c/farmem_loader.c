/* The loader's own tables (link maps, scope lists, made at start-up in
 * anonymous memory) are read by every symbol lookup, the far-memory
 * handler thread's too: served memory, they would make it wait on a fault
 * only it can serve. This program says whether any of its link maps (or
 * their names) lies in memory registered with a userfaultfd (the `um`
 * flag in smaps), then sends everything far with a sweep larger than the
 * budget, forks (which wakes the handler thread), looks a symbol up, and
 * checks its sweep. Built linked to many libraries, as a server is: that
 * is when the loader's tables spill into a mapping of their own. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Whether `p` lies in a mapping registered with a userfaultfd (-1: none). */
static int served(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    int in = 0, r = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        char *dash = strchr(line, '-'), *space = strchr(line, ' ');
        if (dash && space && dash < space && sscanf(line, "%lx-%lx", &a, &b) == 2)
            in = (unsigned long)p >= a && (unsigned long)p < b;
        else if (in && !strncmp(line, "VmFlags:", 8)) {
            r = strstr(line, " um") != NULL;
            break;
        }
    }
    fclose(f);
    return r;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    int maps = 0, in_served = 0;
    for (struct link_map *m = _r_debug.r_map; m; m = m->l_next) {
        maps++;
        in_served += served(m) == 1;
        in_served += m->l_name && m->l_name[0] && served(m->l_name) == 1;
    }
    printf("link maps in served memory: %d\n", in_served);
    size_t n = 16u << 20;
    long bad = 0;
    for (int round = 0; round < 2; round++) {
        unsigned char *p = malloc(n);
        if (!p)
            return 2;
        for (size_t i = 0; i < n; i += 4096)
            p[i] = (unsigned char)((i >> 12) ^ round);
        pid_t c = fork();
        if (c == 0)
            _exit(7);
        int st = 0;
        waitpid(c, &st, 0);
        for (size_t i = 0; i < n; i += 4096)
            bad += p[i] != (unsigned char)((i >> 12) ^ round);
        printf("round %d: child exited %d, strlen found %d\n", round,
               WIFEXITED(st) ? WEXITSTATUS(st) : -1, dlsym(RTLD_DEFAULT, "strlen") != NULL);
        free(p);
    }
    printf("pages wrong: %ld; %s\n", bad, maps > 1 ? "link maps seen" : "no link maps");
    return 0;
}
