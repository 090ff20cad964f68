//! `pagewise bench`: the command line of the benchmarks (the CLI's `bench`
//! subcommand is a thin call into [`run`]).

use crate::report::{progress, Output};
use crate::track as bt;
use anyhow::Result;

#[derive(clap::Args)]
/// `pagewise bench`'s arguments.
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// LDT's experiments (a) write-only, (b) read/write timeline, (c) collection
    /// time, for every available backend and no tracking. Short by default.
    Track {
        /// The full experiment (64 MiB..4 GiB, 1 GiB timeline for 10 s; ~5 minutes).
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        output: Output,
    },
    /// SimGrid's experiments: (a) a depth-first state-space search with full-copy
    /// snapshots against the page store (time, peak RSS); (b) snapshot + restore
    /// cycles against fork() and memcpy; (c) `pagewise snapshot --pid` against
    /// `criu dump` on the same process (skipped with the reason where CRIU
    /// cannot run). Short by default.
    Snap {
        /// The full experiment (256 MiB search heap, 1 GiB cycles, 256 MiB
        /// process; a few minutes).
        #[arg(long)]
        full: bool,
        /// Run only these experiments: any of a, b and c (for example `--only bc`).
        #[arg(long, default_value = "abc")]
        only: String,
        #[command(flatten)]
        output: Output,
    },
    /// Restore: (a) rollback of another process in place as the reset of
    /// a fuzzing / model-checking loop (k pages written per input) against
    /// an AFL-style fork server and re-exec + reload; (b) take + restore
    /// cycles in another process against a fork server; (c) a real Redis
    /// reset between test cases against DEBUG RELOAD, a restart and an undo
    /// journal; (d) lazy restore
    /// of own memory from a store against eager restore and the far-memory
    /// floor. Short by default.
    Rollback {
        /// The full experiment (64 MiB and 1 GiB, base pages and THP, 200
        /// resets per point; Redis with a million keys; lazy restore of
        /// 4 GiB; several minutes).
        #[arg(long)]
        full: bool,
        /// Run only these experiments: any of a, b, c and d.
        #[arg(long, default_value = "abcd")]
        only: String,
        #[command(flatten)]
        output: Output,
    },
    /// Resets at fuzzing speed: a reset session (the process held between
    /// resets) against a one-shot restore and an AFL-style fork server, on
    /// a process holding MiB of state that writes k pages per input:
    /// median and 99th-percentile reset, resets a second, phases. Short by
    /// default.
    Reset {
        /// The full experiment (64 MiB and 1 GiB; 16 and 64 pages; 2,000
        /// resets per point).
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        output: Output,
    },
    /// AFL++ fuzzing an example target (64 MiB of state, 16 pages
    /// written per input) and two real parsers from Debian's source
    /// (cJSON, expat) four ways: through pagewise's reset inside the
    /// program and from outside (`pagewise snapshot afl`, `--outside`),
    /// through AFL++'s own fork server (deferred), and in AFL++'s
    /// persistent mode: executions a second, stability, paths and edges,
    /// from afl-fuzz's own statistics; with the floor of a reset inside
    /// the program on this kernel. Needs afl++ (afl-cc, afl-fuzz) and the
    /// sources scripts/setup.sh unpacks. Short by default.
    Afl {
        /// The full experiment (five 30-second runs per mode and target).
        #[arg(long)]
        full: bool,
        /// Seconds per run, instead of the experiment's (30 full, 4 short).
        #[arg(long, value_name = "S")]
        seconds: Option<u64>,
        #[command(flatten)]
        output: Output,
    },
    /// DiME's validation: (a) Table 5.1 fetch counts, (b) the two-page test,
    /// (c) delay accuracy against the configured latency, (f) the cost of a
    /// fault at latency 0. Short by default.
    Farmem {
        /// The full experiment (twelve latencies, five repeats; about a minute).
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        output: Output,
    },
    /// Tracking a running process from outside, experiment (a): one
    /// collection with x % of its pages written, uffd-wp from outside
    /// against hash from outside and uffd-wp in-process. Short by default.
    Outside {
        /// The full experiment (1 GiB; 1, 10 and 50 %; 11 repeats).
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        output: Output,
    },
    /// Live checkpoints, experiment (c): a process writing at 1-50 % of the
    /// copy rate, checkpointed live (pre-copy) against stop-and-copy:
    /// downtime, total time, passes, every snapshot checked byte for byte.
    /// Short by default.
    Live {
        /// The full experiment (1 and 4 GiB; 1, 5, 10, 25 and 50 %).
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        output: Output,
    },
    /// SmartMD's trade-off: memory saved by deduplication against
    /// throughput, on four self-checking processes sharing most of their
    /// content in huge pages, under no dedup, KSM everywhere, no splitting,
    /// Ingens-like and pagewise's agent. Short by default.
    Dedup(DedupArgs),
    /// SmartMD's comparison on four real redis-server instances with
    /// overlapping data sets under redis-benchmark: memory saved, GET and
    /// SET throughput and CPU of each scheme; every value read back.
    DedupRedis(DedupRedisArgs),
    /// HawkEye's experiment (b): time saved per huge page promoted, by
    /// coverage against address order and utilisation, on a self-checking
    /// random-update workload. Short by default.
    Thp {
        /// The full experiment (budgets 4, 8, 16; 5 repeats).
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        output: Output,
    },
    /// HawkEye's experiment (c): fairness. A random-update process and a
    /// streaming one share one budget of huge pages; each one's speedup
    /// under first-come promotion, Ingens-like utilisation and pagewise's
    /// coverage fairness. Short by default.
    ThpFair {
        /// The full experiment (5 repeats, 15 rounds timed).
        #[arg(long)]
        full: bool,
        /// A smoke run (256 MiB per process, 5 rounds): that it runs and
        /// checks its memory, not its figures.
        #[arg(long, conflicts_with = "full")]
        smoke: bool,
        #[command(flatten)]
        output: Output,
    },
    /// HawkEye's experiment (a): memory bloat of a real redis-server in a
    /// memory cgroup (P1 insert, P2 delete 80 %, P3 insert larger values)
    /// under the kernel's THP policies (never, madvise, always, always
    /// with the shrinker, 64 KiB mTHP), an Ingens-like policy and
    /// pagewise's bloat recovery; every value checked after P3. Short by
    /// default.
    ThpRedis {
        /// The full experiment (twice the data and limit).
        #[arg(long)]
        full: bool,
        /// Run only this way (repeatable): never, madvise, always,
        /// always-shrinker, mthp-64k (the kernel's own), ingens, pagewise.
        #[arg(long = "way")]
        ways: Vec<String>,
        #[command(flatten)]
        output: Output,
    },
    /// A real redis-server whose speed depends on the TLB: a large key
    /// space under redis-benchmark's random GETs, in rounds, under the
    /// kernel's THP policies and under pagewise's agent: GET/s against
    /// resident memory and huge pages; every value read back. Short by
    /// default.
    ThpRedisGet {
        /// The full experiment (2,000,000 keys, 10 rounds, 5 runs per way).
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        output: Output,
    },
    /// HawkEye's experiment (d): pre-zeroed huge pages; first-touch latency
    /// of each new 2 MiB and run time of a loop growing through memory,
    /// without THP, with THP, and with THP and pre-zeroing. Short by default.
    Prezero {
        /// The full experiment (2 GiB, 5 runs).
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        output: Output,
    },
    /// LDT's experiment (d): a real redis-server loaded by redis-benchmark,
    /// untracked and tracked every 1, 5 and 10 s.
    Redis(crate::redis::Args),
    /// Incremental checkpoints, experiment (b): a real redis-server under
    /// redis-benchmark, checkpointed every second (live pre-copy,
    /// incremental, full read): throughput, time stopped and bytes read per
    /// checkpoint.
    Checkpoint(crate::checkpoint::Args),
    /// CRIU's dumps of a real redis-server kept by pagewise's page server
    /// against CRIU's own, in one run: bytes kept on disk for all the
    /// dumps and the time of each `criu dump` (CRIU 4.2, built by
    /// scripts/setup.sh).
    Criu(crate::criu::Args),
    /// DiME's experiments (d) and (e): a real redis-server under `pagewise
    /// farmem run`, GET throughput against local memory and latency, and
    /// isolation between instances (with --full); every run checks a sample
    /// of keys and values.
    FarmemRedis(crate::farmem_redis::Args),
    /// DiME's Memcached experiment (Figure 5.5): a real memcached under
    /// `pagewise farmem run`, loaded by memaslap (90 % get, 10 % set):
    /// throughput against local memory and latency, and isolation between
    /// instances (with --full); every run checks a sample of keys and
    /// values it stored.
    FarmemMemcached(crate::farmem_redis::Args),
    /// The inspector's cost: time to inspect a process holding the known
    /// layout (128 MiB; 256 MiB, 1 GiB and 4 GiB with --full) against
    /// reading that memory once at this machine's bandwidth, the target's
    /// slowdown during the scan, and every exact figure checked.
    Inspect(crate::inspect::Args),
    /// Snapshot commands on sparse processes: CRIU's maps03 shape (10 GiB
    /// mapped, 2 pages written) and a 64 GiB PROT_NONE reservation with
    /// 1 GiB made writable, against the same program holding only its 2
    /// pages: each command's time and pagewise's own peak memory, against
    /// 50 ms and 64 MiB; every snapshot and restore checked.
    Sparse(crate::sparse::Args),
    /// The node agent's cost: `pagewise agent` over N podman containers (4;
    /// 50 with --full) against the same agent watching none, in the same
    /// run: its share of one CPU, the series it serves per container, how
    /// soon it answers /healthz and /metrics, how soon every container is
    /// watched, and KSM's settings after its SIGTERM.
    Node(crate::node::Args),
}

