//! A snapshot's process record (store format 4): any bytes are refused
//! or read, never a panic; what is read writes back the same bytes.

use pagewise_snap::disk::ProcessRecord;

use super::Target;
use crate::mutate::Rng;

/// The record's reader.
pub(super) struct ProcessRecordTarget;

impl Target for ProcessRecordTarget {
    fn feed(&self, input: &[u8]) -> bool {
        let Ok(rec) = ProcessRecord::decode(input) else {
            return false;
        };
        assert_eq!(rec.encode(), input, "a record read back writes other bytes");
        true
    }

    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>> {
        (0..4).map(|_| seed(rng).encode()).collect()
    }
}

/// A process record with two mappings and two threads.
fn seed(rng: &mut Rng) -> ProcessRecord {
    use pagewise_snap::layout::{Backing, Vma};
    use pagewise_snap::threads::{AltStack, ThreadState};
    let thread = |tid: i32, rng: &mut Rng| {
        let mut regs = pagewise_sys::process::zeroed_regs();
        regs.rip = rng.word();
        regs.rsp = rng.word();
        ThreadState {
            tid,
            regs,
            xstate: (0..64).map(|_| rng.word() as u8).collect(),
            sigmask: rng.word(),
            altstack: AltStack::default(),
            rewound: Some(35),
            rseq: Some((0x7000, 32)),
        }
    };
    ProcessRecord {
        start_time: rng.word(),
        brk: Some(0x56000000),
        layout: vec![
            Vma {
                start: 0x10000,
                end: 0x20000,
                prot: 3,
                shared: false,
                backing: Backing::Anonymous,
                offset: 0,
            },
            Vma {
                start: 0x400000,
                end: 0x401000,
                prot: 5,
                shared: false,
                backing: Backing::File {
                    path: "/usr/bin/true".into(),
                    inode: 42,
                },
                offset: 0x1000,
            },
        ],
        threads: vec![thread(100, rng), thread(101, rng)],
        fds: Some(vec![
            pagewise_mech::procfs::Descriptor {
                fd: 3,
                kind: pagewise_mech::procfs::FdKind::File,
                dev: rng.word(),
                ino: rng.word(),
                flags: 0o2000002,
                pos: rng.word() % 65536,
                target: b"/var/lib/x.db".to_vec(),
            },
            pagewise_mech::procfs::Descriptor {
                fd: 9,
                kind: pagewise_mech::procfs::FdKind::Socket,
                dev: 8,
                ino: rng.word(),
                flags: 0o4002,
                pos: 0,
                target: b"socket:[12345]".to_vec(),
            },
        ]),
        identity: Some(pagewise_mech::procfs::ExecIdentity {
            random_at: rng.word(),
            random: [rng.word() as u8; 16],
            entry: rng.word(),
        }),
    }
}
