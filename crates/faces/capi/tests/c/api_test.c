/*
 * Tests of the C API against ground truth: a random model of snapshots over
 * three regions checked byte for byte against shadow copies for every
 * backend, exact page store counts, tracker consumers, per-thread error
 * messages, the durable store (also corrupt), and another process.
 * Run by tests/c_programs.rs; exits 0 when every check passed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pagewise.h"

static int failures;
static size_t page;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " [last error: %s]\n", pw_last_error());                             \
        }                                                                                          \
    } while (0)

#define OK(call) CHECK((call) == 0, "%s", #call)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static unsigned char *map(size_t pages) {
    void *p = mmap(NULL, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    return p;
}

/* ---------------------------------------------------------------- snapshots */

#define NREG 3
#define MAXSNAP 8
/* Mapped one after the other, so the regions are likely adjacent. */
static const size_t reg_pages[NREG] = {64, 37, 128};

struct model {
    unsigned char *mem[NREG];
    pw_region regions[NREG];
    int live[MAXSNAP];
    uint64_t id[MAXSNAP];
    unsigned char *copy[MAXSNAP][NREG];
};

static size_t differing_pages(struct model *m, int k) {
    size_t n = 0;
    for (int r = 0; r < NREG; r++)
        for (size_t p = 0; p < reg_pages[r]; p++)
            n += memcmp(m->mem[r] + p * page, m->copy[k][r] + p * page, page) != 0;
    return n;
}

static int cmp_page(const void *a, const void *b) {
    return memcmp(*(unsigned char *const *)a, *(unsigned char *const *)b, page);
}

/* Distinct non-zero page contents over the live snapshots' copies. */
static size_t model_unique(struct model *m, size_t *zero) {
    unsigned char **all = malloc(MAXSNAP * 256 * sizeof *all);
    unsigned char *z = calloc(1, page);
    size_t n = 0, u = 0;
    *zero = 0;
    for (int k = 0; k < MAXSNAP; k++)
        for (int r = 0; m->live[k] && r < NREG; r++)
            for (size_t p = 0; p < reg_pages[r]; p++) {
                unsigned char *pg = m->copy[k][r] + p * page;
                if (memcmp(pg, z, page) == 0)
                    ++*zero;
                else
                    all[n++] = pg;
            }
    qsort(all, n, sizeof *all, cmp_page);
    for (size_t i = 0; i < n; i++)
        u += i == 0 || memcmp(all[i - 1], all[i], page) != 0;
    free(all);
    free(z);
    return u;
}

