//! Hidden `pagewise workload`: a writer process with a known pattern, for tests
//! and benchmarks that watch another process.

use anyhow::Result;
use pagewise::workload::{AnonMemory, Rng};
use pagewise::PAGE_SIZE;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Size of the anonymous region in MiB.
    #[arg(long, default_value_t = 64)]
    mib: usize,
    /// Pages written per second (random pages, one byte each).
    #[arg(long, default_value_t = 10000)]
    pages_per_sec: u64,
    /// How long to run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Instead of random writes: after --delay-ms, write the first K pages once
    /// (value 0xA5 at offset 100), then idle. A known layout for tests.
    #[arg(long)]
    write_first: Option<usize>,
    /// Delay before --write-first, in ms.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// With --write-first: write when FILE exists (not after --delay-ms),
    /// print `written` on its own line, then exit 0 once FILE is removed.
    /// A test drives the writes by events; --seconds bounds each wait.
    #[arg(long, value_name = "FILE", requires = "write_first")]
    write_when: Option<std::path::PathBuf>,
    /// Instead: build the inspector's known layout over this many 2 MiB
    /// regions (`pagewise::workload::Layout`), write what it holds to
    /// --truth as JSON, then read every page of its hot regions in a loop
    /// for --seconds (and print the passes per second at the end).
    #[arg(long, value_name = "REGIONS")]
    layout: Option<usize>,
    /// Where --layout writes what it holds.
    #[arg(long, value_name = "FILE")]
    truth: Option<std::path::PathBuf>,
    /// Where --layout keeps the count of passes so far (8 bytes, native
    /// order, rewritten every 5 ms): a benchmark reads the target's speed.
    #[arg(long, value_name = "FILE")]
    passes: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> Result<i32> {
    if let Some(regions) = a.layout {
        let l = pagewise::workload::Layout::build(regions, 0x1a40)?;
        let truth = serde_json::to_string(&l.truth())?;
        match &a.truth {
            Some(p) => std::fs::write(p, truth.as_bytes())?,
            None => println!("{truth}"),
        }
        let counter = match &a.passes {
            Some(p) => Some(std::fs::File::create(p)?),
            None => None,
        };
        let t0 = Instant::now();
        let mut passes = 0u64;
        let mut noted = Instant::now();
        while t0.elapsed().as_secs_f64() < a.seconds {
            std::hint::black_box(l.touch_hot());
            passes += 1;
            if let Some(f) = &counter {
                if noted.elapsed() >= Duration::from_millis(5) {
                    use std::os::unix::fs::FileExt;
                    f.write_at(&passes.to_ne_bytes(), 0)?;
                    noted = Instant::now();
                }
            }
        }
        eprintln!(
            "layout: {:.1} passes over the hot regions per second",
            passes as f64 / t0.elapsed().as_secs_f64()
        );
        return Ok(0);
    }
    if a.mib == 0 || a.mib > (1 << 20) {
        crate::usage!("--mib {}: use 1..=1048576", a.mib);
    }
    let mem = AnonMemory::new(a.mib << 20)?;
    mem.write_pass(1, 1);
    println!("{:#x} {}", mem.addr(), mem.len());
    use std::io::Write;
    std::io::stdout().flush()?;
    let t0 = Instant::now();
    if let Some(k) = a.write_first {
        let within = |exists: bool, f: &std::path::Path| {
            while f.exists() != exists {
                if t0.elapsed().as_secs_f64() >= a.seconds {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            true
        };
        match &a.write_when {
            Some(f) if !within(true, f) => {
                anyhow::bail!("{} did not appear within --seconds", f.display())
            }
            Some(_) => {}
            None => std::thread::sleep(Duration::from_millis(a.delay_ms)),
        }
        for p in 0..k.min(mem.pages()) {
            mem.write_byte(p * PAGE_SIZE + 100, 0xA5);
        }
        if let Some(f) = &a.write_when {
            println!("written");
            std::io::stdout().flush()?;
            if !within(false, f) {
                anyhow::bail!("{} was not removed within --seconds", f.display());
            }
            return Ok(0);
        }
        while t0.elapsed().as_secs_f64() < a.seconds {
            std::thread::sleep(Duration::from_millis(10));
        }
        return Ok(0);
    }
    let mut rng = Rng::new(1);
    let mut written = 0u64;
    while t0.elapsed().as_secs_f64() < a.seconds {
        let due = (t0.elapsed().as_secs_f64() * a.pages_per_sec as f64) as u64;
        // Bounded in time too: a rate beyond what the machine can write
        // must not keep the loop past --seconds.
        while written < due
            && (!written.is_multiple_of(4096) || t0.elapsed().as_secs_f64() < a.seconds)
        {
            let p = rng.below(mem.pages() as u64) as usize;
            mem.write_byte(p * PAGE_SIZE, (written % 250) as u8 + 2);
            written += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(0)
}
