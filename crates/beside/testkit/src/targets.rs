//! Targets the library's integration tests act on (memory of known
//! content, scripted processes, writers checked against a shadow copy) and
//! the helpers they share, for the tests of each crate (`crates/X/tests`).
#![allow(dead_code)]

use pagewise_track::BackendKind;

/// Runs `f` for every backend available in-process; prints skips with reasons.
pub fn for_each_backend(name: &str, skip: &[BackendKind], f: impl Fn(BackendKind)) {
    for kind in BackendKind::ALL {
        if skip.contains(&kind) {
            crate::skip!("[{kind}] does not apply to this backend");
            continue;
        }
        if let Err(why) = kind.available_in_process() {
            crate::skip!("[{kind}] {why}");
            continue;
        }
        f(kind);
        println!("ok   {name} [{kind}]");
    }
}

/// A mapping of one kind of memory, for the memory-type tests; unmapped when
/// dropped.
pub struct Mapped {
    /// Where the mapping starts.
    pub addr: u64,
    /// Its length in bytes.
    pub len: usize,
    _file: Option<std::fs::File>,
}

impl Mapped {
    /// `pages` pages of `kind`, filled with a pattern; `None` (with the
    /// reason) where this machine cannot make it (hugetlb unconfigured).
    pub fn new(kind: pagewise_mech::procfs::MemoryKind, pages: usize) -> Result<Self, String> {
        use pagewise_mech::procfs::MemoryKind as K;
        use std::os::fd::AsRawFd;
        let mut len = pages * pagewise_mech::PAGE_SIZE;
        let (flags, file) = match kind {
            K::PrivateAnonymous => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, None),
            K::Shared => {
                let name = c"pagewise-test";
                // SAFETY: memfd_create with a valid name and no flags.
                let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
                if fd < 0 {
                    return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
                }
                // SAFETY: a new descriptor that we own.
                let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                f.set_len(len as u64).map_err(|e| e.to_string())?;
                (libc::MAP_SHARED, Some(f))
            }
            K::FilePrivate => {
                let p = std::env::temp_dir().join(format!(
                    "mapped-{}-{addr}",
                    std::process::id(),
                    addr = pages
                ));
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&p)
                    .map_err(|e| e.to_string())?;
                let _ = std::fs::remove_file(&p);
                f.set_len(len as u64).map_err(|e| e.to_string())?;
                (libc::MAP_PRIVATE, Some(f))
            }
            K::Hugetlb => {
                let n: u64 = pagewise_mech::procfs::read_trimmed("/proc/sys/vm/nr_hugepages")
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if n == 0 {
                    return Err("no hugetlb pages configured (vm.nr_hugepages is 0)".into());
                }
                len = len.next_multiple_of(pagewise_mech::HUGE_PAGE_SIZE);
                (
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
                    None,
                )
            }
            other => return Err(format!("{other:?}: a memory kind the tests do not make")),
        };
        let fd = file.as_ref().map_or(-1, |f| f.as_raw_fd());
        // SAFETY: a new mapping at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        for i in 0..len / pagewise_mech::PAGE_SIZE {
            // SAFETY: inside the mapping just made, readable and writable.
            unsafe { *(p as *mut u8).add(i * pagewise_mech::PAGE_SIZE + 9) = (i as u8) | 1 };
        }
        Ok(Mapped {
            addr: p as u64,
            len,
            _file: file,
        })
    }

    /// The mapping as a region.
    pub fn region(&self) -> pagewise_mech::Region {
        pagewise_mech::Region::new(self.addr, self.len as u64).unwrap()
    }

    /// The byte at `off`, read as the program would.
    pub fn byte(&self, off: usize) -> u8 {
        // SAFETY: inside the mapping.
        unsafe { std::ptr::read_volatile((self.addr as *const u8).add(off)) }
    }

    /// Writes `v` at `off`, as the program would.
    pub fn set(&self, off: usize, v: u8) {
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile((self.addr as *mut u8).add(off), v) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: our own mapping, not referenced any more.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// A forked child that acts on its region when told, over a pipe: writes a
/// page (`w`), drops pages (`d`: `MADV_DONTNEED`), forks a grandchild that
/// writes and exits (`f`), maps and writes a new region (`m`), changes the
/// protection of pages and back (`p` read-only, `n` none), collapses its
/// region into huge pages (`h`), makes it mergeable by KSM (`k`), installs
/// a seccomp filter that refuses userfaultfd with EPERM (`s`), replaces itself with
/// `sleep 5` (`e`, answered before the exec), or exits.
/// It answers each command with one byte once done (for `h`: 1 if the
/// collapse succeeded).
pub struct Scripted {
    /// The child.
    pub pid: i32,
    /// The region it acts on.
    pub region: pagewise_mech::Region,
    /// Where its commands are written.
    pub cmd: std::io::PipeWriter,
    ack: std::io::PipeReader,
}

impl Scripted {
    /// Forks the child over a region of `pages` pages, each written once.
    pub fn start(pages: usize) -> Scripted {
        use std::io::{Read, Write};
        let (mut cmd_r, cmd_w) = std::io::pipe().unwrap();
        let (ack_r, mut ack_w) = std::io::pipe().unwrap();
        let mem =
            pagewise_mech::workload::AnonMemory::new(pages * pagewise_mech::PAGE_SIZE).unwrap();
        mem.write_pass(1, 3);
        let region = mem.region();
        // SAFETY: the child reads and writes pipes, writes its memory, calls
        // madvise, mmap, fork and _exit: no allocation, no lock.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            {
                use std::os::fd::AsRawFd;
                close_inherited(&[cmd_r.as_raw_fd(), ack_w.as_raw_fd()]);
            }
            // Ready: from here it holds none of the test process's
            // descriptors (a userfaultfd another test thread made, seen
            // in its table until now, would read as its own).
            let _ = ack_w.write_all(&[1]);
            let base = region.start as usize;
            loop {
                let mut c = [0u8; 9];
                if cmd_r.read_exact(&mut c).is_err() {
                    // SAFETY: ends the child.
                    unsafe { libc::_exit(0) };
                }
                let arg = u64::from_le_bytes(c[1..9].try_into().unwrap()) as usize;
                match c[0] {
                    // SAFETY: the child's own region or mapping; plain system calls.
                    b'w' => unsafe {
                        std::ptr::write_volatile(
                            (base + (arg & 0xffff) * pagewise_mech::PAGE_SIZE + 64) as *mut u8,
                            (arg >> 16) as u8,
                        )
                    },
                    // SAFETY: the child's own region or mapping; plain system calls.
                    b'd' => unsafe {
                        libc::madvise(
                            (base + (arg & 0xffff) * pagewise_mech::PAGE_SIZE) as *mut _,
                            (arg >> 16) * pagewise_mech::PAGE_SIZE,
                            libc::MADV_DONTNEED,
                        );
                    },
                    // SAFETY: the child's own region or mapping; plain system calls.
                    b'f' => unsafe {
                        let g = libc::fork();
                        if g == 0 {
                            std::ptr::write_volatile(
                                (base + arg * pagewise_mech::PAGE_SIZE + 80) as *mut u8,
                                0xCC,
                            );
                            libc::_exit(0);
                        }
                        libc::waitpid(g, std::ptr::null_mut(), 0);
                    },
                    // SAFETY: the child's own region or mapping; plain system calls.
                    b'm' => unsafe {
                        let p = libc::mmap(
                            std::ptr::null_mut(),
                            arg * pagewise_mech::PAGE_SIZE,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                            -1,
                            0,
                        );
                        for i in 0..arg {
                            std::ptr::write_volatile(
                                (p as usize + i * pagewise_mech::PAGE_SIZE) as *mut u8,
                                0x77,
                            );
                        }
                    },
                    // SAFETY: the child's own region; plain system calls.
                    b'p' | b'n' => unsafe {
                        // The program changes its protections: pages
                        // read-only (p) or inaccessible (n), then back.
                        let (at, len) = (
                            (base + (arg & 0xffff) * pagewise_mech::PAGE_SIZE) as *mut libc::c_void,
                            (arg >> 16) * pagewise_mech::PAGE_SIZE,
                        );
                        let prot = if c[0] == b'p' {
                            libc::PROT_READ
                        } else {
                            libc::PROT_NONE
                        };
                        libc::mprotect(at, len, prot);
                        libc::mprotect(at, len, libc::PROT_READ | libc::PROT_WRITE);
                    },
                    // SAFETY: the child's own region; plain system calls.
                    b'h' => unsafe {
                        // Huge pages: advised, then collapsed (answers 0
                        // when the kernel refused).
                        let len = region.len as usize;
                        libc::madvise(base as *mut _, len, libc::MADV_HUGEPAGE);
                        let ok = libc::madvise(base as *mut _, len, 25 /* MADV_COLLAPSE */) == 0;
                        let _ = ack_w.write_all(&[ok as u8]);
                        continue;
                    },
                    // SAFETY: plain system calls on a filter that lives
                    // through the call.
                    b's' => unsafe {
                        // A seccomp filter that answers EPERM to
                        // userfaultfd and allows everything else.
                        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                        let insn = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter {
                            code,
                            jt,
                            jf,
                            k,
                        };
                        let mut filter = [
                            insn(0x20, 0, 0, 0),                            // BPF_LD | BPF_W | BPF_ABS: nr
                            insn(0x15, 0, 1, libc::SYS_userfaultfd as u32), // BPF_JEQ
                            insn(0x06, 0, 0, 0x0005_0000 | libc::EPERM as u32), // RET_ERRNO
                            insn(0x06, 0, 0, 0x7fff_0000),                  // SECCOMP_RET_ALLOW
                        ];
                        let prog = libc::sock_fprog {
                            len: filter.len() as u16,
                            filter: filter.as_mut_ptr(),
                        };
                        libc::syscall(libc::SYS_seccomp, 1, 0, &prog as *const libc::sock_fprog);
                    },
                    // SAFETY: execv with static, NUL-terminated strings;
                    // the new program answers nothing.
                    b'e' => unsafe {
                        let _ = ack_w.write_all(&[1]);
                        let argv = [c"sleep".as_ptr(), c"5".as_ptr(), std::ptr::null()];
                        libc::execv(c"/bin/sleep".as_ptr(), argv.as_ptr());
                        libc::_exit(127);
                    },
                    // SAFETY: the child's own region; plain system calls.
                    b'k' => unsafe {
                        libc::madvise(base as *mut _, region.len as usize, libc::MADV_MERGEABLE);
                    },
                    // SAFETY: the child's own region or mapping; plain system calls.
                    _ => unsafe { libc::_exit(0) },
                }
                let _ = ack_w.write_all(&[1]);
            }
        }
        // The child's copy is what counts; ours goes (kept, every start left
        // its pages in the test process, and every later child inherited
        // them).
        drop(mem);
        drop(cmd_r);
        drop(ack_w);
        let mut ack = ack_r;
        let mut ready = [0u8; 1];
        if let Err(e) = ack.read_exact(&mut ready) {
            panic!("the scripted child {pid} never said it had closed the descriptors it inherited: {e}");
        }
        Scripted {
            pid,
            region,
            cmd: cmd_w,
            ack,
        }
    }

    /// Sends a command and reads its answer byte, without waiting for the
    /// child to be back in its read (for `e`, after which it never is).
    pub fn send(&mut self, op: u8, arg: u64) -> u8 {
        use std::io::{Read, Write};
        let mut c = [0u8; 9];
        c[0] = op;
        c[1..].copy_from_slice(&arg.to_le_bytes());
        self.cmd.write_all(&c).unwrap();
        let mut b = [0u8; 1];
        self.ack.read_exact(&mut b).unwrap();
        b[0]
    }

    /// Sends a command and waits until it is done and the child is back in
    /// its read; returns the child's answer byte.
    pub fn tell(&mut self, op: u8, arg: u64) -> u8 {
        let answer = self.send(op, arg);
        // Back in its read of the next order, it writes nothing more (its
        // stack and errno are touched on the way there).
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(2) {
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next());
            let wchan =
                std::fs::read_to_string(format!("/proc/{}/wchan", self.pid)).unwrap_or_default();
            if state == Some("S") && wchan.contains("pipe_read") {
                return answer;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        answer
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        // SAFETY: our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// A forked child whose two threads write pseudo-random bytes into random
/// pages of a private region until told to stop; the region's address is the
/// same in the child (inherited mapping).
pub struct Writer {
    /// The child.
    pub pid: i32,
    /// The region its threads write.
    pub region: pagewise_mech::Region,
    ctl: *mut std::sync::atomic::AtomicU64,
}

impl Writer {
    /// Forks the writer over a region of `pages` pages.
    pub fn start(pages: usize) -> Writer {
        // SAFETY: fresh anonymous mappings.
        let (mem, ctl) = unsafe {
            (
                libc::mmap(
                    std::ptr::null_mut(),
                    pages * pagewise_mech::PAGE_SIZE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                ),
                libc::mmap(
                    std::ptr::null_mut(),
                    pagewise_mech::PAGE_SIZE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                ),
            )
        };
        assert!(mem != libc::MAP_FAILED && ctl != libc::MAP_FAILED);
        let ctl = ctl as *mut std::sync::atomic::AtomicU64;
        struct Arg {
            mem: usize,
            pages: usize,
            ctl: usize,
            seed: u64,
        }
        extern "C" fn write_loop(a: *mut libc::c_void) -> *mut libc::c_void {
            // SAFETY: an Arg leaked for the thread's lifetime.
            let a = unsafe { &*(a as *const Arg) };
            let ctl = a.ctl as *const std::sync::atomic::AtomicU64;
            let mut x = a.seed | 1;
            let mut n = 0u64;
            // SAFETY: the control page lives as long as the process.
            while unsafe { (*ctl).load(std::sync::atomic::Ordering::Relaxed) } == 0 {
                n += 1;
                if n.is_multiple_of(256) {
                    // SAFETY: the second word of the control page counts
                    // batches of writes, for tests that wait for some.
                    unsafe { (*ctl.add(1)).fetch_add(1, std::sync::atomic::Ordering::Relaxed) };
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let page = (x as usize >> 8) % a.pages;
                let off = (x as usize >> 40) % (pagewise_mech::PAGE_SIZE - 8);
                // SAFETY: inside the region.
                unsafe {
                    std::ptr::write_volatile(
                        (a.mem + page * pagewise_mech::PAGE_SIZE + off) as *mut u8,
                        x as u8,
                    )
                };
            }
            std::ptr::null_mut()
        }
        // SAFETY: the child creates threads (glibc's fork leaves its locks
        // free) that write into memory it owns, and exits through _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            close_inherited(&[]);
            let mut t: [libc::pthread_t; 2] = [0; 2];
            for (i, th) in t.iter_mut().enumerate() {
                let a = Box::into_raw(Box::new(Arg {
                    mem: mem as usize,
                    pages,
                    ctl: ctl as usize,
                    seed: 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i as u64 + 1),
                }));
                // SAFETY: starting a thread on a plain extern "C" function.
                unsafe { libc::pthread_create(th, std::ptr::null(), write_loop, a as *mut _) };
            }
            for th in t {
                // SAFETY: our own threads.
                unsafe { libc::pthread_join(th, std::ptr::null_mut()) };
            }
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        Writer {
            pid,
            region: pagewise_mech::Region::new(
                mem as u64,
                (pages * pagewise_mech::PAGE_SIZE) as u64,
            )
            .unwrap(),
            ctl,
        }
    }

    /// Batches of 256 writes made so far (both threads).
    pub fn writes(&self) -> u64 {
        // SAFETY: the shared control page, two words.
        unsafe { (*self.ctl.add(1)).load(std::sync::atomic::Ordering::Relaxed) }
    }

    /// Waits until the writer has made `batches` more batches of writes
    /// (a liveness bound of a minute: a writer that never runs is a
    /// failure, not a slow machine).
    pub fn wait_for_writes(&self, batches: u64) {
        let want = self.writes() + batches;
        let t0 = std::time::Instant::now();
        while self.writes() < want {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "the writer did not run"
            );
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// The whole region as the child holds it now, read from outside.
    pub fn read_all(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.region.len as usize];
        let n = pagewise_mech::remote::read(self.pid, self.region.start, &mut b).unwrap();
        assert_eq!(n, b.len());
        b
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // SAFETY: the shared control page; then our own child.
        unsafe {
            (*self.ctl).store(1, std::sync::atomic::Ordering::Relaxed);
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

static TARGETS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Tests that fork a target and watch it from outside run one at a time: a
/// child forked by one test inherits the other tests' shared control pages
/// and descriptors (a userfaultfd taken from another target), and another
/// test writing its control page then changes this child's memory.
pub fn one_target_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    TARGETS.lock().unwrap_or_else(|e| e.into_inner())
}

/// In a forked child: closes every descriptor from 3 up but `keep`, so that
/// the child holds no store lock, userfaultfd or pipe of other tests.
pub fn close_inherited(keep: &[i32]) {
    let mut keep: Vec<u32> = keep.iter().map(|&k| k as u32).collect();
    keep.sort();
    let mut from = 3u32;
    for k in keep.into_iter().chain([u32::MAX]) {
        if k > from {
            // SAFETY: closes descriptors of this (child) process only.
            unsafe { libc::syscall(libc::SYS_close_range, from, k - 1, 0) };
        }
        from = k.saturating_add(1);
    }
}

/// Which of the `n` 2 MiB regions of process `pid` from `base` are mapped
/// by a huge page.
pub fn huge_regions(pid: i32, base: u64, n: usize) -> Vec<bool> {
    let mut w = pagewise_mech::walk::PageWalker::new(Some(pid)).unwrap();
    let mut runs = Vec::new();
    let h = pagewise_sys::pagemap::category::HUGE;
    (0..n)
        .map(|r| {
            let reg = pagewise_mech::Region::new(
                base + (r * pagewise_mech::HUGE_PAGE_SIZE) as u64,
                pagewise_mech::HUGE_PAGE_SIZE as u64,
            )
            .unwrap();
            w.categories(reg, h, h, &mut runs).unwrap();
            !runs.is_empty()
        })
        .collect()
}

#[allow(unused_imports)]
pub use crate::can_ptrace;

/// The fds of `pid`, as /proc lists them.
pub fn fds(pid: i32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The name the test harness knows test `name` of module `module` (its
/// `module_path!()`) by: the path without the test crate's name, for a test
/// that runs itself again alone (`--exact`).
pub fn test_path(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, inner)) => format!("{inner}::{name}"),
        None => name.to_string(),
    }
}

/// Runs test `name` of module `module` (its `module_path!()`) again, alone in
/// a process of its own, unless this is that process: for a test that
/// measures or shares the whole process (its RSS, every page a `fork`
/// copies), which the binary's other tests, running beside it, would
/// disturb. Returns true in the process that launched the run (the test
/// ends there: the run passed, exactly one test ran, and its skips are said
/// again), false in the process where the test runs alone.
pub fn ran_alone(module: &str, name: &str) -> bool {
    const ALONE: &str = "PAGEWISE_TEST_ALONE";
    if std::env::var_os(ALONE).is_some() {
        return false;
    }
    let name = test_path(module, name);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name, "--test-threads=1", "--nocapture"])
        .env(ALONE, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{name} alone:\n{text}"
    );
    for line in text.lines() {
        if line.starts_with("SKIP ") {
            let why = line.split_once(": ").map_or(line, |(_, why)| why);
            match why.strip_prefix("(did not happen) ") {
                Some(why) => crate::not_happened!("{why}"),
                None => crate::skip!("{why}"),
            }
        } else if !line.is_empty()
            && !line.starts_with("running ")
            && !line.starts_with("test result")
        {
            println!("alone: {line}");
        }
    }
    true
}

/// Kills and reaps a forked child when dropped: a test that ends early
/// leaves no child behind.
pub struct KillOnDrop(pub i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: signals and reaps the test's own child.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}
