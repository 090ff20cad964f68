//! The classic-BPF evaluator of `--respect-seccomp` against the kernel:
//! random filters, each loaded in a real child process that then makes one
//! system call; the verdict the kernel gave (the call returned, with its
//! value, or a `SIGSYS` was raised with its data, or the child was killed)
//! is compared with what `seccomp::run` answers for the same call.
//!
//! `PAGEWISE_BPF_FILTERS` filters (default 1,000; the full run 10,000).
//! Regression: the evaluator computed `A <<= X` with X >= 32 as 0, the
//! kernel masks the count with 31, and pagewise made a call the filter
//! killed the target for.

use pagewise_sys::process::BpfInsn;

/// A small deterministic generator (xorshift64*), seeded per run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const NR: i64 = libc::SYS_getppid;
const ARCH: u32 = 0xc000_003e;

/// The call every child makes: `getppid` with these arguments (which it
/// ignores), so that filters can test them.
const ARGS: [u64; 6] = [
    0x0000_0000_0000_0020,
    0xffff_ffff_0000_0001,
    0x0000_0001_8000_0000,
    7,
    0,
    0x1234_5678_9abc_def0,
];

fn stmt(code: u16, k: u32) -> BpfInsn {
    BpfInsn {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

/// A constant of the kinds filters use: small, shift edges, the data's
/// words, actions, anything.
fn constant(r: &mut Rng) -> u32 {
    match r.below(8) {
        0 => r.below(40) as u32,
        1 => [31, 32, 33, 63, 64, 255][r.below(6) as usize],
        2 => NR as u32,
        3 => ARGS[r.below(6) as usize] as u32,
        4 => (ARGS[r.below(6) as usize] >> 32) as u32,
        5 => [
            0x7fff_0000,
            0x0005_0001,
            0x0003_0007,
            0x8000_0000,
            0x7ff0_0000,
        ][r.below(5) as usize],
        6 => u32::MAX - r.below(3) as u32,
        _ => r.next() as u32,
    }
}

/// A random filter of the instructions seccomp accepts, ending in a
/// return, behind a guard that lets every call but the test's through (the
/// child must still be able to end).
fn filter(r: &mut Rng) -> Vec<BpfInsn> {
    let n = 2 + r.below(14) as usize;
    let mut prog = Vec::with_capacity(n + 4);
    prog.push(stmt(0x20, 0));
    prog.push(BpfInsn {
        code: 0x15,
        jt: 1,
        jf: 0,
        k: NR as u32,
    });
    prog.push(stmt(0x06, 0x7fff_0000));
    let mut stored = Vec::new();
    for i in 0..n {
        let left = (n - i - 1) as u64; // instructions after this one, before the last return
        let insn = match r.below(12) {
            // A load of a word of the data (nr, arch, an argument's half).
            0 | 1 => {
                let off = [0u32, 4, 16, 20, 24, 28, 32, 36, 40, 44, 56, 60][r.below(12) as usize];
                stmt(0x20, off)
            }
            2 => stmt([0x00, 0x01][r.below(2) as usize], constant(r)), // LD/LDX IMM
            3 => stmt([0x80, 0x81][r.below(2) as usize], 0),           // LD/LDX LEN
            4 => {
                let slot = r.below(16) as u32;
                stored.push(slot);
                stmt([0x02, 0x03][r.below(2) as usize], slot) // ST/STX
            }
            5 if !stored.is_empty() => {
                let slot = stored[r.below(stored.len() as u64) as usize];
                stmt([0x60, 0x61][r.below(2) as usize], slot) // LD/LDX MEM
            }
            6..=8 => {
                // ALU: add sub mul div or and lsh rsh neg mod xor, K or X.
                let op = [
                    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0,
                ][r.below(11) as usize];
                let src = if r.below(2) == 0 { 0x00 } else { 0x08 };
                stmt(0x04 | op | src, constant(r))
            }
            9 => stmt([0x07, 0x87][r.below(2) as usize], 0), // TAX, TXA
            10 if left > 0 => {
                let op = [0x10, 0x20, 0x30, 0x40][r.below(4) as usize];
                let src = if r.below(2) == 0 { 0x00 } else { 0x08 };
                BpfInsn {
                    code: 0x05 | op | src,
                    jt: r.below(left + 1) as u8,
                    jf: r.below(left + 1) as u8,
                    k: constant(r),
                }
            }
            11 if r.below(4) == 0 => {
                // A return in the middle: K or A.
                if r.below(2) == 0 {
                    stmt(0x06, constant(r))
                } else {
                    stmt(0x16, 0)
                }
            }
            _ => stmt(0x20, 0),
        };
        prog.push(insn);
    }
    // The end: A (or A against X) decides between two different actions,
    // so that the verdict says what the body computed; now and then A
    // itself is returned.
    if r.below(8) == 0 {
        prog.push(stmt(0x16, 0));
        return prog;
    }
    let op = [0x10, 0x20, 0x30, 0x40][r.below(4) as usize];
    let src = if r.below(2) == 0 { 0x00 } else { 0x08 };
    prog.push(BpfInsn {
        code: 0x05 | op | src,
        jt: 0,
        jf: 1,
        k: constant(r),
    });
    let yes = action(r);
    let mut no = action(r);
    while no == yes {
        no = action(r);
    }
    prog.push(stmt(0x06, yes));
    prog.push(stmt(0x06, no));
    prog
}

/// An action a filter returns, with data.
fn action(r: &mut Rng) -> u32 {
    let data = r.below(5000) as u32 & 0xffff;
    match r.below(6) {
        0 => 0x7fff_0000,
        1 => 0x0005_0000 | data,
        2 => 0x0003_0000 | data,
        3 => 0x8000_0000,
        4 => 0x7ff0_0000 | data,
        _ => 0x7ffc_0000,
    }
}

/// What the kernel did with the child's call.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Seen {
    /// The filter was refused at load.
    Refused,
    /// The call returned this.
    Returned(i64),
    /// A SIGSYS with this data (the filter's TRAP).
    Trapped(u32),
    /// The child was killed by SIGSYS.
    Killed,
}

/// Shared between a child and this test: what the child saw.
#[repr(C)]
struct Report {
    kind: u32,
    data: u32,
    value: i64,
}

static mut REPORT: *mut Report = std::ptr::null_mut();

extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo; REPORT was set before the
    // filter was loaded, to a shared page; only async-signal-safe calls.
    unsafe {
        (*REPORT).kind = 2;
        (*REPORT).data = (*info).si_errno as u32;
        libc::_exit(0);
    }
}

