//! Calls inside a process that runs under seccomp filters (a container's
//! profile, a sandbox): how pagewise makes them without the filters
//! applying, and, where it cannot, what the filters would answer.
//!
//! **Suspended.** A tracer with CAP_SYS_ADMIN, itself under no filter, may
//! set `PTRACE_O_SUSPEND_SECCOMP` on a seized thread: the thread's filters
//! do not apply to its calls while the option is set (CRIU's parasite runs
//! so). [`crate::inject::Remote`] sets it on the one thread that makes
//! pagewise's call, just before the call, and clears it right after, so
//! that no call of the program's own ever runs unfiltered; the filters
//! themselves are never touched. Should pagewise die meanwhile, the kernel
//! drops the option with the tracer.
//!
//! **Evaluated.** Where the option is refused but the filters can be read
//! (`PTRACE_SECCOMP_GET_FILTER`), each call is run through the thread's
//! filters as the kernel would ([`Filters::verdict`]: every filter, the
//! most severe answer) and made only if they allow it; a call they would
//! refuse, trap or kill for is refused here, naming the call and the
//! answer. (On Linux both need CAP_SYS_ADMIN and a tracer under no filter,
//! so a tracer refused one is mostly refused the other; the evaluation is
//! also what the tests use to show a filter unchanged, instruction for
//! instruction.)
//!
//! **Neither.** Every call is refused with the reason ([`Refusal::Seccomp`]):
//! the filter, and why pagewise could not step around it.
//!
//! [`Policy::Respect`] never suspends a filter: calls are evaluated (and
//! refused where the filters would not allow them), for an operator who
//! wants a sandbox's rules kept even by a root tool.

use crate::stop::Refusal;
use crate::{procfs, Error, Result};
use pagewise_sys::process::{self as p, BpfInsn};

/// What a seccomp filter answers a call with (`SECCOMP_RET_*`), most
/// severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub enum Action {
    /// The process is killed.
    KillProcess,
    /// The thread is killed.
    KillThread,
    /// `SIGSYS` is sent to the thread.
    Trap,
    /// The call fails with this errno, unmade.
    Errno(u16),
    /// A supervisor holding the listener decides.
    UserNotif,
    /// A tracer is told (without one, the call fails with `ENOSYS`).
    Trace(u16),
    /// Allowed, and logged.
    Log,
    /// Allowed.
    Allow,
}

const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_KILL_THREAD: u32 = 0;
const RET_TRAP: u32 = 0x0003_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
const RET_TRACE: u32 = 0x7ff0_0000;
const RET_LOG: u32 = 0x7ffc_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ACTION_FULL: u32 = 0xffff_0000;

impl Action {
    /// The action of a filter's return value, as the kernel reads it (an
    /// unknown action kills the process).
    pub fn of(ret: u32) -> Action {
        let data = (ret & 0xffff) as u16;
        match ret & RET_ACTION_FULL {
            RET_KILL_PROCESS => Action::KillProcess,
            RET_KILL_THREAD => Action::KillThread,
            RET_TRAP => Action::Trap,
            RET_ERRNO => Action::Errno(data),
            RET_USER_NOTIF => Action::UserNotif,
            RET_TRACE => Action::Trace(data),
            RET_LOG => Action::Log,
            RET_ALLOW => Action::Allow,
            _ => Action::KillProcess,
        }
    }

    /// Whether the call is made.
    pub fn allows(self) -> bool {
        matches!(self, Action::Allow | Action::Log)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::KillProcess => write!(f, "KILL_PROCESS"),
            Action::KillThread => write!(f, "KILL_THREAD"),
            Action::Trap => write!(f, "TRAP (SIGSYS)"),
            Action::Errno(e) => write!(
                f,
                "ERRNO ({})",
                std::io::Error::from_raw_os_error(i32::from(*e))
            ),
            Action::UserNotif => write!(f, "USER_NOTIF"),
            Action::Trace(d) => write!(f, "TRACE ({d})"),
            Action::Log => write!(f, "LOG"),
            Action::Allow => write!(f, "ALLOW"),
        }
    }
}

/// `AUDIT_ARCH_X86_64`: the `arch` field of a call made through `syscall`.
pub const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

/// Bytes of `struct seccomp_data`, what a filter reads.
const DATA_LEN: u32 = 64;

/// The seccomp filters of one thread, the one installed last first.
#[derive(Debug, Clone)]
pub struct Filters {
    progs: Vec<Vec<BpfInsn>>,
}

