//! What the command line's tests share: the tool and its shim, the C
//! programs of `tests/c` (compiled once per test process), the built-in
//! workload with a known layout, JSON output, runs with a deadline, a busy
//! CPU, and the far-memory runs' helpers (an instance directory, both fault
//! paths). Each test file uses what it needs.

#![allow(dead_code, unused_macros)]

pub use std::io::{BufRead, BufReader};
pub use std::path::{Path, PathBuf};
pub use std::process::{Command, Stdio};
pub use std::sync::atomic::{AtomicBool, Ordering};
pub use std::sync::Arc;
pub use std::time::{Duration, Instant};

/// The tool under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_pagewise");

pub const PAGE: u64 = 4096;

pub fn shim() -> Option<std::path::PathBuf> {
    pagewise_testkit::ensure_preload_shim(BIN).ok()
}

/// The workload with a known layout: after 700 ms it writes exactly the first
/// 300 pages of a 16 MiB region, whose address and length it prints first.
pub const KNOWN_WORKLOAD: &[&str] = &[
    "workload",
    "--mib",
    "16",
    "--write-first",
    "300",
    "--delay-ms",
    "700",
    "--seconds",
    "3",
];

/// The known workload driven by events: it writes its first 300 pages when
/// `when` exists, says `written` (see [`written`]), and exits 0 once `when`
/// is removed; 60 s bound each wait.
pub fn known_workload_when(when: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = [
        "workload",
        "--mib",
        "16",
        "--write-first",
        "300",
        "--seconds",
        "60",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("--write-when".into());
    v.push(when.display().to_string());
    v
}

/// Makes the event-driven known workload write (creates `when`) and waits,
/// bounded, for it to say it has written.
pub fn written(wl: &mut std::process::Child, when: &std::path::Path) {
    std::fs::write(when, b"").unwrap();
    let pid = wl.id() as i32;
    let line = pagewise_testkit::line_within(&mut BufReader::new(wl.stdout.as_mut().unwrap()), pid)
        .unwrap_or_default();
    assert_eq!(
        line.trim(),
        "written",
        "the workload said it wrote its pages"
    );
}

/// Parses the workload's first line, `0xADDR LEN`.
pub fn region_line(line: &str) -> (u64, u64) {
    let mut it = line.split_whitespace();
    let addr = u64::from_str_radix(it.next().unwrap().trim_start_matches("0x"), 16).unwrap();
    let len = it.next().unwrap().parse().unwrap();
    (addr, len)
}

/// Pages reported inside `[addr, addr+len)` over all JSON lines, as a set.
pub fn pages_in(
    lines: &[serde_json::Value],
    addr: u64,
    len: u64,
) -> std::collections::BTreeSet<u64> {
    let mut s = std::collections::BTreeSet::new();
    for l in lines {
        for r in l["ranges"].as_array().expect("ranges array") {
            let (start, n) = (r[0].as_u64().unwrap(), r[1].as_u64().unwrap());
            for i in 0..n {
                let a = start + i * PAGE;
                if a >= addr && a < addr + len {
                    s.insert((a - addr) / PAGE);
                }
            }
        }
    }
    s
}

/// Starts the hidden workload; returns it with the region it printed.
pub fn spawn_workload<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (std::process::Child, u64, u64) {
    let mut wl = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let wl_pid = wl.id() as i32;
    let first =
        pagewise_testkit::line_within(&mut BufReader::new(wl.stdout.as_mut().unwrap()), wl_pid)
            .unwrap_or_default();
    let (addr, len) = region_line(&first);
    (wl, addr, len)
}

/// The JSON lines of a command that must have succeeded (else its stderr
/// is the failure).
pub fn ok_json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_lines(&out.stdout)
}

pub fn json_lines(out: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect()
}

pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pagewise-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