static void model_run(uint32_t backend) {
    struct model m;
    memset(&m, 0, sizeof m);
    for (int r = 0; r < NREG; r++) {
        m.mem[r] = map(reg_pages[r]);
        m.regions[r].start = (uint64_t)(uintptr_t)m.mem[r];
        m.regions[r].len = reg_pages[r] * page;
        for (size_t p = 0; p < reg_pages[r]; p += 3)
            memset(m.mem[r] + p * page, (int)(p % 5), page);
    }
    pw_snapshots *s;
    int rc = pw_snapshots_new(m.regions, NREG, backend, 1, &s);
    if (rc == -EOPNOTSUPP) {
        printf("skip snapshots with %s: %s\n", pw_backend_name(backend), pw_last_error());
        goto out;
    }
    CHECK(rc == 0, "pw_snapshots_new(%s) = %d", pw_backend_name(backend), rc);
    if (rc)
        goto out;
    CHECK(pw_snapshots_backend(s) == backend, "backend %u", pw_snapshots_backend(s));
    size_t restores = 0, takes = 0;
    for (int step = 0; step < 300; step++) {
        uint64_t op = next() % 10;
        int k = (int)(next() % MAXSNAP);
        if (op < 5) { /* write some pages */
            int n = (int)(next() % 12);
            for (int i = 0; i < n; i++) {
                int r = (int)(next() % NREG);
                size_t p = next() % reg_pages[r];
                uint64_t v = next();
                size_t off = next() % (page - 8);
                if (v % 7 == 0)
                    memset(m.mem[r] + p * page, 0, page); /* back to the zero page */
                else if (v % 7 == 1)
                    memset(m.mem[r] + p * page, 0x11, page); /* a shared content */
                else
                    memcpy(m.mem[r] + p * page + off, &v, 8);
            }
        } else if (op < 7) { /* take into slot k */
            if (m.live[k]) {
                OK(pw_snapshots_drop(s, m.id[k]));
                m.live[k] = 0;
            }
            uint64_t id;
            rc = pw_snapshots_take(s, &id);
            CHECK(rc == 0, "take = %d", rc);
            if (rc)
                continue;
            takes++;
            m.id[k] = id;
            m.live[k] = 1;
            for (int r = 0; r < NREG; r++) {
                if (!m.copy[k][r])
                    m.copy[k][r] = malloc(reg_pages[r] * page);
                memcpy(m.copy[k][r], m.mem[r], reg_pages[r] * page);
            }
        } else if (op < 9 && m.live[k]) { /* restore slot k */
            pw_restore_stats st;
            OK(pw_snapshots_restore(s, m.id[k], &st));
            restores++;
            CHECK(st.foreign_writes == 0, "foreign writes %llu", (unsigned long long)st.foreign_writes);
            for (int r = 0; r < NREG; r++)
                CHECK(memcmp(m.mem[r], m.copy[k][r], reg_pages[r] * page) == 0,
                      "%s: region %d differs after restore at step %d", pw_backend_name(backend), r,
                      step);
        } else if (m.live[k]) { /* diffs and reads against the model */
            const pw_range *ranges;
            size_t n, pages = 0;
            OK(pw_snapshots_diff_live(s, m.id[k], &ranges, &n));
            for (size_t i = 0; i < n; i++)
                pages += ranges[i].pages;
            size_t want = differing_pages(&m, k);
            CHECK(pages == want, "diff_live: %zu pages, model %zu", pages, want);
            int j = (int)(next() % MAXSNAP);
            if (m.live[j]) {
                OK(pw_snapshots_diff(s, m.id[k], m.id[j], &ranges, &n));
                size_t got = 0, exp = 0;
                for (size_t i = 0; i < n; i++)
                    got += ranges[i].pages;
                for (int r = 0; r < NREG; r++)
                    for (size_t p = 0; p < reg_pages[r]; p++)
                        exp += memcmp(m.copy[k][r] + p * page, m.copy[j][r] + p * page, page) != 0;
                CHECK(got == exp, "diff: %zu pages, model %zu", got, exp);
            }
            int r = (int)(next() % NREG);
            size_t off = next() % (reg_pages[r] * page - 3 * page);
            unsigned char buf[3 * 4096];
            size_t len = 2 * page + 100;
            OK(pw_snapshots_read(s, m.id[k], m.regions[r].start + off, buf, len));
            CHECK(memcmp(buf, m.copy[k][r] + off, len) == 0, "read across pages");
        }
    }
    /* Exact page store counts: unique non-zero contents over live snapshots. */
    size_t live = 0, listed = 0;
    for (int k = 0; k < MAXSNAP; k++)
        live += m.live[k];
    pw_snapshot_info infos[MAXSNAP];
    OK(pw_snapshots_list(s, infos, MAXSNAP, &listed));
    CHECK(listed == live, "list: %zu snapshots, model %zu", listed, live);
    /* The store holds the pages of the live snapshots and of memory at the last take: after
     * dropping every snapshot and taking one, exactly the distinct non-zero contents of memory. */
    size_t zero, unique;
    for (int k = 0; k < MAXSNAP; k++)
        if (m.live[k])
            OK(pw_snapshots_drop(s, m.id[k]));
    memset(m.live, 0, sizeof m.live);
    uint64_t last;
    OK(pw_snapshots_take(s, &last));
    m.live[0] = 1;
    m.id[0] = last;
    for (int r = 0; r < NREG; r++)
        memcpy(m.copy[0][r] ? m.copy[0][r] : (m.copy[0][r] = malloc(reg_pages[r] * page)), m.mem[r],
               reg_pages[r] * page);
    unique = model_unique(&m, &zero);
    pw_store_stats ss;
    OK(pw_snapshots_store_stats(s, &ss));
    CHECK(ss.unique_pages == unique, "store: %llu unique pages, model %zu",
          (unsigned long long)ss.unique_pages, unique);
    printf("snapshots with %-10s %zu takes, %zu restores byte-exact, %zu live\n",
           pw_backend_name(backend), takes, restores, live);
    pw_snapshots_free(s);
out:
    for (int r = 0; r < NREG; r++) {
        munmap(m.mem[r], reg_pages[r] * page);
        for (int k = 0; k < MAXSNAP; k++)
            free(m.copy[k][r]);
    }
}

/* ---------------------------------------------------------------- store */