/// Loads `prog` in a child and makes the call there; what the kernel did.
fn observe(prog: &[BpfInsn], report: *mut Report) -> Seen {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut BpfInsn,
    };
    // SAFETY: the report page is shared with the child; reset here.
    unsafe {
        (*report).kind = 0;
        (*report).data = 0;
        (*report).value = 0;
        REPORT = report;
    }
    // SAFETY: the child makes only async-signal-safe calls (sigaction,
    // prctl, seccomp, the call, _exit) and touches only `fprog` and the
    // shared page, both made before the fork.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigsys as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut());
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            if libc::syscall(libc::SYS_seccomp, 1, 0, &fprog as *const libc::sock_fprog) != 0 {
                (*REPORT).kind = 9;
                libc::_exit(0);
            }
            let r = pagewise_sys::seccomp::raw_syscall(NR, ARGS);
            (*REPORT).kind = 1;
            (*REPORT).value = r;
            libc::_exit(0);
        }
    }
    assert!(pid > 0, "fork");
    let mut st = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    // SAFETY: the child has ended; the page is ours to read.
    let rep = unsafe { &*report };
    if libc::WIFSIGNALED(st) {
        assert_eq!(
            libc::WTERMSIG(st),
            libc::SIGSYS,
            "the child died of {}",
            libc::WTERMSIG(st)
        );
        return Seen::Killed;
    }
    match rep.kind {
        1 => Seen::Returned(rep.value),
        2 => Seen::Trapped(rep.data),
        9 => Seen::Refused,
        k => panic!("the child said nothing ({k}), status {st:#x}"),
    }
}