/// Runs the benchmark `a` names; the process's exit code.
pub fn run(a: Args, quiet: bool) -> Result<i32> {
    crate::provenance::begin();
    match a.what {
        What::Track { full, output } => {
            let cfg = if full {
                bt::Config::full()
            } else {
                bt::Config::quick()
            };
            let report = bt::run(&cfg, &mut progress(quiet))?;
            output.emit(&report, report.summary(), report.charts())
        }
        What::Snap { full, only, output } => {
            use crate::snap as bs;
            let mut cfg = if full {
                bs::Config::full()
            } else {
                bs::Config::quick()
            };
            cfg.parts = only;
            let report = bs::run(&cfg, &mut progress(quiet))?;
            output.emit(&report, report.summary(), report.charts())
        }
        What::Rollback { full, only, output } => {
            use crate::rollback as br;
            let mut cfg = if full {
                br::Config::full()
            } else {
                br::Config::quick()
            };
            cfg.parts = only;
            let report = br::run(&cfg, &mut progress(quiet))?;
            output.emit(&report, report.summary(), report.charts())
        }
        What::Reset { full, output } => {
            use crate::reset as bz;
            let cfg = if full {
                bz::Config::full()
            } else {
                bz::Config::quick()
            };
            let report = bz::run(&cfg, &mut progress(quiet))?;
            output.emit(&report, report.summary(), report.charts())
        }
        What::Afl {
            full,
            seconds,
            output,
        } => {
            use crate::afl as ba;
            let mut cfg = if full {
                ba::Config::full()
            } else {
                ba::Config::quick()
            };
            if let Some(s) = seconds {
                cfg.seconds = s;
            }
            let report = ba::run(&cfg, &mut progress(quiet))?;
            output.emit(&report, report.summary(), report.charts())
        }
        What::Farmem { full, output } => {
            use crate::farmem as bf;
            let cfg = if full {
                bf::FarmemConfig::full()
            } else {
                bf::FarmemConfig::quick()
            };
            let report = bf::run(&cfg, &mut progress(quiet))?;
            output.emit(&report, report.summary(), report.charts())
        }
        What::Outside { full, output } => {
            use crate::outside as bo;
            let cfg = if full {
                bo::Config::full()
            } else {
                bo::Config::quick()
            };
            let report = bo::run(&cfg, &mut progress(quiet))?;
            output.emit(&report, report.summary(), report.charts())
        }
        What::Live { full, output } => live(full, output, quiet),
        What::Dedup(a) => dedup(a, quiet),
        What::Thp { full, output } => {
            let cfg = if full {
                crate::thp::Config::full()
            } else {
                crate::thp::Config::quick()
            };
            let report = crate::thp::run(&cfg, &mut progress(quiet))?;
            let rc = output.emit(&report, report.summary(), report.charts())?;
            let bad = report.rows.iter().filter(|r| !r.verified).count();
            if bad > 0 {
                anyhow::bail!("{bad} runs failed their own check: a write was lost or torn");
            }
            Ok(rc)
        }
        What::ThpFair {
            full,
            smoke,
            output,
        } => {
            let cfg = match (full, smoke) {
                (true, _) => crate::thp_fair::Config::full(),
                (_, true) => crate::thp_fair::Config::smoke(),
                _ => crate::thp_fair::Config::quick(),
            };
            let report = crate::thp_fair::run(&cfg, &mut progress(quiet))?;
            let rc = output.emit(&report, report.summary(), report.charts())?;
            if report.rows.iter().any(|r| !r.verified) {
                anyhow::bail!("a process found its memory other than it wrote it");
            }
            Ok(rc)
        }
        What::DedupRedis(a) => dedup_redis(a, quiet),
        What::ThpRedisGet { full, output } => thp_redis_get(full, &output, quiet),
        What::ThpRedis { full, ways, output } => thp_redis(full, &ways, &output, quiet),
        What::Prezero { full, output } => {
            let cfg = if full {
                crate::prezero::Config::full()
            } else {
                crate::prezero::Config::quick()
            };
            let report = crate::prezero::run(&cfg, &mut progress(quiet))?;
            let rc = output.emit(&report, report.summary(), report.charts())?;
            if report.rows.iter().any(|r| !r.verified) {
                anyhow::bail!("a run read back memory other than it wrote");
            }
            Ok(rc)
        }
        What::Redis(r) => crate::redis::run(r, quiet),
        What::Checkpoint(r) => crate::checkpoint::run(r, quiet),
        What::Criu(r) => crate::criu::run(r, quiet),
        What::FarmemRedis(r) => crate::farmem_redis::run(r, quiet),
        What::FarmemMemcached(r) => {
            crate::farmem_redis::run_app(crate::farmem_redis::App::Memcached, r, quiet)
        }
        What::Inspect(r) => crate::inspect::run(r, quiet),
        What::Sparse(r) => crate::sparse::run(r, quiet),
        What::Node(r) => crate::node::run(r, quiet),
    }
}

