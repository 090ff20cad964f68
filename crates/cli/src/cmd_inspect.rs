//! `pagewise inspect`: residency, huge pages, bloat and duplicates of processes.

use anyhow::{bail, Result};
use pagewise::inspect::{inspect, Options, Report};

#[derive(clap::Args)]
pub struct Args {
    /// Process to inspect (repeat for several: duplicates are counted
    /// within and across them).
    #[arg(long = "pid", required = true)]
    pids: Vec<i32>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// List every 2 MiB region holding memory.
    #[arg(long)]
    regions: bool,
    /// Look up only every 4th base page of a region in the counting Bloom
    /// filter (SmartMD's 25 % sampling); the exact count is unaffected.
    #[arg(long)]
    bloom_sample: bool,
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1} %", 100.0 * part as f64 / whole as f64)
    }
}

pub fn run(a: Args) -> Result<i32> {
    for &p in &a.pids {
        if !pagewise::procfs::is_alive(p) {
            bail!("no process {p}");
        }
    }
    let mut bar = crate::cmd_bench::progress();
    let mut last = 0u64;
    let opts = Options {
        regions: a.regions,
        bloom_sample: a.bloom_sample,
    };
    let rep: Report = inspect(&a.pids, opts, &mut |done, total| {
        // One line per 5 % (or per update on a terminal).
        let pct = done * 20 / total.max(1);
        if pct != last || done == total {
            last = pct;
            bar(&format!("read {} of {} anonymous pages", done, total));
        }
    })?;
    eprintln!();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
        return Ok(0);
    }
    let pids: Vec<String> = rep.pids.iter().map(|p| p.to_string()).collect();
    println!("process {}", pids.join(", "));
    println!(
        "  resident        {:>12}  (anonymous {}, file {}; swapped {})",
        mib(rep.rss_bytes),
        mib(rep.anon_bytes),
        mib(rep.file_bytes),
        mib(rep.swapped_bytes)
    );
    println!(
        "  huge pages      {:>12}  ({} of anonymous)",
        mib(rep.thp_bytes),
        share(rep.thp_bytes, rep.anon_bytes)
    );
    println!(
        "  bloat           {:>12}  (zero-filled base pages inside huge pages)",
        mib(rep.bloat_bytes)
    );
    println!(
        "  zero pages      {:>12}  ({} of anonymous)",
        mib(rep.zero_bytes),
        share(rep.zero_bytes, rep.anon_bytes)
    );
    println!("  duplicates      {:>12}  (freed by merging identical non-zero pages; {} across processes)", mib(rep.duplicate_bytes), mib(rep.cross_process_duplicate_bytes));
    match rep.ksm_merging_bytes {
        Some(k) => println!(
            "  KSM merges now  {:>12}  (would save up to {} with zero pages)",
            mib(k),
            mib(rep.duplicate_bytes + rep.zero_bytes)
        ),
        None => println!(
            "  KSM merges now  {:>12}  (this kernel has no /proc/PID/ksm_stat)",
            "-"
        ),
    }
    let b = &rep.bloom;
    println!(
        "  Bloom filter    {:>12}  (SmartMD's: {} pages labelled duplicate against {} exact, error {}; {} % looked up)",
        mib(b.memory_bytes),
        b.duplicate_pages,
        b.exact_duplicate_pages,
        b.relative_error
            .map(|e| format!("{:+.2} %", 100.0 * e))
            .unwrap_or_else(|| "-".into()),
        b.sample_percent
    );
    if a.regions {
        println!();
        println!(
            "{:>8} {:>18} {:>9} {:>6} {:>6} {:>6} {:>6} {:>6}  path",
            "pid", "region", "resident", "huge", "zero", "bloat", "rep%", "bloom%"
        );
        for r in &rep.regions {
            println!(
                "{:>8} {:>#18x} {:>9} {:>6} {:>6} {:>6} {:>6.1} {:>6.1}  {}",
                r.pid,
                r.start,
                r.resident_pages,
                r.huge_pages,
                r.zero_pages,
                r.bloat_pages,
                100.0 * r.repetition_rate,
                100.0 * r.bloom_repetition_rate,
                r.path
            );
        }
    }
    Ok(0)
}
