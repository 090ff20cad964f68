//! `pagewise farmem run | ls | set` end to end, on a self-checking C program
//! (`tests/c/farmem_target.c`): exact fetch counts from the trace, output
//! identical to a plain run, memory checked by the program itself, and live
//! instances listed and changed from outside.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_pagewise");

/// Why this machine cannot run these tests, if it cannot.
fn unsupported() -> Option<String> {
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
fn target() -> PathBuf {
    c_program("farmem_target")
}

/// A C program of `tests/c`, compiled once per test process.
fn c_program(name: &str) -> PathBuf {
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
        .status()
        .expect("running cc");
    assert!(st.success(), "compiling {}", src.display());
    built.push((name.to_string(), out.clone()));
    out
}

/// How a command ended within its deadline: (exit code or 128 + signal,
/// stdout, stderr); `None` when it had to be killed (with every process
/// it started: it runs in a process group of its own).
fn run_with_deadline(mut c: Command, deadline: Duration) -> Option<(i32, String, String)> {
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
struct Busy(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Busy {
    fn start() -> Self {
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
fn same_as_native(tag: &str, program: &str, args: &[&str], option_sets: &[&[&str]]) {
    same_as_native_cmd(tag, &c_program(program), args, option_sets, true, &[]);
}

/// [`same_as_native`] for any program `prog`.
/// With `need_faults`, the runs must have served faults (a pipeline of
/// small programs may fit its budget).
fn same_as_native_cmd(
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

/// Regression: an mremap sequence (grow with a move, shrink in place, move
/// over a PROT_NONE reservation with MREMAP_FIXED, grow after the move)
/// read zeros instead of the data (17 MiB) and hung (LRU, 64 pages).
fn mremap_sequence_keeps_every_byte() {
    need_support!();
    for mib in ["17", "16"] {
        same_as_native(
            &format!("mremap-{mib}"),
            "farmem_mremap",
            &[mib],
            &[
                &["--local-pages", "100000"],
                &["--local-pages", "4096"],
                &["--local-pages", "4096", "--policy", "lru"],
                &["--local-pages", "64", "--policy", "lru"],
            ],
        );
    }
}

/// Regression: realloc cycles up to 48 MiB and back deadlocked in the
/// second round (the handler faulted on a staged page it was hashing,
/// which a stale adoption had moved away).
fn realloc_cycles_neither_hang_nor_lose_data() {
    need_support!();
    same_as_native(
        "realloc",
        "farmem_realloc",
        &[],
        &[&["--local-pages", "4096"], &["--local-pages", "100000"]],
    );
}

/// Random mmap / munmap / mremap (every shape) / MADV_DONTNEED / realloc
/// sequences, checked page by page by the program and against its native
/// output, under several budgets and policies.
fn random_memory_operations_match_native() {
    need_support!();
    // Under load: seed 4 with lru lost writes in 60 % of loaded runs while an
    // mremap or madvise was half done, and in 3 % of unloaded ones.
    let _busy = Busy::start();
    // Seeds 1006, 1210 and 1231 differed from the native run once each in
    // a long randomized run (scripts/farmem-stress) on a loaded machine.
    // The engine checks its books against the page tables at every fault
    // (PAGEWISE_FARMEM_CHECK), all of them every 64 faults.
    // Seeds 5, 6 and 6044 run with two more threads faulting all the while
    // on buffers of their own, racing the remap, unmap and remove events
    // (6044 stopped once on the thread path, LRU at 4,096 pages: the move
    // back of a parked page met EEXIST; 10045 stopped the debug mode on
    // the inline path with the other vCPU busy: a helper's fresh mapping
    // took the address of one the main thread had just unmapped, before
    // the engine read the unmap).
    for (seed, helpers) in [
        ("1", "0"),
        ("2", "0"),
        ("3", "0"),
        ("4", "0"),
        ("1006", "0"),
        ("1210", "0"),
        ("1231", "0"),
        ("5", "2"),
        ("6", "2"),
        ("6044", "2"),
        ("10045", "2"),
    ] {
        same_as_native_cmd(
            &format!("mmfuzz-{seed}"),
            &c_program("farmem_mmfuzz"),
            &[seed, "120", helpers],
            &[
                &["--local-pages", "256"],
                &["--local-pages", "4096", "--policy", "lru"],
                &["--local-pages", "512", "--policy", "clock"],
            ],
            true,
            &[(pagewise::mech::shim::env::FARMEM_CHECK, "64")],
        );
    }
}

/// Memory the kernel reads and writes for the program, remote when it is
/// handed over (a sweep of 1 MiB through a budget of 64 pages comes first):
/// read/write/pread/readv/writev into heap buffers, stat and getdents64
/// into heap structures, a path in the heap, send/recv and sendmsg/recvmsg
/// with heap msghdr and iovecs, poll and epoll_wait arrays, a mutex and a
/// condition variable in the heap, the program's own SIGBUS handler (raised,
/// and a real bus error past a file's end), a sweep with every signal
/// blocked, a handler on an alternate stack in the heap, posix_spawn with
/// argv and envp in the heap, getcwd and getrandom into the heap, and
/// process_vm_readv/writev of 1 MiB on itself. The program checks each and
/// prints what it saw: the same as natively.
fn kernel_accesses_match_native() {
    need_support!();
    let scratch = instance_dir("kernel-scratch");
    let d = scratch.to_str().unwrap();
    // process_vm_readv/writev on itself, larger than the budget: the inline
    // path holds every buffer; on the handler-thread path the pages the
    // kernel pins while it copies are passed over as victims (it waited
    // for ever on them before).
    let args: &[&str] = &[d, "self-vm"];
    same_as_native(
        "kernel",
        "farmem_kernel",
        args,
        &[
            &["--local-pages", "64"],
            &["--local-pages", "64", "--policy", "clock"],
            &["--local-pages", "100000"],
        ],
    );
    let _ = std::fs::remove_dir_all(&scratch);
}

/// python3 reading a file larger than the budget whole, over and over, at
/// budgets of 512 and 64 pages, prints what it prints natively. (The
/// EFAULT this was written for — a read into a buffer just grown by
/// `realloc`, before the engine adopted it — does not show here every
/// run; it showed in 298 of 300 reads of an 8 MB file run by hand. The
/// kernel-access program's `grown` case shows it in every run: 1 to 99
/// of its 100 reads failed in each of 18 runs before the fix.)
fn python3_reads_files_larger_than_the_budget() {
    need_support!();
    let py = std::path::PathBuf::from("/usr/bin/python3");
    if !py.is_file() {
        pagewise_testkit::skip!("/usr/bin/python3 is not installed");
        return;
    }
    let dir = instance_dir("python3-data");
    // On tmpfs (the kernel's copy into a missing page fails the read
    // there, where a disk file's read comes back short and is retried).
    let shm = std::path::Path::new("/dev/shm");
    let data = if shm.is_dir() {
        shm.join(format!(
            "pagewise-python3-{}-{}.bin",
            std::process::id(),
            PATH.with(|p| p.get())
        ))
    } else {
        dir.join("data.bin")
    };
    let bytes: Vec<u8> = (0..8_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&data, &bytes).unwrap();
    let script = dir.join("read.py");
    std::fs::write(
        &script,
        "import hashlib, sys\n\
         path = sys.argv[1]\n\
         bad = 0\n\
         h = hashlib.sha256()\n\
         for i in range(100):\n\
         \x20   try:\n\
         \x20       with open(path, 'rb') as f:\n\
         \x20           d = f.read()\n\
         \x20       h.update(d[i * 1000:i * 1000 + 4096])\n\
         \x20   except OSError as e:\n\
         \x20       bad += 1\n\
         print('errors', bad, 'digest', h.hexdigest())\n",
    )
    .unwrap();
    let (s, d) = (script.to_str().unwrap(), data.to_str().unwrap());
    same_as_native_cmd(
        "python3",
        &py,
        &[s, d],
        &[&["--local-pages", "512"], &["--local-pages", "64"]],
        true,
        &[],
    );
    let _ = std::fs::remove_file(&data);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Real programs, byte for byte as natively, at budgets of 64, 512 and
/// 4,096 pages: perl (a hash and a sort), python3 (dicts and lists),
/// sqlite3 (a table built and queried in memory), gzip and xz (compressed
/// and back, digested), sort (lines of a file, digested), git (init,
/// commits, gc, fsck, log, in a fresh repository with fixed dates).
/// Threads, forks and a program's own SIGBUS handler are in
/// farmem_kernel and farmem_forkreset. Inputs are a few MiB here. On the
/// handler-thread path the pipelines (gzip, xz, sort, git) run at 4,096
/// pages only (all three budgets take about 160 s there on a loaded
/// machine, against 106 s for everything inline);
/// `PAGEWISE_REAL_PROGRAMS_FULL=1` runs them at 64 and 512 too, and
/// `PAGEWISE_REAL_PROGRAMS_MIB=200` sorts 200 MiB.
fn real_programs_match_native() {
    need_support!();
    let dir = instance_dir("real-programs");
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let sort_mib: usize = std::env::var("PAGEWISE_REAL_PROGRAMS_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    // Text lines from a fixed generator: sort's input and the archivers'.
    let mut text = String::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while text.len() < sort_mib << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(&format!("{:016x} line {}\n", x, x % 100_003));
    }
    let input = work.join("input.txt");
    std::fs::write(&input, &text).unwrap();
    let inp = input.to_str().unwrap().to_string();
    let repo = work.join("repo");
    let git = format!(
        "set -e; rm -rf {r}; mkdir {r}; cd {r}; export GIT_AUTHOR_DATE=2020-01-01T00:00:00Z \
         GIT_COMMITTER_DATE=2020-01-01T00:00:00Z GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@b \
         GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@b; git init -q -b main .; \
         head -c 300000 {inp} > f1; git add f1; git commit -qm c1; \
         git gc -q; git fsck --no-progress 2>&1; git log --format='%H %s'; git count-objects -v",
        r = repo.display()
    );
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "perl",
            vec![
                "-e".into(),
                "my %h; $h{\"k$_\"} = $_ * $_ for 1..60000; my $s = 0; $s += $h{\"k$_\"} for 1..60000; \
                 my @a = sort { $a <=> $b } map { ($_ * 7919) % 100003 } 1..60000; \
                 print \"$s $a[0] $a[-1] \", scalar(@a), \"\\n\";"
                    .into(),
            ],
        ),
        (
            "/usr/bin/python3",
            vec![
                "-c".into(),
                "d = {str(i): i * i for i in range(80000)}\n\
                 l = sorted((i * 7919) % 100003 for i in range(80000))\n\
                 print(sum(d.values()), l[0], l[-1], len(l), sum(l[::1000]))"
                    .into(),
            ],
        ),
        (
            "sqlite3",
            vec![
                ":memory:".into(),
                "create table t(a integer primary key, b integer, c text); \
                 with recursive n(x) as (select 1 union all select x + 1 from n where x < 50000) \
                 insert into t select x, (x * 7919) % 100003, hex(x * 31) from n; \
                 create index tb on t(b); select count(*), sum(b), min(c), max(c) from t; \
                 select a from t order by b desc, a limit 3;"
                    .into(),
            ],
        ),
        ("sh", vec!["-c".into(), format!("gzip -c {inp} | gzip -dc | sha256sum; gzip -c {inp} | sha256sum")]),
        ("sh", vec!["-c".into(), format!("xz --lzma2=preset=0,dict=64KiB -T1 -c {inp} | xz -dc | sha256sum; xz --lzma2=preset=0,dict=64KiB -T1 -c {inp} | sha256sum")]),
        ("sh", vec!["-c".into(), format!("sort {inp} | sha256sum; sort -r -k3n {inp} | head -c 100000 | sha256sum")]),
        ("sh", vec!["-c".into(), git]),
    ];
    // Every program at every budget on the default (inline) path; on the
    // handler-thread path the pipelines, whose small-budget runs are the
    // long ones, at 4,096 pages (`PAGEWISE_REAL_PROGRAMS_FULL=1`: all).
    let full = std::env::var_os("PAGEWISE_REAL_PROGRAMS_FULL").is_some()
        || PATH.with(|p| p.get()) == "inline";
    for (prog, args) in &cases {
        let path = if prog.starts_with('/') {
            std::path::PathBuf::from(prog)
        } else {
            match which(prog) {
                Some(p) => p,
                None => {
                    pagewise_testkit::skip!("{prog} is not installed");
                    continue;
                }
            }
        };
        if !path.is_file() {
            pagewise_testkit::skip!("{} is not installed", path.display());
            continue;
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        same_as_native_cmd(
            "real",
            &path,
            &args,
            if *prog != "sh" || full {
                &[
                    &["--local-pages", "64"],
                    &["--local-pages", "512"],
                    &["--local-pages", "4096"],
                ]
            } else {
                &[&["--local-pages", "4096"]]
            },
            *prog != "sh",
            &[],
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The path of `prog` in /usr/bin or /bin (the system's own).
fn which(prog: &str) -> Option<std::path::PathBuf> {
    ["/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(prog))
        .find(|p| p.is_file())
}

/// A forked child that blocks every signal, resets every handler to the
/// default and allocates before it execs (git's run-command does) keeps
/// being served: the shim's SIGSYS stays installed and unblocked (it died
/// of SIGSYS at its first trapped call).
fn a_child_resetting_its_signals_survives() {
    need_support!();
    same_as_native(
        "forkreset",
        "farmem_forkreset",
        &[],
        &[&["--local-pages", "64"], &["--local-pages", "4096"]],
    );
}

/// When the engine's books and memory disagree (here: the program unmaps
/// the engine's staging behind its back), the program is stopped loudly,
/// never left running on wrong memory or waiting forever.
fn a_failing_handler_stops_the_program() {
    need_support!();
    let dir = instance_dir("sabotage");
    let mut c = farmem(&dir);
    c.args(["run", "--local-pages", "16", "--"])
        .arg(c_program("farmem_sabotage"));
    let Some((code, out, err)) = run_with_deadline(c, Duration::from_secs(60)) else {
        panic!("the program hung after its engine's staging was dropped");
    };
    assert!(
        out.contains("staging dropped: ") && !out.contains("staging dropped: 0"),
        "the program found no staging to drop: {out}\n{err}"
    );
    assert!(!out.contains("read back"), "the program ran on: {out}");
    assert_eq!(code, 128 + libc::SIGABRT, "{out}\n{err}");
    assert!(err.contains("the fault handler failed"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A private instance directory per test, so tests never see each other.
fn instance_dir(tag: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "pagewise-farmem-inst-{}-{tag}-{}",
        std::process::id(),
        PATH.with(|p| p.get())
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn farmem(dir: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.arg("farmem")
        .env("PAGEWISE_FARMEM_DIR", dir)
        .env("PAGEWISE_FARMEM_FAULT_PATH", PATH.with(|p| p.get()));
    c
}

thread_local! {
    /// The fault path the running test uses (`farmem run` takes it from
    /// PAGEWISE_FARMEM_FAULT_PATH).
    static PATH: std::cell::Cell<&'static str> = const { std::cell::Cell::new("thread") };
}

/// Runs `test` with `farmem run --fault-path PATH` (see `per_fault_path!`).
fn on_path(path: &'static str, name: &str, test: fn()) {
    let sigbus = pagewise::probe::get().uffd_has(pagewise_sys::uffd::feature::SIGBUS);
    if !pagewise_testkit::fault_path_runs(path, name, sigbus) {
        return;
    }
    PATH.with(|p| p.set(path));
    test();
}

// Every test runs on both fault paths: `NAME::thread` and `NAME::inline`.
pagewise_testkit::per_fault_path!(
    super::on_path;
    kernel_accesses_match_native,
    a_child_resetting_its_signals_survives,
    python3_reads_files_larger_than_the_budget,
    real_programs_match_native,
    mremap_sequence_keeps_every_byte,
    realloc_cycles_neither_hang_nor_lose_data,
    random_memory_operations_match_native,
    a_failing_handler_stops_the_program,
    table_5_1_exact_under_farmem_run,
    programs_keep_their_memory,
    shared_instance_listed_and_set_live,
    a_newcomer_gets_its_share_of_a_shared_budget,
    io_uring_and_aio_are_refused_inline_only,
    redis_keeps_every_value,
    bad_input_is_refused_clearly,
    planted_instances_are_never_joined,
    bad_settings_are_refused_before_the_program_starts,
    budgets_of_one_to_three_pages_run,
    several_processes_add_up_and_free_their_slots,
    snapshot_and_inspect_of_an_emulated_process_never_hang,
    heap_grown_and_trimmed_with_brk_keeps_its_bytes,
    unusable_trace_paths_and_static_programs_are_said,
    a_missing_command_is_one_line,
);

fn run_target(dir: &Path, opts: &[&str], args: &[&str]) -> (String, String) {
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

fn plain(args: &[&str]) -> String {
    let out = Command::new(target()).args(args).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn trace_events(path: &Path) -> Vec<serde_json::Value> {
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

/// DiME's Table 5.1 under `farmem run`: the 2000-page buffer is fetched
/// exactly 2000 times for x <= 1000 and 2000 + x above; the C library adds
/// only its malloc header page. Output is that of a plain run.
fn table_5_1_exact_under_farmem_run() {
    need_support!();
    let dir = instance_dir("table");
    for x in [0u64, 500, 1000, 1100, 2000] {
        let tr = dir.join(format!("trace-{x}"));
        let stats = dir.join(format!("stats-{x}.json"));
        let xs = x.to_string();
        let (out, _) = run_target(
            &dir,
            &[
                "--local-pages",
                "1000",
                "--trace",
                tr.to_str().unwrap(),
                "--stats-json",
                stats.to_str().unwrap(),
            ],
            &["table", &xs],
        );
        assert_eq!(
            out.split_whitespace().last(),
            plain(&["table", &xs]).split_whitespace().last(),
            "the program's result changed"
        );
        let w: Vec<&str> = out.split_whitespace().collect();
        let a = u64::from_str_radix(w[1].trim_start_matches("0x"), 16).unwrap();
        let b = u64::from_str_radix(w[2].trim_start_matches("0x"), 16).unwrap();
        let ev = trace_events(&tr);
        let fetches = |inside: bool| {
            ev.iter()
                .filter(|e| e["kind"] == "fetch")
                .filter(|e| {
                    let addr = e["addr"].as_u64().unwrap();
                    (a <= addr && addr < b) == inside
                })
                .count() as u64
        };
        let want = if x <= 1000 { 2000 } else { 2000 + x };
        assert_eq!(fetches(true), want, "buffer fetches for x = {x}");
        let extra = fetches(false);
        assert!(extra <= 8, "{extra} fetches outside the buffer for x = {x}");
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        for k in [
            "page_fault_count",
            "remote_fetches",
            "evictions",
            "writebacks",
            "injected_delay_ns",
            "floor_ns",
        ] {
            assert!(s[k].is_u64(), "stats JSON lacks {k}: {s}");
        }
        // The counters also see faults after the trace was written at exit
        // (the C library flushes stdout last), and the last fault before
        // exit may beat its publication: a page or two either way.
        let f = s["page_fault_count"].as_u64().unwrap();
        assert_eq!(s["remote_fetches"].as_u64().unwrap(), f);
        assert!(
            f.abs_diff(want + extra) <= 2,
            "{f} faults counted, {} traced",
            want + extra
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Memory stays correct through read(), realloc (mremap), threads and fork,
/// with a budget of 100 pages.
fn programs_keep_their_memory() {
    need_support!();
    let dir = instance_dir("memory");
    let file = dir.join("input");
    let data: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &data).unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["read", file.to_str().unwrap()],
        vec!["grow"],
        vec!["threads"],
        // Threads whose first fault comes after the whole heap was pushed
        // out while they slept.
        vec!["parked"],
        vec!["fork"],
    ];
    for args in &cases {
        for policy in ["fifo", "clock"] {
            let (out, err) = run_target(&dir, &["--local-pages", "100", "--policy", policy], args);
            assert_eq!(
                out,
                plain(args),
                "{args:?} with {policy}: output differs\n{err}"
            );
            assert!(!err.contains("stopped"), "{args:?}: {err}");
        }
    }
    // Thread stacks emulated too (--stacks): threads start, run and exit.
    let (out, err) = run_target(
        &dir,
        &["--stacks", "--local-pages", "100", "--policy", "clock"],
        &["threads"],
    );
    assert_eq!(out, plain(&["threads"]), "threads with --stacks\n{err}");

    // A forked child stays in its parent's instance: two members, one run.
    let stats = dir.join("fork-stats.json");
    run_target(
        &dir,
        &[
            "--local-pages",
            "100",
            "--stats-json",
            stats.to_str().unwrap(),
        ],
        &["fork"],
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let members = s["members"].as_array().unwrap();
    assert_eq!(members.len(), 2, "parent and child: {s}");
    assert_ne!(members[0]["pid"], members[1]["pid"]);
    assert!(
        members
            .iter()
            .all(|m| m["stats"]["page_fault_count"].as_u64().unwrap() > 0),
        "{s}"
    );

    // The plain run itself is right (its check is what we compare).
    let fnv = data
        .iter()
        .take(256 * 4096)
        .fold(1469598103934665603u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(1099511628211)
        });
    assert!(plain(&cases[0]).contains(&format!("fnv {fnv:016x} other_bad 0")));
    assert!(plain(&["grow"]).contains("bad 0"));
    assert!(plain(&["threads"]).contains("bad 0"));
    assert!(plain(&["fork"]).contains("child_bad 0 parent_bad 0"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn ls(dir: &Path) -> serde_json::Value {
    let out = farmem(dir).args(["ls", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], 1, "{v}");
    v["instances"].clone()
}

/// Starts `farmem run --instance NAME` of the target holding `pages`
/// pages for `secs` seconds (creating the instance with a budget of 600
/// pages and 1 µs latency if it does not exist); returns once it holds them.
fn hold_in_instance(dir: &Path, name: &str, pages: u64, secs: u64) -> std::process::Child {
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
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), format!("holding {pages}"));
    c
}

/// Two processes share one named instance; `ls` lists both with the
/// instance's figures; `set` shrinks the budget and both fit under it at
/// once; another user may not change it.
fn shared_instance_listed_and_set_live() {
    need_support!();
    let dir = instance_dir("live");
    let a = hold_in_instance(&dir, "shared", 400, 6);
    let b = hold_in_instance(&dir, "shared", 400, 6);
    let l = ls(&dir);
    let inst = l
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["instance_id"] == "shared")
        .expect("instance listed");
    assert_eq!(inst["latency_ns"], 1000);
    assert_eq!(inst["local_npages"], 600);
    assert_eq!(inst["pids"].as_array().unwrap().len(), 2, "{inst}");
    for k in [
        "page_fault_count",
        "remote_fetches",
        "evictions",
        "injected_delay_ns",
        "bandwidth_bps",
    ] {
        assert!(inst[k].is_u64(), "ls lacks {k}");
    }
    // Both hold 400 pages: the shared budget of 600 keeps them under it.
    assert!(
        inst["local_pages_now"].as_u64().unwrap() <= 600 + 2,
        "{inst}"
    );

    // Another user may not change it.
    if unsafe_is_root() && Path::new("/usr/bin/setpriv").exists() {
        let out = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                BIN,
                "farmem",
                "set",
                "shared",
                "local_npages=10",
            ])
            .env("PAGEWISE_FARMEM_DIR", &dir)
            .output()
            .unwrap();
        assert!(!out.status.success(), "another user changed the instance");
        assert!(String::from_utf8_lossy(&out.stderr).contains("owner"));
    } else {
        pagewise_testkit::skip!("owner check: needs root and setpriv");
    }

    let out = farmem(&dir)
        .args(["set", "shared", "local_npages=50", "latency_ns=2000"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t0 = Instant::now();
    loop {
        let l = ls(&dir);
        let i = &l[0];
        assert_eq!(i["latency_ns"], 2000);
        assert_eq!(i["local_npages"], 50);
        assert_eq!(
            i["pids"].as_array().unwrap().len(),
            2,
            "a member left early: {i}"
        );
        if i["local_pages_now"].as_u64().unwrap() <= 50 + 2 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "budget not applied: {i}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in [a, b] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hold bad 0");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: a process joining a shared instance whose other member sat
/// above its share of a full budget was held to the few pages left (the
/// other member, not faulting, never gave any back) and crawled. Now a
/// member well above its share of a full budget comes down to it: the
/// newcomer gets its share, the budget holds, and every byte is kept.
fn a_newcomer_gets_its_share_of_a_shared_budget() {
    need_support!();
    let dir = instance_dir("share");
    let a = hold_in_instance(&dir, "share", 500, 14);
    let b = hold_in_instance(&dir, "share", 400, 10);
    let (pa, pb) = (a.id() as i64, b.id() as i64);
    // The target's pages with data are 500 and 400 and a few of its own:
    // shares of 600 near 333 and 267. Held to what `a` left, `b` had
    // at most about 100.
    let t0 = Instant::now();
    let mut seen = Vec::new();
    let got = loop {
        let l = ls(&dir);
        let i = l
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["instance_id"] == "share")
            .expect("instance listed")
            .clone();
        let local = |pid: i64| {
            i["members"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["live"] == true)
                // `farmem run` runs the target as its child: the member is
                // the run or its child.
                .find(|m| {
                    let p = m["pid"].as_i64().unwrap();
                    p == pid
                        || std::fs::read_to_string(format!("/proc/{p}/status"))
                            .ok()
                            .and_then(|t| pagewise::mech::procfs::status_field(&t, "PPid"))
                            == Some(pid as u64)
                })
                .map(|m| m["stats"]["local_pages_now"].as_u64().unwrap())
        };
        let (la, lb) = (local(pa), local(pb));
        let total = i["local_pages_now"].as_u64().unwrap();
        assert!(total <= 600 + 2, "budget broken: {i}");
        seen.push((la, lb));
        if let (Some(la), Some(lb)) = (la, lb) {
            if lb >= 200 && la <= 333 + 30 {
                break (la, lb);
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "the newcomer never got its share (local pages of the first and \
             the newcomer over time: {seen:?})"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("shares reached: first {} pages, newcomer {}", got.0, got.1);
    for c in [b, a] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hold bad 0");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// io_uring and Linux AIO use a program's buffers later, from the kernel's
/// own threads or at completion, where the inline path cannot hold them:
/// refused there with ENOSYS (as on a kernel without them) and one line
/// saying why, even when made by code outside the C library; on the
/// handler-thread path they answer as without pagewise.
fn io_uring_and_aio_are_refused_inline_only() {
    need_support!();
    let dir = instance_dir("uring");
    let (out, err) = run_target(&dir, &["--local-pages", "64"], &["uring"]);
    if PATH.with(|p| p.get()) == "inline" {
        let enosys = std::io::Error::from_raw_os_error(libc::ENOSYS).to_string();
        // "Function not implemented (os error 38)": the C library's text.
        let text = enosys.split(" (os error").next().unwrap();
        assert_eq!(out, format!("io_uring_setup {text}\nio_setup {text}\n"));
        assert_eq!(
            err.matches("io_uring and Linux AIO are refused").count(),
            1,
            "{err}"
        );
    } else {
        assert_eq!(out, plain(&["uring"]));
        assert!(!err.contains("refused"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Debian's Redis under `farmem run` with a quarter of its memory local:
/// 3000 keys of 1 KiB stored, then every one read back and compared, while
/// its own threads sleep and wake; the server must still answer and exit
/// cleanly. (On the inline path a thread-local read in the fault handler
/// once killed it: the C library's tables of its threads sit in the heap.)
fn redis_keeps_every_value() {
    need_support!();
    if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        pagewise_testkit::skip!("redis-server is not installed (scripts/setup.sh installs it)");
        return;
    }
    use pagewise_bench::farmem_redis::{fill, verify, App};
    use pagewise_bench::redis::{free_port, server_args, wait_ready_within};
    use std::io::Write;
    let dir = instance_dir("redis");
    let port = free_port().unwrap();
    let mut server = farmem(&dir)
        .args(["run", "--local-percent", "25", "--latency-ns", "1000", "--"])
        .arg("redis-server")
        .args(server_args(port))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Err(e) = wait_ready_within(port, Duration::from_secs(30)) {
        let _ = server.kill();
        panic!("redis under farmem run: {e}");
    }
    let (keys, len) = (3000, 1024);
    fill(App::Redis, port, keys, len).unwrap();
    let checked = verify(App::Redis, port, keys, len, keys).unwrap();
    assert_eq!(checked, keys, "values read back");
    std::net::TcpStream::connect(("127.0.0.1", port))
        .unwrap()
        .write_all(b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
        .unwrap();
    let out = server.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "redis under farmem run: {:?}\n{err}",
        out.status
    );
    let served = match PATH.with(|p| p.get()) {
        "inline" => "served in the faulting threads",
        _ => "served by the handler threads",
    };
    assert!(err.contains(served), "faults not {served}:\n{err}");
    println!("redis: {checked} of {keys} values read back and equal");
    let _ = std::fs::remove_dir_all(&dir);
}

fn unsafe_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Bad input gets one clear line and a non-zero exit.
fn bad_input_is_refused_clearly() {
    let dir = instance_dir("bad");
    let run = |args: &[&str]| {
        let out = farmem(&dir).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&["run", "--", "true"]).contains("--local-pages"));
    assert!(run(&["run", "--local-percent", "0", "--", "true"]).contains("1..=100"));
    assert!(run(&["set", "nosuch", "latency_ns=1"]).contains("no far-memory instance"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: an instance file another user planted (a copy of a live one,
/// under the name the next run would take, or a pre-created `--instance`)
/// made root's `farmem run` join it and hang. Now a process joins only an
/// instance its own user owns, names are not predictable, instance files
/// are owner-only, and a shared directory another user could rewrite is
/// refused.
fn planted_instances_are_never_joined() {
    need_support!();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        pagewise_testkit::skip!("making a file another user owns needs root");
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = instance_dir("planted");
    // A live instance to copy.
    let mut live = farmem(&dir)
        .args([
            "run",
            "--instance",
            "victim",
            "--local-pages",
            "1000",
            "--",
            "sleep",
            "3",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let src = dir.join("victim");
    let t0 = Instant::now();
    while !src.exists() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(src.exists(), "the instance file never appeared");
    let mode = std::fs::metadata(&src).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "instance files are owner-only");
    let planted = dir.join("planted");
    std::fs::copy(&src, &planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    let mut c = farmem(&dir);
    c.args(["run", "--instance", "planted", "--", "true"]);
    let Some((code, _, err)) = run_with_deadline(c, Duration::from_secs(60)) else {
        panic!("farmem run hung on a planted instance");
    };
    assert_ne!(code, 0, "joined an instance another user owns: {err}");
    assert!(err.contains("belongs to uid 65534"), "{err}");
    let _ = live.wait();
    // Names farmem run makes up are not the next pid.
    let names: Vec<String> = (0..2)
        .map(|_| {
            let out = farmem(&dir)
                .args(["run", "--local-pages", "100", "--", "true"])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            let name = err
                .split_whitespace()
                .find(|w| w.starts_with("run-"))
                .unwrap_or_else(|| panic!("no instance name in {err}"))
                .trim_end_matches(':')
                .to_string();
            let hex = name.trim_start_matches("run-");
            assert!(
                hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()),
                "a predictable name: {name}"
            );
            name
        })
        .collect();
    assert_ne!(names[0], names[1]);
    // A shared directory another user owns, writable without the sticky bit.
    let bad = instance_dir("planted-dir");
    std::os::unix::fs::chown(&bad, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = farmem(&bad)
        .args(["run", "--local-pages", "100", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "used an unsafe directory: {err}");
    assert!(err.contains("not a safe instance directory"), "{err}");
    assert_eq!(std::fs::metadata(&bad).unwrap().uid(), 65534);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&bad);
}

/// Regression: a latency near `u64::MAX` overflowed to "0.0 ms injected",
/// and an unknown policy (or a plugin that does not load) only warned and
/// ran the program without emulation. Each is refused in one line before
/// the program starts, and `farmem set` refuses the same values on a live
/// instance. (Budgets of 1 to 3 pages run: see
/// `budgets_of_one_to_three_pages_run`.)
fn bad_settings_are_refused_before_the_program_starts() {
    need_support!();
    let dir = instance_dir("badsettings");
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--local-pages",
                "100",
                "--latency-ns",
                "18446744073709551615",
            ],
            "at most",
        ),
        (
            &["--local-pages", "100", "--policy", "bogus"],
            "unknown policy",
        ),
        (
            &["--local-pages", "100", "--policy", "FIFO"],
            "unknown policy",
        ),
        (&["--local-pages", "100", "--policy", ""], "unknown policy"),
        (
            &["--local-pages", "100", "--policy", "./no-such-policy.so"],
            "policy plugin",
        ),
        (
            &["--local-pages", "100", "--policy", "/etc/hostname"],
            "policy plugin",
        ),
    ];
    for (opts, want) in cases {
        let out = farmem(&dir)
            .arg("run")
            .args(*opts)
            .args(["--", "sh", "-c", "echo the program ran"])
            .output()
            .unwrap();
        let so = String::from_utf8_lossy(&out.stdout);
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{opts:?} accepted:\n{so}{se}");
        assert!(!so.contains("the program ran"), "{opts:?}: the program ran");
        assert!(se.contains(want), "{opts:?}: {se}");
        assert_eq!(se.trim().lines().count(), 1, "{opts:?}: one line: {se}");
    }
    // On a live instance.
    let mut live = farmem(&dir)
        .args([
            "run",
            "--instance",
            "live",
            "--local-pages",
            "1000",
            "--",
            "sleep",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !dir.join("live").exists() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (kv, want) in [
        ("local_npages=0", "1..=100"),
        ("latency_ns=18446744073709551615", "at most"),
        ("local_percent=0", "1..=100"),
    ] {
        let out = farmem(&dir).args(["set", "live", kv]).output().unwrap();
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{kv} accepted");
        assert!(se.contains(want), "{kv}: {se}");
    }
    let _ = live.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Budgets of one, two and three pages (`--local-pages 1` livelocked: one
/// instruction may need four pages at once). Copies whose source and
/// destination cross page boundaries, then two pages read in turn: the
/// same output as natively, and the summary says by how much the budget
/// was exceeded: inline, by the pages lent to instructions that needed
/// them (and some faults were served so); on the handler-thread path, by
/// the four pages each process keeps.
fn budgets_of_one_to_three_pages_run() {
    need_support!();
    let opts: [&[&str]; 3] = [
        &["--local-pages", "1"],
        &["--local-pages", "2"],
        &["--local-pages", "3"],
    ];
    same_as_native("lend", "farmem_lend", &[], &opts);
    let dir = instance_dir("lend-summary");
    for opts in opts {
        let mut c = farmem(&dir);
        c.arg("run")
            .args(opts)
            .arg("--")
            .arg(c_program("farmem_lend"));
        let (code, _, err) = run_with_deadline(c, Duration::from_secs(180)).expect("hung");
        assert_eq!(code, 0, "{err}");
        let line = err
            .lines()
            .find(|l| l.contains("the budget was exceeded by up to"))
            .unwrap_or_else(|| panic!("{opts:?}: no overshoot reported:\n{err}"));
        if PATH.with(|p| p.get()) == "inline" {
            let lent: u64 = line
                .split(" pages (")
                .nth(1)
                .and_then(|t| t.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{line}"));
            assert!(
                lent > 0,
                "{opts:?}: no fault served with pages lent: {line}"
            );
        } else {
            assert!(line.contains("keeps at least 4 pages"), "{line}");
        }
        println!("{opts:?}: {line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: with several processes in one run, the summary reported the
/// last one's fetches (130 where three processes fetched 130 each: exited
/// members' slots were reused and their counts dropped), and members that
/// left through `_exit` kept their slots, so after 64 of them new processes
/// ran without emulation. Totals are totals, checked against every
/// process's own trace; slots of exited members are reused.
fn several_processes_add_up_and_free_their_slots() {
    need_support!();
    let dir = instance_dir("stats");
    let touch = c_program("farmem_touch");
    let t = touch.to_str().unwrap();
    let tr = dir.join("trace");
    let stats = dir.join("stats.json");
    let out = farmem(&dir)
        .args(["run", "--local-pages", "1000", "--trace"])
        .arg(&tr)
        .arg("--stats-json")
        .arg(&stats)
        .args(["--", "sh", "-c", &format!("{t} 130; {t} 130; {t} 130")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let traced = trace_events(&tr)
        .iter()
        .filter(|e| e["kind"] == "fetch")
        .count() as u64;
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert!(traced >= 3 * 130, "{traced} fetches traced");
    assert_eq!(
        s["remote_fetches"].as_u64().unwrap(),
        traced,
        "the total is not the sum"
    );
    // 70 members that leave through _exit, then one more.
    let out = farmem(&dir)
        .args(["run", "--local-pages", "1000", "--stats-json"])
        .arg(&stats)
        .args([
            "--",
            "sh",
            "-c",
            &format!("i=0; while [ $i -lt 70 ]; do {t} 5 _exit; i=$((i+1)); done; {t} 130"),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("members already") && !err.contains("without"),
        "{err}"
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let f = s["remote_fetches"].as_u64().unwrap();
    assert!(
        f >= 70 * 5 + 130,
        "{f} fetches for 70 x 5 + 130 pages touched"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: `snapshot --pid` of a process under `farmem run` failed with
/// "more pages pushed than the regions hold" (or could wait forever on the
/// handler it had stopped), and `inspect --pid` of one could hang. Now the
/// snapshot is refused with the reason, and inspect finishes.
fn snapshot_and_inspect_of_an_emulated_process_never_hang() {
    need_support!();
    let dir = instance_dir("outside");
    let mut run = farmem(&dir)
        .args([
            "run",
            "--local-pages",
            "2000",
            "--",
            BIN,
            "workload",
            "--mib",
            "32",
        ])
        .args(["--seconds", "20", "--pages-per-sec", "5000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(run.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The workload is the run's child.
    let children =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", run.id(), run.id()))
            .unwrap_or_default();
    let pid = children
        .split_whitespace()
        .next()
        .expect("the workload's pid")
        .to_string();
    let store = dir.join("store");
    let mut c = Command::new(BIN);
    c.args(["snapshot", "--pid", &pid, "--out"]).arg(&store);
    let Some((code, _, err)) = run_with_deadline(c, Duration::from_secs(60)) else {
        panic!("snapshot --pid of an emulated process hung");
    };
    assert_ne!(
        code, 0,
        "a snapshot of an emulated process was taken: {err}"
    );
    assert!(err.contains("serves its own page faults"), "{err}");
    assert!(!store.exists(), "a store was left behind");
    for i in 0..4 {
        let mut c = Command::new(BIN);
        c.args(["inspect", "--json", "--pid", &pid]);
        let Some((code, out, err)) = run_with_deadline(c, Duration::from_secs(60)) else {
            panic!("inspect --pid of an emulated process hung (run {i})");
        };
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(v["rss_bytes"].as_u64().unwrap() >= 32 << 20, "{out}");
        // Its engine served the inspector's reads: the program runs on.
        assert!(
            pagewise::mech::procfs::is_alive(pid.parse().unwrap()),
            "the emulated process died while inspected (run {i})"
        );
    }
    // SAFETY: kill(2) of the workload this test started.
    unsafe { libc::kill(pid.parse().unwrap(), libc::SIGTERM) };
    let _ = run.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A heap grown with sbrk and given back at once, many times (growths the
/// engine hears of after they are gone, then ones in use): no complaint, no
/// byte lost, the output of a plain run.
fn heap_grown_and_trimmed_with_brk_keeps_its_bytes() {
    need_support!();
    same_as_native(
        "brk",
        "farmem_brk",
        &[],
        &[
            &["--local-pages", "64"],
            &["--local-pages", "4096", "--policy", "clock"],
        ],
    );
}

/// Regression: `--trace /nonexistent/dir/t` wrote nothing and exited 0, and a
/// statically linked program got 0 faults with no word said. The trace's
/// directory is checked before the program runs; a run no process joined
/// says so (and still reports the program's status).
fn unusable_trace_paths_and_static_programs_are_said() {
    need_support!();
    let dir = instance_dir("said");
    let out = farmem(&dir)
        .args([
            "run",
            "--local-pages",
            "100",
            "--trace",
            "/nonexistent/dir/t",
            "--",
        ])
        .args(["sh", "-c", "echo the program ran"])
        .output()
        .unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{se}");
    assert!(se.contains("is not a directory"), "{se}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("the program ran"));
    let src = dir.join("static.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(void) { puts(\"static\"); return 5; }\n",
    )
    .unwrap();
    let bin = dir.join("static");
    let built = Command::new("cc")
        .arg("-static")
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .output()
        .unwrap();
    if !built.status.success() {
        pagewise_testkit::skip!("cc -static failed (no static C library?)");
        return;
    }
    let out = farmem(&dir)
        .args(["run", "--local-pages", "100", "--"])
        .arg(&bin)
        .output()
        .unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{se}");
    assert!(se.contains("nothing was emulated"), "{se}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: `farmem run -- /nonexistent` printed an instance summary
/// before the error. Now one line, and no instance is left.
fn a_missing_command_is_one_line() {
    need_support!();
    let dir = instance_dir("missing");
    let out = farmem(&dir)
        .args(["run", "--local-pages", "100", "--", "/nonexistent/program"])
        .output()
        .unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(se.trim().lines().count(), 1, "{se}");
    assert!(
        se.contains("/nonexistent/program") && !se.contains("faults"),
        "{se}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