/// What the kernel would do, from the evaluator's answer `ret`.
fn expected(ret: u32, ppid: i64) -> Seen {
    let data = ret & 0xffff;
    match ret & 0xffff_0000 {
        0x7fff_0000 | 0x7ffc_0000 => Seen::Returned(ppid),
        0x0005_0000 => Seen::Returned(-(data.min(4095) as i64)),
        0x0003_0000 => Seen::Trapped(data),
        0x7ff0_0000 | 0x7fc0_0000 => Seen::Returned(-(libc::ENOSYS as i64)),
        _ => Seen::Killed,
    }
}

#[test]
fn the_evaluator_agrees_with_the_kernel_on_random_filters() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let count: u64 = std::env::var("PAGEWISE_BPF_FILTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let seed = std::env::var("PAGEWISE_BPF_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    // SAFETY: a fresh shared anonymous page for the children's reports.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED);
    let report = page.cast::<Report>();
    let ppid = std::process::id() as i64;
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&(NR as i32).to_ne_bytes());
    data[4..8].copy_from_slice(&ARCH.to_ne_bytes());
    for (k, a) in ARGS.iter().enumerate() {
        data[16 + 8 * k..24 + 8 * k].copy_from_slice(&a.to_ne_bytes());
    }
    let mut r = Rng(seed);
    let (mut loaded, mut refused, mut kinds) = (0u64, 0u64, [0u64; 4]);
    for i in 0..count {
        let prog = filter(&mut r);
        let seen = observe(&prog, report);
        let ours = pagewise_mech::seccomp::run_checked(&prog, &data);
        if seen == Seen::Refused {
            refused += 1;
            continue;
        }
        loaded += 1;
        let want = ours.map(|ret| expected(ret, ppid));
        assert_eq!(
            want,
            Some(seen),
            "filter {i} of seed {seed} (PAGEWISE_BPF_SEED={seed}): the evaluator answered \
             {ours:x?}, the kernel did {seen:?}; the filter: {:?}",
            prog.iter()
                .map(|x| (x.code, x.jt, x.jf, x.k))
                .collect::<Vec<_>>()
        );
        kinds[match seen {
            Seen::Returned(v) if v == ppid => 0,
            Seen::Returned(_) => 1,
            Seen::Trapped(_) => 2,
            _ => 3,
        }] += 1;
    }
    // SAFETY: the page mapped above; no child uses it any more.
    unsafe { libc::munmap(page, 4096) };
    assert!(
        loaded > count / 4,
        "only {loaded} of {count} filters loaded"
    );
    println!(
        "ok   seed {seed}: {loaded} filters loaded (of {count}; {refused} refused at load) agree \
         with the kernel: {} allowed, {} refused with a value, {} trapped, {} killed",
        kinds[0], kinds[1], kinds[2], kinds[3]
    );
}

/// The case found: `X = 32; A = 1; A <<= X; A == 0 ? ALLOW : KILL`. The
/// kernel shifts by 32 & 31 = 0, so A stays 1 and the filter kills.
#[test]
fn a_shift_by_x_of_32_is_masked_as_the_kernel_masks_it() {
    let prog = [
        stmt(0x01, 32),              // X = 32
        stmt(0x00, 1),               // A = 1
        stmt(0x04 | 0x60 | 0x08, 0), // A <<= X
        BpfInsn {
            code: 0x15,
            jt: 0,
            jf: 1,
            k: 0,
        },
        stmt(0x06, 0x7fff_0000),
        stmt(0x06, 0x8000_0000),
    ];
    let data = [0u8; 64];
    assert_eq!(
        pagewise_mech::seccomp::run_checked(&prog, &data),
        Some(0x8000_0000)
    );
    // A constant shift of 32 the kernel refuses at load.
    let by_k = [stmt(0x00, 1), stmt(0x04 | 0x60, 32), stmt(0x16, 0)];
    assert_eq!(pagewise_mech::seccomp::run_checked(&by_k, &data), None);
}
