//! What pagewise's tests share.
//!
//! A test whose kernel feature (or tool, or privilege) is missing does not
//! pass silently: it reports `SKIP <test>: <reason>` straight to the
//! process's standard error, which `cargo test` shows even for a test that
//! passes (it captures only what the print macros write), and returns.

pub mod container;
pub mod criu;
pub mod host;
pub mod servers;
pub mod targets;

/// Reports that the calling test skips (part of) what it is named after,
/// and why: a kernel feature, a tool or a privilege this machine lacks.
/// The test's name is its thread's, as the test harness names it.
///
/// With `PAGEWISE_REQUIRE` set (a comma-separated list such as
/// `uffd-wp,ksm,madv_collapse`), a skip whose reason names one of them
/// (case-insensitive, `-` and `_` alike) fails the test instead: on a
/// machine that must have a feature, its absence is a failure.
pub fn report_skip(why: &str) {
    say(&format!("SKIP {}: {why}\n", test_name()));
    if let Some(req) = required_in(why) {
        panic!("PAGEWISE_REQUIRE names {req:?}, which this skip is about: {why}");
    }
}

/// Reports that a precondition of the calling test did not happen this run
/// (the kernel refused a collapse, KSM did not merge yet, the passes
/// converged): what it is named after went unchecked this time. Such
/// skips vary from run to run; `.ci/run` counts them but does not compare
/// them with the machine's list.
pub fn report_not_happened(why: &str) {
    say(&format!("SKIP {}: (did not happen) {why}\n", test_name()));
}

/// Reports that a core claim of the calling test did not happen this run
/// although the test did what makes it happen (the dedup agent merged
/// nothing, the huge-page agent collapsed nothing): on a machine where
/// `PAGEWISE_REQUIRE` names `feature`, that is a failure; elsewhere it is
/// a skip whose precondition did not happen.
pub fn report_claim_not_happened(feature: &str, why: &str) {
    say(&format!(
        "SKIP {}: (did not happen) [{feature}] {why}\n",
        test_name()
    ));
    if let Some(req) = required(feature) {
        panic!(
            "PAGEWISE_REQUIRE names {req:?}: this machine must make it happen, and it did not: \
             {why}"
        );
    }
}

/// The feature of `PAGEWISE_REQUIRE` that `why` is about, if any. A
/// skip's reason may begin with tags, `[backend] [feature] text`: the
/// leading ones name what the test was running (a tracking backend), the
/// last one and the text after it what was missing.
fn required_in(why: &str) -> Option<String> {
    let mut rest = why.trim_start();
    let mut last_tag = "";
    while let Some(tail) = rest.strip_prefix('[') {
        let Some(end) = tail.find(']') else { break };
        last_tag = &tail[..end];
        rest = tail[end + 1..].trim_start();
    }
    required(&format!("[{last_tag}] {rest}"))
}

/// The feature of `PAGEWISE_REQUIRE` that `text` names, if any
/// (case-insensitive, `-` and `_` alike).
fn required(text: &str) -> Option<String> {
    let norm = |t: &str| t.trim().to_lowercase().replace('_', "-");
    let reason = norm(text);
    std::env::var("PAGEWISE_REQUIRE")
        .ok()?
        .split(',')
        .map(norm)
        .find(|f| !f.is_empty() && reason.contains(f.as_str()))
}

fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string()
}

