//! Pages a parent shares with its forked child stay shared when pagewise
//! reads them (`cow_share.c`: 256 MiB filled, then forked): after
//! `snapshot --pid`, `snapshot --live`, `snapshot restore` and `inspect` of
//! the parent, both still map the same frames (pagemap, as root) and the
//! two processes' summed proportional set size is what it was.

#[macro_use]
mod support;
use support::*;

const MIB: u64 = 256;

/// A parent and child sharing `MIB` MiB; killed when dropped.
struct Pair {
    p: pagewise_testkit::Piped,
    addr: u64,
    len: u64,
    child: i32,
}

fn start() -> Pair {
    let prog = c_program("cow_share");
    let mut p = pagewise_testkit::Piped::start(Command::new(prog).arg(MIB.to_string()));
    let l = p.line();
    let w: Vec<&str> = l.split_whitespace().collect();
    assert_eq!(w.first(), Some(&"ready"), "{l}");
    let addr = u64::from_str_radix(w[1].trim_start_matches("0x"), 16).unwrap();
    Pair {
        addr,
        len: w[2].parse().unwrap(),
        child: w[3].parse().unwrap(),
        p,
    }
}

/// The frames of `[addr, addr+len)` in `pid` (0 where not shown).
fn frames(pid: i32, addr: u64, len: u64) -> Vec<u64> {
    use std::os::fd::AsFd;
    let f = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut e = vec![0u64; (len / PAGE) as usize];
    pagewise_sys::pagemap::read_entries(f.as_fd(), addr, &mut e).unwrap();
    e.iter()
        .map(|x| x & pagewise_sys::pagemap::entry::PFN_MASK)
        .collect()
}

/// Pages of the region both map with the same frame.
fn shared(pair: &Pair) -> usize {
    let a = frames(pair.p.pid(), pair.addr, pair.len);
    let b = frames(pair.child, pair.addr, pair.len);
    a.iter().zip(&b).filter(|(x, y)| **x != 0 && x == y).count()
}

/// The summed proportional set size of both, KiB.
fn pss(pair: &Pair) -> u64 {
    [pair.p.pid(), pair.child]
        .iter()
        .map(|p| {
            let t = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).unwrap();
            pagewise_mech::procfs::status_field(&t, "Pss").unwrap()
        })
        .sum()
}

#[test]
fn pages_shared_after_fork_stay_shared_when_read() {
    need_support!();
    let pair = start();
    let pid = pair.p.pid().to_string();
    let pages = (pair.len / PAGE) as usize;
    let frames_shown = shared(&pair) > 0;
    if !frames_shown {
        println!("frames are not shown here (not root): summed PSS alone is compared");
    } else {
        assert_eq!(shared(&pair), pages, "shared after fork");
    }
    let pss0 = pss(&pair);
    let dir = temp_dir("cow-sharing");
    let live = dir.with_extension("live");
    let steps: Vec<(&str, Vec<String>)> = vec![
        (
            "snapshot --pid",
            vec![
                "snapshot".into(),
                "--pid".into(),
                pid.clone(),
                "--out".into(),
                dir.display().to_string(),
            ],
        ),
        (
            "snapshot --live",
            vec![
                "snapshot".into(),
                "--live".into(),
                "--pid".into(),
                pid.clone(),
                "--out".into(),
                live.display().to_string(),
            ],
        ),
        (
            "snapshot restore",
            vec![
                "snapshot".into(),
                "restore".into(),
                "--pid".into(),
                pid.clone(),
                dir.display().to_string(),
            ],
        ),
        (
            "inspect",
            vec![
                "inspect".into(),
                "--pid".into(),
                pid.clone(),
                "--json".into(),
            ],
        ),
    ];
    for (name, args) in steps {
        ok(Command::new(BIN).args(&args));
        if frames_shown {
            assert_eq!(shared(&pair), pages, "{name}: pages no longer shared");
        }
        let now = pss(&pair);
        // Unshared, the pair would hold 256 MiB more.
        assert!(
            now < pss0 + MIB * 1024 / 16,
            "{name}: summed PSS {now} KiB, {pss0} KiB before"
        );
        println!(
            "{name}: {} of {pages} pages still shared; PSS {now} KiB ({pss0} before)",
            shared(&pair)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&live);
}
