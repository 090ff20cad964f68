//! `pagewise-fuzz`: structure-aware fuzzing of every input pagewise takes
//! from another party (see the README). Each target starts from valid
//! inputs — built here with the real formats, and any files of
//! `corpus/TARGET/` — mutates them, and feeds them to the real parser. A
//! panic fails the run (the input is saved under `target/fuzz/`); so does
//! an allocation beyond the address-space limit set at start (the process
//! aborts) and a case that takes longer than a minute (the watchdog
//! aborts).

use anyhow::{bail, Context, Result};
use pagewise::snap::wire::{Receiver, MAGIC, NONCE_LEN, VERSION};
use pagewise::snap::DiskStore;
use pagewise::{Region, PAGE_SIZE};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Parser)]
#[command(about = "Structure-aware fuzzing of pagewise's parsers of untrusted input")]
struct Args {
    /// Seconds to run, shared among the targets.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Seed of the mutations (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Write the built-in seeds of the wire, track-protocol, shim-hello and
    /// prezero-report targets into `corpus/` and end.
    #[arg(long)]
    write_corpus: bool,
    /// Targets to run (default: all): wire, track-protocol, shim-hello,
    /// prezero-report, instance, store, process-record.
    targets: Vec<String>,
}

const TARGETS: [&str; 7] = [
    "wire",
    "track-protocol",
    "shim-hello",
    "prezero-report",
    "instance",
    "store",
    "process-record",
];

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Values that break length and address arithmetic.
const EDGES: [u64; 12] = [
    0,
    1,
    2,
    4095,
    4096,
    1 << 20,
    1 << 26,
    0x7fff_ffff,
    0xffff_ffff,
    u64::MAX - 8191,
    u64::MAX - 4095,
    u64::MAX,
];

/// One to four mutations of `input`.
fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = [0u8, 1, 0x7f, 0x80, 0xff][rng.below(5)];
            }
            2 if b.len() >= 4 => {
                let i = rng.below(b.len() - 3) & !3;
                let v = EDGES[rng.below(EDGES.len())] as u32;
                b[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            3 if b.len() >= 8 => {
                let i = rng.below(b.len() - 7) & !3;
                let v = EDGES[rng.below(EDGES.len())];
                b[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            4 => {
                let n = rng.below(b.len() + 1);
                b.truncate(n);
            }
            5 if !b.is_empty() => {
                let (a, n) = (rng.below(b.len()), 1 + rng.below(64));
                let part: Vec<u8> = b[a..(a + n).min(b.len())].to_vec();
                let at = rng.below(b.len() + 1);
                b.splice(at..at, part);
            }
            _ => {
                let at = rng.below(b.len() + 1);
                let extra: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next() as u8).collect();
                b.splice(at..at, extra);
            }
        }
    }
    b
}

/// The seeds of `corpus/TARGET/`.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect()
}

/// Saves a failing input; its path.
fn save_failure(target: &str, input: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz");
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(format!(
        "{target}-{}.bin",
        pagewise_mech::hash::page_hash(input)
    ));
    let _ = std::fs::write(&p, input);
    p
}