fn say(line: &str) {
    // Straight to the file descriptor: the harness captures the print
    // macros' output of passing tests, and a skip must be seen.
    // SAFETY: write(2) of a valid buffer to standard error.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// `skip!("reason {x}")`: [`report_skip`] with a formatted reason.
#[macro_export]
macro_rules! skip {
    ($($t:tt)*) => {
        $crate::report_skip(&format!($($t)*))
    };
}

/// `claim_not_happened!("feature", "reason {x}")`:
/// [`report_claim_not_happened`] with a formatted reason.
#[macro_export]
macro_rules! claim_not_happened {
    ($feature:expr, $($t:tt)*) => {
        $crate::report_claim_not_happened($feature, &format!($($t)*))
    };
}

/// `not_happened!("reason {x}")`: [`report_not_happened`] with a
/// formatted reason.
#[macro_export]
macro_rules! not_happened {
    ($($t:tt)*) => {
        $crate::report_not_happened(&format!($($t)*))
    };
}

/// Makes sure the preload shim (`libpagewise_preload.so`) sits beside the
/// `pagewise` binary `bin` that the CLI tests run, building it when it does
/// not (on a clean tree, `cargo test` builds the binary but not the shim).
/// It is built in a target directory of its own, so as not to wait on the
/// lock of the `cargo test` that runs this, and copied beside `bin`.
/// Returns why it could not, if it could not.
pub fn ensure_preload_shim(bin: &str) -> Result<std::path::PathBuf, String> {
    use std::path::Path;
    static ONCE: std::sync::Mutex<Option<Result<std::path::PathBuf, String>>> =
        std::sync::Mutex::new(None);
    let mut done = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = done.as_ref() {
        return r.clone();
    }
    let dir = Path::new(bin)
        .parent()
        .ok_or("the binary has no directory")?;
    let want = dir.join("libpagewise_preload.so");
    let r = if want.exists() {
        Ok(want)
    } else {
        build_shim(dir, &want)
    };
    *done = Some(r.clone());
    r
}

fn build_shim(dir: &std::path::Path, want: &std::path::Path) -> Result<std::path::PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // `dir` is `<target>/release`: build in `<target>/testkit-shim`.
    let target = dir
        .parent()
        .ok_or("the binary's directory has no parent")?
        .join("testkit-shim");
    let manifest =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../faces/preload/Cargo.toml");
    let out = std::process::Command::new(&cargo)
        .args(["build", "--release", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .output()
        .map_err(|e| format!("running {cargo}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the preload shim failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    std::fs::copy(target.join("release/libpagewise_preload.so"), want)
        .map_err(|e| format!("copying the preload shim beside the binary: {e}"))?;
    Ok(want.to_path_buf())
}

/// Makes each named test function (`fn NAME()`) two tests, `NAME::thread`
/// and `NAME::inline`, which call `runner("thread" | "inline", "NAME",
/// NAME)`: the far-memory tests run on both fault paths.
#[macro_export]
macro_rules! per_fault_path {
    ($runner:path; $($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn thread() {
                $runner("thread", stringify!($name), super::$name);
            }
            #[test]
            fn inline() {
                $runner("inline", stringify!($name), super::$name);
            }
        }
    )*};
}

/// Whether test `name` can run on fault path `path` here (`sigbus`: the
/// kernel has `UFFD_FEATURE_SIGBUS`); reports the skip when not.
pub fn fault_path_runs(path: &str, name: &str, sigbus: bool) -> bool {
    if path == "inline" && !sigbus {
        report_skip(&format!(
            "{name} (inline): the kernel lacks UFFD_FEATURE_SIGBUS"
        ));
        return false;
    }
    true
}

/// Where `scripts/setup.sh` unpacks Debian's source of `package` (real
/// fuzz targets: cJSON, expat), outside the clone.
pub fn debian_source(package: &str) -> std::path::PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("pagewise/src").join(package)
}

/// Compiles the C program `src` with the system's C compiler (`$CC`, else
/// `cc`) and `flags` into `out_dir`, once per test process and name; the
/// executable's path. Panics when the compiler fails on it (the sources
/// are the repository's own); `Err` with the reason when there is no
/// compiler.
pub fn c_program(
    src: &std::path::Path,
    out_dir: &std::path::Path,
    flags: &[&str],
) -> Result<std::path::PathBuf, String> {
    use std::path::PathBuf;
    static BUILT: std::sync::Mutex<Vec<(PathBuf, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(s, _)| s == src) {
        return Ok(p.clone());
    }
    let dir = out_dir.join(format!("pagewise-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let stem = src.file_stem().unwrap_or_default();
    let out = dir.join(stem);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = std::process::Command::new(&cc)
        .args(["-O", "-Wall", "-Wextra", "-Werror"])
        .args(flags)
        .arg(src)
        .arg("-o")
        .arg(&out)
        .status()
        .map_err(|e| format!("no C compiler ({cc}: {e})"))?;
    assert!(st.success(), "{cc} failed on {}", src.display());
    built.push((src.to_path_buf(), out.clone()));
    Ok(out)
}

/// A child with piped stdin and stdout that answers one line per line it
/// is sent; killed and reaped when dropped.
pub struct Piped {
    /// The child.
    pub child: std::process::Child,
    /// Its stdin.
    pub input: std::process::ChildStdin,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Piped {
    /// Starts `c` with stdin and stdout piped.
    pub fn start(c: &mut std::process::Command) -> Piped {
        use std::process::Stdio;
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the child");
        let input = child.stdin.take().expect("piped");
        let out = std::io::BufReader::new(child.stdout.take().expect("piped"));
        Piped { child, input, out }
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Its next line, trimmed (empty at its end), awaited at most
    /// [`LINE_WAIT`] (see [`line_within`]).
    pub fn line(&mut self) -> String {
        let pid = self.pid();
        line_within(&mut self.out, pid).unwrap_or_default()
    }

    /// Sends `req` as one line and returns the line it answers.
    pub fn ask(&mut self, req: &str) -> String {
        use std::io::Write;
        writeln!(self.input, "{req}").expect("writing to the child");
        self.input.flush().expect("writing to the child");
        self.ask_answer(req)
    }

    /// As [`ask`](Self::ask), calling `meanwhile` every few milliseconds
    /// until the answer comes (a holder that hands over the signals that
    /// stop the child on their way, say).
    pub fn ask_while(&mut self, req: &str, meanwhile: impl FnMut()) -> String {
        use std::io::Write;
        writeln!(self.input, "{req}").expect("writing to the child");
        self.input.flush().expect("writing to the child");
        let a = self.line_while(meanwhile);
        assert!(!a.is_empty(), "the child ended on {req:?}");
        a
    }

    /// As [`line`](Self::line), calling `meanwhile` every few milliseconds
    /// until the line comes.
    pub fn line_while(&mut self, mut meanwhile: impl FnMut()) -> String {
        use std::os::fd::AsRawFd;
        let deadline = std::time::Instant::now() + LINE_WAIT;
        while self.out.buffer().is_empty()
            && !readable_within(
                self.out.get_ref().as_raw_fd(),
                std::time::Duration::from_millis(5),
            )
        {
            assert!(
                std::time::Instant::now() < deadline,
                "process {} said no line within {LINE_WAIT:?}; its threads: {}",
                self.pid(),
                threads_doing(self.pid())
            );
            meanwhile();
        }
        self.line()
    }

    fn ask_answer(&mut self, req: &str) -> String {
        let a = self.line();
        assert!(!a.is_empty(), "the child ended on {req:?}");
        a
    }

    /// Waits until its main thread blocks in a `read` of its stdin (it has
    /// answered and asks for the next line): its memory stands still.
    pub fn settle_in_read(&self) {
        settle_in_read(self.pid());
    }
}

/// The next line of `out`, trimmed; `None` at its end. Waits at most
/// [`LINE_WAIT`]: a process (`pid`, which writes it) that says nothing for
/// that long fails the test with what each of its threads was doing,
/// instead of holding the suite until CI's own limit.
pub fn line_within<R: std::io::Read + std::os::fd::AsFd>(
    out: &mut std::io::BufReader<R>,
    pid: i32,
) -> Option<String> {
    use std::io::BufRead;
    use std::os::fd::AsRawFd;
    let deadline = std::time::Instant::now() + LINE_WAIT;
    let mut l = Vec::new();
    loop {
        let held = out.buffer();
        if let Some(i) = held.iter().position(|&b| b == b'\n') {
            l.extend_from_slice(&held[..i]);
            out.consume(i + 1);
            break;
        }
        let n = held.len();
        l.extend_from_slice(held);
        out.consume(n);
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if !readable_within(out.get_ref().as_fd().as_raw_fd(), left) {
            panic!(
                "process {pid} said no line within {LINE_WAIT:?} (so far {:?}); its threads: {}",
                String::from_utf8_lossy(&l),
                threads_doing(pid)
            );
        }
        if out
            .fill_buf()
            .expect("reading the child's output")
            .is_empty()
        {
            if l.is_empty() {
                return None;
            }
            break;
        }
    }
    Some(String::from_utf8_lossy(&l).trim().to_string())
}

/// How long [`line_within`] waits for a line.
pub const LINE_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Whether `fd` has something to read (or its end) within `wait`.
fn readable_within(fd: i32, wait: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `p` is one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return true;
        }
        let interrupted =
            n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
        if !interrupted || left.is_zero() {
            return false;
        }
    }
}

/// What each thread of process `pid` is doing, for a failure's message:
/// its id, state, kernel wait channel and system call (`/proc`).
pub fn threads_doing(pid: i32) -> String {
    let tids = threads(pid);
    if tids.is_empty() {
        return format!("process {pid} is gone");
    }
    let mut out = Vec::new();
    for tid in tids {
        let read = |f: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/{f}")).unwrap_or_default()
        };
        let state = thread_state(pid, tid);
        let call = read("syscall");
        let call = call
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        out.push(format!(
            "{tid} {state} wchan={} syscall={call}",
            read("wchan")
        ));
    }
    out.sort();
    out.join("; ")
}

/// The threads of process `pid` (`/proc/PID/task`); none once it is gone.
pub fn threads(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The state letter of thread `tid` of process `pid`
/// (`/proc/PID/task/TID/stat`: `R`, `S`, `D`, `t`, ...); `gone` once it
/// is.
pub fn thread_state(pid: i32, tid: i32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().next())
        .unwrap_or("gone")
        .to_string()
}

/// The userfaultfd descriptors process `pid` holds (its `/proc/PID/fd`
/// links).
pub fn userfaultfds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("reading the process's descriptors")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().contains("userfaultfd"))
        .count()
}

/// Descriptors of process `pid` whose link in `/proc/PID/fd` reads
/// `link` exactly (`/dev/userfaultfd`, `anon_inode:[userfaultfd]`).
pub fn fds_on(pid: i32, link: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("reading the process's descriptors")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.as_os_str() == link)
        .count()
}