impl PartialEq for Filters {
    /// The same filters, instruction for instruction.
    fn eq(&self, other: &Filters) -> bool {
        let words = |f: &Filters| -> Vec<Vec<(u16, u8, u8, u32)>> {
            f.progs
                .iter()
                .map(|p| p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect())
                .collect()
        };
        words(self) == words(other)
    }
}

impl Eq for Filters {}

/// `CAP_SYS_ADMIN` (`linux/capability.h`).
const CAP_SYS_ADMIN: u32 = 21;

/// Most filters read from one thread (the kernel caps a thread's filters
/// at 256 KiB of instructions; a chain this long is not a real one).
const MAX_FILTERS: usize = 4096;

impl Filters {
    /// Reads the filters of stopped tracee `tid` (see
    /// [`p::ptrace_seccomp_filter`]).
    pub fn read(tid: i32) -> std::io::Result<Filters> {
        let mut progs = Vec::new();
        while progs.len() < MAX_FILTERS {
            match p::ptrace_seccomp_filter(tid, progs.len())? {
                Some(prog) => progs.push(prog),
                None => break,
            }
        }
        Ok(Filters { progs })
    }

    /// Filters from their programs, the one installed last first.
    pub fn from_programs(progs: Vec<Vec<BpfInsn>>) -> Filters {
        Filters { progs }
    }

    /// How many filters.
    pub fn len(&self) -> usize {
        self.progs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.progs.is_empty()
    }

    /// What the filters answer system call `nr` with `args`, made at
    /// `ip` by 64-bit code: each filter runs, and the most severe answer
    /// holds (the kernel's rule). None: allowed.
    pub fn verdict(&self, nr: i64, args: [u64; 6], ip: u64) -> Action {
        let mut data = [0u8; DATA_LEN as usize];
        data[0..4].copy_from_slice(&(nr as i32).to_ne_bytes());
        data[4..8].copy_from_slice(&AUDIT_ARCH_X86_64.to_ne_bytes());
        data[8..16].copy_from_slice(&ip.to_ne_bytes());
        for (k, a) in args.iter().enumerate() {
            data[16 + 8 * k..24 + 8 * k].copy_from_slice(&a.to_ne_bytes());
        }
        let mut worst = RET_ALLOW;
        for prog in &self.progs {
            let ret = run(prog, &data);
            // The kernel compares the actions as signed numbers.
            if ((ret & RET_ACTION_FULL) as i32) < ((worst & RET_ACTION_FULL) as i32) {
                worst = ret;
            }
        }
        Action::of(worst)
    }
}

/// Runs one classic BPF program over `data` as the kernel's seccomp does
/// (a filter the kernel accepted: loads of 32-bit words of `data`, the
/// scratch memory, arithmetic, jumps, returns). Anything else, or a jump
/// or load out of bounds, answers KILL_PROCESS: an installed filter never
/// does that, and a caller must not take a malformed one for an allowing one.
pub fn run(prog: &[BpfInsn], data: &[u8; DATA_LEN as usize]) -> u32 {
    run_checked(prog, data).unwrap_or(RET_KILL_PROCESS)
}