static void store_test(void) {
    pw_store *st;
    OK(pw_store_new(1, &st));
    unsigned char *a = calloc(1, page), *b = calloc(1, page), *z = calloc(1, page);
    memset(a, 0xaa, page);
    memset(b, 0xaa, page);
    b[page - 1] = 0xbb;
    uint32_t ia, ia2, ib, iz;
    OK(pw_store_intern(st, a, &ia));
    OK(pw_store_intern(st, a, &ia2));
    OK(pw_store_intern(st, b, &ib));
    OK(pw_store_intern(st, z, &iz));
    CHECK(ia == ia2 && ia != ib && ia != 0, "ids %u %u %u", ia, ia2, ib);
    CHECK(iz == 0, "the zero page has id 0, got %u", iz);
    uint64_t refs;
    OK(pw_store_refs(st, ia, &refs));
    CHECK(refs == 2, "refs %llu", (unsigned long long)refs);
    const void *bytes;
    OK(pw_store_page(st, ib, &bytes));
    CHECK(memcmp(bytes, b, page) == 0, "stored bytes");
    pw_store_stats ss;
    OK(pw_store_get_stats(st, &ss));
    CHECK(ss.unique_pages == 2 && ss.referenced_pages == 3 && ss.zero_pages == 1 &&
              ss.bytes_saved == 2 * page,
          "stats %llu %llu %llu %llu", (unsigned long long)ss.unique_pages,
          (unsigned long long)ss.referenced_pages, (unsigned long long)ss.zero_pages,
          (unsigned long long)ss.bytes_saved);
    OK(pw_store_decref(st, ib));
    CHECK(pw_store_page(st, ib, &bytes) == -ENOENT, "a freed page is gone");
    CHECK(pw_store_decref(st, ib) == -ENOENT, "decref of a freed page");
    OK(pw_store_decref(st, 0));
    CHECK(pw_store_decref(st, 0) == -EINVAL, "zero page without references");
    CHECK(pw_store_incref(st, 999) == -ENOENT, "unknown id");
    OK(pw_store_get_stats(st, &ss));
    CHECK(ss.unique_pages == 1 && ss.referenced_pages == 2 && ss.zero_pages == 0, "stats after decref");
    pw_store_free(st);
    free(a);
    free(b);
    free(z);
    printf("page store: exact counts ok\n");
}

/* ---------------------------------------------------------------- tracker */

static size_t pages_in(const pw_range *r, size_t n) {
    size_t p = 0;
    for (size_t i = 0; i < n; i++)
        p += r[i].pages;
    return p;
}

static void tracker_test(void) {
    unsigned char *mem = map(32);
    pw_region reg = {(uint64_t)(uintptr_t)mem, 32 * page};
    for (uint32_t b = PW_BACKEND_UFFD_WP; b <= PW_BACKEND_HASH; b++) {
        memset(mem, 1, 32 * page);
        pw_tracker *t;
        int rc = pw_tracker_new(&reg, 1, b, &t);
        if (rc == -EOPNOTSUPP) {
            printf("skip tracker with %s: %s\n", pw_backend_name(b), pw_last_error());
            continue;
        }
        CHECK(rc == 0, "pw_tracker_new(%s) = %d", pw_backend_name(b), rc);
        if (rc)
            continue;
        uint32_t second;
        OK(pw_tracker_add_consumer(t, &second));
        const pw_range *r;
        size_t n;
        mem[2 * page] = 7;
        OK(pw_tracker_collect(t, PW_CONSUMER_DEFAULT, &r, &n, NULL));
        CHECK(n == 1 && r[0].start == reg.start + 2 * page && r[0].pages == 1, "%s: first", pw_backend_name(b));
        mem[9 * page] = 7;
        OK(pw_tracker_collect(t, second, &r, &n, NULL));
        CHECK(pages_in(r, n) == 2, "%s: second consumer sees both writes, got %zu", pw_backend_name(b),
              pages_in(r, n));
        pw_collect_stats cs;
        OK(pw_tracker_collect(t, PW_CONSUMER_DEFAULT, &r, &n, &cs));
        CHECK(n == 1 && r[0].start == reg.start + 9 * page && cs.pages_dirty == 1,
              "%s: default sees the later write", pw_backend_name(b));
        OK(pw_tracker_remove_consumer(t, second));
        CHECK(pw_tracker_collect(t, second, &r, &n, NULL) == -ENOENT, "removed consumer");
        printf("tracker with %-10s exact ranges, two consumers ok\n", pw_backend_name(b));
        pw_tracker_free(t);
    }
    munmap(mem, 32 * page);
}

/* ---------------------------------------------------------------- errors */

