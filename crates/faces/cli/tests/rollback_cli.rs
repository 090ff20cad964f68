//! `pagewise snapshot serve` end to end: a target (`rollback.c`, which
//! checks its own registers across every read) reset by requests on
//! stdin answers an input after each reset as it did the first time; bad
//! requests are answered and the next is read; SIGTERM ends the command
//! between requests and leaves the target running, unregistered.

#[macro_use]
mod support;
use pagewise_testkit::Piped;
use support::*;

/// A fresh store `name` holding one snapshot of `pid`, taken once it
/// waits in `read`.
fn snapshot_into(name: &str, pid: i32) -> std::path::PathBuf {
    let store = temp_dir(name);
    let _ = std::fs::remove_dir_all(&store);
    pagewise_testkit::settle_in_read(pid);
    let out = Command::new(BIN)
        .args(["snapshot", "--pid", &pid.to_string(), "--out"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: snapshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    store
}

fn json(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

#[test]
fn serve_resets_a_target_to_its_snapshot_on_request() {
    need_support!();
    let Some(path) = rollback_target() else {
        return;
    };
    let mut t = Piped::start(&mut Command::new(path));
    assert!(t.line().starts_with("ready"));
    t.ask("w 32 1");
    let mut s = Piped::start(Command::new(BIN).args([
        "snapshot",
        "serve",
        "--pid",
        &t.child.id().to_string(),
    ]));
    let hello = json(&s.line());
    assert_eq!(hello["serving"], t.child.id());
    t.settle_in_read();
    let take = json(&s.ask("take"));
    assert_eq!(take["schema"], 1);
    let id = take["take"]["id"].as_u64().unwrap();
    let first = t.ask("w 100 7");
    assert!(first.contains("bad=0"), "{first}");
    for round in 0..5 {
        t.ask(&format!("w {} {}", 10 + round, 99 + round));
        t.settle_in_read();
        let r = json(&s.ask(&format!("restore {id}")));
        assert_eq!(r["restore"]["id"], id, "{r}");
        assert_eq!(r["restore"]["report"]["threads"], 1, "{r}");
        assert_eq!(
            t.ask("w 100 7"),
            first,
            "round {round}: the same input after a reset"
        );
    }
    let bad = json(&s.ask("restore banana"));
    assert_eq!(bad["class"], "bad-input", "{bad}");
    let missing = json(&s.ask("restore 99"));
    assert!(
        missing["error"]
            .as_str()
            .unwrap()
            .contains("no snapshot 99"),
        "{missing}"
    );
    assert_eq!(json(&s.ask("list"))["snapshots"], serde_json::json!([id]));
    // SIGTERM ends it; the target runs on, with nothing registered.
    // SAFETY: kill of our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let st = s.child.wait().unwrap();
    assert_eq!(st.code(), Some(0), "{st:?}");
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", t.child.id())).unwrap();
    assert!(
        !smaps
            .lines()
            .any(|l| l.starts_with("VmFlags:") && l.contains(" uw")),
        "a mapping is still registered for write-protect"
    );
    assert!(t.ask("c").contains("bad=0"));
}

/// `snapshot serve --session`: the point answered as a take at once,
/// each `reset` puts the target back there by the quick path (its answer
/// to the same input the same each time, registers checked by the target),
/// a mapping made since takes the whole path and says so, requests outside
/// a session are refused, and SIGTERM lets the target go, unregistered.
#[test]
fn serve_session_resets_a_target_to_its_point() {
    need_support!();
    let Some(path) = rollback_target() else {
        return;
    };
    let mut t = Piped::start(&mut Command::new(path));
    assert!(t.line().starts_with("ready"));
    t.settle_in_read();
    let mut s = Piped::start(Command::new(BIN).args([
        "snapshot",
        "serve",
        "--session",
        "--pid",
        &t.child.id().to_string(),
    ]));
    assert_eq!(json(&s.line())["serving"], t.child.id());
    let point = json(&s.line())["take"]["id"].as_u64().unwrap();
    let first = t.ask("w 100 7");
    assert!(first.contains("bad=0"), "{first}");
    for round in 0..20 {
        t.settle_in_read();
        let r = json(&s.ask("reset"));
        assert_eq!(r["reset"]["full"], serde_json::Value::Null, "{r}");
        assert!(r["reset"]["pages_written"].as_u64().unwrap() >= 100, "{r}");
        assert_eq!(t.ask("w 100 7"), first, "round {round}");
    }
    t.ask("m");
    t.settle_in_read();
    let r = json(&s.ask("reset"));
    assert_eq!(r["reset"]["full"], "the layout changed", "{r}");
    assert_eq!(t.ask("w 100 7"), first, "after the whole path");
    let refused = json(&s.ask("take"));
    assert_eq!(refused["class"], "bad-input", "{refused}");
    assert_eq!(
        json(&s.ask("list"))["snapshots"],
        serde_json::json!([point])
    );
    // SAFETY: kill of our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let st = s.child.wait().unwrap();
    assert_eq!(st.code(), Some(0), "{st:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", t.child.id())).unwrap();
    assert!(status.contains("TracerPid:\t0"), "let go: {status}");
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", t.child.id())).unwrap();
    assert!(
        !smaps
            .lines()
            .any(|l| l.starts_with("VmFlags:") && l.contains(" uw")),
        "a mapping is still registered for write-protect"
    );
    assert!(t.ask("c").contains("bad=0"));
}

/// `snapshot --pid P --out DIR` records the layout and threads with the
/// pages (store format 3); `snapshot restore DIR --pid P` puts them back:
/// the target answers as it did right after the snapshot. `extract`
/// writes the snapshot's bytes of a range, which then equal the
/// restored memory.
#[test]
fn a_stored_snapshot_is_restored_and_extracted_from_the_command_line() {
    need_support!();
    let Some(path) = rollback_target() else {
        return;
    };
    let mut t = Piped::start(&mut Command::new(path));
    let ready = t.line();
    let big = ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("big=0x"))
        .map(|h| u64::from_str_radix(h, 16).unwrap())
        .unwrap();
    let pid = t.child.id().to_string();
    let dir = temp_dir("rollback-cli-store");
    t.ask("w 20 1");
    t.settle_in_read();
    let out = ok(Command::new(BIN)
        .args(["snapshot", "--pid", &pid, "--json", "--out"])
        .arg(&dir));
    let id = json_lines(&out.stdout)[0]["save"]["id"].as_u64().unwrap();
    let first = t.ask("w 64 2");
    t.ask("m");
    t.settle_in_read();
    let out = ok(Command::new(BIN)
        .args(["snapshot", "restore", "--pid", &pid, "--json"])
        .arg(&dir));
    let r = &json_lines(&out.stdout)[0]["restored"];
    assert_eq!(r["id"], id, "{r}");
    assert_eq!(r["report"]["threads"], 1, "{r}");
    assert_eq!(t.ask("w 64 2"), first, "the same input after the restore");
    // Extract 16 pages of the big buffer and compare with memory, which
    // after another restore is the snapshot's.
    ok(Command::new(BIN)
        .args(["snapshot", "restore", "--pid", &pid])
        .arg(&dir));
    t.settle_in_read();
    let file = dir.with_extension("raw");
    let range = format!("{:x}-{:x}", big, big + 16 * PAGE);
    let out = ok(Command::new(BIN)
        .args(["snapshot", "extract", "--json", "--range", &range, "--out"])
        .arg(&file)
        .arg(&dir)
        .arg(id.to_string()));
    assert_eq!(json_lines(&out.stdout)[0]["extracted"]["bytes"], 16 * PAGE);
    let bytes = std::fs::read(&file).unwrap();
    let mut mem = vec![0u8; bytes.len()];
    use std::os::unix::fs::FileExt;
    std::fs::File::open(format!("/proc/{pid}/mem"))
        .unwrap()
        .read_exact_at(&mut mem, big)
        .unwrap();
    assert!(
        bytes == mem,
        "the extracted bytes are the restored memory's"
    );
    // As an ELF core: a LOAD segment per region, one thread's registers,
    // and the big buffer's bytes at its address.
    let core = dir.with_extension("core");
    ok(Command::new(BIN)
        .args(["snapshot", "extract", "--core", "--out"])
        .arg(&core)
        .arg(&dir)
        .arg(id.to_string()));
    let elf = std::fs::read(&core).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF");
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    let (phoff, phnum) = (u64_at(32) as usize, u16_at(56));
    let mut covered = false;
    for k in 0..phnum {
        let h = phoff + k * 56;
        let kind = u32::from_le_bytes(elf[h..h + 4].try_into().unwrap());
        let (off, vaddr, size) = (u64_at(h + 8), u64_at(h + 16), u64_at(h + 32));
        if kind == 1 && vaddr <= big && big + 16 * PAGE <= vaddr + size {
            let at = (off + big - vaddr) as usize;
            assert!(
                elf[at..at + mem.len()] == mem[..],
                "the core's bytes at the big buffer"
            );
            covered = true;
        }
    }
    assert!(covered, "a LOAD segment holds the big buffer");
    if let Some(readelf) = which("readelf") {
        let notes = ok(Command::new(readelf).arg("-n").arg(&core));
        let text = String::from_utf8_lossy(&notes.stdout);
        assert_eq!(text.matches("NT_PRSTATUS").count(), 1, "{text}");
    }
    let _ = std::fs::remove_file(&core);
    // A range outside the snapshot is a usage error.
    let st = Command::new(BIN)
        .args(["snapshot", "extract", "--range", "1000-2000", "--out"])
        .arg(&file)
        .arg(&dir)
        .arg(id.to_string())
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&file);
}

