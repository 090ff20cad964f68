//! Whole containers as targets: a container of several processes that
//! count together in memory they share, snapshotted at one instant each
//! time (its cgroup frozen while every thread is seized), checked against
//! the relations the program keeps between its processes' memories.

#[macro_use]
mod support;
use pagewise::snap::{DiskSnapshot, DiskStore};
use pagewise_testkit::container::{podman_missing, Container};
use support::*;

fn tmp() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// The page at `addr` in snapshot `s` of `disk`.
fn page_at(disk: &DiskStore, s: &DiskSnapshot, addr: u64) -> Vec<u8> {
    let mut i = 0u64;
    for r in &s.regions {
        if addr >= r.start && addr < r.end() {
            let k = (i + (addr - r.start) / PAGE) as usize;
            let mut out = vec![0u8; PAGE as usize];
            disk.read_page(s.entries[k], &mut out).unwrap();
            return out;
        }
        i += r.pages();
    }
    panic!("snapshot {} has no page at {addr:#x}", s.id);
}

/// The shared page's and the own page's addresses the program says first
/// (`ready shared=ADDR mine=ADDR`).
fn addresses(ready: &str) -> (u64, u64) {
    let addr = |key: &str| {
        let v = ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("{key} in {ready:?}"));
        u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap()
    };
    (addr("shared="), addr("mine="))
}

fn word(p: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(p[i * 8..i * 8 + 8].try_into().unwrap())
}

/// Checks one group of snapshots (a snapshot per process) against the
/// program's relations; `Err` says which one broke.
fn check_group(disk: &DiskStore, ids: &[u64], shared: u64, mine: u64) -> Result<u64, String> {
    let snaps: Vec<DiskSnapshot> = ids.iter().map(|&id| disk.load(id).unwrap()).collect();
    let first = page_at(disk, &snaps[0], shared);
    for s in &snaps[1..] {
        if page_at(disk, s, shared) != first {
            return Err(format!(
                "the shared page differs between snapshots {} and {}",
                snaps[0].id, s.id
            ));
        }
    }
    let total = word(&first, 0);
    let slots: Vec<u64> = (1..=4).map(|i| word(&first, i)).collect();
    let sum: u64 = slots.iter().sum();
    if !(sum..=sum + 4).contains(&total) {
        return Err(format!("total {total} against slots {slots:?}"));
    }
    let mut seen = Vec::new();
    for s in &snaps {
        let p = page_at(disk, s, mine);
        let (count, index) = (word(&p, 0), word(&p, 1));
        if index == 0 {
            continue;
        }
        let slot = slots[(index - 1) as usize];
        if count != slot && count != slot + 1 {
            return Err(format!(
                "process {index} (snapshot {}) counts {count}, its slot {slot}",
                s.id
            ));
        }
        seen.push(index);
    }
    seen.sort();
    if seen != [1, 2, 3, 4] {
        return Err(format!("the counting processes found: {seen:?}"));
    }
    Ok(total)
}

