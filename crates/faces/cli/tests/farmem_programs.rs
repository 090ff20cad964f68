//! `pagewise farmem run` on real and self-checking programs: every run
//! prints what the native run printed, on both fault paths and several
//! budgets and policies.

#[macro_use]
mod support;
use support::*;

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

/// Regression: a mapping split by `mprotect` and put back whole stayed two
/// mappings under emulation, and the program's `mremap` over the whole met
/// `EFAULT` (each part first touched by a read, which the engine fills:
/// each part was given a reverse-map root of its own). Every round of
/// `farmem_split_merge` failed so; seed 4 of `farmem_mmfuzz` about one
/// run in a hundred.
fn a_mapping_split_and_put_back_moves_whole() {
    need_support!();
    same_as_native(
        "split-merge",
        "farmem_split_merge",
        &["20"],
        &[&["--local-pages", "256"], &["--local-pages", "2"]],
    );
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
    // the engine read the unmap; 6 stopped 4 % of inline runs with LRU at
    // 4,096 pages: an adoption that began before an mremap reclaimed a
    // page the mremap moved in, booked remote where the move's event then
    // booked it local).
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
            &[(pagewise_mech::shim::env::FARMEM_CHECK, "64")],
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
    use pagewise_testkit::servers::{fill, verify, Kv};
    use pagewise_testkit::servers::{free_port, redis_args, wait_ready_within};
    use std::io::Write;
    let dir = instance_dir("redis");
    let port = free_port().unwrap();
    let mut server = farmem(&dir)
        .args(["run", "--local-percent", "25", "--latency-ns", "1000", "--"])
        .arg("redis-server")
        .args(redis_args(port))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Err(e) = wait_ready_within(port, Duration::from_secs(30)) {
        let _ = server.kill();
        panic!("redis under farmem run: {e}");
    }
    let (keys, len) = (3000, 1024);
    fill(Kv::Redis, port, keys, len).unwrap();
    let checked = verify(Kv::Redis, port, keys, len, keys).unwrap();
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

/// Regression: the handler thread looked a C library function up the
/// first time it used it (the shim's `poll`, then `read`), walking the
/// loader's tables, which the shim served when they sat in an anonymous
/// mapping of their own (a program linked to many libraries, as Redis is):
/// it then waited on a fault only it could serve, with the program in its
/// start-up (Redis hung 1 run in 7). Before the fix, 4 runs in 24 of this
/// program linked as Redis is hung or had link maps in served memory.
/// Now nothing mapped before the shim starts is served, and every function
/// the shim forwards to is looked up before any memory is.
fn the_loaders_tables_are_never_served() {
    need_support!();
    let dir = Path::new("/lib/x86_64-linux-gnu");
    let libs: Vec<PathBuf> = [
        "libjemalloc.so.2",
        "liblzf.so.1",
        "libsystemd.so.0",
        "libssl.so.3",
        "libcrypto.so.3",
        "libstdc++.so.6",
        "libatomic.so.1",
        "libm.so.6",
    ]
    .iter()
    .map(|l| dir.join(l))
    .filter(|p| p.exists())
    .collect();
    if libs.len() < 4 {
        pagewise_testkit::skip!(
            "fewer than 4 of Redis's libraries in {} (scripts/setup.sh installs Redis)",
            dir.display()
        );
        return;
    }
    let prog = c_program_linked("farmem_loader", &libs);
    let inst = instance_dir("loader");
    for run in 0..24 {
        let mut c = farmem(&inst);
        c.args(["run", "--local-pages", "300", "--"]).arg(&prog);
        let Some((code, out, err)) = run_with_deadline(c, Duration::from_secs(60)) else {
            panic!("run {run}: the program hung (killed after 60 s)");
        };
        assert_eq!(code, 0, "run {run}: {out}\n{err}");
        assert!(
            out.contains("link maps in served memory: 0\n"),
            "run {run}: {out}\n{err}"
        );
        assert!(
            out.contains("pages wrong: 0; link maps seen"),
            "run {run}: {out}\n{err}"
        );
        assert_eq!(
            out.matches("child exited 7, strlen found 1").count(),
            2,
            "{out}"
        );
    }
    let _ = std::fs::remove_dir_all(&inst);
}

/// A program that registers memory with a userfaultfd of its own, memory
/// far memory holds already: the kernel refuses it (EBUSY), as it must
/// (one userfaultfd holds a mapping), and `farmem run` says so once,
/// however often it happens. Before, nothing was said: the program got
/// EBUSY and no one knew why.
fn a_refused_registration_of_its_own_is_said_once() {
    need_support!();
    let native = plain(&["own_uffd"]);
    if native != "register: ok\nregister: ok\n" {
        pagewise_testkit::skip!("the program cannot use a userfaultfd of its own here: {native}");
        return;
    }
    let dir = instance_dir("own-uffd");
    let (out, err) = run_target(&dir, &["--local-pages", "64"], &["own_uffd"]);
    let busy = std::io::Error::from_raw_os_error(libc::EBUSY).to_string();
    let text = busy.split(" (os error").next().unwrap();
    assert_eq!(
        out,
        format!("register: {text}\nregister: {text}\n"),
        "its two registrations, under far memory"
    );
    assert_eq!(
        err.matches("refused it (UFFDIO_REGISTER: EBUSY)").count(),
        1,
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// Every test runs on both fault paths: `NAME::thread` and `NAME::inline`.
pagewise_testkit::per_fault_path!(
    super::on_path;
    kernel_accesses_match_native,
    a_child_resetting_its_signals_survives,
    python3_reads_files_larger_than_the_budget,
    real_programs_match_native,
    mremap_sequence_keeps_every_byte,
    a_mapping_split_and_put_back_moves_whole,
    realloc_cycles_neither_hang_nor_lose_data,
    random_memory_operations_match_native,
    a_failing_handler_stops_the_program,
    io_uring_and_aio_are_refused_inline_only,
    redis_keeps_every_value,
    the_loaders_tables_are_never_served,
    budgets_of_one_to_three_pages_run,
    heap_grown_and_trimmed_with_brk_keeps_its_bytes,
    unusable_trace_paths_and_static_programs_are_said,
    a_missing_command_is_one_line,
    a_refused_registration_of_its_own_is_said_once,
);
