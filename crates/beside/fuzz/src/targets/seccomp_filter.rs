//! A seccomp filter read from another process (`PTRACE_SECCOMP_GET_FILTER`)
//! and run by pagewise's classic-BPF interpreter for a call it would make:
//! input = the 64 bytes of `struct seccomp_data`, then the program, 8
//! bytes an instruction (code u16, jt u8, jf u8, k u32, little-endian).

use pagewise_mech::seccomp::{self, Action, Filters};
use pagewise_sys::process::BpfInsn;

use super::Target;
use crate::mutate::Rng;

/// The interpreter.
pub(super) struct SeccompFilter;

const DATA: usize = 64;

fn program(bytes: &[u8]) -> Vec<BpfInsn> {
    bytes
        .chunks_exact(8)
        .map(|c| BpfInsn {
            code: u16::from_le_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect()
}

impl Target for SeccompFilter {
    fn feed(&self, input: &[u8]) -> bool {
        if input.len() < DATA + 8 || !(input.len() - DATA).is_multiple_of(8) {
            return false;
        }
        let data: [u8; DATA] = input[..DATA].try_into().expect("64 bytes");
        let prog = program(&input[DATA..]);
        let checked = seccomp::run_checked(&prog, &data);
        // A malformed program is never taken for an allowing one.
        let ret = seccomp::run(&prog, &data);
        assert_eq!(checked.unwrap_or(ret), ret);
        if checked.is_none() {
            assert_eq!(Action::of(ret), Action::KillProcess);
        }
        // The verdict of the filter alone, for the call the data names, is
        // its answer's action.
        let word = |at: usize| u64::from_le_bytes(input[at..at + 8].try_into().expect("8 bytes"));
        let nr = i32::from_le_bytes(input[0..4].try_into().expect("4 bytes"));
        let arch = u32::from_le_bytes(input[4..8].try_into().expect("4 bytes"));
        if arch == seccomp::AUDIT_ARCH_X86_64 {
            let args = [word(16), word(24), word(32), word(40), word(48), word(56)];
            let v = Filters::from_programs(vec![prog]).verdict(i64::from(nr), args, word(8));
            assert_eq!(v, Action::of(ret));
        }
        checked.is_some()
    }

    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>> {
        (0..8).map(|_| seed(rng)).collect()
    }
}

/// A filter of the usual shape (the architecture checked, then one call
/// answered, another checked on an argument, the rest allowed), with the
/// data of a call.
fn seed(rng: &mut Rng) -> Vec<u8> {
    let nr = [
        libc::SYS_userfaultfd,
        libc::SYS_madvise,
        libc::SYS_mmap,
        libc::SYS_munmap,
    ][rng.below(4)] as u32;
    let answer = [0x8000_0000u32, 0x0003_0000, 0x0005_0001, 0x7fc0_0000][rng.below(4)];
    let insn = |code: u16, jt: u8, jf: u8, k: u32| {
        let mut b = code.to_le_bytes().to_vec();
        b.extend([jt, jf]);
        b.extend(k.to_le_bytes());
        b
    };
    let mut out = Vec::new();
    out.extend((rng.below(400) as i32).to_le_bytes());
    out.extend(seccomp::AUDIT_ARCH_X86_64.to_le_bytes());
    out.extend(rng.word().to_le_bytes());
    for _ in 0..6 {
        out.extend((rng.word() >> rng.below(64)).to_le_bytes());
    }
    for i in [
        insn(0x20, 0, 0, 4),
        insn(0x15, 1, 0, seccomp::AUDIT_ARCH_X86_64),
        insn(0x06, 0, 0, 0x8000_0000),
        insn(0x20, 0, 0, 0),
        insn(0x15, 0, 1, nr),
        insn(0x06, 0, 0, answer),
        insn(0x15, 0, 3, libc::SYS_madvise as u32),
        insn(0x20, 0, 0, 32),
        insn(0x15, 0, 1, 12),
        insn(0x06, 0, 0, 0x0005_0001),
        insn(0x06, 0, 0, 0x7fff_0000),
    ] {
        out.extend(i);
    }
    out
}
