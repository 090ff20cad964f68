/*
 * pagewise from C: dirty tracking, snapshots with restore, the page store and
 * a durable store, each checked against a shadow copy.
 *
 * Build and run (from the repository root):
 *
 *   cargo build --release
 *   cc -O2 -Wall -o snapshot examples/snapshot.c -Iinclude -Ltarget/release \
 *      -lpagewise -Wl,-rpath,"$PWD/target/release" && ./snapshot
 *
 * It prints what it did and exits 0 when every check passed, 1 otherwise.
 * Give a directory as the first argument to keep the durable store there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pagewise.h"

#define PAGES 256

static int failures;

/* Reports a failed call with its errno value and message, and exits. */
static void check(int rc, const char *what) {
    if (rc < 0) {
        fprintf(stderr, "%s failed: %s (%s)\n", what, strerror(-rc), pw_last_error());
        exit(1);
    }
}

static void expect(int ok, const char *what) {
    printf("%-58s %s\n", what, ok ? "ok" : "MISMATCH");
    if (!ok)
        failures++;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Writes one byte into `n` pages chosen by `seed`. */
static void scribble(unsigned char *mem, size_t page, unsigned seed, int n) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        mem[(seed >> 8) % PAGES * page + (seed >> 4) % page] = (unsigned char)(seed >> 24) | 1;
    }
}

int main(int argc, char **argv) {
    size_t page = pw_page_size();
    size_t len = PAGES * page;
    unsigned char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *shadow = malloc(len);
    if (mem == MAP_FAILED || !shadow) {
        perror("memory");
        return 1;
    }
    /* Half the pages hold the same content, a quarter stay zero. */
    for (size_t p = 0; p < PAGES; p++)
        if (p % 4 != 3)
            memset(mem + p * page, p % 2 ? 0x5a : (int)(p & 0xff) | 1, page);
    pw_region region = {(uint64_t)(uintptr_t)mem, len};
    printf("pagewise %s, page size %zu, %d pages\n", pw_version(), page, PAGES);

    /* 1. Dirty tracking: exactly the pages written are reported. */
    pw_tracker *t;
    check(pw_tracker_new(&region, 1, PW_BACKEND_AUTO, &t), "pw_tracker_new");
    mem[3 * page] = 1;
    mem[4 * page + 7] = 2;
    mem[100 * page] = 3;
    const pw_range *ranges;
    size_t n;
    pw_collect_stats cs;
    check(pw_tracker_collect(t, PW_CONSUMER_DEFAULT, &ranges, &n, &cs), "pw_tracker_collect");
    printf("tracker (%s): %zu ranges, %llu dirty pages\n", pw_backend_name(pw_tracker_backend(t)), n,
           (unsigned long long)cs.pages_dirty);
    expect(n == 2 && ranges[0].start == region.start + 3 * page && ranges[0].pages == 2 &&
               ranges[1].start == region.start + 100 * page && ranges[1].pages == 1,
           "tracker reports pages 3-4 and 100");
    pw_tracker_free(t);

    /* 2. Snapshots: take, change, restore; memory must match the shadow. */
    pw_snapshots *s;
    check(pw_snapshots_new(&region, 1, PW_BACKEND_AUTO, 1, &s), "pw_snapshots_new");
    uint64_t base, later;
    check(pw_snapshots_take(s, &base), "pw_snapshots_take");
    memcpy(shadow, mem, len);
    scribble(mem, page, 1, 40);
    check(pw_snapshots_take(s, &later), "pw_snapshots_take");
    pw_snapshot_info info;
    check(pw_snapshots_info(s, later, &info), "pw_snapshots_info");
    printf("second snapshot read %llu of %llu pages\n", (unsigned long long)info.pages_read,
           (unsigned long long)info.pages);
    check(pw_snapshots_diff(s, base, later, &ranges, &n), "pw_snapshots_diff");
    size_t differ = 0, really = 0;
    for (size_t i = 0; i < n; i++)
        differ += ranges[i].pages;
    for (size_t p = 0; p < PAGES; p++)
        really += memcmp(mem + p * page, shadow + p * page, page) != 0;
    expect(differ == really, "diff counts exactly the pages that changed");
    scribble(mem, page, 2, 40);
    pw_restore_stats rs;
    check(pw_snapshots_restore(s, base, &rs), "pw_snapshots_restore");
    printf("restore wrote %llu pages in %.3f ms\n", (unsigned long long)rs.pages_written,
           rs.elapsed_ns / 1e6);
    expect(memcmp(mem, shadow, len) == 0, "restore brings memory back byte for byte");
    unsigned char byte;
    check(pw_snapshots_read(s, base, region.start + 5 * page + 9, &byte, 1), "pw_snapshots_read");
    expect(byte == shadow[5 * page + 9], "read from a snapshot sees its bytes");
    pw_store_stats ss;
    check(pw_snapshots_store_stats(s, &ss), "pw_snapshots_store_stats");
    printf("page store: %llu unique pages for %llu references, %llu zero pages\n",
           (unsigned long long)ss.unique_pages, (unsigned long long)ss.referenced_pages,
           (unsigned long long)ss.zero_pages);

    /* 3. Durable store: save, then load into other memory and restore there. */
    char tmp[] = "/tmp/pagewise-example-XXXXXX";
    const char *dir = argc > 1 ? argv[1] : mkdtemp(tmp);
    pw_disk *d;
    check(pw_disk_create(dir, 1, &d), "pw_disk_create");
    pw_save_stats sv;
    check(pw_snapshots_save(s, base, d, "base", &sv), "pw_snapshots_save");
    printf("saved snapshot %llu to %s: %llu pages, %llu new, %llu bytes of pack\n",
           (unsigned long long)sv.id, dir, (unsigned long long)sv.pages,
           (unsigned long long)sv.pages_new, (unsigned long long)sv.pack_bytes);
    unsigned char *other = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pw_region oregion = {(uint64_t)(uintptr_t)other, len};
    pw_snapshots *o;
    check(pw_snapshots_new(&oregion, 1, PW_BACKEND_AUTO, 1, &o), "pw_snapshots_new");
    uint64_t loaded;
    check(pw_snapshots_load(o, d, sv.id, &loaded), "pw_snapshots_load");
    check(pw_snapshots_restore(o, loaded, NULL), "pw_snapshots_restore");
    expect(memcmp(other, shadow, len) == 0, "loaded snapshot restores into other memory");

    /* 4. Errors are negative errno values with a message. */
    int rc = pw_snapshots_restore(s, 12345, NULL);
    printf("restoring a snapshot that does not exist: %d (%s)\n", rc, pw_last_error());
    expect(rc == -ENOENT && strstr(pw_last_error(), "12345") != NULL, "bad id gives -ENOENT and says which");

    pw_snapshots_free(o);
    pw_disk_free(d);
    pw_snapshots_free(s);
    if (argc <= 1)
        nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    munmap(other, len);
    munmap(mem, len);
    free(shadow);
    printf("%s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