/// The arguments of `bench dedup`.
#[derive(clap::Args)]
struct DedupArgs {
    /// The full experiment (256 MiB per process, 60 s per scheme, two
    /// runs of each at overcommitment 0.8, 1.1 and 1.4).
    #[arg(long)]
    full: bool,
    /// Run only this scheme (repeatable): none, ksm-everywhere,
    /// ksm-advisor, ksm-advisor-tuned, no-splitting, ingens-like, smartmd.
    #[arg(long = "scheme")]
    schemes: Vec<String>,
    /// Seconds per scheme (default 16, or 60 with --full).
    #[arg(long)]
    seconds: Option<u64>,
    /// Overcommitment levels, comma-separated: the processes' memory
    /// against their memory cgroup's limit (default 0.8, or 0.8,1.1,1.4
    /// with --full); above 1 needs zram for swap.
    #[arg(long, value_delimiter = ',')]
    overcommit: Vec<f64>,
    /// Runs of each scheme at each level (default 1, or 2 with --full).
    #[arg(long)]
    repeats: Option<usize>,
    /// Append every step of the agent (its decisions and their
    /// reasons) to FILE, one JSON object per line.
    #[arg(long, value_name = "FILE")]
    log: Option<std::path::PathBuf>,
    #[command(flatten)]
    output: Output,
}