/// [`run`], `None` for a program the kernel would not have accepted (an
/// unknown instruction, a load or jump out of bounds, no return).
pub fn run_checked(prog: &[BpfInsn], data: &[u8; DATA_LEN as usize]) -> Option<u32> {
    let (mut a, mut x) = (0u32, 0u32);
    let mut mem = [0u32; 16];
    let mut pc = 0usize;
    // Jumps go forward only, so a program ends within its length.
    while let Some(i) = prog.get(pc) {
        let k = i.k;
        pc += 1;
        let code = i.code;
        match code & 0x07 {
            // BPF_LD, BPF_LDX
            0x00 | 0x01 => {
                let v = match (code & 0xe0, code & 0x18) {
                    (0x00, 0x00) => k,        // IMM
                    (0x80, 0x00) => DATA_LEN, // LEN
                    (0x20, 0x00) if code & 0x07 == 0x00 => {
                        // ABS, a 32-bit word
                        let w = (k as usize)
                            .checked_add(4)
                            .filter(|&e| k % 4 == 0 && e <= data.len())
                            .map(|e| &data[k as usize..e])?;
                        u32::from_ne_bytes([w[0], w[1], w[2], w[3]])
                    }
                    (0x60, 0x00) => *mem.get(k as usize)?, // MEM
                    _ => return None,
                };
                if code & 0x07 == 0x00 {
                    a = v;
                } else {
                    x = v;
                }
            }
            // BPF_ST, BPF_STX
            0x02 | 0x03 => *mem.get_mut(k as usize)? = if code & 0x07 == 0x02 { a } else { x },
            // BPF_ALU
            0x04 => {
                let by_x = code & 0x08 != 0;
                let src = if by_x { x } else { k };
                // The kernel refuses at load a constant shift of 32 or
                // more and a constant division or remainder by 0; it masks
                // a shift count taken from X (`& 31`, as its 32-bit ALU
                // does) and ends the filter with 0 on a division by an X
                // of 0.
                if !by_x && (matches!(code & 0xf0, 0x60 | 0x70) && k >= 32)
                    || !by_x && matches!(code & 0xf0, 0x30 | 0x90) && k == 0
                {
                    return None;
                }
                a = match code & 0xf0 {
                    0x00 => a.wrapping_add(src),
                    0x10 => a.wrapping_sub(src),
                    0x20 => a.wrapping_mul(src),
                    0x30 => match a.checked_div(src) {
                        Some(v) => v,
                        None => return Some(0), // the kernel's division by zero
                    },
                    0x40 => a | src,
                    0x50 => a & src,
                    0x60 => a.wrapping_shl(src & 31),
                    0x70 => a.wrapping_shr(src & 31),
                    0x80 => a.wrapping_neg(),
                    0x90 => match a.checked_rem(src) {
                        Some(v) => v,
                        None => return Some(0),
                    },
                    0xa0 => a ^ src,
                    _ => return None,
                };
            }
            // BPF_JMP
            0x05 => {
                let src = if code & 0x08 != 0 { x } else { k };
                let skip = match code & 0xf0 {
                    0x00 => k as usize, // JA
                    op => {
                        let taken = match op {
                            0x10 => a == src,
                            0x20 => a > src,
                            0x30 => a >= src,
                            0x40 => a & src != 0,
                            _ => return None,
                        };
                        usize::from(if taken { i.jt } else { i.jf })
                    }
                };
                pc = match pc.checked_add(skip) {
                    Some(n) if n < prog.len() => n,
                    _ => return None,
                };
            }
            // BPF_RET
            0x06 => {
                return match code & 0x18 {
                    0x00 => Some(k),
                    0x10 => Some(a),
                    _ => None,
                }
            }
            // BPF_MISC: TAX, TXA
            _ => match code & 0xf8 {
                0x00 => x = a,
                0x80 => a = x,
                _ => return None,
            },
        }
    }
    None
}

/// Whether pagewise may suspend a target's filters for its own calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Policy {
    /// Suspend them around each call where the kernel allows it, else
    /// evaluate them (the default).
    #[default]
    Suspend,
    /// Never suspend them: make a call only where they allow it.
    Respect,
}

static DEFAULT_POLICY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    static THREAD_POLICY: std::cell::Cell<Option<Policy>> = const { std::cell::Cell::new(None) };
}

/// Sets the policy of this process (see [`Policy`]).
pub fn set_policy(p: Policy) {
    DEFAULT_POLICY.store(p == Policy::Respect, std::sync::atomic::Ordering::Relaxed);
}

/// Sets the policy of the calling thread alone (the thread that stops a
/// process makes every call inside it), over the process's; `None` goes
/// back to the process's.
pub fn set_thread_policy(p: Option<Policy>) {
    THREAD_POLICY.with(|c| c.set(p));
}

/// The calling thread's policy.
pub fn policy() -> Policy {
    THREAD_POLICY.with(|c| c.get()).unwrap_or(
        if DEFAULT_POLICY.load(std::sync::atomic::Ordering::Relaxed) {
            Policy::Respect
        } else {
            Policy::Suspend
        },
    )
}

/// How calls are made inside one thread of a filtered process.
#[derive(Debug)]
pub(crate) enum Inside {
    /// No filter: as they are.
    Unfiltered,
    /// Under `PTRACE_O_SUSPEND_SECCOMP`, set around each call.
    Suspended,
    /// Each checked against the thread's filters first; why suspending
    /// them was refused.
    Evaluated(Filters, String),
}