static void *thread_error(void *arg) {
    (void)arg;
    pw_store *st;
    int rc = pw_store_new(1, NULL);
    (void)st;
    CHECK(rc == -EINVAL && strstr(pw_last_error(), "out is NULL"), "thread's own error");
    return NULL;
}

static void error_test(void) {
    pw_snapshots *s;
    pw_region bad = {4096 + 1, 4096};
    CHECK(pw_snapshots_new(&bad, 1, PW_BACKEND_AUTO, 1, &s) == -EINVAL, "unaligned region");
    CHECK(strstr(pw_last_error(), "page-aligned") != NULL, "message names the problem: %s", pw_last_error());
    CHECK(pw_snapshots_new(NULL, 1, 0, 1, &s) == -EINVAL, "NULL regions");
    CHECK(pw_snapshots_new(&bad, 0, 0, 1, &s) == -EINVAL, "no regions");
    CHECK(pw_tracker_new(&bad, 1, 77, NULL) == -EINVAL, "unknown backend");
    CHECK(pw_backend_name(77) == NULL, "no name for an unknown backend");
    CHECK(pw_snapshots_take(NULL, NULL) == -EINVAL, "NULL handle");
    /* Another thread's failure does not change this thread's message. */
    pw_store *st;
    CHECK(pw_store_incref(NULL, 0) == -EINVAL, "NULL store");
    pthread_t th;
    pthread_create(&th, NULL, thread_error, NULL);
    pthread_join(th, NULL);
    CHECK(strstr(pw_last_error(), "pw_store_incref: store is NULL") != NULL, "message is per thread: %s",
          pw_last_error());
    (void)st;
    /* A mapping that is not writable. */
    unsigned char *ro = mmap(NULL, 4 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pw_region r = {(uint64_t)(uintptr_t)ro, 4 * page};
    int rc = pw_snapshots_new(&r, 1, PW_BACKEND_AUTO, 1, &s);
    CHECK(rc < 0, "read-only region refused");
    munmap(ro, 4 * page);
    printf("errors: negative errno and per-thread messages ok\n");
}

/* ---------------------------------------------------------------- durable store */

static void disk_test(const char *dir) {
    pw_disk *d;
    CHECK(pw_disk_open(dir, &d) < 0, "a directory without a store is refused");
    OK(pw_disk_create(dir, 1, &d));
    unsigned char *mem = map(16);
    for (size_t p = 0; p < 16; p += 2)
        memset(mem + p * page, 0x30 + (int)(p % 4), page);
    pw_region reg = {(uint64_t)(uintptr_t)mem, 16 * page};
    pw_snapshots *s;
    OK(pw_snapshots_new(&reg, 1, PW_BACKEND_AUTO, 1, &s));
    uint64_t a, b;
    OK(pw_snapshots_take(s, &a));
    mem[page] = 1;
    OK(pw_snapshots_take(s, &b));
    pw_save_stats sa, sb;
    OK(pw_snapshots_save(s, a, d, "a", &sa));
    OK(pw_snapshots_save(s, b, d, NULL, &sb));
    /* Pages 0,2,..: two distinct contents; page 1 is new in b. */
    CHECK(sa.pages == 16 && sa.zero_pages == 8 && sa.pages_new == 2, "save a: %llu %llu %llu",
          (unsigned long long)sa.pages, (unsigned long long)sa.zero_pages, (unsigned long long)sa.pages_new);
    CHECK(sb.pages_new == 1 && sb.zero_pages == 7, "save b: %llu new", (unsigned long long)sb.pages_new);
    uint64_t ids[4];
    size_t n;
    OK(pw_disk_list(d, ids, 4, &n));
    CHECK(n == 2 && ids[0] == sa.id && ids[1] == sb.id, "list %zu", n);
    pw_disk_stats ds;
    OK(pw_disk_get_stats(d, &ds));
    CHECK(ds.snapshots == 2 && ds.unique_pages == 3 && ds.zero_pages == 15 && ds.referenced_pages == 17,
          "disk stats %llu %llu %llu %llu", (unsigned long long)ds.snapshots,
          (unsigned long long)ds.unique_pages, (unsigned long long)ds.zero_pages,
          (unsigned long long)ds.referenced_pages);
    pw_disk_free(d);
    /* Load both into other memory, read-only, and restore each. */
    OK(pw_disk_open(dir, &d));
    unsigned char *other = map(16);
    pw_region oreg = {(uint64_t)(uintptr_t)other, 16 * page};
    pw_snapshots *o;
    OK(pw_snapshots_new(&oreg, 1, PW_BACKEND_AUTO, 1, &o));
    uint64_t la;
    OK(pw_snapshots_load(o, d, sa.id, &la));
    OK(pw_snapshots_restore(o, la, NULL));
    CHECK(other[page] == 0 && memcmp(other + 2 * page, mem + 2 * page, 14 * page) == 0, "a restored");
    OK(pw_snapshots_load(o, d, sb.id, &la));
    OK(pw_snapshots_restore(o, la, NULL));
    CHECK(memcmp(other, mem, 16 * page) == 0, "b restored");
    /* b again, lazily, into a third mapping: pages come in when touched. */
    unsigned char *lz = map(16);
    memset(lz, 0xee, 16 * page);
    pw_region lreg = {(uint64_t)(uintptr_t)lz, 16 * page};
    pw_lazy *l;
    OK(pw_lazy_start(dir, sb.id, &lreg, 1, PW_LAZY_NO_BACKGROUND, &l));
    CHECK(lz[2 * page] == mem[2 * page], "a lazily restored page on its first touch");
    pw_lazy_stats ls;
    OK(pw_lazy_get_stats(l, &ls));
    CHECK(ls.faults == 1 && ls.copied == 1 && ls.complete == 0, "lazy after one touch: %llu faults %llu copied",
          (unsigned long long)ls.faults, (unsigned long long)ls.copied);
    OK(pw_lazy_finish(l, &ls));
    /* Nine non-zero pages in b (0, 1, 2, 4, .., 14), each copied once. */
    CHECK(ls.copied == 9 && ls.complete == 1 && ls.pages == 16 && ls.zero_pages == 7,
          "lazy finish: %llu copied of %llu pages", (unsigned long long)ls.copied, (unsigned long long)ls.pages);
    CHECK(memcmp(lz, mem, 16 * page) == 0, "b lazily restored");
    CHECK(pw_lazy_start(dir, sb.id, &lreg, 1, 77, &l) == -EINVAL, "lazy: unknown flags");
    munmap(lz, 16 * page);
    /* The wrong shape is refused. */
    unsigned char *half = map(8);
    pw_region hreg = {(uint64_t)(uintptr_t)half, 8 * page};
    pw_snapshots *small;
    OK(pw_snapshots_new(&hreg, 1, PW_BACKEND_AUTO, 1, &small));
    CHECK(pw_snapshots_load(small, d, sa.id, &la) == -EINVAL, "shape mismatch");
    CHECK(pw_lazy_start(dir, sa.id, &hreg, 1, 0, &l) == -EINVAL, "lazy: shape mismatch");
    pw_snapshots_free(small);
    munmap(half, 8 * page);
    pw_disk_free(d);
    /* A damaged index: -EBADMSG, never wrong data. */
    char path[4200];
    snprintf(path, sizeof path, "%s/snap-%010llu.idx", dir, (unsigned long long)sb.id);
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0, "open %s", path);
    if (fd >= 0) {
        pwrite(fd, "\xff\xff\xff\xff", 4, 40);
        close(fd);
    }
    OK(pw_disk_open(dir, &d));
    int rc = pw_snapshots_load(o, d, sb.id, &la);
    CHECK(rc == -EBADMSG, "corrupt index gives -EBADMSG, got %d", rc);
    printf("corrupt index: %s\n", pw_last_error());
    pw_disk_free(d);
    pw_snapshots_free(o);
    pw_snapshots_free(s);
    munmap(mem, 16 * page);
    munmap(other, 16 * page);
    printf("durable store: exact counts, round trip, corruption ok\n");
}