/// SmartMD's comparison of the dedup schemes (`bench dedup`).
fn dedup(a: DedupArgs, quiet: bool) -> Result<i32> {
    let DedupArgs {
        full,
        schemes,
        seconds,
        overcommit,
        repeats,
        log,
        output,
    } = a;
    crate::dedup::check_schemes(&schemes).map_err(anyhow::Error::msg)?;
    if let Some(why) = crate::dedup::unavailable() {
        println!("bench dedup: skipped: {why}");
        return Ok(0);
    }
    let cfg = if full {
        crate::dedup::Config::full()
    } else {
        crate::dedup::Config::quick()
    };
    if let Some(bad) = overcommit.iter().find(|l| !(0.1..=4.0).contains(*l)) {
        anyhow::bail!("--overcommit {bad}: a level between 0.1 and 4");
    }
    let cfg = crate::dedup::Config {
        schemes,
        seconds: seconds.unwrap_or(cfg.seconds),
        levels: if overcommit.is_empty() {
            cfg.levels
        } else {
            overcommit
        },
        repeats: repeats.unwrap_or(cfg.repeats).max(1),
        log,
        ..cfg
    };
    let report = crate::dedup::run(&cfg, &mut progress(quiet))?;
    let rc = output.emit(&report, report.summary(), report.charts())?;
    let bad: Vec<&str> = report
        .rows
        .iter()
        .filter(|r| !r.verified)
        .map(|r| r.scheme.as_str())
        .collect();
    if !bad.is_empty() {
        anyhow::bail!("a process found its memory other than it wrote it under {bad:?}");
    }
    Ok(rc)
}