impl Inside {
    /// Refuses system call `nr` with `args`, made at `ip` in process `pid`,
    /// where the filters are evaluated and would not allow it.
    pub(crate) fn check_call(&self, pid: i32, nr: i64, args: [u64; 6], ip: u64) -> Result<()> {
        let Inside::Evaluated(filters, why) = self else {
            return Ok(());
        };
        let answer = filters.verdict(nr, args, ip);
        if answer.allows() {
            return Ok(());
        }
        Err(Refusal::Seccomp {
            feature: "system calls inside another process",
            pid,
            call: call_name(nr),
            answer: Some(answer),
            why: why.clone(),
        }
        .into())
    }
}

/// Why this process cannot step around a target's filters: it lacks
/// CAP_SYS_ADMIN, or it runs under a seccomp filter itself. None: it can.
pub fn tracer_limit() -> Option<&'static str> {
    static LIMIT: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let own = std::fs::read_to_string("/proc/self/status").ok();
        let filtered = own
            .as_deref()
            .and_then(|s| procfs::status_field(s, "Seccomp"))
            .unwrap_or(0)
            != 0;
        if filtered {
            Some("pagewise runs under a seccomp filter itself, and the kernel lets only an unfiltered tracer suspend or read another process's filters")
        } else if !procfs::has_capability(CAP_SYS_ADMIN) {
            Some("suspending or reading another process's filters needs CAP_SYS_ADMIN, which pagewise lacks")
        } else {
            None
        }
    })
}

/// Whether calls can be made inside process `pid` despite its filters, as
/// far as can be told before it is stopped: refused, with the reason, when
/// it has filters and this process can step around none of them.
pub fn check(pid: i32, feature: &'static str, call: &str) -> Result<()> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| Error::for_pid(pid, "reading its status", e))?;
    check_status(pid, &status, feature, call)
}

/// [`check`] of process `pid` whose `/proc/PID/status` reads `status`.
pub(crate) fn check_status(
    pid: i32,
    status: &str,
    feature: &'static str,
    call: &str,
) -> Result<()> {
    match procfs::status_field(status, "Seccomp").unwrap_or(0) {
        0 => Ok(()),
        1 => Err(Refusal::Seccomp {
            feature,
            pid,
            call: call.to_string(),
            answer: None,
            why: "the process runs in seccomp's strict mode, which allows only read, write, exit and sigreturn".into(),
        }
        .into()),
        _ => match tracer_limit() {
            None => Ok(()),
            Some(why) => Err(Refusal::Seccomp {
                feature,
                pid,
                call: call.to_string(),
                answer: None,
                why: why.into(),
            }
            .into()),
        },
    }
}

/// How calls are to be made in thread `tid` (seized and stopped) of
/// process `pid`: suspended if the kernel lets this tracer, else checked
/// against the filters if it lets them be read; refused otherwise.
pub(crate) fn inside(pid: i32, tid: i32) -> Result<Inside> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .map_err(|e| Error::for_pid(pid, format!("reading thread {tid}'s status"), e))?;
    if procfs::status_field(&status, "Seccomp").unwrap_or(0) == 0 {
        return Ok(Inside::Unfiltered);
    }
    let refused = if policy() == Policy::Respect {
        "pagewise was asked to respect them (never to suspend them)".to_string()
    } else {
        // Tried and cleared at once: it is set again around each call.
        let suspend = p::ptrace_set_suspend_seccomp(tid, true)
            .and_then(|()| p::ptrace_set_suspend_seccomp(tid, false));
        match suspend {
            Ok(()) => return Ok(Inside::Suspended),
            Err(e) => format!("the kernel refused to suspend them ({e})"),
        }
    };
    match Filters::read(tid) {
        Ok(f) => Ok(Inside::Evaluated(f, refused)),
        Err(e) => Err(Refusal::Seccomp {
            feature: "system calls inside another process",
            pid,
            call: "any call".into(),
            answer: None,
            why: format!(
                "{refused}, and the kernel refused to let them be read ({e}){}",
                tracer_limit().map(|w| format!(": {w}")).unwrap_or_default()
            ),
        }
        .into()),
    }
}

