//! A CRIU dump's threads, as its images say them: which threads a task
//! has (`pstree.img`), and each one's registers, extended state, signal
//! mask and alternate signal stack (`core-TID.img`), made into the
//! [`ThreadState`] a rollback of pagewise's own snapshots puts back.
//!
//! The general registers are CRIU's as it saved them: a thread caught
//! inside an interrupted system call is already rewound to make it again
//! (CRIU's `compel_get_task_regs`), or, for `-ERESTART_RESTARTBLOCK`, left
//! to return `EINTR`, as `criu restore` makes it. `orig_rax` is set to -1,
//! so that the kernel takes no step back of its own when the thread runs.
//!
//! The extended state is the thread's own `XSAVE` area with the dump's
//! parts written over it: the legacy area (x87 and SSE, less the bytes
//! the kernel keeps for itself), the header's `xstate_bv`, and each
//! component the dump holds (AVX, MPX, AVX-512, PKRU) at the offset this
//! CPU gives it. A component the dump holds that this CPU lacks, or of
//! another size, refuses the restore: the thread could not run on as
//! dumped.
//!
//! x86-64 only; a thread dumped in 32-bit (compat) mode is refused.

use std::path::Path;

use pagewise_sys::process::{self as p, Regs};

use super::restore::{corrupt, fields, int, messages, read, Value};
use crate::threads::{AltStack, ThreadState};
use crate::Result;

/// `PSTREE_MAGIC` (criu/include/magic.h).
const PSTREE_MAGIC: u32 = 0x5027_3030;
/// `CORE_MAGIC`.
const CORE_MAGIC: u32 = 0x5505_3847;
/// `core_entry.mtype` of x86-64.
const X86_64: u64 = 1;
/// `user_x86_regs_mode` COMPAT.
const COMPAT: u64 = 2;

/// Every value of a repeated numeric field, packed or not.
fn repeated(f: &[(u64, Value<'_>)], field: u64) -> Option<Vec<u64>> {
    let mut out = Vec::new();
    for (_, v) in f.iter().filter(|(k, _)| *k == field) {
        match v {
            Value::Int(i) => out.push(*i),
            Value::Bytes(b) => {
                let mut at = 0;
                while at < b.len() {
                    out.push(super::restore::varint(b, &mut at)?);
                }
            }
        }
    }
    Some(out)
}

fn message<'a>(f: &[(u64, Value<'a>)], field: u64) -> Option<&'a [u8]> {
    f.iter().find_map(|(k, v)| match v {
        Value::Bytes(b) if *k == field => Some(*b),
        _ => None,
    })
}

/// The threads of task `task` in the dump in `dir`, ascending.
pub(super) fn threads_of(dir: &Path, task: u32) -> Result<Vec<u32>> {
    let path = dir.join("pstree.img");
    let b = read(&path)?;
    for m in messages(&path, &b, PSTREE_MAGIC)? {
        let f = fields(m).ok_or_else(|| corrupt(&path, "a pstree_entry cut short"))?;
        if int(&f, 1) != Some(u64::from(task)) {
            continue;
        }
        let mut threads: Vec<u32> = repeated(&f, 5)
            .ok_or_else(|| corrupt(&path, "a pstree_entry's threads cut short"))?
            .into_iter()
            .map(|t| t as u32)
            .collect();
        if threads.is_empty() {
            threads.push(task);
        }
        threads.sort_unstable();
        return Ok(threads);
    }
    Err(corrupt(&path, format!("no task {task}")))
}

/// The bytes of `words` of `width` bytes each, little-endian: what a
/// repeated `uint32`/`uint64` field of the image holds.
fn bytes_of(words: &[u64], width: usize) -> Vec<u8> {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes()[..width].to_vec())
        .collect()
}