/// The arguments of `bench dedup-redis`.
#[derive(clap::Args)]
struct DedupRedisArgs {
    /// The full experiment (256 MiB per server, 60 s per scheme).
    #[arg(long)]
    full: bool,
    /// Run only this scheme (repeatable).
    #[arg(long = "scheme")]
    schemes: Vec<String>,
    /// Seconds per scheme (default 20, or 60 with --full).
    #[arg(long)]
    seconds: Option<u64>,
    #[command(flatten)]
    output: Output,
}

/// SmartMD's comparison on real Redis servers (`bench dedup-redis`).
fn dedup_redis(a: DedupRedisArgs, quiet: bool) -> Result<i32> {
    let DedupRedisArgs {
        full,
        schemes,
        seconds,
        output,
    } = a;
    crate::dedup::check_schemes(&schemes).map_err(anyhow::Error::msg)?;
    if let Some(why) = crate::dedup_redis::unavailable() {
        println!("bench dedup-redis: skipped: {why}");
        return Ok(0);
    }
    let cfg = if full {
        crate::dedup_redis::Config::full()
    } else {
        crate::dedup_redis::Config::quick()
    };
    let cfg = crate::dedup_redis::Config {
        schemes,
        seconds: seconds.unwrap_or(cfg.seconds),
        ..cfg
    };
    let report = crate::dedup_redis::run(&cfg, &mut progress(quiet))?;
    let rc = output.emit(&report, report.summary(), report.charts())?;
    let bad: Vec<&str> = report
        .rows
        .iter()
        .filter(|r| r.values_ok != r.values_checked)
        .map(|r| r.scheme.as_str())
        .collect();
    if !bad.is_empty() {
        anyhow::bail!("values were lost or wrong under {bad:?}");
    }
    Ok(rc)
}

/// Live checkpoints and migration (`bench live`), every stored page
/// compared with the process's memory at the stop.
fn live(full: bool, output: Output, quiet: bool) -> Result<i32> {
    use crate::live as bl;
    let cfg = if full {
        bl::Config::full()
    } else {
        bl::Config::quick()
    };
    let scratch = std::env::temp_dir().join(format!("pagewise-bench-live-{}", std::process::id()));
    let report = bl::run(&cfg, &scratch, &mut progress(quiet));
    let _ = std::fs::remove_dir_all(&scratch);
    let report = report?;
    let wrong: u64 = report
        .rows
        .iter()
        .map(|r| r.wrong_pages + r.migration.wrong_pages)
        .chain(
            report
                .compression
                .iter()
                .flat_map(|c| c.runs.iter().map(|m| m.wrong_pages)),
        )
        .sum();
    let rc = output.emit(&report, report.summary(), report.charts())?;
    if wrong > 0 {
        anyhow::bail!("{wrong} stored pages differ from the process's memory at the stop");
    }
    Ok(rc)
}

/// `bench thp-redis-get`.
fn thp_redis_get(full: bool, output: &Output, quiet: bool) -> Result<i32> {
    if let Some(why) = crate::thp_redis_get::unavailable() {
        println!("bench thp-redis-get: skipped: {why}");
        return Ok(0);
    }
    let cfg = if full {
        crate::thp_redis_get::Config::full()
    } else {
        crate::thp_redis_get::Config::quick()
    };
    let report = crate::thp_redis_get::run(&cfg, &mut progress(quiet))?;
    let rc = output.emit(&report, report.summary(), report.charts())?;
    let (lost, misses): (u64, u64) = report
        .rows
        .iter()
        .fold((0, 0), |(l, m), r| (l + r.lost, m + r.misses));
    if lost > 0 || misses > 0 {
        anyhow::bail!("{lost} values lost or wrong, {misses} GETs found no key");
    }
    Ok(rc)
}

/// `bench thp-redis`.
fn thp_redis(full: bool, ways: &[String], output: &Output, quiet: bool) -> Result<i32> {
    if let Some(why) = crate::thp_redis::unavailable() {
        println!("bench thp-redis: skipped: {why}");
        return Ok(0);
    }
    let cfg = if full {
        crate::thp_redis::Config::full()
    } else {
        crate::thp_redis::Config::quick()
    };
    let (ways, skipped) = crate::thp_redis::Way::chosen(ways)?;
    let report = crate::thp_redis::run(&cfg, &ways, &skipped, &mut progress(quiet))?;
    let rc = output.emit(&report, report.summary(), report.charts())?;
    let lost: u64 = report.rows.iter().map(|r| r.lost).sum();
    if lost > 0 {
        anyhow::bail!("{lost} values were lost or wrong after P3");
    }
    Ok(rc)
}
