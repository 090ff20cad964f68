//! A snapshot's process record (index versions 3 and 4): what a rollback of
//! another process needs besides pages, and reading it back with every
//! length checked.
//!
//! All integers little-endian:
//!
//! | field | bytes |
//! |---|---|
//! | process start time (clock ticks after boot, `/proc/PID/stat` field 22) | 8 |
//! | program break, or `u64::MAX` when not known | 8 |
//! | mapping count `M` | 4 |
//! | thread count `T` | 4 |
//! | `M` mappings: start, end (8 each), protection, shared (4 each), file offset, inode (8 each), backing (4: 0 anonymous, 1 file, 2 other), name length (4), name (UTF-8) | 48 + name |
//! | `T` threads: tid (4), 27 general registers (`user_regs_struct`, 8 each), XSAVE length (4), XSAVE area, signal mask (8), alternate stack base (8), flags (4), size (8), rewound call or -1 (8), rseq address (8, 0 if none), rseq length (4) | 272 + XSAVE |
//! | sections (index version 4), each: tag (4), body length (4), body | 8 + body |
//!
//! Sections follow the threads, each at most once, in tag order; a record
//! of index version 3 has none. Tag 1, the descriptor table: count `F`
//! (4), then `F` descriptors in increasing number: number (4), kind (4,
//! [`FdKind::code`]), device (8), inode (8), open flags (4), offset (8),
//! link length (4), link (what `/proc/PID/fd/N` reads) — 40 + link each.
//! Tag 2, the program's identity (what changes at `exec`): the address of
//! `AT_RANDOM` (8), its 16 bytes, `AT_ENTRY` (8) — 32 bytes.

use crate::layout::{Backing, Vma};
use crate::threads::{AltStack, ThreadState};
use pagewise_mech::procfs::{Descriptor, ExecIdentity, FdKind};

/// Most mappings a record may list when reading.
const MAX_VMAS: usize = 1 << 20;
/// Most threads.
const MAX_THREADS: usize = 1 << 16;
/// Longest XSAVE area (with AMX tiles, about 11 KiB).
const MAX_XSTATE: usize = 64 << 10;
/// Longest mapping name, and descriptor link.
const MAX_NAME: usize = 4096;
/// Most descriptors.
const MAX_FDS: usize = 1 << 20;
/// The tag of the descriptor table's section.
const TAG_FDS: u32 = 1;
/// The tag of the program identity's section.
const TAG_IDENTITY: u32 = 2;

/// What a snapshot of another process holds besides its pages.
#[derive(Debug, Clone)]
pub struct ProcessRecord {
    /// The process's start time (clock ticks after boot): with the pid,
    /// who it was.
    pub start_time: u64,
    /// The program break, where known.
    pub brk: Option<u64>,
    /// Every mapping (without the kernel's special ones).
    pub layout: Vec<Vma>,
    /// Every thread's state.
    pub threads: Vec<ThreadState>,
    /// Every open descriptor (`None` in a record of index version 3).
    pub fds: Option<Vec<Descriptor>>,
    /// The program the process ran (`None` in a record of index version 3).
    pub identity: Option<ExecIdentity>,
}

fn regs_words(r: &libc::user_regs_struct) -> [u64; 27] {
    [
        r.r15, r.r14, r.r13, r.r12, r.rbp, r.rbx, r.r11, r.r10, r.r9, r.r8, r.rax, r.rcx, r.rdx,
        r.rsi, r.rdi, r.orig_rax, r.rip, r.cs, r.eflags, r.rsp, r.ss, r.fs_base, r.gs_base, r.ds,
        r.es, r.fs, r.gs,
    ]
}

fn regs_of(w: &[u64; 27]) -> libc::user_regs_struct {
    libc::user_regs_struct {
        r15: w[0],
        r14: w[1],
        r13: w[2],
        r12: w[3],
        rbp: w[4],
        rbx: w[5],
        r11: w[6],
        r10: w[7],
        r9: w[8],
        r8: w[9],
        rax: w[10],
        rcx: w[11],
        rdx: w[12],
        rsi: w[13],
        rdi: w[14],
        orig_rax: w[15],
        rip: w[16],
        cs: w[17],
        eflags: w[18],
        rsp: w[19],
        ss: w[20],
        fs_base: w[21],
        gs_base: w[22],
        ds: w[23],
        es: w[24],
        fs: w[25],
        gs: w[26],
    }
}