/// Regression: a process that keeps a SIGTRAP blocked and pending for its
/// whole life was refused every restore with "a signal arrived before
/// each of 200 tries ... try again" (exit 6, for ever): the calls made
/// inside it unblocked SIGTRAP, which then came first each time. It is
/// now snapshotted and restored in full, and its SIGTRAP is still blocked
/// and pending afterwards (never delivered by pagewise).
#[test]
fn a_process_with_a_sigtrap_pending_for_ever_is_restored() {
    need_support!();
    let mut t = Piped::start(&mut Command::new(c_program("trap_pending")));
    assert_eq!(t.line(), "ready");
    let pid = t.pid().to_string();
    let store = snapshot_into("trap-pending", t.pid());
    let first = t.ask("x");
    assert!(first.ends_with("pending 1"), "{first}");
    pagewise_testkit::settle_in_read(t.pid());
    let out = Command::new(BIN)
        .args(["snapshot", "restore", "--pid", &pid])
        .arg(&store)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "restore ({:?}): {err}",
        out.status.code()
    );
    let r = String::from_utf8_lossy(&out.stdout);
    assert!(r.contains("registers of 1 thread"), "in full: {r}");
    let after = t.ask("x");
    assert!(
        after.ends_with("pending 1"),
        "the SIGTRAP is still pending: {after}"
    );
}