fn le(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A whole migration session, valid, as a sender writes it (no key).
fn wire_session(rng: &mut Rng) -> Vec<u8> {
    let mut m = Vec::new();
    for v in [MAGIC, VERSION, 1] {
        m.extend_from_slice(&v.to_le_bytes());
    }
    m.extend_from_slice(&[9u8; NONCE_LEN]);
    m.push(b'B');
    let base = 0x10000u64;
    let pages = 1 + rng.below(4) as u64;
    m.push(b'R');
    m.extend_from_slice(&1u32.to_le_bytes());
    m.extend_from_slice(&le(&[base, pages * PAGE_SIZE as u64]));
    for p in 0..pages {
        let fill = rng.next() as u8;
        let page = vec![fill; PAGE_SIZE];
        let (enc, payload): (u8, Vec<u8>) = match rng.below(3) {
            0 => (0, page.clone()),
            1 => (1, lz4_block(&page)),
            _ => (2, Vec::new()),
        };
        let page = if enc == 2 { vec![0u8; PAGE_SIZE] } else { page };
        let mut h = [0u8; 24];
        h[0] = b'P';
        h[1] = enc;
        h[4..8].copy_from_slice(&1u32.to_le_bytes());
        h[8..16].copy_from_slice(&(base + p * PAGE_SIZE as u64).to_le_bytes());
        h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        m.extend_from_slice(&h);
        m.extend_from_slice(&pagewise_mech::hash::page_hash(&page).to_le_bytes());
        m.extend_from_slice(&payload);
    }
    m.push(b'E');
    m.extend_from_slice(&0u32.to_le_bytes());
    m.push(b'D');
    m.push(b'F');
    m.extend_from_slice(&7i64.to_le_bytes());
    m.extend_from_slice(&2u32.to_le_bytes());
    m.extend_from_slice(b"fz");
    m.push(b'Q');
    m
}

/// The pages of a page as one LZ4 block, as the sender makes it: a
/// literal-only block is valid LZ4 and needs no compressor here.
fn lz4_block(page: &[u8]) -> Vec<u8> {
    // One sequence: token 0xF0 (15+ literals, no match), the literal
    // length's extension bytes, the literals.
    let mut out = vec![0xf0u8];
    let mut n = page.len() - 15;
    while n >= 255 {
        out.push(255);
        n -= 255;
    }
    out.push(n as u8);
    out.extend_from_slice(page);
    out
}

/// Serves `input` to `rx` as one connection over loopback.
fn serve_wire(rx: &Receiver, l: &std::net::TcpListener, input: &[u8]) -> Result<()> {
    let addr = l.local_addr()?;
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let _ = s.write_all(&data);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut s, &mut sink);
        }
    });
    let (s, _) = l.accept()?;
    // Store errors are the receiver's own (a full disk); the peer's faults
    // are results. Only a panic is a failure.
    let _ = rx.serve(s, &mut |_| {});
    let _ = writer.join();
    Ok(())
}

/// A valid track-protocol hello and collection reply.
fn track_seeds(rng: &mut Rng) -> Vec<Vec<u8>> {
    use pagewise::track::protocol as p;
    let mut hello = Vec::new();
    for v in [p::MAGIC, p::VERSION, 1, 0] {
        hello.extend_from_slice(&v.to_le_bytes());
    }
    let n = rng.below(8) as u64;
    let mut c = le(&[n, 100, 5000, 0]);
    for i in 0..n {
        c.extend_from_slice(&le(&[0x10000 + i * 0x3000, 1 + i % 2]));
    }
    vec![hello, c]
}

/// A valid shim advice hello.
fn shim_seed(rng: &mut Rng) -> Vec<u8> {
    use pagewise_mech::inject::shim;
    let m = rng.below(4) as u32;
    let mut b = Vec::new();
    for v in [shim::MAGIC, shim::VERSION, 4242, m] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for i in 0..m as u64 {
        b.extend_from_slice(&le(&[0x7000_0000 + i * 0x10000, 0x4000]));
    }
    b
}

/// A pre-zeroing report as the shim sends it at a program's exit.
fn prezero_seed(rng: &mut Rng) -> Vec<u8> {
    let s = pagewise::thp::prezero::PrezeroStats {
        populated: rng.next() >> rng.below(64),
        scans: rng.next() >> rng.below(64),
        cpu_ms: (rng.next() >> 40) as f64 / 1e3,
    };
    s.encode().to_vec()
}

/// Cases run so far, for the watchdog.
static BEAT: AtomicU64 = AtomicU64::new(0);