impl ProcessRecord {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        let put8 = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
        let put4 = |b: &mut Vec<u8>, v: u32| b.extend_from_slice(&v.to_le_bytes());
        put8(&mut b, self.start_time);
        put8(&mut b, self.brk.unwrap_or(u64::MAX));
        put4(&mut b, self.layout.len() as u32);
        put4(&mut b, self.threads.len() as u32);
        for v in &self.layout {
            put8(&mut b, v.start);
            put8(&mut b, v.end);
            put4(&mut b, v.prot as u32);
            put4(&mut b, v.shared as u32);
            put8(&mut b, v.offset);
            let (kind, inode, name) = match &v.backing {
                Backing::Anonymous => (0, 0, ""),
                Backing::File { path, inode } => (1, *inode, path.as_str()),
                Backing::Other(n) => (2, 0, n.as_str()),
            };
            put8(&mut b, inode);
            put4(&mut b, kind);
            put4(&mut b, name.len() as u32);
            b.extend_from_slice(name.as_bytes());
        }
        for t in &self.threads {
            put4(&mut b, t.tid as u32);
            for w in regs_words(&t.regs) {
                put8(&mut b, w);
            }
            put4(&mut b, t.xstate.len() as u32);
            b.extend_from_slice(&t.xstate);
            put8(&mut b, t.sigmask);
            put8(&mut b, t.altstack.sp);
            put4(&mut b, t.altstack.flags as u32);
            put8(&mut b, t.altstack.size);
            put8(&mut b, t.rewound.unwrap_or(-1) as u64);
            put8(&mut b, t.rseq.map_or(0, |r| r.0));
            put4(&mut b, t.rseq.map_or(0, |r| r.1));
        }
        if let Some(fds) = &self.fds {
            let mut body = Vec::new();
            put4(&mut body, fds.len() as u32);
            for d in fds {
                put4(&mut body, d.fd as u32);
                put4(&mut body, d.kind.code());
                put8(&mut body, d.dev);
                put8(&mut body, d.ino);
                put4(&mut body, d.flags);
                put8(&mut body, d.pos);
                put4(&mut body, d.target.len() as u32);
                body.extend_from_slice(&d.target);
            }
            put4(&mut b, TAG_FDS);
            put4(&mut b, body.len() as u32);
            b.extend_from_slice(&body);
        }
        if let Some(id) = &self.identity {
            put4(&mut b, TAG_IDENTITY);
            put4(&mut b, 32);
            put8(&mut b, id.random_at);
            b.extend_from_slice(&id.random);
            put8(&mut b, id.entry);
        }
        b
    }

    /// Reads a record back; `Err` with what is wrong. Only the bytes
    /// [`encode`](Self::encode) writes are read: a record read writes back
    /// the same bytes.
    pub fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        let mut r = Reader { b, at: 0 };
        let start_time = r.u64()?;
        let brk = Some(r.u64()?).filter(|&v| v != u64::MAX);
        let nv = r.u32()? as usize;
        let nt = r.u32()? as usize;
        if nv > MAX_VMAS || nt > MAX_THREADS {
            return Err(format!(
                "{nv} mappings and {nt} threads is more than a record holds"
            ));
        }
        let mut layout = Vec::with_capacity(nv.min(4096));
        for _ in 0..nv {
            let (start, end) = (r.u64()?, r.u64()?);
            let prot = r.u32()? as i32;
            let shared = match r.u32()? {
                0 => false,
                1 => true,
                v => return Err(format!("a shared flag {v}")),
            };
            let offset = r.u64()?;
            let inode = r.u64()?;
            let kind = r.u32()?;
            let name = r.string(MAX_NAME)?;
            if start >= end
                || start % pagewise_mech::PAGE_SIZE as u64 != 0
                || end % pagewise_mech::PAGE_SIZE as u64 != 0
            {
                return Err(format!(
                    "a mapping {start:#x}..{end:#x} that is not page-aligned or empty"
                ));
            }
            if layout.last().is_some_and(|l: &Vma| l.end > start) {
                return Err("mappings out of order or overlapping".into());
            }
            if prot & !(libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) != 0 {
                return Err(format!("a protection {prot:#x}"));
            }
            if (kind == 0 && (inode != 0 || offset != 0 || !name.is_empty()))
                || (kind == 2 && inode != 0)
            {
                return Err(format!("fields a backing of kind {kind} does not have"));
            }
            let backing = match kind {
                0 => Backing::Anonymous,
                1 => Backing::File { path: name, inode },
                2 => Backing::Other(name),
                k => return Err(format!("a backing kind {k}")),
            };
            layout.push(Vma {
                start,
                end,
                prot,
                shared,
                backing,
                offset,
            });
        }
        let mut threads = Vec::with_capacity(nt.min(1024));
        for _ in 0..nt {
            let tid = r.u32()? as i32;
            let mut w = [0u64; 27];
            for x in &mut w {
                *x = r.u64()?;
            }
            let n = r.u32()? as usize;
            if n > MAX_XSTATE {
                return Err(format!("an XSAVE area of {n} bytes"));
            }
            let xstate = r.bytes(n)?.to_vec();
            let sigmask = r.u64()?;
            let altstack = AltStack {
                sp: r.u64()?,
                flags: r.u32()? as i32,
                size: r.u64()?,
            };
            let rewound = match r.u64()? as i64 {
                -1 => None,
                v if v >= 0 => Some(v),
                v => return Err(format!("a rewound call {v}")),
            };
            let (ra, rl) = (r.u64()?, r.u32()?);
            if ra == 0 && rl != 0 {
                return Err("an rseq length without its address".into());
            }
            threads.push(ThreadState {
                tid,
                regs: regs_of(&w),
                xstate,
                sigmask,
                altstack,
                rewound,
                rseq: (ra != 0).then_some((ra, rl)),
            });
        }
        let mut fds = None;
        let mut identity = None;
        let mut last_tag = 0;
        while r.at < b.len() {
            let tag = r.u32()?;
            let n = r.u32()? as usize;
            if tag <= last_tag {
                return Err(format!("a section {tag} after section {last_tag}"));
            }
            last_tag = tag;
            let mut body = Reader {
                b: r.bytes(n)?,
                at: 0,
            };
            match tag {
                TAG_FDS => fds = Some(decode_fds(&mut body)?),
                TAG_IDENTITY => {
                    identity = Some(ExecIdentity {
                        random_at: body.u64()?,
                        random: body.bytes(16)?.try_into().expect("16 bytes"),
                        entry: body.u64()?,
                    })
                }
                t => return Err(format!("an unknown section {t}")),
            }
            if body.at != body.b.len() {
                return Err(format!(
                    "{} bytes after section {tag}",
                    body.b.len() - body.at
                ));
            }
        }
        Ok(ProcessRecord {
            start_time,
            brk,
            layout,
            threads,
            fds,
            identity,
        })
    }
}