/// Thread `tid`'s state in the dump in `dir` (`core-TID.img`), its
/// extended state written over `xstate` (the thread's own, as
/// `NT_X86_XSTATE` reads it); `sigmask` is the task's mask, for a thread
/// whose image has none of its own.
pub(super) fn thread_state(
    dir: &Path,
    tid: u32,
    mut xstate: Vec<u8>,
    task_sigmask: Option<u64>,
) -> Result<(ThreadState, Option<u64>)> {
    let path = dir.join(format!("core-{tid}.img"));
    let b = read(&path)?;
    let msgs = messages(&path, &b, CORE_MAGIC)?;
    let core = msgs
        .first()
        .and_then(|m| fields(m))
        .ok_or_else(|| corrupt(&path, "no core_entry"))?;
    let bad = |what: &str| corrupt(&path, what.to_string());
    if int(&core, 1) != Some(X86_64) {
        return Err(bad("not an x86-64 thread"));
    }
    let info = message(&core, 2)
        .and_then(fields)
        .ok_or_else(|| bad("no thread_info"))?;
    let gp = message(&info, 2)
        .and_then(fields)
        .ok_or_else(|| bad("no gpregs"))?;
    if int(&gp, 28) == Some(COMPAT) {
        return Err(bad("a thread dumped in 32-bit (compat) mode"));
    }
    let reg = |n: u64| int(&gp, n).ok_or_else(|| bad("gpregs missing a register"));
    let regs = Regs {
        r15: reg(1)?,
        r14: reg(2)?,
        r13: reg(3)?,
        r12: reg(4)?,
        rbp: reg(5)?,
        rbx: reg(6)?,
        r11: reg(7)?,
        r10: reg(8)?,
        r9: reg(9)?,
        r8: reg(10)?,
        rax: reg(11)?,
        rcx: reg(12)?,
        rdx: reg(13)?,
        rsi: reg(14)?,
        rdi: reg(15)?,
        orig_rax: u64::MAX,
        rip: reg(17)?,
        cs: reg(18)?,
        eflags: reg(19)?,
        rsp: reg(20)?,
        ss: reg(21)?,
        fs_base: reg(22)?,
        gs_base: reg(23)?,
        ds: reg(24)?,
        es: reg(25)?,
        fs: reg(26)?,
        gs: reg(27)?,
    };
    let fp = message(&info, 3)
        .and_then(fields)
        .ok_or_else(|| bad("no fpregs"))?;
    overlay_fpu(&fp, &mut xstate).map_err(|why| corrupt(&path, why))?;
    // The task's own mask (the leader's image) and the thread's.
    let task_mask = message(&core, 3)
        .and_then(fields)
        .and_then(|tc| int(&tc, 5));
    let tc = message(&core, 5).and_then(fields);
    let sigmask = tc
        .as_ref()
        .and_then(|t| int(t, 6))
        .or(task_mask)
        .or(task_sigmask)
        .ok_or_else(|| bad("no signal mask"))?;
    let altstack = match tc.as_ref().and_then(|t| message(t, 7)).and_then(fields) {
        Some(sas) => AltStack {
            sp: int(&sas, 1).unwrap_or(0),
            size: int(&sas, 2).unwrap_or(0),
            flags: int(&sas, 3).unwrap_or(0) as i32,
        },
        None => AltStack {
            flags: libc::SS_DISABLE,
            ..AltStack::default()
        },
    };
    Ok((
        ThreadState {
            tid: tid as i32,
            regs,
            xstate,
            sigmask,
            altstack,
            rewound: None,
            rseq: None,
        },
        task_mask,
    ))
}

/// The fxsave part of the legacy area a thread's state takes from the
/// dump: bytes 0..416 (control and status words, x87 and SSE registers);
/// the rest of the 512 bytes is reserved or the kernel's own.
const LEGACY: usize = 416;
/// Where `xstate_bv` is in the `XSAVE` header.
const XSTATE_BV: usize = 512;