/// Runs `target` until `until`; the cases run.
/// A process record with two mappings and two threads.
fn record_seed(rng: &mut Rng) -> pagewise::snap::disk::ProcessRecord {
    use pagewise::snap::layout::{Backing, Vma};
    use pagewise::snap::threads::{AltStack, ThreadState};
    let thread = |tid: i32, rng: &mut Rng| {
        let mut regs = pagewise_sys::process::zeroed_regs();
        regs.rip = rng.next();
        regs.rsp = rng.next();
        ThreadState {
            tid,
            regs,
            xstate: (0..64).map(|_| rng.next() as u8).collect(),
            sigmask: rng.next(),
            altstack: AltStack::default(),
            rewound: Some(35),
            rseq: Some((0x7000, 32)),
        }
    };
    pagewise::snap::disk::ProcessRecord {
        start_time: rng.next(),
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
                dev: rng.next(),
                ino: rng.next(),
                flags: 0o2000002,
                pos: rng.next() % 65536,
                target: b"/var/lib/x.db".to_vec(),
            },
            pagewise_mech::procfs::Descriptor {
                fd: 9,
                kind: pagewise_mech::procfs::FdKind::Socket,
                dev: 8,
                ino: rng.next(),
                flags: 0o4002,
                pos: 0,
                target: b"socket:[12345]".to_vec(),
            },
        ]),
        identity: Some(pagewise_mech::procfs::ExecIdentity {
            random_at: rng.next(),
            random: [rng.next() as u8; 16],
            entry: rng.next(),
        }),
    }
}

