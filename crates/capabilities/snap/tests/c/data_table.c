/* A program whose private file mapping holds data it has not touched:
 * a 4 MiB initialised table in .data, every int 7, none of its pages
 * read or written until asked. Answers one line per request on stdin:
 *   a          the table's address
 *   w I V      table[I] = V, answers "ok"
 *   r I        answers table[I]
 * (tests/rollback: a take reads such a mapping's pages whole, since a
 * page not populated holds the file's contents, not zeros.) */
#include <stdio.h>
#include <string.h>

#define N (1 << 20)
int table[N] = {[0 ... N - 1] = 7};

int main(void) {
    char line[128];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        long i, v;
        if (line[0] == 'a') {
            printf("%p\n", (void *)table);
        } else if (sscanf(line, "w %ld %ld", &i, &v) == 2 && i >= 0 && i < N) {
            table[i] = (int)v;
            printf("ok\n");
        } else if (sscanf(line, "r %ld", &i) == 1 && i >= 0 && i < N) {
            printf("%d\n", table[i]);
        } else {
            printf("?\n");
        }
    }
    return 0;
}