/// `count` snapshots, every 20 ms, of the group of `group_counter`
/// processes `selector` names (five), each checked; whether the cgroup was
/// frozen to take them is `frozen`. The pids of the group, the last
/// group's total and the store.
fn group_snapshots_agree(
    selector: &[&str],
    frozen: bool,
    count: usize,
    shared: u64,
    mine: u64,
) -> (Vec<i32>, u64, PathBuf) {
    let store = temp_dir(&format!(
        "group-store-{}",
        selector[0].trim_start_matches('-')
    ));
    let out = Command::new(BIN)
        .arg("snapshot")
        .args(selector)
        .arg("--out")
        .arg(&store)
        .args(["--every-ms", "20", "--count", &count.to_string(), "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines = json_lines(&out.stdout);
    assert_eq!(lines.len(), count, "{err}");
    let disk = DiskStore::open(&store).unwrap();
    let mut totals = Vec::new();
    let mut pids = Vec::new();
    for (k, l) in lines.iter().enumerate() {
        assert_eq!(
            l["frozen"].is_string(),
            frozen,
            "group {k}: the cgroup frozen to take it: {l}"
        );
        let members = l["members"].as_array().unwrap();
        assert_eq!(members.len(), 5, "group {k}: {l}");
        pids = members
            .iter()
            .map(|m| m["pid"].as_i64().unwrap() as i32)
            .collect();
        let ids: Vec<u64> = members
            .iter()
            .map(|m| m["snapshot"]["save"]["id"].as_u64().unwrap())
            .collect();
        match check_group(&disk, &ids, shared, mine) {
            Ok(t) => totals.push(t),
            Err(why) => panic!("group {k} (snapshots {ids:?}) is not of one instant: {why}"),
        }
    }
    // Counted on between snapshots: never back, and on over the series
    // (two snapshots 20 ms apart may both fall before the processes ran
    // again on a loaded machine).
    assert!(
        totals.windows(2).all(|w| w[0] <= w[1]) && totals.first() < totals.last(),
        "the processes counted on between snapshots: {totals:?}"
    );
    // A series reads, after the first snapshot, only what each process
    // wrote since: its shared page and its own counting page, a few more
    // of the C library's and its stack's (at most 16), fewer than the
    // first, which reads all that memory holds (about 20: holes are not
    // read, so the first is no longer hundreds).
    let read = |k: usize| -> Vec<u64> {
        lines[k]["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["snapshot"]["pages_read"].as_u64().unwrap())
            .collect()
    };
    let (first, last) = (read(0), read(count - 1));
    for (f, l) in first.iter().zip(&last) {
        assert!(
            *l <= 16 && l < f,
            "pages read: first {first:?}, last {last:?}"
        );
    }
    println!(
        "ok   {count} snapshots of {} ({}), each of one instant (totals {} .. {}); pages read per process first {first:?}, last {last:?}",
        selector.join(" "),
        if frozen {
            "frozen"
        } else {
            "stopped one by one, held together"
        },
        totals[0],
        totals[count - 1]
    );
    (pids, totals[count - 1], store)
}

/// `track --container`: a line per process and collection, each naming
/// the process's pid inside and its container; every counting process
/// wrote exactly its own page in every interval (the shared page is not
/// private memory, which is what is tracked).
fn track_the_group(name: &str, mine: u64) {
    let out = ok(Command::new(BIN).args([
        "track",
        "--container",
        name,
        "--json",
        "--interval-ms",
        "200",
        "--count",
        "3",
    ]));
    let lines = json_lines(&out.stdout);
    assert_eq!(
        lines.len(),
        15,
        "a line per process and collection: {lines:?}"
    );
    let mut counting = std::collections::BTreeSet::new();
    for l in &lines {
        assert_eq!(l["backend"], "uffd-wp", "{l}");
        assert_eq!(l["container"]["runtime"], "podman", "{l}");
        let ns = l["ns_pid"].as_i64().unwrap();
        if ns == 1 {
            continue;
        }
        let mut pages: Vec<u64> = Vec::new();
        for r in l["ranges"].as_array().unwrap() {
            for i in 0..r[1].as_u64().unwrap() {
                pages.push(r[0].as_u64().unwrap() + i * PAGE);
            }
        }
        pages.sort();
        // The shared page is not private memory: not tracked.
        assert_eq!(pages, [mine], "process {ns} inside wrote: {l}");
        counting.insert(l["pid"].as_i64().unwrap());
    }
    assert_eq!(
        counting.len(),
        4,
        "the counting processes tracked: {counting:?}"
    );
    println!("ok   track --container: 5 processes, each counting one wrote exactly its own page");
}

/// 100 snapshots of a container of five processes (four counting, one
/// reading commands) taken with `--container`, every 20 ms: in each, the
/// page the processes share is the same in every process's snapshot and
/// the counts agree; the cgroup was frozen to take them. Snapshots taken
/// one process at a time (`--pid`, one after another) do not agree: the
/// check can fail. The program's own check passes afterwards, and its
/// seccomp filters are as they were.
#[test]
fn a_containers_snapshots_agree_across_its_processes() {
    need_support!();
    if let Some(why) = podman_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let prog = c_program("group_counter");
    let mut c = Container::start(
        tmp(),
        prog.parent().unwrap(),
        prog.file_name().unwrap().to_str().unwrap(),
        &[],
    );
    let (shared, mine) = addresses(&c.ready);
    track_the_group(&c.name, mine);
    let (pids, last, store) =
        group_snapshots_agree(&["--container", &c.name], true, 100, shared, mine);
    // --live: each process copied while the group runs, then the group
    // frozen at one instant for what it wrote meanwhile: of one instant
    // still, the stop reading far fewer pages than the pre-copy did.
    for round in 0..5 {
        let live = temp_dir("container-live-store");
        let out = ok(Command::new(BIN)
            .args([
                "snapshot",
                "--container",
                &c.name,
                "--live",
                "--json",
                "--out",
            ])
            .arg(&live));
        let l = &json_lines(&out.stdout)[0];
        let members = l["members"].as_array().unwrap();
        let ids: Vec<u64> = members
            .iter()
            .map(|m| m["snapshot"]["save"]["id"].as_u64().unwrap())
            .collect();
        let disk = DiskStore::open(&live).unwrap();
        if let Err(why) = check_group(&disk, &ids, shared, mine) {
            panic!("--live round {round} (snapshots {ids:?}) is not of one instant: {why}");
        }
        let pre = l["precopy_pages_read"].as_u64().unwrap();
        let at_stop: u64 = members
            .iter()
            .map(|m| m["snapshot"]["pages_read"].as_u64().unwrap())
            .sum();
        // At the stop, what each process wrote since the pre-copy (at
        // most 16 pages each, as above), fewer than the pre-copy read.
        assert!(
            at_stop <= 16 * members.len() as u64 && at_stop < pre,
            "pages read: pre-copy {pre}, at the stop {at_stop}"
        );
        if round == 0 {
            println!(
                "ok   --live: of one instant, pre-copy {pre} pages, {at_stop} at the stop ({} ms)",
                l["stopped_ms"]
            );
        }
        let _ = std::fs::remove_dir_all(&live);
    }
    // --live --to: the group taken at one instant, each process's snapshot
    // migrated to a receiver on loopback, of one instant there too.
    let there = temp_dir("container-received-store");
    let (mut rx, mut rx_out, addr) = start_receiver(&there, &[]);
    ok(Command::new(BIN).args([
        "snapshot",
        "--container",
        &c.name,
        "--live",
        "--json",
        "--to",
        &addr,
    ]));
    for _ in 0..5 {
        let l = pagewise_testkit::line_within(&mut rx_out, rx.id() as i32).unwrap_or_default();
        assert!(l.contains("saved"), "{l}");
    }
    pagewise_sys::process::kill(rx.id() as i32, libc::SIGTERM).unwrap();
    assert!(rx.wait().unwrap().success());
    let disk = DiskStore::open(&there).unwrap();
    let ids = disk.ids().unwrap();
    assert_eq!(ids.len(), 5, "one snapshot a process received");
    if let Err(why) = check_group(&disk, &ids, shared, mine) {
        panic!("the received snapshots {ids:?} are not of one instant: {why}");
    }
    let _ = std::fs::remove_dir_all(&there);
    println!("ok   --live --to: five snapshots received, of one instant");
    // One process at a time: the shared page moves on between them.
    let apart = temp_dir("container-apart-store");
    let mut disagreed = 0;
    for _ in 0..5 {
        let mut ids = Vec::new();
        for pid in &pids {
            let out = ok(Command::new(BIN)
                .args(["snapshot", "--pid", &pid.to_string(), "--json", "--out"])
                .arg(&apart));
            let v = &json_lines(&out.stdout)[0];
            ids.push(v["save"]["id"].as_u64().unwrap());
        }
        let disk = DiskStore::open(&apart).unwrap();
        if check_group(&disk, &ids, shared, mine).is_err() {
            disagreed += 1;
        }
    }
    assert!(
        disagreed > 0,
        "snapshots taken one process at a time agreed 5 times of 5: the check cannot tell"
    );
    println!("ok   taken one process at a time, {disagreed} of 5 groups disagree");
    let total = |said: String| -> u64 {
        said.strip_prefix("ok total=")
            .unwrap_or_else(|| panic!("the program's check: {said}"))
            .parse()
            .unwrap()
    };
    // A second of counting, then the whole container put back to its last
    // snapshot: its counts go back, and agree (the shared page with them).
    std::thread::sleep(Duration::from_secs(1));
    let before = total(c.p.ask("check"));
    let out = ok(Command::new(BIN)
        .args(["snapshot", "restore"])
        .arg(&store)
        .args(["--container", &c.name, "--json"]));
    let done = &json_lines(&out.stdout)[0]["restored"];
    assert_eq!(done.as_array().unwrap().len(), 5, "{done}");
    for m in done.as_array().unwrap() {
        assert!(m["shared_pages"].as_u64().unwrap() >= 1, "{m}");
        assert!(m["report"]["threads"].as_u64().unwrap() >= 1, "{m}");
    }
    let after = total(c.p.ask("check"));
    assert!(
        (last..before).contains(&after),
        "put back to a total of {last}: the program counts {after} (it had counted {before})"
    );
    println!("ok   the container put back: its total {before} -> {after} (snapshot: {last}), the program's check passes");
    for &pid in &pids {
        assert_eq!(
            pagewise_testkit::userfaultfds(pid),
            0,
            "pid {pid} holds a userfaultfd"
        );
    }
    let _ = std::fs::remove_dir_all(&apart);
    let _ = std::fs::remove_dir_all(&store);
}

/// The same program on the host, in a memory cgroup of its own whose
/// freezer cgroup is the root's (shared with every other process): the
/// group is stopped one process after another, each held until all are,
/// and its snapshots agree all the same.
#[test]
fn a_cgroup_without_a_freezer_of_its_own_is_held_process_by_process() {
    need_support!();
    let group = match pagewise_testkit::host::MemoryCgroup::create(
        &format!("pagewise-group-{}", std::process::id()),
        1 << 30,
    ) {
        Ok(g) => g,
        Err(e) => {
            pagewise_testkit::skip!("no memory cgroup: {e}");
            return;
        }
    };
    let prog = c_program("group_counter");
    let mut p = pagewise_testkit::Piped::start(
        Command::new("sh").args(["-c", &format!("read go; exec {}", prog.display())]),
    );
    group.add(p.pid()).unwrap();
    let ready = p.ask("go");
    let dir = group.dir().to_str().unwrap().to_string();
    let (shared, mine) = addresses(&ready);
    let (_, _, store) = group_snapshots_agree(&["--cgroup", &dir], false, 20, shared, mine);
    let _ = std::fs::remove_dir_all(&store);
    let said = p.ask("check");
    assert!(said.starts_with("ok total="), "{said}");
}

/// Regression: on a v1 host a one-component path under /sys/fs/cgroup (a
/// typo, the v2 layout's path, a directory that does not exist) became
/// `/`, and every command selected the whole node (`agent --check` listed
/// all 114 processes, pid 1 first). Each command now refuses a path that
/// is no cgroup, with the reason, as bad input (exit 2), before it acts.
#[test]
fn a_cgroup_path_that_is_no_cgroup_is_refused_by_every_command() {
    let store = temp_dir("not-a-cgroup");
    let store = store.to_str().unwrap();
    for bad in [
        "/sys/fs/cgroup/system.slice",
        "/sys/fs/cgroup/no-such",
        "/no-such.slice",
    ] {
        if std::path::Path::new(bad).join("cgroup.procs").exists() {
            continue;
        }
        for cmd in [
            &["track", "--count", "1", "--cgroup", bad][..],
            &["snapshot", "--out", store, "--cgroup", bad],
            &["thp", "run", "--cgroup", bad],
            &["dedup", "run", "--cgroup", bad],
        ] {
            let out = Command::new(BIN).args(cmd).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
            assert!(err.contains("is not a cgroup"), "{cmd:?}: {err}");
        }
        let conf = temp_dir("not-a-cgroup-conf").with_extension("toml");
        std::fs::write(&conf, format!("[[select]]\ncgroup = {bad:?}\n")).unwrap();
        let out = Command::new(BIN)
            .args(["agent", "--check", "--config"])
            .arg(&conf)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "agent --check: {err}");
        assert!(err.contains("is not a cgroup"), "agent --check: {err}");
        assert!(
            out.stdout.is_empty(),
            "nothing selected: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