fn run_target(target: &str, rng: &mut Rng, until: Instant, work: &Path) -> Result<u64> {
    let current = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let mut cases = 0u64;
    let fail = |input: &[u8], e: Box<dyn std::any::Any + Send>| -> anyhow::Error {
        let why = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        anyhow::anyhow!(
            "{target}: a panic ({why}) on the input saved as {}",
            save_failure(target, input).display()
        )
    };
    match target {
        "wire" => {
            let dir = work.join("wire-store");
            let _ = std::fs::remove_dir_all(&dir);
            let mut rx = Receiver::new(DiskStore::create(&dir, true)?);
            rx.idle = Duration::from_secs(5);
            rx.max_bytes = 64 << 20;
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            let mut seeds = corpus(target);
            for _ in 0..8 {
                seeds.push(wire_session(rng));
            }
            while Instant::now() < until {
                let pick = rng.below(seeds.len());
                let input = mutate(rng, &seeds[pick]);
                *current.lock().expect("not poisoned") = input.clone();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    serve_wire(&rx, &l, &input)
                }));
                match r {
                    Ok(r) => r?,
                    Err(e) => return Err(fail(&input, e)),
                }
                cases += 1;
                BEAT.fetch_add(1, Ordering::Relaxed);
            }
        }
        "track-protocol" => {
            let mut seeds = corpus(target);
            for _ in 0..8 {
                seeds.extend(track_seeds(rng));
            }
            while Instant::now() < until {
                let pick = rng.below(seeds.len());
                let input = mutate(rng, &seeds[pick]);
                let r = std::panic::catch_unwind(|| {
                    let _ = pagewise::track::protocol::read_hello(&mut &input[..]);
                    let _ = pagewise::track::protocol::read_collection(&mut &input[..]);
                });
                if let Err(e) = r {
                    return Err(fail(&input, e));
                }
                cases += 1;
                BEAT.fetch_add(1, Ordering::Relaxed);
            }
        }
        "shim-hello" => {
            let mut seeds = corpus(target);
            for _ in 0..8 {
                seeds.push(shim_seed(rng));
            }
            while Instant::now() < until {
                let pick = rng.below(seeds.len());
                let input = mutate(rng, &seeds[pick]);
                let r = std::panic::catch_unwind(|| {
                    let (mut a, b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
                    let _ = a.write_all(&input);
                    drop(a);
                    if let Ok(s) =
                        pagewise_mech::inject::shim::ShimAdvice::hello(b, Duration::from_secs(1))
                    {
                        let own = s.own_memory().to_vec();
                        let inside = pagewise_mech::inject::Inside::Shim(s);
                        for (start, len) in own {
                            let _ = inside.is_own_memory(start, len);
                            let _ = inside.is_own_memory(u64::MAX - 4095, 4096);
                        }
                    }
                });
                if let Err(e) = r {
                    return Err(fail(&input, e));
                }
                cases += 1;
                BEAT.fetch_add(1, Ordering::Relaxed);
            }
        }
        "prezero-report" => {
            let mut seeds = corpus(target);
            for _ in 0..8 {
                seeds.push(prezero_seed(rng));
            }
            // A report reads back as it was written.
            for _ in 0..64 {
                let s = prezero_seed(rng);
                let r = pagewise::thp::prezero::PrezeroStats::decode(&mut &s[..]);
                let same = r.is_ok_and(|r| r.encode()[..24] == s[..24]);
                if !same {
                    bail!(
                        "{target}: a report does not read back as written: {}",
                        save_failure(target, &s).display()
                    );
                }
            }
            while Instant::now() < until {
                let pick = rng.below(seeds.len());
                let input = mutate(rng, &seeds[pick]);
                let r = std::panic::catch_unwind(|| {
                    let _ = pagewise::thp::prezero::PrezeroStats::decode(&mut &input[..]);
                });
                if let Err(e) = r {
                    return Err(fail(&input, e));
                }
                cases += 1;
                BEAT.fetch_add(1, Ordering::Relaxed);
            }
        }
        "instance" => {
            use pagewise::farmem::instance::{Access, Instance, Settings};
            let name = "fuzz-seed";
            let _ = std::fs::remove_file(pagewise::farmem::instance::dir().join(name));
            let inst = Instance::create(
                name,
                Settings::default().latency_ns(1000).local_pages(64),
                (1000, 100),
                (800, 50),
            )?;
            inst.join(std::process::id() as i32, 1)?;
            let path = pagewise::farmem::instance::dir().join(name);
            let mut seeds = corpus(target);
            seeds.push(std::fs::read(&path)?);
            drop(inst);
            let case = pagewise::farmem::instance::dir().join("fuzz-case");
            while Instant::now() < until {
                let pick = rng.below(seeds.len());
                let input = mutate(rng, &seeds[pick]);
                let _ = std::fs::remove_file(&case);
                std::fs::write(&case, &input)?;
                let r = std::panic::catch_unwind(|| {
                    if let Ok(i) = Instance::open("fuzz-case", Access::Read) {
                        let _ = i.members();
                        let _ = i.settings();
                        let _ = i.retired(None);
                        let _ = i.is_stale();
                        let _ = i.calibration(pagewise::farmem::FaultPath::Inline);
                    }
                });
                if let Err(e) = r {
                    return Err(fail(&input, e));
                }
                cases += 1;
                BEAT.fetch_add(1, Ordering::Relaxed);
            }
            let _ = std::fs::remove_file(&case);
            let _ = std::fs::remove_file(&path);
        }
        "store" => {
            let seed_dir = work.join("store-seed");
            let _ = std::fs::remove_dir_all(&seed_dir);
            {
                let mut s = DiskStore::create(&seed_dir, true)?;
                let r1 = Region::new(0x10000, 3 * PAGE_SIZE as u64)?;
                let mut buf = vec![0u8; 3 * PAGE_SIZE];
                buf[5] = 1;
                buf[PAGE_SIZE + 9] = 2;
                s.save(&[(r1, buf.clone())], Some(1), "one", None)?;
                buf[2 * PAGE_SIZE] = 3;
                s.save(&[(r1, buf)], Some(1), "two", None)?;
            }
            let files: Vec<PathBuf> = std::fs::read_dir(&seed_dir)?
                .flatten()
                .map(|e| e.path())
                .filter(|p| !p.ends_with("lock"))
                .collect();
            let case = work.join("store-case");
            while Instant::now() < until {
                let _ = std::fs::remove_dir_all(&case);
                std::fs::create_dir_all(&case)?;
                std::fs::set_permissions(
                    &case,
                    std::os::unix::fs::PermissionsExt::from_mode(0o700),
                )?;
                for f in &files {
                    std::fs::copy(f, case.join(f.file_name().expect("a file")))?;
                }
                let victim = &files[rng.below(files.len())];
                let input = mutate(rng, &std::fs::read(victim)?);
                std::fs::write(case.join(victim.file_name().expect("a file")), &input)?;
                let r = std::panic::catch_unwind(|| {
                    if let Ok(s) = DiskStore::open(&case) {
                        for id in s.ids().unwrap_or_default() {
                            if let Ok(snap) = s.load(id) {
                                let mut page = vec![0u8; PAGE_SIZE];
                                for &off in &snap.entries {
                                    let _ = s.read_page(off, &mut page);
                                }
                            }
                        }
                    }
                });
                if let Err(e) = r {
                    return Err(fail(&input, e));
                }
                cases += 1;
                BEAT.fetch_add(1, Ordering::Relaxed);
            }
            let _ = std::fs::remove_dir_all(&case);
        }
        "process-record" => {
            // A snapshot's process record (store format 3): any bytes are
            // refused or read, never a panic; what is read writes back the
            // same bytes.
            use pagewise::snap::disk::ProcessRecord;
            let mut seeds = corpus(target);
            seeds.push(record_seed(rng).encode());
            while Instant::now() < until {
                let pick = rng.below(seeds.len());
                let input = mutate(rng, &seeds[pick]);
                let r = std::panic::catch_unwind(|| {
                    if let Ok(rec) = ProcessRecord::decode(&input) {
                        assert_eq!(rec.encode(), input, "a record read back writes other bytes");
                    }
                });
                if let Err(e) = r {
                    return Err(fail(&input, e));
                }
                cases += 1;
                BEAT.fetch_add(1, Ordering::Relaxed);
            }
        }
        other => bail!("no fuzz target {other:?}: {}", TARGETS.join(", ")),
    }
    Ok(cases)
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1
    });
    if a.write_corpus {
        let mut rng = Rng(seed);
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let put = |t: &str, i: usize, b: &[u8]| -> Result<()> {
            let d = root.join(t);
            std::fs::create_dir_all(&d)?;
            std::fs::write(d.join(format!("seed-{i}")), b)?;
            Ok(())
        };
        for i in 0..4 {
            put("wire", i, &wire_session(&mut rng))?;
            for (k, b) in track_seeds(&mut rng).iter().enumerate() {
                put("track-protocol", 2 * i + k, b)?;
            }
            put("shim-hello", i, &shim_seed(&mut rng))?;
            put("prezero-report", i, &prezero_seed(&mut rng))?;
        }
        println!("wrote {}", root.display());
        return Ok(());
    }
    let targets: Vec<String> = if a.targets.is_empty() {
        TARGETS.iter().map(|t| t.to_string()).collect()
    } else {
        a.targets.clone()
    };
    // An allocation past 8 GiB of address space fails, and the process
    // aborts: no input may make a parser allocate without bound.
    let limit = libc::rlimit {
        rlim_cur: 8 << 30,
        rlim_max: 8 << 30,
    };
    // SAFETY: setrlimit with a valid struct.
    unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
    let work = std::env::temp_dir().join(format!("pagewise-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    std::env::set_var("PAGEWISE_FARMEM_DIR", work.join("farmem"));
    // The watchdog: a case that takes a minute is a hang.
    std::thread::spawn(|| {
        let mut last = (u64::MAX, Instant::now());
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let b = BEAT.load(Ordering::Relaxed);
            if b != last.0 {
                last = (b, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(60) {
                eprintln!("pagewise-fuzz: a case has run for a minute: a hang");
                std::process::abort();
            }
        }
    });
    println!(
        "pagewise-fuzz: seed {seed}, {} s over {}",
        a.seconds,
        targets.join(", ")
    );
    let share = Duration::from_secs(a.seconds) / targets.len().max(1) as u32;
    let mut rng = Rng(seed);
    for t in &targets {
        let t0 = Instant::now();
        let cases =
            run_target(t, &mut rng, t0 + share, &work).with_context(|| format!("target {t}"))?;
        BEAT.fetch_add(1, Ordering::Relaxed);
        println!(
            "  {t}: {cases} cases in {:.1} s, no failure",
            t0.elapsed().as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