/// The descriptor table's section.
fn decode_fds(r: &mut Reader<'_>) -> std::result::Result<Vec<Descriptor>, String> {
    let n = r.u32()? as usize;
    if n > MAX_FDS {
        return Err(format!("{n} descriptors"));
    }
    let mut fds: Vec<Descriptor> = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let fd = r.u32()? as i32;
        let code = r.u32()?;
        let kind = FdKind::from_code(code).ok_or_else(|| format!("a descriptor kind {code}"))?;
        let (dev, ino) = (r.u64()?, r.u64()?);
        let flags = r.u32()?;
        let pos = r.u64()?;
        let len = r.u32()? as usize;
        if len > MAX_NAME {
            return Err(format!("a descriptor link of {len} bytes"));
        }
        let target = r.bytes(len)?.to_vec();
        if fd < 0 || fds.last().is_some_and(|l| l.fd >= fd) {
            return Err(format!("descriptor {fd} out of order"));
        }
        fds.push(Descriptor {
            fd,
            kind,
            dev,
            ino,
            flags,
            pos,
            target,
        });
    }
    Ok(fds)
}

/// Reads fields off a byte slice, never past its end.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                format!(
                    "the record ends at {} of {} bytes wanted",
                    self.b.len(),
                    self.at.saturating_add(n)
                )
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.bytes(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn string(&mut self, max: usize) -> std::result::Result<String, String> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(format!("a name of {n} bytes"));
        }
        String::from_utf8(self.bytes(n)?.to_vec()).map_err(|_| "a name that is not UTF-8".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ProcessRecord {
        let mut regs = pagewise_sys::process::zeroed_regs();
        regs.rip = 0x401000;
        regs.gs = 7;
        regs.r15 = 1;
        ProcessRecord {
            start_time: 12345,
            brk: Some(0x555000),
            layout: vec![
                Vma {
                    start: 0x1000,
                    end: 0x3000,
                    prot: 3,
                    shared: false,
                    backing: Backing::Anonymous,
                    offset: 0,
                },
                Vma {
                    start: 0x5000,
                    end: 0x6000,
                    prot: 5,
                    shared: false,
                    backing: Backing::File {
                        path: "/bin/x".into(),
                        inode: 9,
                    },
                    offset: 0x2000,
                },
            ],
            threads: vec![ThreadState {
                tid: 42,
                regs,
                xstate: vec![1, 2, 3],
                sigmask: 0x8000,
                altstack: AltStack {
                    sp: 0x7000,
                    flags: 0,
                    size: 8192,
                },
                rewound: Some(35),
                rseq: Some((0x9000, 32)),
            }],
            fds: Some(vec![
                Descriptor {
                    fd: 0,
                    kind: FdKind::CharDevice,
                    dev: 5,
                    ino: 6,
                    flags: 0o2,
                    pos: 0,
                    target: b"/dev/null".to_vec(),
                },
                Descriptor {
                    fd: 7,
                    kind: FdKind::File,
                    dev: 8,
                    ino: 99,
                    flags: 0o2000000,
                    pos: 4096,
                    target: b"/tmp/a \xff".to_vec(),
                },
            ]),
            identity: Some(ExecIdentity {
                random_at: 0x7ffc_0000_1000,
                random: [7; 16],
                entry: 0x401020,
            }),
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = sample();
        let b = r.encode();
        let back = ProcessRecord::decode(&b).unwrap();
        assert_eq!(back.encode(), b);
        assert_eq!(back.layout, r.layout);
        assert_eq!(back.threads[0].regs.rip, 0x401000);
        assert_eq!(back.threads[0].regs.gs, 7);
        assert_eq!(back.threads[0].rewound, Some(35));
        assert_eq!(back.fds, r.fds);
        assert_eq!(back.identity, r.identity);
        // A record of index version 3 (no sections) reads as one without a
        // descriptor table.
        let old = ProcessRecord {
            fds: None,
            identity: None,
            ..r
        };
        let b = old.encode();
        assert!(ProcessRecord::decode(&b).unwrap().fds.is_none());
    }

    #[test]
    fn every_truncation_and_overrun_is_refused() {
        let b = sample().encode();
        // Cut where a section begins, it is a record with the sections
        // before it (none: index version 3).
        let v3 = b.len() - sample().sections_len();
        let fds_only = b.len() - 40;
        for n in 0..b.len() {
            match ProcessRecord::decode(&b[..n]) {
                Ok(r) if n == v3 => assert!(r.fds.is_none()),
                Ok(r) if n == fds_only => assert!(r.identity.is_none() && r.fds.is_some()),
                r => assert!(r.is_err(), "truncated at {n}"),
            }
        }
        let mut long = b.clone();
        long.push(0);
        assert!(ProcessRecord::decode(&long).is_err());
        // A huge count does not allocate or read past the end.
        let mut big = b.clone();
        big[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(ProcessRecord::decode(&big).is_err());
        // An unknown section, or the same one twice, is refused.
        let mut unknown = b.clone();
        unknown.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0]);
        assert!(ProcessRecord::decode(&unknown).is_err());
        let mut twice = b.clone();
        twice.extend_from_slice(&b[b.len() - 40..]);
        assert!(ProcessRecord::decode(&twice).is_err());
    }

    impl ProcessRecord {
        fn sections_len(&self) -> usize {
            let a = self.encode().len();
            let b = ProcessRecord {
                fds: None,
                identity: None,
                ..self.clone()
            }
            .encode()
            .len();
            a - b
        }
    }
}
