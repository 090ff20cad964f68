//! Reset sessions (`pagewise_snap::ResetSession`) against ground truth:
//! after resets memory equals the point page for page (read through
//! `/proc/PID/mem`); every answer equals the first answer to the same
//! command, and that of a run of the same program without pagewise; the
//! target's own checks of its registers and thread-local hold
//! (`bad=0`); resets take the quick path unless the layout, the
//! descriptors or the threads changed, and then put those back too; a
//! file's offset is put back on the quick path; workers writing all the
//! time keep whole hash chains; a thread that cannot stop (in a `vfork`)
//! fails the reset but leaves the others running, and its stop is taken
//! later.

use super::*;
use pagewise_snap::ResetSession;

/// `read=XXXXXXXX pos=N` of an answer.
fn read_word(answer: &str) -> String {
    answer
        .split_whitespace()
        .filter(|w| w.starts_with("read=") || w.starts_with("pos="))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn a_session_puts_the_process_back_at_its_point_at_every_reset() {
    let Some(path) = target() else { return };
    let cmds = ["w 16 1", "w 64 2", "w 3 3", "c"];
    // Each command's answer from a run without pagewise: the first
    // command of a fresh target.
    let plain: Vec<String> = cmds
        .iter()
        .map(|c| {
            let mut t = Target::start(&path, &[]);
            t.ask(c)
        })
        .collect();
    let mut t = Target::start(&path, &[]);
    t.settle();
    let mut s = ResetSession::open(t.pid()).unwrap();
    let (mut dirty, mut compared) = (0, 0);
    for round in 0..200usize {
        let i = round % cmds.len();
        let a = t.ask(cmds[i]);
        assert!(a.contains("bad=0"), "round {round}: {a}");
        assert_eq!(a, plain[i], "round {round}: {:?} after resets", cmds[i]);
        t.settle();
        let r = s.reset().unwrap();
        assert_eq!(r.full, None, "round {round}: {r:?}");
        dirty += r.pages_dirty;
        if round % 50 == 49 {
            compared += assert_memory_is(s.snapshots(), s.point(), &t);
        }
    }
    // Each input wrote its pages (and the stack, libc's buffers).
    assert!(dirty >= 50 * (16 + 64 + 3), "{dirty} pages written back");
    println!("ok   200 resets, {dirty} pages written back, {compared} pages compared");
}

#[test]
fn a_changed_layout_or_descriptor_table_takes_the_whole_path() {
    let Some(path) = target() else { return };
    let file = std::env::temp_dir().join(format!("pagewise-session-{}", std::process::id()));
    std::fs::write(&file, "0123456789abcdefghijklmnopqrstuv").unwrap();
    let mut t = Target::start(&path, &[]);
    t.ask(&format!("o {}", file.display()));
    t.settle();
    let mut s = ResetSession::open(t.pid()).unwrap();
    let before = layout(t.pid());
    let first = t.ask("r");
    assert_eq!(read_word(&first), "read=01234567 pos=8");
    t.settle();
    // The offset moved: put back on the quick path.
    assert_eq!(s.reset().unwrap().full, None);
    assert_eq!(t.ask("r"), first, "the read after a reset");
    for (change, why) in [
        ("m", "layout"),
        ("v", "layout"),
        ("b", "layout"),
        ("P", "descriptors"),
        ("k", "descriptors"),
    ] {
        t.settle();
        s.reset().unwrap();
        t.ask(change);
        t.ask("w 5 9");
        t.settle();
        let r = s.reset().unwrap();
        let full = r.full.clone().unwrap_or_default();
        assert!(full.contains(why), "{change:?}: {r:?}");
        assert_eq!(layout(t.pid()), before, "the layout after {change:?}");
        assert_memory_is(s.snapshots(), s.point(), &t);
        assert_eq!(t.ask("r"), first, "the read after undoing {change:?}");
        // And quick again.
        t.settle();
        assert_eq!(s.reset().unwrap().full, None, "after {change:?}");
        println!("ok   {change}: {full}");
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
fn workers_writing_all_the_time_are_reset_with_whole_chains() {
    let Some(path) = target() else { return };
    let mut t = Target::start(&path, &["threads", "3"]);
    // The workers past their start (a thread put back to before glibc
    // registered its rseq area would register it again, which the kernel
    // refuses: that registration is the kernel's, not memory).
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut s = ResetSession::open(t.pid()).unwrap();
    for round in 0..40 {
        std::thread::sleep(std::time::Duration::from_millis(5));
        let r = s.reset().unwrap();
        assert_eq!(r.full, None, "round {round}: {r:?}");
        let a = t.ask("c");
        assert!(
            a.contains("bad=0") && a.contains("chains=ok"),
            "round {round}: {a}"
        );
    }
}

#[test]
fn a_thread_made_between_resets_is_refused_then_the_session_goes_on() {
    let Some(path) = target() else { return };
    let mut t = Target::start(&path, &[]);
    t.settle();
    let mut s = ResetSession::open(t.pid()).unwrap();
    let first = t.ask("c");
    t.ask("t");
    t.settle();
    let e = s.reset().unwrap_err();
    assert!(e.to_string().contains("thread"), "{e}");
    // Its thread ended: the next reset goes through.
    t.ask("x");
    t.settle();
    let r = s.reset().unwrap();
    assert!(r.full.is_none() || r.pages_written > 0, "{r:?}");
    assert_memory_is(s.snapshots(), s.point(), &t);
    assert_eq!(t.ask("c"), first);
}

#[test]
fn a_session_used_from_another_thread_says_so() {
    let Some(path) = target() else { return };
    let mut t = Target::start(&path, &[]);
    t.settle();
    let s = ResetSession::open(t.pid()).unwrap();
    let (s, e) = std::thread::scope(|sc| {
        sc.spawn(move || {
            let mut s = s;
            let e = s.reset().unwrap_err();
            (s, e)
        })
        .join()
        .unwrap()
    });
    assert!(e.to_string().contains("opened it"), "{e}");
    drop(s);
    // Let go whole by its own thread: the target answers.
    assert!(t.ask("c").contains("bad=0"));
}

/// Waits at most `secs` seconds until `ok` holds of the main thread's
/// state letter.
fn until_main(pid: i32, secs: u64, what: &str, ok: impl Fn(&str) -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !ok(&pagewise_testkit::thread_state(pid, pid)) {
        assert!(
            std::time::Instant::now() < until,
            "the main thread never {what}: {}",
            pagewise_testkit::threads_doing(pid)
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The child a target vforked, killed when the test says (or at the end
/// of the test, however it ends).
struct VforkChild(i32);

impl VforkChild {
    /// Ends the child: its parent's vfork returns.
    fn end(&self) {
        // SAFETY: kill of a process this test's target started.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

impl Drop for VforkChild {
    fn drop(&mut self) {
        self.end();
    }
}

/// A target with two workers in a session, its answer at the point, and
/// its main thread in a vfork whose child lives until the test ends it:
/// it waits uninterruptibly meanwhile, and cannot stop.
fn main_in_a_long_vfork() -> Option<(Target, ResetSession, String, VforkChild)> {
    use std::io::Write;
    let path = target()?;
    let mut t = Target::start(&path, &["threads", "2"]);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let pid = t.pid();
    let mut s = ResetSession::open(pid).unwrap();
    s.reset().unwrap();
    let first = t.ask("c");
    writeln!(t.input, "V 600000").unwrap();
    t.input.flush().unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let child = loop {
        let kids = pagewise_mech::procfs::children(pid).unwrap_or_default();
        if let Some(&k) = kids.first() {
            break VforkChild(k);
        }
        assert!(std::time::Instant::now() < until, "no vfork happened");
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    until_main(pid, 30, "waited for its vfork", |s| s == "D");
    Some((t, s, first, child))
}

#[test]
fn a_thread_that_does_not_stop_in_time_leaves_the_others_running() {
    let Some((mut t, mut s, first, child)) = main_in_a_long_vfork() else {
        return;
    };
    let pid = t.pid();
    let e = s.reset().unwrap_err();
    assert!(e.to_string().contains("did not stop in time"), "{e}");
    // The workers run on, not held in a stop.
    let tids = pagewise_testkit::threads(pid);
    assert_eq!(tids.len(), 3, "{tids:?}");
    for &tid in tids.iter().filter(|&&t| t != pid) {
        let st = pagewise_testkit::thread_state(pid, tid);
        assert!(
            st == "R" || st == "S",
            "worker {tid} is {st} after the failed reset"
        );
    }
    // The child ends: the main thread's late stop is taken and it runs
    // on to its answer.
    child.end();
    let vforked = t.line_while(|| {
        s.hand_over_signals().unwrap();
    });
    assert!(vforked.contains("vforked=1"), "{vforked}");
    // The next reset stops every thread and puts the point back.
    t.settle();
    s.reset().unwrap();
    assert_eq!(t.ask("c"), first);
    assert!(
        first.contains("bad=0") && first.contains("chains=ok"),
        "{first}"
    );
}

/// A run that ends (a worker meets a signal that would end the process)
/// while the main thread cannot stop (in a 6 s vfork): the wait fails and
/// the workers run on; the next wait stops them all once the main thread
/// can be, and returns the end; the reset after it puts the point back.
#[test]
fn an_end_whose_others_do_not_stop_in_time_is_returned_by_the_next_wait() {
    use pagewise_mech::stop::RunEnd;
    use std::time::{Duration, Instant};
    let Some((mut t, mut s, first, child)) = main_in_a_long_vfork() else {
        return;
    };
    let pid = t.pid();
    let workers: Vec<i32> = pagewise_testkit::threads(pid)
        .into_iter()
        .filter(|&w| w != pid)
        .collect();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let (ended, other) = (workers[0], workers[1]);
    // SAFETY: tgkill of a thread of a child of this test.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, pid, ended, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let e = s
        .wait_end(Some(Instant::now() + Duration::from_secs(20)))
        .unwrap_err();
    assert!(e.to_string().contains("did not stop in time"), "{e}");
    assert_eq!(pagewise_testkit::thread_state(pid, ended), "t");
    let st = pagewise_testkit::thread_state(pid, other);
    assert!(st == "R" || st == "S", "the other worker is {st}");
    // The vfork over, the next wait returns the end, every thread stopped.
    child.end();
    until_main(pid, 20, "left its vfork", |s| s != "D");
    let end = s
        .wait_end(Some(Instant::now() + Duration::from_secs(20)))
        .unwrap();
    assert_eq!(end, RunEnd::Signal(libc::SIGTERM));
    for tid in [pid, ended, other] {
        assert_eq!(
            pagewise_testkit::thread_state(pid, tid),
            "t",
            "thread {tid}"
        );
    }
    // The vfork child's SIGCHLD, sent while the process was running,
    // comes after the reset: handed over while the answer is awaited.
    s.reset().unwrap();
    let again = t.ask_while("c", || {
        s.hand_over_signals().unwrap();
    });
    assert_eq!(again, first);
    assert!(
        first.contains("bad=0") && first.contains("chains=ok"),
        "{first}"
    );
}

/// `ResetSession::launch` of a program whose every run moves its heap
/// (`heap_moves MODE`, its input read from a file at a descriptor of its
/// own): every run ends with the code of a run of the program without
/// pagewise, and every reset goes through (the whole path where the
/// layout changed, never a failure).
fn launched_runs_that_move_the_heap_are_reset(mode: &str) {
    use pagewise_snap::process::session::RunEnd;
    if let Some(why) = can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../faces/cli/tests/c/heap_moves.c");
    let prog = match pagewise_testkit::c_program(&src, Path::new(env!("CARGO_TARGET_TMPDIR")), &[])
    {
        Ok(p) => p,
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            return;
        }
    };
    let path = std::env::temp_dir().join(format!("pagewise-heap-{mode}-{}", std::process::id()));
    std::fs::write(&path, b"").unwrap();
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // Inherited by the program (not close-on-exec), closed here at the end.
    // SAFETY: dup of a descriptor this function owns.
    let fd = unsafe { libc::dup(std::os::fd::AsRawFd::as_raw_fd(&file)) };
    assert!(fd >= 0, "dup: {}", std::io::Error::last_os_error());
    let argv: Vec<std::ffi::OsString> =
        vec![prog.clone().into(), mode.into(), fd.to_string().into()];
    let mut s = ResetSession::launch(&argv, fd, &[], std::time::Duration::from_secs(10)).unwrap();
    let (mut full, mut quick) = (0, 0);
    for i in 0..20u8 {
        let input: Vec<u8> = (0..(1 + i as usize * 13)).map(|k| (k as u8) ^ i).collect();
        let mut native = Command::new(&prog)
            .arg(mode)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        native.stdin.take().unwrap().write_all(&input).unwrap();
        let want = native.wait().unwrap().code().unwrap();
        assert_ne!(
            want & 32,
            0,
            "precondition: run {i} without pagewise moved its heap"
        );
        file.set_len(0).unwrap();
        file.write_all_at(&input, 0).unwrap();
        let r = s
            .reset()
            .unwrap_or_else(|e| panic!("{mode}, reset {i}: {e}"));
        match &r.full {
            Some(why) => {
                assert!(why.contains("layout"), "{mode}, reset {i}: {why}");
                full += 1
            }
            None => quick += 1,
        }
        let end = s
            .wait_end(Some(
                std::time::Instant::now() + std::time::Duration::from_secs(10),
            ))
            .unwrap();
        assert!(
            matches!(end, RunEnd::Exit(c) if c == want),
            "{mode}, run {i}: {end:?}, {want} without pagewise"
        );
    }
    drop(s);
    // SAFETY: the descriptor dup'ed above, closed once.
    unsafe { libc::close(fd) };
    let _ = std::fs::remove_file(&path);
    println!("ok   {mode}: 20 runs, {full} reset by the whole path, {quick} by the quick one");
}

#[test]
fn launched_runs_that_grow_and_trim_the_break_are_reset() {
    launched_runs_that_move_the_heap_are_reset("brk");
}

#[test]
fn launched_runs_that_map_move_and_unmap_an_arena_are_reset() {
    launched_runs_that_move_the_heap_are_reset("arena");
}

/// Regression: a reset put back the offset of every regular file of the
/// point, also one whose open file description another process holds (the
/// output file of whoever started the target): that process's next write
/// overwrote its earlier ones. Such an offset is left; the target's own
/// file still gets its offset back at each quick reset.
#[test]
fn a_reset_leaves_the_offset_of_a_file_another_process_shares() {
    use std::io::Write;
    let path = std::env::temp_dir().join(format!("pagewise-shared-off-{}", std::process::id()));
    let mut mine = std::fs::File::create(&path).unwrap();
    let mut child = pagewise_testkit::shell_writing_to(
        "exec 4</proc/self/exe; echo ready; while read x; do head -c 100 <&4 >/dev/null; echo moved; done",
        &mine,
    );
    let pid = child.id() as i32;
    let text = || std::fs::read_to_string(&path).unwrap();
    let pos4 = || {
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/4")).unwrap();
        pagewise_mech::procfs::parse_fdinfo(&info).unwrap().0
    };
    pagewise_testkit::wait_in_file(&path, "ready\n", 1, || {});
    pagewise_testkit::settle_in_read(pid);
    let mut s = ResetSession::open(pid).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut expected = String::from("ready\n");
    for round in 1..=3 {
        let line = format!("the test, round {round}\n");
        mine.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"x\n").unwrap();
        // The session answers the target's stops (its shell forks
        // `head`, whose end is a SIGCHLD) while it waits.
        pagewise_testkit::wait_in_file(&path, "moved\n", round, || {
            s.hand_over_signals().unwrap();
        });
        expected.push_str(&line);
        expected.push_str("moved\n");
        assert!(
            pos4() > 0,
            "round {round}: head moved descriptor 4's offset"
        );
        pagewise_testkit::settle_in_read(pid);
        let r = s.reset().unwrap();
        assert_eq!(r.full, None, "round {round}: {r:?}");
        assert_eq!(pos4(), 0, "round {round}: its own file's offset put back");
    }
    mine.write_all(b"after\n").unwrap();
    expected.push_str("after\n");
    assert_eq!(text(), expected, "the shared file's offset is the test's");
    drop(s);
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&path);
}
