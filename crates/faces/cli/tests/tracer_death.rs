//! pagewise killed while it makes a call inside another process leaves
//! that process running as it was. `tracer_death.c` (two threads sleeping
//! in raw `nanosleep` with known values in r12–r15, one spinning on a
//! floating-point sum, the main thread blocked in `read`, each with a mask
//! of its own, all checked all the time) takes SIGKILLs of `snapshot
//! --pid` and `track --pid` at every phase of their calls
//! (`PAGEWISE_DIE_IN_CALL`), and at random moments; then it must report
//! no damage. 200 kills in a call by default; `PAGEWISE_LONG_RUNS=1` makes
//! 1,000.

#[macro_use]
mod support;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use support::*;

/// Phases of a call (`mech::inject::Phase`).
const PHASES: usize = 8;

struct Target {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Target {
    let mut child = Command::new(c_program("tracer_death"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let l = pagewise_testkit::line_within(&mut out, child.id() as i32).unwrap_or_default();
    assert_eq!(l, "ready");
    Target { child, out }
}

/// How one run of pagewise ended: killed (SIGKILL), or its exit code and
/// what it said. Bounded: killed after 60 s as a failure.
fn run(mut c: Command, kill_after: Option<Duration>) -> Result<(), (i32, String)> {
    let mut child = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    if let Some(after) = kill_after {
        std::thread::sleep(after);
        let _ = child.kill();
    }
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("pagewise ran for 60 s: {:?}", c);
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let said = said.join().unwrap();
    match st.signal() {
        Some(libc::SIGKILL) => Ok(()),
        _ => Err((st.code().unwrap_or(-1), said)),
    }
}

/// The target after a run: alive, not stopped, traced by nobody.
fn unharmed(pid: i32, what: &str) {
    for _ in 0..1000 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let tracer = pagewise_mech::procfs::status_field(&status, "TracerPid");
        let state = pagewise_mech::procfs::process_state(pid).ok().flatten();
        assert!(
            pagewise_mech::procfs::is_alive(pid),
            "the target died after {what}"
        );
        if tracer == Some(0) && !matches!(state.as_deref(), Some("t" | "T")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("the target is still stopped or traced 1 s after {what}");
}

/// A small generator, seeded from the clock (the seed is printed).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn a_tracer_killed_in_a_call_leaves_its_target_as_it_was() {
    if let Some(why) = pagewise_testkit::can_ptrace() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let want: u32 = if std::env::var_os("PAGEWISE_LONG_RUNS").is_some_and(|v| v == "1") {
        1000
    } else {
        200
    };
    let mut t = start();
    let pid = t.child.id() as i32;
    let spid = pid.to_string();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut rng = Rng(seed);
    let dir = temp_dir("tracer-death");
    // [snapshot, track][phase]: runs killed in a call; runs that ended
    // before their call N.
    let mut killed = [[0u32; PHASES]; 2];
    let mut whole = [0u32; 2];
    let mut runs = 0u32;
    // Until `want` runs were killed in a call, and at least one at each
    // phase of each command (a phase drawn seldom is drawn again).
    while killed.iter().flatten().sum::<u32>() < want || killed.iter().flatten().any(|&n| n == 0) {
        runs += 1;
        assert!(
            runs < want * 5,
            "too few runs were killed in a call: by phase, snapshot {:?}, track {:?}",
            killed[0],
            killed[1]
        );
        let which = usize::from(rng.below(3) == 0);
        let phase = rng.below(PHASES as u64);
        let (call, mut c) = if which == 0 {
            let _ = std::fs::remove_dir_all(&dir);
            let mut c = Command::new(BIN);
            c.args(["snapshot", "--pid", &spid, "--out"]).arg(&dir);
            (1 + rng.below(8), c)
        } else {
            let mut c = Command::new(BIN);
            c.args([
                "track",
                "--pid",
                &spid,
                "--count",
                "1",
                "--interval-ms",
                "10",
            ]);
            (1 + rng.below(3), c)
        };
        c.env("PAGEWISE_DIE_IN_CALL", format!("{call}:{phase}"));
        let what = format!("{c:?} (PAGEWISE_DIE_IN_CALL={call}:{phase})");
        match run(c, None) {
            Ok(()) => killed[which][phase as usize] += 1,
            Err((0, _)) => whole[which] += 1,
            Err((code, said)) => panic!("{what} exited {code}: {said}"),
        }
        unharmed(pid, &what);
    }
    // At random moments of a whole snapshot, in a call or not.
    let mut at_random = 0;
    for _ in 0..want / 5 {
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = Command::new(BIN);
        c.args(["snapshot", "--pid", &spid, "--out"]).arg(&dir);
        let after = Duration::from_micros(rng.below(30_000));
        match run(c, Some(after)) {
            Ok(()) => at_random += 1,
            Err((0, _)) => {}
            Err((code, said)) => panic!("snapshot exited {code}: {said}"),
        }
        unharmed(pid, &format!("a snapshot killed after {after:?}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The program's verdict.
    drop(t.child.stdin.take());
    let mut rest = String::new();
    t.out.read_to_string(&mut rest).unwrap();
    let st = t.child.wait().unwrap();
    let mut err = String::new();
    if let Some(mut e) = t.child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    println!(
        "seed {seed}: killed in a call, by phase: snapshot {:?}, track {:?}; runs that ended \
         first: {whole:?}; killed at random moments: {at_random}; the program: {}",
        killed[0],
        killed[1],
        rest.trim()
    );
    assert!(st.success(), "the program found damage: {rest} {err}");
    assert!(rest.contains("bad=0"), "{rest} {err}");
    for (k, name) in ["snapshot", "track"].iter().enumerate() {
        assert!(
            killed[k].iter().all(|&n| n > 0),
            "{name} was not killed at every phase: {:?}",
            killed[k]
        );
    }
}