/// Writes the dump's `user_x86_fpregs_entry` `fp` over `x`, an `XSAVE`
/// area in the standard format.
fn overlay_fpu(fp: &[(u64, Value<'_>)], x: &mut [u8]) -> std::result::Result<(), String> {
    if x.len() < XSTATE_BV + 64 {
        return Err(format!("an XSAVE area of {} bytes", x.len()));
    }
    let get = |n| int(fp, n).ok_or_else(|| format!("fpregs missing field {n}"));
    let mut legacy = Vec::with_capacity(LEGACY);
    legacy.extend_from_slice(&(get(1)? as u16).to_le_bytes());
    legacy.extend_from_slice(&(get(2)? as u16).to_le_bytes());
    legacy.extend_from_slice(&(get(3)? as u16).to_le_bytes());
    legacy.extend_from_slice(&(get(4)? as u16).to_le_bytes());
    legacy.extend_from_slice(&get(5)?.to_le_bytes());
    legacy.extend_from_slice(&get(6)?.to_le_bytes());
    legacy.extend_from_slice(&(get(7)? as u32).to_le_bytes());
    legacy.extend_from_slice(&(get(8)? as u32).to_le_bytes());
    let st = repeated(fp, 9).ok_or("st_space cut short")?;
    let xmm = repeated(fp, 10).ok_or("xmm_space cut short")?;
    if st.len() != 32 || xmm.len() != 64 {
        return Err(format!(
            "st_space of {} and xmm_space of {} words (32 and 64 expected)",
            st.len(),
            xmm.len()
        ));
    }
    legacy.extend_from_slice(&bytes_of(&st, 4));
    legacy.extend_from_slice(&bytes_of(&xmm, 4));
    debug_assert_eq!(legacy.len(), LEGACY);
    x[..LEGACY].copy_from_slice(&legacy);
    let Some(xs) = message(fp, 13).and_then(fields) else {
        // fxsave only: the x87 and SSE state alone is in use.
        x[XSTATE_BV..XSTATE_BV + 8].copy_from_slice(&3u64.to_le_bytes());
        return Ok(());
    };
    let bv = int(&xs, 1).ok_or("xsave without xstate_bv")?;
    // Component, field, width of the field's words.
    const PARTS: [(u32, u64, usize); 7] = [
        (2, 2, 4), // AVX: ymmh_space
        (3, 3, 8), // MPX: bndreg_state
        (4, 4, 8), // MPX: bndcsr_state
        (5, 5, 8), // AVX-512: opmask_reg
        (6, 6, 8), // AVX-512: zmm_upper
        (7, 7, 8), // AVX-512: hi16_zmm
        (9, 8, 4), // PKRU
    ];
    for (component, field, width) in PARTS {
        let words = repeated(&xs, field).ok_or("an xsave component cut short")?;
        if words.is_empty() {
            continue;
        }
        let bytes = bytes_of(&words, width);
        let (at, size) = p::xsave_component(component)
            .ok_or_else(|| format!("XSAVE component {component}, which this CPU lacks"))?;
        if bytes.len() > size || at + size > x.len() {
            return Err(format!(
                "XSAVE component {component} of {} bytes (this CPU's: {size} at {at}, area {})",
                bytes.len(),
                x.len()
            ));
        }
        x[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    x[XSTATE_BV..XSTATE_BV + 8].copy_from_slice(&bv.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn field(k: u64, v: u64, out: &mut Vec<u8>) {
        varint(k << 3, out);
        varint(v, out);
    }

    fn sub(k: u64, m: &[u8], out: &mut Vec<u8>) {
        varint((k << 3) | 2, out);
        varint(m.len() as u64, out);
        out.extend_from_slice(m);
    }

    /// An fpregs entry whose every byte is known: each word its index
    /// plus `base`.
    fn fpregs(base: u64, ymm: bool) -> Vec<u8> {
        let mut m = Vec::new();
        for (k, v) in [
            (1, 0x37f),
            (2, 1),
            (3, 0xff),
            (4, 2),
            (5, 3),
            (6, 4),
            (7, 0x1f80),
            (8, 0xffff),
        ] {
            field(k, v, &mut m);
        }
        for i in 0..32 {
            field(9, base + i, &mut m);
        }
        for i in 0..64 {
            field(10, base + 100 + i, &mut m);
        }
        if ymm {
            let mut xs = Vec::new();
            field(1, 7, &mut xs);
            for i in 0..64 {
                field(2, base + 200 + i, &mut xs);
            }
            sub(13, &xs, &mut m);
        }
        m
    }

    #[test]
    fn the_dumps_fpu_state_lands_where_xsave_keeps_it() {
        let m = fpregs(1000, true);
        let f = fields(&m).unwrap();
        let mut x = vec![0xaau8; 2048];
        overlay_fpu(&f, &mut x).unwrap();
        let u32_at = |at: usize| u32::from_le_bytes(x[at..at + 4].try_into().unwrap());
        assert_eq!(u16::from_le_bytes([x[0], x[1]]), 0x37f, "cwd");
        assert_eq!(u32_at(24), 0x1f80, "mxcsr");
        assert_eq!(u32_at(32), 1000, "st_space[0]");
        assert_eq!(u32_at(160), 1100, "xmm_space[0]");
        assert_eq!(u32_at(160 + 63 * 4), 1163, "xmm_space[63]");
        // The kernel's own bytes of the legacy area are left.
        assert_eq!(x[LEGACY..XSTATE_BV], vec![0xaa; XSTATE_BV - LEGACY][..]);
        assert_eq!(
            u64::from_le_bytes(x[512..520].try_into().unwrap()),
            7,
            "xstate_bv"
        );
        if let Some((at, _)) = p::xsave_component(2) {
            assert_eq!(u32_at(at), 1200, "ymmh_space[0]");
            assert_eq!(u32_at(at + 63 * 4), 1263, "ymmh_space[63]");
        }
        // Without the xsave extension, x87 and SSE alone are in use.
        let m = fpregs(0, false);
        overlay_fpu(&fields(&m).unwrap(), &mut x).unwrap();
        assert_eq!(u64::from_le_bytes(x[512..520].try_into().unwrap()), 3);
        // A short register file is refused.
        let mut short = Vec::new();
        field(1, 0, &mut short);
        assert!(overlay_fpu(&fields(&short).unwrap(), &mut x).is_err());
    }

    #[test]
    fn repeated_fields_read_packed_and_unpacked() {
        let mut m = Vec::new();
        field(5, 7, &mut m);
        field(5, 300, &mut m);
        let mut packed = Vec::new();
        varint(9, &mut packed);
        varint(70000, &mut packed);
        sub(5, &packed, &mut m);
        assert_eq!(
            repeated(&fields(&m).unwrap(), 5),
            Some(vec![7, 300, 9, 70000])
        );
    }
}
