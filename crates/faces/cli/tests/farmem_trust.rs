//! `pagewise farmem serve` (root) against its own members turned
//! attackers, a second unprivileged user and planted sockets. Each test
//! is the regression test of one way the server could be turned against
//! the machine:
//!
//! - a member that becomes root by a setuid `exec` (asking itself on the
//!   connection it made, or through a child it forked) gets nothing;
//! - a member that asks and ends, its pid taken by another user's process
//!   before the request is served, gets nothing made in that process;
//! - no user gets a full userfaultfd from the machine while members are
//!   served (`vm.unprivileged_userfaultfd` is never changed);
//! - idle and slow peers hold only their own connection, one more than
//!   the server answers at once is told so, and a stop ends within a
//!   second while they hang on;
//! - a socket planted where the server's was does not stop it, a socket
//!   directory others may write is refused, and the shim does not trust a
//!   socket another user answers.
//!
//! Members are the instance's owner's processes (uid 65534); their slots
//! are taken as the owner takes them (the instance file is the owner's to
//! write), by this test binary run as that user
//! (`helper_join_as_the_owner`).

#[macro_use]
mod support;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

const OWNER: u32 = 65534;
const STRANGER: u32 = 65533;

/// Whether the tests can act as other users here (root, setpriv); the
/// reason where not.
fn users_missing() -> Option<&'static str> {
    if !pagewise_testkit::is_root() {
        return Some("needs root to act as two other users");
    }
    None
}