/* ---------------------------------------------------------------- live pre-copy */

#define LIVE_PAGES 1024
static unsigned char *live_mem, *live_shadow;
static atomic_int live_gate;   /* 0 run, 1 pause asked */
static atomic_int live_parked; /* writers parked */
static atomic_int live_quit;
static int live_pauses;

static void *live_writer(void *arg) {
    uint64_t x = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull | 1;
    while (!atomic_load(&live_quit)) {
        if (atomic_load(&live_gate)) {
            atomic_fetch_add(&live_parked, 1);
            while (atomic_load(&live_gate) && !atomic_load(&live_quit))
                ;
            atomic_fetch_sub(&live_parked, 1);
            continue;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((volatile unsigned char *)live_mem)[(x >> 8) % (LIVE_PAGES * page)] = (unsigned char)x;
    }
    return NULL;
}

/* The writers stop (stop = 1); before they run again (stop = 0) the memory
 * is what the checkpoint holds: kept as the shadow. */
static void live_pause(void *user, int stop) {
    (void)user;
    if (stop) {
        live_pauses++;
        atomic_store(&live_gate, 1);
        while (atomic_load(&live_parked) < 2)
            ;
    } else {
        memcpy(live_shadow, live_mem, LIVE_PAGES * page);
        atomic_store(&live_gate, 0);
    }
}

/* Three live checkpoints of a region two threads write all the while: each
 * stored snapshot equals the region at its stop, byte for byte; the writers
 * were paused once per checkpoint. Then a checkpoint of a child process. */
static void live_test(const char *dir) {
    live_mem = map(LIVE_PAGES);
    live_shadow = malloc(LIVE_PAGES * page);
    memset(live_mem, 1, LIVE_PAGES * page);
    pw_region r = {(uint64_t)(uintptr_t)live_mem, LIVE_PAGES * page};
    pw_live_options o = {20.0, 10, 0};
    pw_live *l;
    int rc = pw_live_regions(&r, 1, live_pause, NULL, &o, &l);
    if (rc == -EOPNOTSUPP) {
        printf("skip live pre-copy: %s\n", pw_last_error());
        return;
    }
    CHECK(rc == 0, "pw_live_regions = %d", rc);
    if (rc)
        return;
    rc = pw_live_checkpoint(l, "x", NULL);
    CHECK(rc == -EINVAL, "a checkpoint without a destination gives -EINVAL, got %d", rc);
    OK(pw_live_to_store(l, dir, 1));
    pthread_t t[2];
    for (uintptr_t i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, live_writer, (void *)(i + 1));
    unsigned char *back = map(LIVE_PAGES);
    pw_region br = {(uint64_t)(uintptr_t)back, LIVE_PAGES * page};
    unsigned char *got = malloc(LIVE_PAGES * page);
    for (int k = 0; k < 3; k++) {
        usleep(20000);
        pw_live_report rep;
        OK(pw_live_checkpoint(l, "live", &rep));
        CHECK(rep.downtime_ms >= 0 && rep.passes >= 1, "report: %u passes", rep.passes);
        CHECK(rep.final_pages <= LIVE_PAGES && rep.save.pages == LIVE_PAGES,
              "checkpoint %d: %llu pages at the stop, %llu saved", k,
              (unsigned long long)rep.final_pages, (unsigned long long)rep.save.pages);
        /* Read the stored snapshot back through a handle over other memory. */
        pw_disk *d;
        OK(pw_disk_open(dir, &d));
        pw_snapshots *s;
        OK(pw_snapshots_new(&br, 1, PW_BACKEND_HASH, 1, &s));
        uint64_t id = 0;
        OK(pw_snapshots_load(s, d, rep.save.id, &id));
        OK(pw_snapshots_read(s, id, br.start, got, LIVE_PAGES * page));
        CHECK(memcmp(got, live_shadow, LIVE_PAGES * page) == 0, "checkpoint %d differs from the memory at its stop", k);
        pw_snapshots_free(s);
        pw_disk_free(d);
    }
    CHECK(live_pauses == 3, "paused %d times for 3 checkpoints", live_pauses);
    atomic_store(&live_quit, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pw_live_free(l);
    free(got);
    free(live_shadow);
    printf("live pre-copy of own regions ok\n");
}

/* ---------------------------------------------------------------- another process */

static void process_test(const char *dir) {
    int ready[2];
    if (pipe(ready))
        exit(2);
    pid_t child = fork();
    if (child == 0) {
        unsigned char *mem = map(64);
        for (size_t p = 0; p < 64; p++)
            memset(mem + p * page, 0x40 + (int)(p % 8), page);
        (void)!write(ready[1], "x", 1);
        for (;;)
            pause();
    }
    char x;
    (void)!read(ready[0], &x, 1);
    pw_disk *d;
    OK(pw_disk_create(dir, 1, &d));
    pw_save_stats st;
    int rc = pw_snapshot_process(child, d, "child", &st);
    if (rc == -EPERM) {
        printf("skip snapshot of another process: %s\n", pw_last_error());
    } else {
        CHECK(rc == 0, "pw_snapshot_process = %d", rc);
        /* At least the 8 distinct contents the child wrote. */
        CHECK(rc != 0 || st.pages_new >= 8, "pages new %llu", (unsigned long long)st.pages_new);
        CHECK(kill(child, 0) == 0, "the child runs on");
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    rc = pw_snapshot_process(child, d, "gone", &st);
    CHECK(rc == -ESRCH, "a reaped child gives -ESRCH, got %d", rc);
    pw_disk_free(d);
    printf("snapshot of another process ok\n");
}

/* ---------------------------------------------------------------- rollback of another process */

static uint64_t sum_pages(const unsigned char *mem, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n * page; i++)
        h = (h ^ mem[i]) * 1099511628211ull;
    return h;
}

/* A child holding the 64 pages of `mem` (filled with base + page number):
 * it answers 's' with a checksum of them and 'w' by rewriting every
 * `stride`-th page first. Its command and answer pipes go to `*to` and
 * `*from`. */
static pid_t pager(unsigned char *mem, int base, size_t stride, int *to, int *from) {
    int cmd[2], ans[2];
    if (pipe(cmd) || pipe(ans))
        exit(2);
    for (size_t p = 0; p < 64; p++)
        memset(mem + p * page, base + (int)p, page);
    pid_t child = fork();
    if (child == 0) {
        char c;
        unsigned v = 0;
        close(cmd[1]);
        close(ans[0]);
        while (read(cmd[0], &c, 1) == 1) {
            if (c == 'w')
                for (size_t p = 0; p < 64; p += stride)
                    memset(mem + p * page, (int)(++v), page);
            uint64_t h = sum_pages(mem, 64);
            (void)!write(ans[1], &h, sizeof h);
        }
        _exit(0);
    }
    close(cmd[0]);
    close(ans[1]);
    *to = cmd[1];
    *from = ans[0];
    return child;
}

/* A child holding 64 pages answers 's' with a checksum of them and 'w'
 * by rewriting them; a restore after 'w' must give back the first
 * checksum, and its memory must read as the snapshot says. */
static void rollback_test(void) {
    int cmd[2], ans[2];
    unsigned char *mem = map(64);
    pid_t child = pager(mem, 0x20, 3, &cmd[1], &ans[0]);
    uint64_t before, after, again;
    (void)!write(cmd[1], "s", 1);
    (void)!read(ans[0], &before, sizeof before);
    pw_process *p;
    int rc = pw_process_open(child, &p);
    if (rc == -EPERM || rc == -EOPNOTSUPP) {
        printf("skip rollback of another process: %s\n", pw_last_error());
    } else {
        CHECK(rc == 0, "pw_process_open = %d", rc);
        uint64_t id = 0;
        OK(pw_process_take(p, &id));
        (void)!write(cmd[1], "w", 1);
        (void)!read(ans[0], &after, sizeof after);
        CHECK(after != before, "the child's writes change its pages");
        pw_process_restore_stats st;
        OK(pw_process_restore(p, id, 0, &st));
        CHECK(st.threads == 1, "threads %llu", (unsigned long long)st.threads);
        CHECK(st.pages_written >= 22, "pages written %llu", (unsigned long long)st.pages_written);
        unsigned char buf[16];
        OK(pw_process_read(p, id, (uint64_t)(uintptr_t)(mem + 5 * page), buf, sizeof buf));
        CHECK(buf[0] == 0x25 && buf[15] == 0x25, "the snapshot reads 0x%x", buf[0]);
        (void)!write(cmd[1], "s", 1);
        (void)!read(ans[0], &again, sizeof again);
        CHECK(again == before, "after the restore the child's pages are as at the snapshot");
        CHECK(pw_process_restore(p, id + 5, 0, NULL) == -ENOENT, "an unknown snapshot is -ENOENT");
        CHECK(pw_process_restore(p, id, 8, NULL) == -EINVAL, "unknown flags are -EINVAL");
        OK(pw_process_restore(p, id, PW_RESTORE_MEMORY_ONLY, &st));
        CHECK(st.threads == 0, "memory only puts back no registers");
        OK(pw_process_drop(p, id));
        pw_process_free(p);
    }
    close(cmd[1]);
    close(ans[0]);
    waitpid(child, NULL, 0);
    CHECK(pw_process_open(child, &p) == -ESRCH, "a reaped child gives -ESRCH");
    munmap(mem, 64 * page);
    printf("rollback of another process ok\n");
}

/* The same child under a reset session: after each 'w' a reset gives back
 * the point's checksum, by the quick path. */
static void session_test(void) {
    int cmd[2], ans[2];
    unsigned char *mem = map(64);
    pid_t child = pager(mem, 0x40, 5, &cmd[1], &ans[0]);
    uint64_t before, after;
    (void)!write(cmd[1], "s", 1);
    (void)!read(ans[0], &before, sizeof before);
    pw_rollback *r;
    int rc = pw_rollback_open(child, &r);
    if (rc == -EPERM || rc == -EOPNOTSUPP) {
        printf("skip reset session: %s\n", pw_last_error());
    } else {
        CHECK(rc == 0, "pw_rollback_open = %d", rc);
        for (int round = 0; round < 10; round++) {
            (void)!write(cmd[1], "w", 1);
            (void)!read(ans[0], &after, sizeof after);
            CHECK(after != before, "round %d: the child's writes change its pages", round);
            pw_rollback_stats st;
            OK(pw_rollback_reset(r, &st));
            CHECK(st.full == 0, "round %d: the quick path", round);
            CHECK(st.pages_written >= 13, "round %d: pages written %llu", round,
                  (unsigned long long)st.pages_written);
            (void)!write(cmd[1], "s", 1);
            (void)!read(ans[0], &after, sizeof after);
            CHECK(after == before, "round %d: after a reset the pages are the point's", round);
            OK(pw_rollback_reset(r, NULL));
        }
        CHECK(pw_rollback_pump(r) >= 0, "pump");
        pw_rollback_free(r);
    }
    close(cmd[1]);
    close(ans[0]);
    waitpid(child, NULL, 0);
    munmap(mem, 64 * page);
    printf("reset session ok\n");
}

struct agent_seen {
    int steps;
    uint64_t last_t_ms;
    int ordered;
    int thp;
};

static void agent_step(void *user, const pw_agent_step *s) {
    struct agent_seen *a = user;
    if (a->steps > 0 && s->t_ms < a->last_t_ms)
        a->ordered = 0;
    a->last_t_ms = s->t_ms;
    a->thp += s->thp_stepped;
    a->steps++;
}

static void read_line(const char *path, char *buf, size_t n) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(buf, (int)n, f))
            buf[0] = 0;
        fclose(f);
    }
}

