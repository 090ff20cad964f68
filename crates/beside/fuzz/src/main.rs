//! `pagewise-fuzz`: the fuzz targets of this crate on the stable toolchain.
//!
//! Kept beside libFuzzer (`fuzz/`, which CI runs) for machines without the
//! nightly toolchain that libFuzzer's instrumentation needs: the same
//! targets, fed generic mutations (flipped bits, edge values, truncations,
//! splices) of their built-in seeds and of `corpus/TARGET/`, without
//! coverage. A panic fails the run (the input is saved under
//! `target/fuzz/`); so does an allocation beyond the address-space limit
//! set at start (the process aborts) and a case that takes longer than a
//! minute (the watchdog aborts).

use anyhow::{Context, Result};
use pagewise_fuzz::mutate::{mutate, Rng};
use pagewise_fuzz::targets::corpus_dir;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Parser)]
#[command(about = "Fuzzing of pagewise's parsers of untrusted input on the stable toolchain")]
struct Args {
    /// Seconds to run, shared among the targets.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Seed of the mutations (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Write every target's built-in seeds into `corpus/` and end.
    #[arg(long)]
    write_corpus: bool,
    /// Targets to run (default: all): wire, criu-page-server, criu-images, track-protocol, shim-hello,
    /// prezero-report, instance, store, process-record, seccomp-filter, uffd-maker,
    /// container-names.
    targets: Vec<String>,
}

/// The seeds of `corpus/TARGET/`.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let Ok(rd) = std::fs::read_dir(corpus_dir(target)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect()
}

/// Saves a failing input; its path.
fn save_failure(target: &str, input: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../target/fuzz");
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(format!(
        "{target}-{}.bin",
        pagewise_mech::hash::page_hash(input)
    ));
    let _ = std::fs::write(&p, input);
    p
}

/// Cases run so far, for the watchdog.
static BEAT: AtomicU64 = AtomicU64::new(0);

/// Runs `target` until `until`; the cases run.
fn run_target(name: &str, rng: &mut Rng, until: Instant, work: &Path) -> Result<u64> {
    let target = pagewise_fuzz::open(name, &work.join(name))?;
    let mut seeds = corpus(name);
    seeds.extend(target.seeds(rng));
    let mut cases = 0u64;
    while Instant::now() < until {
        let pick = rng.below(seeds.len());
        let input = mutate(rng, &seeds[pick]);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target.feed(&input)));
        if let Err(e) = r {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            anyhow::bail!(
                "{name}: a panic ({why}) on the input saved as {}",
                save_failure(name, &input).display()
            );
        }
        cases += 1;
        BEAT.fetch_add(1, Ordering::Relaxed);
    }
    Ok(cases)
}

/// Writes every target's built-in seeds into `corpus/TARGET/seed-N`.
fn write_corpus(rng: &mut Rng, work: &Path) -> Result<()> {
    for name in pagewise_fuzz::NAMES {
        let target = pagewise_fuzz::open(name, &work.join(name))?;
        let d = corpus_dir(name);
        std::fs::create_dir_all(&d)?;
        for (i, b) in target.seeds(rng).iter().enumerate().take(8) {
            std::fs::write(d.join(format!("seed-{i}")), b)?;
        }
    }
    println!("wrote {}", corpus_dir("").display());
    Ok(())
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1
    });
    let mut rng = Rng(seed);
    let work = std::env::temp_dir().join(format!("pagewise-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    if a.write_corpus {
        let r = write_corpus(&mut rng, &work);
        let _ = std::fs::remove_dir_all(&work);
        return r;
    }
    let targets: Vec<String> = if a.targets.is_empty() {
        pagewise_fuzz::NAMES.iter().map(|t| t.to_string()).collect()
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