/// A directory every user can reach, for this test's files.
fn shared_dir(tag: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = temp_dir(&format!("trust-{tag}"));
    std::fs::create_dir_all(d.join("inst")).unwrap();
    for p in [d.clone(), d.join("inst")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut a = d.clone();
    while let Some(p) = a.parent() {
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        assert!(
            mode & 0o001 != 0,
            "{} is not reachable by other users",
            p.display()
        );
        a = p.to_path_buf();
    }
    d
}

/// The attack program, built once, reachable by every user.
fn attack() -> PathBuf {
    c_program("serve_attack")
}

/// `farmem serve --owner 65534` over the directories of `d`, its JSON
/// lines gathered as they come.
struct Served {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<serde_json::Value>>>,
    instance: String,
    socket: PathBuf,
}

impl Served {
    fn start(d: &Path, instance: &str) -> Served {
        let mut child = Command::new(BIN)
            .args(["farmem", "serve", "--json", "--local-pages", "64"])
            .args(["--owner", &OWNER.to_string(), "--instance", instance])
            .env("PAGEWISE_FARMEM_DIR", d.join("inst"))
            .env("PAGEWISE_FARMEM_SOCKETS", d.join("sock"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let first = pagewise_testkit::line_within(&mut out, child.id() as i32).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&first).expect("the serving line");
        assert_eq!(v["event"], "serving", "{first}");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let into = lines.clone();
        std::thread::spawn(move || {
            for l in out.lines().map_while(|l| l.ok()) {
                if let Ok(v) = serde_json::from_str(&l) {
                    into.lock().unwrap().push(v);
                }
            }
        });
        Served {
            child,
            lines,
            instance: instance.to_string(),
            socket: PathBuf::from(v["socket"].as_str().unwrap()),
        }
    }

    /// The first line about process `pid` that `pred` accepts, waited for
    /// at most 60 s.
    fn about(&self, pid: i32, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| {
                    (l["pid"] == pid || l["why"].as_str().unwrap_or("").contains(&pid.to_string()))
                        && pred(l)
                })
                .cloned();
            if let Some(l) = found {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "no line of the server about process {pid} within 60 s: {:?}",
                self.lines.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = pagewise_sys::process::kill(self.pid(), libc::SIGCONT);
        let _ = pagewise_sys::process::kill(self.pid(), libc::SIGTERM);
        let _ = self.child.wait();
    }
}

/// A refusal of the server: an answer with a negative value, or a
/// connection it could not answer.
fn refused(l: &serde_json::Value) -> bool {
    l["event"] == "failed" || (l["event"] == "answered" && l["value"].as_i64() < Some(0))
}

/// Makes process `pid` a member of instance `name` as its owner does.
fn join_as_owner(d: &Path, name: &str, pid: i32) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["helper_join_as_the_owner", "--exact", "--nocapture"])
        .args(["--test-threads", "1"])
        .env("PAGEWISE_TEST_JOIN", format!("{name}:{pid}"))
        .env("PAGEWISE_FARMEM_DIR", d.join("inst"))
        .uid(OWNER)
        .gid(OWNER)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("joined"),
        "joining {pid}: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Not a test of its own: run as the owner by [`join_as_owner`], it takes
/// a member's slot for the pid `PAGEWISE_TEST_JOIN` names.
#[test]
fn helper_join_as_the_owner() {
    let Ok(what) = std::env::var("PAGEWISE_TEST_JOIN") else {
        return;
    };
    let (name, pid) = what.split_once(':').unwrap();
    let inst =
        pagewise::farmem::instance::Instance::open(name, pagewise::farmem::instance::Access::Join)
            .unwrap();
    let slot = inst.join(pid.parse().unwrap(), 1).unwrap();
    println!("joined {pid} in slot {slot}");
}

/// A program run as `uid`, its lines read one at a time.
fn as_user(uid: u32, c: &mut Command) -> pagewise_testkit::Piped {
    pagewise_testkit::Piped::start(c.uid(uid).gid(uid).stderr(Stdio::inherit()))
}

/// The target's `threads` run as the owner in instance `name`, served:
/// emulated, and its output `native`.
fn member_runs_emulated(d: &Path, name: &str, native: &str) {
    let out = Command::new(BIN)
        .args(["farmem", "run", "--instance", name, "--"])
        .arg(target())
        .arg("threads")
        .env("PAGEWISE_FARMEM_DIR", d.join("inst"))
        .env("PAGEWISE_FARMEM_SOCKETS", d.join("sock"))
        .uid(OWNER)
        .gid(OWNER)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "a member: {err}");
    assert!(!err.contains("running without"), "emulated: {err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), native);
}

fn contract() -> String {
    pagewise_testkit::host::CONTRACT.to_string()
}

#[test]
fn a_member_that_becomes_root_by_a_setuid_exec_gets_nothing() {
    need_support!();
    if let Some(why) = users_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let d = shared_dir("setuid");
    // This program, setuid root, where no `nosuid` mount stops it.
    let suid = d.join("serve_attack_setuid");
    std::fs::copy(attack(), &suid).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let served = Served::start(&d, "setuid");
    let sock = served.socket.to_str().unwrap().to_string();
    for (mode, why) in [
        // It asks itself, once root: its uids changed since it connected.
        ("exec-setuid", "uids"),
        // Its child asks on the socket its parent made: not in its name.
        ("fork-setuid", "not by process"),
    ] {
        let mut a = as_user(
            OWNER,
            Command::new(attack()).args([mode, &sock, &contract(), suid.to_str().unwrap()]),
        );
        let pid: i32 = a.line().strip_prefix("ready ").unwrap().parse().unwrap();
        join_as_owner(&d, &served.instance, pid);
        writeln!(a.input, "go").unwrap();
        let mut answer = String::new();
        let mut state = String::new();
        for _ in 0..2 {
            let l = a.line();
            if l.starts_with("answer") {
                answer = l;
            } else {
                state = l;
            }
        }
        if state.contains("euid 65534") {
            pagewise_testkit::skip!(
                "(did not happen) the setuid copy did not run as root here (a nosuid mount?)"
            );
            return;
        }
        let value: i64 = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(value < 0, "{mode}: the server made a userfaultfd: {answer}");
        assert!(state.contains("euid 0"), "{mode}: {state}");
        assert_eq!(
            pagewise_testkit::userfaultfds(pid),
            0,
            "{mode}: no userfaultfd in the process that became root"
        );
        let l = served.about(pid, refused);
        assert!(
            l["why"].as_str().unwrap().contains(why),
            "{mode}: refused for its {why}: {l}"
        );
        println!("ok   {mode}: refused: {}", l["why"]);
    }
}

#[test]
fn a_pid_taken_by_another_users_process_is_not_served() {
    need_support!();
    if let Some(why) = users_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let d = shared_dir("reuse");
    let served = Served::start(&d, "reuse");
    let sock = served.socket.to_str().unwrap().to_string();
    let mut a = as_user(
        OWNER,
        Command::new(attack()).args(["ask-exit", &sock, &contract()]),
    );
    let pid: i32 = a.line().strip_prefix("ready ").unwrap().parse().unwrap();
    join_as_owner(&d, &served.instance, pid);
    // The server held still while the member asks and ends, and another
    // user's process takes its pid.
    pagewise_sys::process::kill(served.pid(), libc::SIGSTOP).unwrap();
    writeln!(a.input, "go").unwrap();
    let st = a.child.wait().unwrap();
    assert!(st.success(), "the member asked and ended: {st:?}");
    let mut victim = pagewise_testkit::Piped::start(Command::new(attack()).args([
        "at-pid",
        &pid.to_string(),
        &STRANGER.to_string(),
        "/bin/sleep",
        "120",
    ]));
    let placed = victim.line();
    if placed != format!("placed {pid}") {
        pagewise_sys::process::kill(served.pid(), libc::SIGCONT).unwrap();
        pagewise_testkit::skip!("(did not happen) pid {pid} could not be taken again: {placed}");
        return;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = pagewise_mech::procfs::status_field(&status, "Uid").unwrap();
    assert_eq!(uid, STRANGER as u64, "pid {pid} is the other user's now");
    pagewise_sys::process::kill(served.pid(), libc::SIGCONT).unwrap();
    let l = served.about(pid, refused);
    let why = l["why"].as_str().unwrap();
    assert!(why.contains("ended") || why.contains("exited"), "{l}");
    assert_eq!(
        pagewise_testkit::userfaultfds(pid),
        0,
        "no userfaultfd in the other user's process"
    );
    let state = pagewise_mech::procfs::process_state(pid).unwrap();
    assert_eq!(state.as_deref(), Some("S"), "it sleeps on, never stopped");
    let _ = pagewise_sys::process::kill(pid, libc::SIGKILL);
    let _ = victim.child.wait();
    println!("ok   pid {pid} taken by uid {STRANGER}: refused: {why}");
}

#[test]
fn no_user_gets_a_userfaultfd_the_machine_lends() {
    need_support!();
    if let Some(why) = users_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    const SETTING: &str = "/proc/sys/vm/unprivileged_userfaultfd";
    if std::fs::read_to_string(SETTING).map_or(true, |s| s.trim() != "0") {
        pagewise_testkit::skip!("{SETTING} is not 0 here: every user may make one anyway");
        return;
    }
    let d = shared_dir("lend");
    let served = Served::start(&d, "lend");
    // The setting, read as often as can be while members are served.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, seen) = (done.clone(), Arc::new(Mutex::new((0u64, 0u64))));
    let into = seen.clone();
    let sampler = std::thread::spawn(move || {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            let one = std::fs::read_to_string(SETTING).unwrap().trim() == "1";
            let mut s = into.lock().unwrap();
            s.0 += 1;
            s.1 += one as u64;
        }
    });
    // A third user tries for a full userfaultfd all the while.
    let mut third = as_user(STRANGER, Command::new(attack()).arg("try-uffd"));
    assert_eq!(third.line(), "trying");
    let native = plain(&["threads"]);
    for _ in 0..3 {
        member_runs_emulated(&d, "lend", &native);
    }
    writeln!(third.input, "stop").unwrap();
    let made = third.line();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    let (reads, ones) = *seen.lock().unwrap();
    let made_n: u64 = made.split_whitespace().nth(1).unwrap().parse().unwrap();
    let tried: u64 = made.split_whitespace().nth(3).unwrap().parse().unwrap();
    let served_n = served
        .lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l["op"] == "userfaultfd" && l["value"].as_i64() >= Some(0))
        .count();
    assert!(
        served_n >= 6,
        "the members' userfaultfds were made: {served_n}"
    );
    assert_eq!(ones, 0, "{SETTING} read 1 in {ones} of {reads} reads");
    assert!(tried > 0, "{made}");
    assert_eq!(made_n, 0, "the third user made full userfaultfds: {made}");
    println!(
        "ok   {served_n} userfaultfds made in members; {SETTING} 0 in all {reads} reads; the \
         third user made 0 of {tried}"
    );
}

