//! Descriptors across a rollback, against the target's own table
//! (`/proc/PID/fd`, `fdinfo`) and what it reads: a file closed since is
//! open again at its number and offset, descriptors opened since are
//! closed, an offset moved since is put back; a pipe gone since refuses the
//! restore before anything changes, unless asked to go on without it.

use super::*;
use pagewise_mech::procfs::{self, Descriptor, FdKind};
use pagewise_snap::RollbackRefusal;

/// A file of known bytes: `0123456789abcdef…` over and over.
fn known_file(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rollback-fds-{name}-{}", std::process::id()));
    let text: String = "0123456789abcdefghijklmnopqrstuv".repeat(8);
    std::fs::write(&p, text).unwrap();
    p
}

/// The bytes `read` answers: `read=XXXXXXXX pos=N`.
fn read_and_pos(answer: &str) -> (String, u64) {
    let word = |k: &str| {
        answer
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {answer:?}"))
            .to_string()
    };
    (word("read="), word("pos=").parse().unwrap())
}

/// The table without offsets (compared apart).
fn without_pos(v: &[Descriptor]) -> Vec<(i32, FdKind, u64, u64, u32)> {
    v.iter()
        .map(|d| (d.fd, d.kind, d.dev, d.ino, d.flags))
        .collect()
}

#[test]
fn descriptors_are_put_back_as_the_snapshot_had_them() {
    let Some(path) = target() else { return };
    let file = known_file("put-back");
    let mut t = Target::start(&path, &[]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    let fd: i32 = t
        .ask(&format!("o {}", file.display()))
        .split_whitespace()
        .find_map(|w| w.strip_prefix("fd="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(fd > 2, "the file opened as descriptor {fd}");
    assert_eq!(read_and_pos(&t.ask("r")), ("01234567".into(), 8));
    t.settle();
    let at_take = procfs::descriptors(t.pid()).unwrap();
    let id = h.take().unwrap();
    // Since: the file read on, then closed; a pipe opened.
    assert_eq!(read_and_pos(&t.ask("r")), ("89abcdef".into(), 16));
    t.ask("k");
    let pipe = t.ask("P");
    t.settle();
    let r = h.restore(id, RestoreOptions::default()).unwrap();
    t.settle();
    assert!(r.fds.recorded && r.fds.applied, "{:?}", r.fds);
    assert_eq!(
        r.fds.closed.len(),
        2,
        "the pipe's ends closed: {:?} ({pipe})",
        r.fds
    );
    assert!(r.fds.closed.iter().all(|n| n.kind == FdKind::Pipe));
    assert_eq!(r.fds.reopened.len(), 1, "{:?}", r.fds);
    assert_eq!(
        (r.fds.reopened[0].fd, r.fds.reopened[0].kind),
        (fd, FdKind::File)
    );
    assert!(r.fds.missing.is_empty() && r.fds.kept.is_empty());
    let mut changes = r.fd_changes.clone();
    changes.sort_unstable();
    assert_eq!(changes.len(), 3, "{changes:?}");
    // The table is the snapshot's, offsets included.
    let now = procfs::descriptors(t.pid()).unwrap();
    assert_eq!(without_pos(&now), without_pos(&at_take));
    let pos = |v: &[Descriptor]| v.iter().find(|d| d.fd == fd).map(|d| d.pos);
    assert_eq!(pos(&now), Some(8));
    // The program reads on from where it was.
    assert_eq!(read_and_pos(&t.ask("r")), ("89abcdef".into(), 16));
    // Open at both times, read on since: the offset is put back.
    assert_eq!(read_and_pos(&t.ask("r")), ("ghijklmn".into(), 24));
    t.settle();
    let r = h.restore(id, RestoreOptions::default()).unwrap();
    assert_eq!(r.fds.rewound.len(), 1, "{:?}", r.fds);
    assert!(
        r.fds.closed.is_empty() && r.fds.reopened.is_empty(),
        "{:?}",
        r.fds
    );
    assert_eq!(read_and_pos(&t.ask("r")), ("89abcdef".into(), 16));
    // Opened since and kept, when asked.
    t.ask("P");
    t.settle();
    let before = procfs::descriptors(t.pid()).unwrap().len();
    let r = h
        .restore(id, RestoreOptions::default().keep_new_fds(true))
        .unwrap();
    assert_eq!(
        (r.fds.kept.len(), r.fds.closed.len()),
        (2, 0),
        "{:?}",
        r.fds
    );
    assert_eq!(procfs::descriptors(t.pid()).unwrap().len(), before);
    assert!(t.ask("c").contains("bad=0"));
    let _ = std::fs::remove_file(&file);
}

#[test]
fn a_pipe_gone_since_refuses_the_restore_unless_asked() {
    let Some(path) = target() else { return };
    let mut t = Target::start(&path, &[]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    t.ask("P");
    t.settle();
    let id = h.take().unwrap();
    t.ask("K");
    t.ask("w 30 5");
    t.settle();
    let written = t.ask("c");
    let table = procfs::descriptors(t.pid()).unwrap();
    let e = h.restore(id, RestoreOptions::default()).unwrap_err();
    match &e {
        pagewise_snap::Error::Rollback(RollbackRefusal::DescriptorsGone { gone, .. }) => {
            assert_eq!(gone.len(), 2, "{gone:?}");
            assert!(gone.iter().all(|g| g.contains("pipe")), "{gone:?}");
        }
        other => panic!("a pipe gone since: {other:?}"),
    }
    assert!(e.to_string().contains("--ignore-missing-fds"), "{e}");
    // Refused before anything changed: memory and descriptors as they were.
    t.settle();
    let sum = |a: &str| a.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(sum(&t.ask("c")), sum(&written));
    assert_eq!(procfs::descriptors(t.pid()).unwrap(), table);
    t.settle();
    let r = h
        .restore(id, RestoreOptions::default().ignore_missing_fds(true))
        .unwrap();
    assert_eq!(r.fds.missing.len(), 2, "{:?}", r.fds);
    t.settle();
    assert_memory_is(&h, id, &t);
}

/// A snapshot saved to a store carries its table: loaded back, a restore
/// closes what was opened since.
#[test]
fn a_stored_snapshot_carries_its_descriptors() {
    let Some(path) = target() else { return };
    let mut t = Target::start(&path, &[]);
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    t.settle();
    let at_take = procfs::descriptors(t.pid()).unwrap();
    let id = h.take().unwrap();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rollback-fds-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut disk = pagewise_snap::DiskStore::create(&dir, true).unwrap();
    h.save(id, &mut disk, "fds").unwrap();
    drop(h);
    t.ask("P");
    t.settle();
    let disk = pagewise_snap::DiskStore::open(&dir).unwrap();
    let mut h = ProcessSnapshots::open(t.pid()).unwrap();
    let last = *disk.ids().unwrap().last().unwrap();
    let sid = h.load(&disk, last, false).unwrap();
    let r = h.restore(sid, RestoreOptions::default()).unwrap();
    assert!(r.fds.recorded);
    assert_eq!(r.fds.closed.len(), 2, "{:?}", r.fds);
    assert_eq!(
        without_pos(&procfs::descriptors(t.pid()).unwrap()),
        without_pos(&at_take)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
