/*
 * A far-memory replacement policy as a plugin: LIFO (the page that became
 * local last is evicted first). pagewise loads it at run time; nothing in
 * pagewise changes.
 *
 * Build (from the repository root):
 *
 *   cc -O2 -Wall -shared -fPIC -o policy_lifo.so examples/policy_lifo.c -Iinclude
 *
 * and give its path where a policy is chosen (`farmem::policy::Plugin::load`,
 * or `--policy ./policy_lifo.so` on the command line). The argument string
 * may hold "capacity=N", the most pages it will track (default 1048576).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pagewise.h"

struct entry {
    uint64_t page;
    uint32_t gen; /* the page's generation when it was pushed */
};

struct lifo {
    struct entry *stack; /* the newest last */
    size_t len, cap;
    uint32_t *gen;       /* per page; an entry with an older one is stale */
};

static void *create(const char *args) {
    size_t cap = 1u << 20;
    const char *c = args ? strstr(args, "capacity=") : NULL;
    if (c)
        cap = strtoull(c + 9, NULL, 10);
    struct lifo *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->stack = calloc(cap, sizeof *l->stack);
    l->gen = calloc(cap, sizeof *l->gen);
    if (!l->stack || !l->gen) {
        free(l->stack);
        free(l->gen);
        free(l);
        return NULL;
    }
    l->cap = cap;
    return l;
}

static void destroy(void *state) {
    struct lifo *l = state;
    free(l->stack);
    free(l->gen);
    free(l);
}

static void inserted(void *state, uint64_t page) {
    struct lifo *l = state;
    if (page >= l->cap || l->len == l->cap)
        return; /* beyond capacity: never chosen */
    l->stack[l->len].page = page;
    l->stack[l->len].gen = ++l->gen[page];
    l->len++;
}

static void removed(void *state, uint64_t page) {
    struct lifo *l = state;
    if (page < l->cap)
        l->gen[page]++; /* its entry goes stale */
}

static int victim(void *state, uint64_t *page) {
    struct lifo *l = state;
    while (l->len > 0) {
        struct entry e = l->stack[--l->len];
        if (e.gen == l->gen[e.page]) {
            l->gen[e.page]++;
            *page = e.page;
            return 0;
        }
    }
    return -1;
}

static const pw_policy_ops ops = {
    .abi_version = PW_POLICY_ABI_VERSION,
    .name = "lifo",
    .create = create,
    .destroy = destroy,
    .inserted = inserted,
    .removed = removed,
    .victim = victim,
};

const pw_policy_ops *pw_policy_plugin(void) { return &ops; }