#[test]
fn idle_and_slow_peers_hold_only_their_own_connection() {
    need_support!();
    if let Some(why) = users_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let d = shared_dir("slow");
    let mut served = Served::start(&d, "slow");
    let sock = served.socket.clone();
    // As many idle connections as are answered at once, and one slow.
    let most = pagewise::farmem::serve::MOST_AT_ONCE;
    let idle: Vec<std::os::unix::net::UnixStream> = (0..most - 1)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap())
        .collect();
    let mut slow = as_user(
        OWNER,
        Command::new(attack()).args(["slow", sock.to_str().unwrap(), &contract()]),
    );
    assert_eq!(slow.line(), "slow");
    // One more than that is told at once that the server is busy.
    let mut extra = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (value, why) = pagewise_mech::inject::uffd_lending::read_answer(&mut extra).unwrap();
    assert_eq!(value, -(libc::EAGAIN as i64), "busy: {why}");
    drop(extra);
    // Half the idle peers leave; the server has seen them go.
    let idle: Vec<_> = idle.into_iter().skip(most / 2).collect();
    let me = std::process::id() as i32;
    let deadline = Instant::now() + Duration::from_secs(60);
    while served
        .lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l["why"].as_str().unwrap_or("").contains("closed after 0"))
        .count()
        < most / 2
    {
        assert!(
            Instant::now() < deadline,
            "the server never saw {} peers of {me} leave",
            most / 2
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A member is served while the others hang on.
    let started = Instant::now();
    member_runs_emulated(&d, "slow", &plain(&["threads"]));
    let took = started.elapsed();
    // And a stop ends the server within a second, peers still hanging on.
    let more: Vec<_> = (0..4)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap())
        .collect();
    let asked = Instant::now();
    pagewise_sys::process::kill(served.pid(), libc::SIGTERM).unwrap();
    let st = served.child.wait().unwrap();
    let ended = asked.elapsed();
    assert_eq!(st.code(), Some(143), "farmem serve after SIGTERM");
    assert!(
        ended < Duration::from_millis(1500),
        "the server took {ended:?} to end after SIGTERM with {} peers connected",
        idle.len() + more.len() + 1
    );
    drop(slow);
    println!(
        "ok   a member served in {took:?} beside {} idle peers and a slow one; busy told at \
         once; ended {ended:?} after SIGTERM",
        idle.len()
    );
}