/* The node agent runs its steps, hands each over in order and puts KSM's
 * run back as it was; a configuration without a selector is -EINVAL. */
static void agent_test(const char *dir) {
    if (geteuid() != 0 || access("/sys/kernel/mm/ksm/run", F_OK) != 0) {
        printf("SKIP agent: the node agent needs root and KSM\n");
        return;
    }
    char cfg[4200], before[64], after[64];
    mkdir(dir, 0700);
    snprintf(cfg, sizeof cfg, "%s/agent.toml", dir);
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL, "writing %s", cfg);
    if (!f)
        return;
    fputs("interval_ms = 200\nwindow_ms = 50\nlisten = \"127.0.0.1:0\"\n"
          "[thp]\nenabled = false\n[[select]]\nall_containers = true\n",
          f);
    fclose(f);
    read_line("/sys/kernel/mm/ksm/run", before, sizeof before);
    struct agent_seen seen = {0, 0, 1, 0};
    uint64_t made = 0;
    OK(pw_agent_run(cfg, 3, 30.0, agent_step, &seen, &made));
    CHECK(made == 3 && seen.steps == 3, "3 steps made and handed over (%llu, %d)",
          (unsigned long long)made, seen.steps);
    CHECK(seen.ordered, "the steps come in order of time");
    CHECK(seen.thp == 0, "the huge-page agent is disabled, yet stepped %d times", seen.thp);
    read_line("/sys/kernel/mm/ksm/run", after, sizeof after);
    CHECK(strcmp(before, after) == 0, "KSM's run put back (%s, now %s)", before, after);
    f = fopen(cfg, "w");
    if (f) {
        fputs("[[select]]\n", f);
        fclose(f);
    }
    CHECK(pw_agent_run(cfg, 1, 30.0, NULL, NULL, NULL) == -EINVAL,
          "a configuration without a selector is refused");
    CHECK(strstr(pw_last_error(), "exactly one of") != NULL, "and the fault named: %s",
          pw_last_error());
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    page = pw_page_size();
    char dir[4096];
    const char *only = getenv("PW_TEST_BACKEND");
    for (uint32_t b = PW_BACKEND_UFFD_WP; b <= PW_BACKEND_HASH; b++)
        if (!only || atoi(only) == (int)b)
            model_run(b);
    store_test();
    tracker_test();
    error_test();
    snprintf(dir, sizeof dir, "%s/disk", argv[1]);
    disk_test(dir);
    snprintf(dir, sizeof dir, "%s/process", argv[1]);
    process_test(dir);
    rollback_test();
    session_test();
    snprintf(dir, sizeof dir, "%s/live", argv[1]);
    live_test(dir);
    snprintf(dir, sizeof dir, "%s/agent", argv[1]);
    agent_test(dir);
    printf("%s\n", failures ? "FAILED" : "all C API checks passed");
    return failures ? 1 : 0;
}