/// Waits until the main thread of process `pid` blocks in a `read` of its
/// stdin (for a child behind another program, such as a container's).
pub fn settle_in_read(pid: i32) {
    for _ in 0..5000 {
        let call = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        if call.starts_with("0 0x0 ") {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    panic!("process {pid} never blocked in its read of stdin");
}

impl Drop for Piped {
    /// Killed, and reaped within 30 s. Its threads this process still
    /// traces (a test that failed while holding it) are reaped first: the
    /// process itself cannot be until they are, and a plain wait for it
    /// would wait for ever.
    fn drop(&mut self) {
        let pid = self.pid();
        let tids = threads(pid);
        let _ = self.child.kill();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            for &t in tids.iter().filter(|&&t| t != pid) {
                let mut status = 0;
                // SAFETY: `status` is a valid out-pointer; a thread this
                // process does not trace is answered with ECHILD.
                unsafe { libc::waitpid(t, &mut status, libc::__WALL | libc::WNOHANG) };
            }
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            if std::time::Instant::now() > deadline {
                say(&format!(
                    "child {pid} not reaped 30 s after SIGKILL; its threads: {}\n",
                    threads_doing(pid)
                ));
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// Starts `sh -c script` with its input piped and its output `out`: one
/// open file description with the caller's, as a test harness's output
/// file is inherited by a program it starts.
pub fn shell_writing_to(script: &str, out: &std::fs::File) -> std::process::Child {
    std::process::Command::new("sh")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(out.try_clone().expect("a second handle on the output file"))
        .spawn()
        .expect("starting sh")
}

/// Waits, 10 s at most, until the file at `path` holds `what` at least
/// `n` times, calling `meanwhile` between looks; fails saying what it
/// waited for and what the file held.
pub fn wait_in_file(path: &std::path::Path, what: &str, n: usize, mut meanwhile: impl FnMut()) {
    let t0 = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.matches(what).count() >= n {
            return;
        }
        assert!(
            t0.elapsed().as_secs() < 10,
            "{} did not hold {what:?} {n} time(s) within 10 s: {text:?}",
            path.display()
        );
        meanwhile();
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Whether the test runs as root (its effective user).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Why ptrace cannot be used here, if it cannot (Yama's scope).
pub fn can_ptrace() -> Option<String> {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
    if scope.trim() == "3" || (scope.trim() == "2" && !is_root()) {
        return Some(format!(
            "ptrace is restricted here (kernel.yama.ptrace_scope = {})",
            scope.trim()
        ));
    }
    None
}

/// `GET path` over HTTP/1.0 from `port` on loopback: its body where it
/// answers 200, `None` where nothing answers (or not 200) within 5 s.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200").then(|| body.to_string())
}

/// The value of the unlabelled series `name` in Prometheus text `text`.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_required_feature_is_matched_in_what_a_skip_is_about() {
        // This test alone sets the variable in this process.
        std::env::set_var("PAGEWISE_REQUIRE", "uffd-wp, KSM");
        let cases = [
            // The backend under test is named first, the missing feature last.
            ("[uffd-wp] [hugetlb] no hugetlb pages configured", None),
            ("[soft-dirty] pagemap bit 55 never set by a write", None),
            ("[mprotect] does not apply to this backend", None),
            ("the kernel lacks UFFD_WP for this user", Some("uffd-wp")),
            ("[hash] [ksm] not built into this kernel", Some("ksm")),
            ("needs KSM and root", Some("ksm")),
        ];
        for (why, want) in cases {
            assert_eq!(super::required_in(why).as_deref(), want, "{why}");
        }
        assert_eq!(
            super::required("[ksm] merged nothing").as_deref(),
            Some("ksm")
        );
        std::env::remove_var("PAGEWISE_REQUIRE");
        assert_eq!(super::required_in("needs KSM and root"), None);
    }
}