#[test]
fn a_planted_socket_neither_stops_the_server_nor_is_trusted_by_the_shim() {
    need_support!();
    if let Some(why) = users_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let d = shared_dir("planted");
    // A shared instance directory, as /dev/shm/pagewise-farmem is, where
    // another user planted a live socket where the server's used to be.
    std::fs::set_permissions(d.join("inst"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let planted = d.join("inst").join(".planted.uffd");
    let mut plant = as_user(
        STRANGER,
        Command::new(attack()).args(["impostor", planted.to_str().unwrap()]),
    );
    assert_eq!(plant.line(), "listening");
    let served = Served::start(&d, "planted");
    assert!(
        served.socket.starts_with(d.join("sock")),
        "{}",
        served.socket.display()
    );
    drop(served);
    let _ = pagewise_sys::process::kill(plant.pid(), libc::SIGKILL);

    // A socket directory others may write is refused.
    let open = d.join("open");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(BIN)
        .args(["farmem", "serve", "--local-pages", "64", "--seconds", "1"])
        .env("PAGEWISE_FARMEM_DIR", d.join("inst"))
        .env("PAGEWISE_FARMEM_SOCKETS", &open)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "served from {}: {err}",
        open.display()
    );
    assert!(
        err.contains("cannot hold a far-memory server's socket"),
        "{err}"
    );

    // A socket another user answers (a directory handed to it by mistake)
    // is not trusted: the program runs, unemulated, and no member is
    // listed under the pid the impostor names.
    let sockets = d.join("sock2");
    std::fs::create_dir_all(sockets.join("evil")).unwrap();
    std::os::unix::fs::chown(sockets.join("evil"), Some(STRANGER), None).unwrap();
    let mut evil = as_user(
        STRANGER,
        Command::new(attack()).args(["impostor", sockets.join("evil/uffd").to_str().unwrap()]),
    );
    assert_eq!(evil.line(), "listening");
    let out = Command::new(BIN)
        .args([
            "farmem",
            "run",
            "--instance",
            "evil",
            "--local-pages",
            "64",
            "--",
        ])
        .arg(target())
        .arg("threads")
        .env("PAGEWISE_FARMEM_DIR", d.join("inst"))
        .env("PAGEWISE_FARMEM_SOCKETS", &sockets)
        .output()
        .unwrap();
    let _ = pagewise_sys::process::kill(evil.pid(), libc::SIGKILL);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        plain(&["threads"]),
        "{err}"
    );
    assert!(err.contains(&format!("served by uid {STRANGER}")), "{err}");
    assert!(err.contains("running without"), "{err}");
    let inst = ls(&d.join("inst"));
    assert!(
        !inst.to_string().contains("\"pid\":1,"),
        "no member under pid 1: {inst}"
    );
    println!("ok   planted socket ignored; open directory refused; impostor not trusted");
}

/// The thread that accepts members runs under a seccomp filter of
/// pagewise's own from before the first peer; the thread that starts the
/// answers does not (a tracer under a filter may not step around a
/// member's), nor does the main thread. Members are still served.
#[test]
fn the_servers_socket_thread_runs_under_a_filter_of_its_own() {
    need_support!();
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let d = shared_dir("confined");
    let mut s = Served::start(&d, "confined");
    let pid = s.child.id() as i32;
    let mode = |comm| thread_seccomp_once_named(pid, comm);
    assert_eq!(
        mode("pw-farmem-accep").as_deref(),
        Some("2"),
        "the accepting thread is under a filter when the server says it serves"
    );
    assert_eq!(
        mode("pw-farmem-hand").as_deref(),
        Some("0"),
        "the answers' thread is not (None: no thread of that name within 10 s)"
    );
    assert_eq!(
        mode("pagewise").as_deref(),
        Some("0"),
        "the main thread is not"
    );
    let _ = s.child.kill();
    let _ = s.child.wait();
}