/// The name of system call `nr`, for the calls pagewise makes inside a
/// process; others by number.
pub fn call_name(nr: i64) -> String {
    let name = match nr {
        libc::SYS_userfaultfd => "userfaultfd",
        libc::SYS_madvise => "madvise",
        libc::SYS_mmap => "mmap",
        libc::SYS_munmap => "munmap",
        libc::SYS_mprotect => "mprotect",
        libc::SYS_mremap => "mremap",
        libc::SYS_brk => "brk",
        libc::SYS_close => "close",
        libc::SYS_prctl => "prctl",
        libc::SYS_sigaltstack => "sigaltstack",
        libc::SYS_rseq => "rseq",
        libc::SYS_ioctl => "ioctl",
        libc::SYS_dup3 => "dup3",
        libc::SYS_fcntl => "fcntl",
        libc::SYS_lseek => "lseek",
        libc::SYS_rt_sigaction => "rt_sigaction",
        libc::SYS_arch_prctl => "arch_prctl",
        libc::SYS_set_robust_list => "set_robust_list",
        _ => return format!("system call {nr}"),
    };
    format!("the {name} call")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insn(code: u16, jt: u8, jf: u8, k: u32) -> BpfInsn {
        BpfInsn { code, jt, jf, k }
    }

    /// The usual shape: check the architecture, then answer `ret` for
    /// `nr` and allow the rest.
    fn deny(nr: u32, ret: u32) -> Vec<BpfInsn> {
        vec![
            insn(0x20, 0, 0, 4),                 // ld arch
            insn(0x15, 1, 0, AUDIT_ARCH_X86_64), // jeq arch
            insn(0x06, 0, 0, RET_KILL_PROCESS),  // ret kill
            insn(0x20, 0, 0, 0),                 // ld nr
            insn(0x15, 0, 1, nr),                // jeq nr
            insn(0x06, 0, 0, ret),               // ret
            insn(0x06, 0, 0, RET_ALLOW),         // ret allow
        ]
    }

    #[test]
    fn the_most_severe_answer_of_all_filters_holds() {
        let uffd = libc::SYS_userfaultfd as u32;
        let mad = libc::SYS_madvise as u32;
        let f = Filters::from_programs(vec![
            deny(uffd, RET_ERRNO | 1),
            deny(uffd, RET_TRAP),
            deny(mad, RET_USER_NOTIF),
        ]);
        assert_eq!(f.verdict(libc::SYS_userfaultfd, [0; 6], 0), Action::Trap);
        assert_eq!(f.verdict(libc::SYS_madvise, [0; 6], 0), Action::UserNotif);
        assert_eq!(f.verdict(libc::SYS_mmap, [0; 6], 0), Action::Allow);
        let k = Filters::from_programs(vec![
            deny(uffd, RET_KILL_PROCESS),
            deny(uffd, RET_ERRNO | 38),
        ]);
        assert_eq!(
            k.verdict(libc::SYS_userfaultfd, [0; 6], 0),
            Action::KillProcess
        );
        assert_eq!(
            Filters::from_programs(vec![deny(uffd, RET_ERRNO | 38)]).verdict(
                libc::SYS_userfaultfd,
                [0; 6],
                0
            ),
            Action::Errno(38)
        );
    }

    #[test]
    fn arguments_are_read_and_compared() {
        // Refuse madvise(_, _, 12) (MADV_MERGEABLE) only: args[2] is at 32.
        let prog = vec![
            insn(0x20, 0, 0, 0),
            insn(0x15, 0, 3, libc::SYS_madvise as u32),
            insn(0x20, 0, 0, 32),
            insn(0x15, 0, 1, 12),
            insn(0x06, 0, 0, RET_ERRNO | 1),
            insn(0x06, 0, 0, RET_ALLOW),
        ];
        let f = Filters::from_programs(vec![prog]);
        assert_eq!(
            f.verdict(libc::SYS_madvise, [0, 0, 12, 0, 0, 0], 0),
            Action::Errno(1)
        );
        assert_eq!(
            f.verdict(libc::SYS_madvise, [0, 0, 4, 0, 0, 0], 0),
            Action::Allow
        );
    }

    #[test]
    fn a_malformed_program_is_never_taken_for_allowing() {
        let data = [0u8; 64];
        for prog in [
            vec![],                                                  // falls off the end
            vec![insn(0x20, 0, 0, 62)],                              // load past the data
            vec![insn(0x20, 0, 0, 2)],                               // unaligned load
            vec![insn(0x05, 0, 0, 5), insn(0x06, 0, 0, RET_ALLOW)],  // jump out
            vec![insn(0x61, 0, 0, 16), insn(0x06, 0, 0, RET_ALLOW)], // mem out
            vec![insn(0xff, 0, 0, 0), insn(0x06, 0, 0, RET_ALLOW)],  // no such code
        ] {
            assert_eq!(run(&prog, &data), RET_KILL_PROCESS, "{prog:?}");
        }
    }
}