/// `--respect-seccomp` on a process whose filter refuses `userfaultfd`
/// (323) alone: restored in full (registers too), with nothing said of
/// tracking (one restore tracks nothing); whose filter also refuses
/// `sigaltstack` (131), which a
/// full restore needs: refused with the call named once (exit 3), and
/// restored memory-only when asked, the reason said once.
#[test]
fn respected_filters_refuse_only_what_needs_a_refused_call_said_once() {
    need_support!();
    let sleeper = c_program("refuse_calls");
    for (calls, full) in [("323", true), ("323,131", false)] {
        let mut child = Command::new(&sleeper)
            .args([calls, "sleep", "60"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let t0 = std::time::Instant::now();
        while !std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() == "sleep")
        {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{calls}: refuse_calls did not exec sleep within 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let store = temp_dir(&format!("respect-{calls}"));
        let _ = std::fs::remove_dir_all(&store);
        let pw = |args: &[&str]| {
            Command::new(BIN)
                .arg("--respect-seccomp")
                .args(args)
                .arg(&store)
                .args(["--pid", &pid.to_string()])
                .output()
                .unwrap()
        };
        let out = pw(&["snapshot", "--out"]);
        assert!(out.status.success(), "{calls}: snapshot: {out:?}");
        let out = pw(&["snapshot", "restore"]);
        let err = String::from_utf8_lossy(&out.stderr);
        if full {
            assert_eq!(out.status.code(), Some(0), "{calls}: {err}");
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                said.contains("registers of 1 thread"),
                "{calls}: in full: {said}"
            );
            assert_eq!(
                err.matches("writes are not tracked").count(),
                0,
                "{calls}: one restore tracks nothing: {err}"
            );
        } else {
            assert_eq!(out.status.code(), Some(3), "{calls}: refused: {err}");
            assert_eq!(
                err.matches("they answer the sigaltstack call").count(),
                1,
                "{calls}: the refused call named once: {err}"
            );
            let out = pw(&["snapshot", "restore", "--memory-only"]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "{calls}: memory-only: {err}");
            assert_eq!(
                err.matches("they answer the sigaltstack call").count(),
                1,
                "{err}"
            );
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A restore of one process leaves its shared memory as it is (it would
/// change it under every other process that maps it): after a snapshot,
/// the program writes its `MAP_SHARED` page and its private ones; a full
/// restore, and a memory-only restore of the same program in seccomp's
/// strict mode (nothing can be done inside it), put the private pages back
/// and leave the shared one. The strict one's maps read as before. Before:
/// the full restore put the shared page back too, and the memory-only one
/// was refused, exit 1, "its mappings changed since snapshot 1
/// (0x…+0x1000 is not mapped private and writable)", naming the shared
/// page, while its maps had not changed.
#[test]
fn a_restore_of_one_process_leaves_its_shared_memory() {
    need_support!();
    for mode in ["full", "strict"] {
        let mut t = Piped::start(Command::new(c_program("shared_page")).args([mode]));
        assert_eq!(t.line(), "ready", "{mode}");
        assert_eq!(t.ask("g"), "shared 1 private 1", "{mode}");
        let pid = t.pid().to_string();
        let maps = || std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let store = snapshot_into(&format!("shared-page-{mode}"), t.pid());
        assert_eq!(t.ask("w"), "shared 2 private 2", "{mode}");
        let before = maps();
        pagewise_testkit::settle_in_read(t.pid());
        let mut restore = Command::new(BIN);
        restore
            .args(["snapshot", "restore", "--pid", &pid])
            .arg(&store);
        if mode == "strict" {
            restore.arg("--memory-only");
        }
        let out = restore.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{mode}: restore: {err}");
        if mode == "strict" {
            assert_eq!(maps(), before, "strict: its maps, before and after");
        }
        assert_eq!(
            t.ask("g"),
            "shared 2 private 1",
            "{mode}: private pages put back, the shared one left"
        );
        let _ = std::fs::remove_dir_all(&store);
    }
}

/// Regression: a restore put back the offset of every regular file open
/// at both times, also one whose open file description another process
/// holds: a test harness's output file, inherited by the program it
/// started. The harness's next line then overwrote its earlier ones (in
/// CI's test log, lines of other tests went missing). Such an offset is
/// that process's too, and is left; a file of the program's own still
/// gets its offset back.
#[test]
fn a_restore_leaves_the_offset_of_a_file_another_process_shares() {
    need_support!();
    use std::io::Write;
    let path = temp_dir("shared-offset.txt");
    let mut mine = std::fs::File::create(&path).unwrap();
    let mut child = pagewise_testkit::shell_writing_to(
        "exec 4</proc/self/exe; echo ready; read x; head -c 100 <&4 >/dev/null; echo moved; read y",
        &mine,
    );
    let pid = child.id() as i32;
    let text = || std::fs::read_to_string(&path).unwrap();
    let wait_for = |what: &str| pagewise_testkit::wait_in_file(&path, what, 1, || {});
    wait_for("ready\n");
    let store = snapshot_into("shared-offset", pid);
    mine.write_all(b"from the test\n").unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"x\n").unwrap();
    wait_for("moved\n");
    let pos4 = || {
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/4")).unwrap();
        pagewise_mech::procfs::parse_fdinfo(&info).unwrap().0
    };
    assert!(pos4() > 0, "head moved descriptor 4's offset");
    pagewise_testkit::settle_in_read(pid);
    let out = Command::new(BIN)
        .args(["snapshot", "restore", "--pid", &pid.to_string()])
        .arg(&store)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(pos4(), 0, "its own file's offset put back");
    mine.write_all(b"after\n").unwrap();
    assert_eq!(
        text(),
        "ready\nfrom the test\nmoved\nafter\n",
        "the shared file's offset is left where the test's writes put it"
    );
    assert!(
        said.contains("offset put back: 4 (file")
            && said.contains("offset left (another process holds it too): 1 (file"),
        "{said}"
    );
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&store);
    let _ = std::fs::remove_file(&path);
}