/// A test's own directory, gone when the test passes and kept when it
/// fails (what a failed run wrote is the evidence). For tests that write
/// much (CRIU's images): left behind, they fill the disk run after run.
pub struct Scratch(PathBuf);

impl Scratch {
    /// An empty directory, `pagewise-cli-NAME-PID` in Cargo's temporary
    /// directory.
    pub fn new(name: &str) -> Scratch {
        let p = temp_dir(name);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        Scratch(p)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for the failure: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Why this machine cannot run these tests, if it cannot.
pub fn unsupported() -> Option<String> {
    if let Err(why) = pagewise_testkit::ensure_preload_shim(BIN) {
        return Some(why);
    }
    let p = pagewise::probe::get();
    if !p.uffd_has(pagewise_sys::uffd::feature::MOVE) {
        return Some("userfaultfd without UFFDIO_MOVE".into());
    }
    if !cfg!(target_arch = "x86_64") {
        return Some("the shim's system-call trap is x86-64 only".into());
    }
    None
}

macro_rules! need_support {
    () => {
        if let Some(why) = unsupported() {
            pagewise_testkit::skip!("{why}");
            return;
        }
    };
}

/// The target program, compiled once per test process.
pub fn target() -> PathBuf {
    c_program("farmem_target")
}

/// A C program of `tests/c`, compiled once per test process.
pub fn c_program(name: &str) -> PathBuf {
    c_program_linked(name, &[])
}

/// [`c_program`] linked to the shared objects `libs` too (paths), each
/// loaded whether or not the program uses it.
pub fn c_program_linked(name: &str, libs: &[PathBuf]) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(n, _)| n == name) {
        return p.clone();
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pagewise-farmem-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let st = Command::new("cc")
        .args(["-O", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .args((!libs.is_empty()).then_some("-Wl,--no-as-needed"))
        .args(libs)
        .status()
        .expect("running cc");
    assert!(st.success(), "compiling {}", src.display());
    built.push((name.to_string(), out.clone()));
    out
}

/// How a command ended within its deadline: (exit code or 128 + signal,
/// stdout, stderr); `None` when it had to be killed (with every process
/// it started: it runs in a process group of its own).
pub fn run_with_deadline(mut c: Command, deadline: Duration) -> Option<(i32, String, String)> {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let mut child = c
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning");
    // Both pipes drained at once, so that neither fills and stops the child.
    fn drain(mut r: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    }
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let code = st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0));
            return Some((code, out.join().unwrap(), err.join().unwrap()));
        }
        if t0.elapsed() > deadline {
            // SAFETY: kill(2) of the process group this test started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Keeps one CPU busy until dropped: the program and its engine then share
/// the other, and the windows in which a system call is half done (between
/// an event the engine has read and the kernel's end of the call) grow from
/// microseconds to scheduler ticks, as on a loaded machine.
pub struct Busy(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Busy {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let t0 = Instant::now();
        let h = std::thread::spawn(move || {
            // Bounded: never more than five minutes.
            while !s.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(300) {
                std::hint::spin_loop();
            }
        });
        Busy(stop, Some(h))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

/// Runs a C program of `tests/c` natively, then under `farmem run` with
/// each option set; every emulated run must end in time, succeed and print
/// exactly what the native run printed.
pub fn same_as_native(tag: &str, program: &str, args: &[&str], option_sets: &[&[&str]]) {
    same_as_native_cmd(tag, &c_program(program), args, option_sets, true, &[]);
}

/// [`same_as_native`] for any program `prog`.
/// With `need_faults`, the runs must have served faults (a pipeline of
/// small programs may fit its budget).
pub fn same_as_native_cmd(
    tag: &str,
    prog: &Path,
    args: &[&str],
    option_sets: &[&[&str]],
    need_faults: bool,
    env: &[(&str, &str)],
) {
    let program = prog.display();
    let native = Command::new(prog).args(args).output().unwrap();
    let native_out = String::from_utf8_lossy(&native.stdout).into_owned();
    assert!(
        native.status.success(),
        "{program} {args:?} natively: {native_out}"
    );
    let dir = instance_dir(tag);
    for opts in option_sets {
        let mut c = farmem(&dir);
        c.arg("run").args(*opts).arg("--").arg(prog).args(args);
        c.envs(env.iter().copied());
        let Some((code, out, err)) = run_with_deadline(c, Duration::from_secs(180)) else {
            panic!("{program} {args:?} under farmem run {opts:?} hung (killed after 180 s)");
        };
        assert_eq!(
            (code, out.as_str()),
            (0, native_out.as_str()),
            "{program} {args:?} under farmem run {opts:?}:\n{err}"
        );
        assert!(
            !err.contains("not emulating") && !err.contains("failed"),
            "{program} {args:?} under farmem run {opts:?} complained:\n{err}"
        );
        let served = match PATH.with(|p| p.get()) {
            "inline" => "served in the faulting threads",
            _ => "served by the handler threads",
        };
        assert!(
            err.contains(served) || (!need_faults && err.contains("(none to serve)")),
            "{program} {args:?} under farmem run {opts:?}: faults not {served}:\n{err}"
        );
        println!("{program} {args:?} under {opts:?}: {}", out.trim());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The path of `prog` in /usr/bin or /bin (the system's own).
pub fn which(prog: &str) -> Option<std::path::PathBuf> {
    ["/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(prog))
        .find(|p| p.is_file())
}

/// A private instance directory per test, so tests never see each other.
pub fn instance_dir(tag: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "pagewise-farmem-inst-{}-{tag}-{}",
        std::process::id(),
        PATH.with(|p| p.get())
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn farmem(dir: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.arg("farmem")
        .env("PAGEWISE_FARMEM_DIR", dir)
        .env("PAGEWISE_FARMEM_FAULT_PATH", PATH.with(|p| p.get()));
    c
}

thread_local! {
    /// The fault path the running test uses (`farmem run` takes it from
    /// PAGEWISE_FARMEM_FAULT_PATH).
    pub static PATH: std::cell::Cell<&'static str> = const { std::cell::Cell::new("thread") };
}

/// Runs `test` with `farmem run --fault-path PATH` (see `per_fault_path!`).
pub fn on_path(path: &'static str, name: &str, test: fn()) {
    let sigbus = pagewise::probe::get().uffd_has(pagewise_sys::uffd::feature::SIGBUS);
    if !pagewise_testkit::fault_path_runs(path, name, sigbus) {
        return;
    }
    PATH.with(|p| p.set(path));
    test();
}

pub fn run_target(dir: &Path, opts: &[&str], args: &[&str]) -> (String, String) {
    let out = farmem(dir)
        .arg("run")
        .args(opts)
        .arg("--")
        .arg(target())
        .args(args)
        .output()
        .expect("running pagewise farmem run");
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "farmem run {args:?} failed:\n{so}\n{se}"
    );
    (so, se)
}

pub fn plain(args: &[&str]) -> String {
    let out = Command::new(target()).args(args).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn trace_events(path: &Path) -> Vec<serde_json::Value> {
    let dir = path.parent().unwrap();
    let stem = path.file_name().unwrap().to_str().unwrap().to_string();
    let mut ev = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_name()
            .to_str()
            .unwrap()
            .starts_with(&format!("{stem}."))
        {
            for l in std::fs::read_to_string(e.path()).unwrap().lines() {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                if v.get("kind").is_some() {
                    ev.push(v);
                }
            }
        }
    }
    ev
}

pub fn ls(dir: &Path) -> serde_json::Value {
    let out = farmem(dir).args(["ls", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], 1, "{v}");
    v["instances"].clone()
}

/// Starts `farmem run --instance NAME` of the target holding `pages`
/// pages for `secs` seconds (creating the instance with a budget of 600
/// pages and 1 µs latency if it does not exist); returns once it holds them.
pub fn hold_in_instance(dir: &Path, name: &str, pages: u64, secs: u64) -> std::process::Child {
    let mut c = farmem(dir)
        .args(["run", "--instance", name])
        .args(if dir.join(name).exists() {
            vec![]
        } else {
            vec!["--local-pages", "600", "--latency-ns", "1000"]
        })
        .arg("--")
        .arg(target())
        .args(["hold", &pages.to_string(), &secs.to_string()])
        .stdout(Stdio::piped())
        // Its summary is not the test console's.
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let c_pid = c.id() as i32;
    let line =
        pagewise_testkit::line_within(&mut BufReader::new(c.stdout.as_mut().unwrap()), c_pid)
            .unwrap_or_default();
    assert_eq!(line, format!("holding {pages}"));
    c
}

/// `pagewise` run as user nobody (65534) through `setpriv`; `None` where
/// that cannot be here (not root, or no setpriv).
pub fn as_nobody() -> Option<Command> {
    if !pagewise_testkit::is_root() || !Path::new("/usr/bin/setpriv").exists() {
        return None;
    }
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
    Some(c)
}

/// Whether `vm.unprivileged_userfaultfd` is 0 here (users other than root
/// get user-mode faults only).
pub fn unprivileged_userfaultfd_off() -> bool {
    std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").is_ok_and(|v| v.trim() == "0")
}

/// Runs `c`, which must succeed (its error output is said if it does not);
/// its output.
pub fn ok(c: &mut Command) -> std::process::Output {
    let out = c.output().expect("starting the command");
    assert!(
        out.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The rollback target of the library's tests (`rollback.c`, which checks
/// its own registers across every read), compiled once; `None` (a skip
/// said) where it cannot be.
pub fn rollback_target() -> Option<PathBuf> {
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../capabilities/snap/tests/c/rollback.c");
    match pagewise_testkit::c_program(&src, Path::new(env!("CARGO_TARGET_TMPDIR")), &["-pthread"]) {
        Ok(p) => Some(p),
        Err(why) => {
            pagewise_testkit::skip!("{why}");
            None
        }
    }
}

/// `receive --json` on a free loopback port saving into `dir`, with
/// `extra` flags: the process, its output after the first line, and the
/// address it listens on.
pub fn start_receiver(
    dir: &std::path::Path,
    extra: &[&str],
) -> (
    std::process::Child,
    BufReader<std::process::ChildStdout>,
    String,
) {
    let mut rx = Command::new(BIN)
        .args(["receive", "--listen", "127.0.0.1:0", "--json"])
        .args(extra)
        .arg("--out")
        .arg(dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(rx.stdout.take().unwrap());
    let first = pagewise_testkit::line_within(&mut out, rx.id() as i32).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&first).unwrap();
    let addr = v["listening"].as_str().unwrap().to_string();
    (rx, out, addr)
}

/// The `Seccomp:` mode (0 none, 1 strict, 2 filter) of the thread of
/// `pid` whose name is `comm`, if it has one.
pub fn thread_seccomp(pid: i32, comm: &str) -> Option<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.filter_map(|t| t.ok()).find_map(|t| {
        let name = std::fs::read_to_string(t.path().join("comm")).ok()?;
        if name.trim() != comm {
            return None;
        }
        let status = std::fs::read_to_string(t.path().join("status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .map(|v| v.trim().to_string())
    })
}

/// [`thread_seccomp`] once the thread named `comm` is there: a thread
/// takes its name when it starts to run, a moment after it is made.
/// Awaited 10 s at most (then `None`).
pub fn thread_seccomp_once_named(pid: i32, comm: &str) -> Option<String> {
    let t0 = std::time::Instant::now();
    loop {
        let mode = thread_seccomp(pid, comm);
        if mode.is_some() || t0.elapsed() > std::time::Duration::from_secs(10) {
            return mode;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
