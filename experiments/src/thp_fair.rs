//! `pagewise bench thp-fair`: HawkEye's experiment (c), fairness. Two
//! forked processes share one budget of huge pages, each on a CPU of its
//! own, with the same amount of memory in base pages:
//!
//! - **random** (TLB-sensitive): GUPS-like updates (`x ^= v`) to random
//!   words of its whole memory: nearly every update misses the TLB;
//! - **stream** (TLB-insensitive): passes over its memory adding 1 to every
//!   word in order, with some arithmetic on each word (a hash, as a
//!   compression or checksum pass would): one TLB miss per 512 words, a
//!   small part of the time.
//!
//! The stream process is started, and watched, first. The budget is as
//! many huge pages as the random process has regions. Policies:
//!
//! - `first-come` (Linux: khugepaged takes processes in the order they
//!   came, each in address order): [`Policy::AddressOrder`];
//! - `utilisation` (Ingens-like, 90 %: both are full, so also first come);
//! - `pagewise` ([`Policy::Coverage`]): the next huge page goes to the
//!   process whose remaining regions promise the most (pages first written
//!   per second × the page-walk cost). Measured over a window shorter than
//!   one streaming pass, the pages first written per second approach each
//!   process's TLB misses per second: the stream touches a few regions per
//!   window, the random process all of them.
//!
//! Each process's time per round is measured before and after the agent
//! spends the budget (median of rounds, both running); its speedup is
//! before / after. Both processes check their memory at the end (the
//! random one undoes its updates; the stream finds every word incremented
//! once per pass): a lost write fails the benchmark.

use crate::thp::{next, rounds_ms, spawn_worker, stop_and_check_all, Child};
use crate::Machine;
use pagewise::{Error, Result, HUGE_PAGE_SIZE};
use pagewise_agent::{drive, Cadence, Uninterrupted};
use pagewise_mech::workload::AnonMemory;
use pagewise_thp::agent::{Action, Agent, Budget, Options, Policy};
use serde::Serialize;
use std::ops::ControlFlow;
use std::time::Duration;

/// The experiment's size.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// 2 MiB regions of each process.
    pub regions: usize,
    /// Updates per round of the random process.
    pub updates_per_round: u64,
    /// Rounds timed before and after (median).
    pub rounds: usize,
    /// Repeats per policy (fresh processes).
    pub repeats: usize,
    /// The agent's interval and coverage window, ms.
    pub interval_ms: u64,
    /// The coverage window, ms.
    pub window_ms: u64,
}

impl Config {
    /// A short run.
    pub fn quick() -> Self {
        Config {
            regions: 512,
            updates_per_round: 1 << 21,
            rounds: 7,
            repeats: 1,
            interval_ms: 300,
            window_ms: 5,
        }
    }
    /// A smoke run: that the experiment runs and checks its memory.
    pub fn smoke() -> Self {
        Config {
            regions: 128,
            updates_per_round: 1 << 19,
            rounds: 5,
            ..Self::quick()
        }
    }
    /// The experiment.
    pub fn full() -> Self {
        Config {
            rounds: 15,
            repeats: 5,
            ..Self::quick()
        }
    }
}

/// One policy's run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Policy.
    pub policy: String,
    /// Repeat.
    pub repeat: usize,
    /// Random process: ms per round before and after.
    pub random_before_ms: f64,
    /// After.
    pub random_after_ms: f64,
    /// Stream process: ms per pass before.
    pub stream_before_ms: f64,
    /// After.
    pub stream_after_ms: f64,
    /// Huge pages given to each.
    pub random_promoted: u64,
    /// To the stream process.
    pub stream_promoted: u64,
    /// Agent steps.
    pub steps: u64,
    /// Both processes found their memory as they wrote it.
    pub verified: bool,
}

impl Row {
    /// before / after of the random process.
    pub fn random_speedup(&self) -> f64 {
        self.random_before_ms / self.random_after_ms
    }
    /// before / after of the stream process.
    pub fn stream_speedup(&self) -> f64 {
        self.stream_before_ms / self.stream_after_ms
    }
}

/// Both processes under one of the kernel's own policies, no agent (fresh
/// processes, started under the policy).
#[derive(Debug, Clone, Serialize)]
pub struct KernelRow {
    /// The policy ([`crate::kernel::ThpPolicy::name`]).
    pub policy: String,
    /// Repeat.
    pub repeat: usize,
    /// Random process: ms per round.
    pub random_ms: f64,
    /// Stream process: ms per pass.
    pub stream_ms: f64,
    /// Random process: KiB in 2 MiB pages.
    pub random_huge_kib: u64,
    /// Stream process: KiB in 2 MiB pages.
    pub stream_huge_kib: u64,
    /// Both processes' resident KiB.
    pub rss_kib: u64,
    /// Both processes found their memory as they wrote it.
    pub verified: bool,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where.
    pub machine: Machine,
    /// Settings.
    pub config: Config,
    /// Page-walk cost measured, ns.
    pub walk_ns: f64,
    /// Runs.
    pub rows: Vec<Row>,
    /// The kernel's own policies, in the same run.
    pub kernel: Vec<KernelRow>,
    /// The policies this kernel cannot run, with why.
    pub kernel_skipped: Vec<String>,
    /// The THP knobs no policy changed, as the machine had them.
    pub thp_knobs: Vec<String>,
}

/// Multiply-rotate rounds per word of the stream process.
const HASH_ROUNDS: usize = 8;

const POLICIES: [(&str, Policy); 3] = [
    ("first-come", Policy::AddressOrder),
    ("utilisation", Policy::Utilisation(0.9)),
    ("pagewise", Policy::Coverage),
];

/// The random process: memory word i starts as i.
fn random(cfg: &Config, cpu: Option<usize>) -> Result<Child> {
    let mem = AnonMemory::new(cfg.regions * HUGE_PAGE_SIZE)?;
    let words = mem.len() / 8;
    for i in 0..words {
        mem.write_word(i, i as u64);
    }
    let n = cfg.updates_per_round;
    let round = move |m: &AnonMemory, r: u64| {
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (r.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
        for _ in 0..n {
            let a = next(&mut x);
            let w = a as usize % words;
            m.write_word(w, m.read_word(w) ^ a);
        }
    };
    spawn_worker(mem, cpu, round, move |m, rounds| {
        for k in 0..rounds {
            round(m, k);
        }
        (0..words).all(|i| m.read_word(i) == i as u64)
    })
}

/// The stream process: word i starts as i and gains 1 per pass.
fn stream(cfg: &Config, cpu: Option<usize>) -> Result<Child> {
    let mem = AnonMemory::new(cfg.regions * HUGE_PAGE_SIZE)?;
    let words = mem.len() / 8;
    for i in 0..words {
        mem.write_word(i, i as u64);
    }
    let round = move |m: &AnonMemory, _r: u64| {
        let mut sum = 0u64;
        for i in 0..words {
            let w = m.read_word(i);
            let mut h = w;
            for _ in 0..HASH_ROUNDS {
                h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
            }
            sum = sum.wrapping_add(h);
            m.write_word(i, w.wrapping_add(1));
        }
        std::hint::black_box(sum);
    };
    spawn_worker(mem, cpu, round, move |m, passes| {
        (0..words).all(|i| m.read_word(i) == i as u64 + passes)
    })
}

/// The stream process, then the random one, each on a CPU of its own
/// where there are two.
fn start_pair(cfg: &Config) -> Result<(Child, Child)> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (cs, cr) = if cpus > 1 {
        (Some(0), Some(1))
    } else {
        (None, None)
    };
    // The stream first: it came first.
    let s = stream(cfg, cs)?;
    let r = random(cfg, cr)?;
    Ok((s, r))
}

/// Both processes under each of the kernel's `policies`, fresh ones each
/// (repeat `repeat`).
fn kernel_rows(
    cfg: &Config,
    policies: &[crate::kernel::ThpPolicy],
    repeat: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<KernelRow>> {
    crate::kernel::under_each(policies, repeat, progress, |policy| {
        let (s, r) = start_pair(cfg)?;
        let (stream_ms, random_ms) = both_ms(&s, &r, cfg.rounds);
        let (hs, hr) = (
            pagewise_testkit::host::resident(s.pid)?,
            pagewise_testkit::host::resident(r.pid)?,
        );
        let verified = stop_and_check_all(&[s, r], Duration::from_secs(60));
        Ok(KernelRow {
            policy: policy.name().to_string(),
            repeat,
            random_ms,
            stream_ms,
            random_huge_kib: hr.anon_huge_kib,
            stream_huge_kib: hs.anon_huge_kib,
            rss_kib: hs.rss_kib + hr.rss_kib,
            verified,
        })
    })
}

fn one(cfg: &Config, name: &str, policy: Policy, repeat: usize, walk_ns: f64) -> Result<Row> {
    let (s, r) = start_pair(cfg)?;
    let (stream_before_ms, random_before_ms) = both_ms(&s, &r, cfg.rounds);
    let k = cfg.regions as u64;
    let opts = Options::default()
        .interval(Duration::from_millis(cfg.interval_ms))
        .window(Duration::from_millis(cfg.window_ms))
        .policy(policy)
        .budget(
            Budget::default()
                .total(Some(k))
                .per_second(1000.0)
                .cpu_share(1.0),
        )
        .walk_ns(walk_ns)
        .recovery(None);
    let mut agent = Agent::new(&[s.pid, r.pid], opts)?;
    let (mut to_s, mut to_r) = (0, 0);
    let mut steps = 0;
    // Until k huge pages were promoted (20 steps at most).
    let cadence = Cadence::default()
        .steps(Some(20))
        .interval(Duration::from_millis(cfg.interval_ms));
    drive(&mut agent, &cadence, &Uninterrupted, None, |_, st| {
        steps += 1;
        for a in st.actions {
            if let Action::Promoted { pid, .. } = a {
                if pid == s.pid {
                    to_s += 1;
                } else {
                    to_r += 1;
                }
            }
        }
        Ok::<_, Error>(if to_s + to_r >= k {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    })?;
    drop(agent);
    let (stream_after_ms, random_after_ms) = both_ms(&s, &r, cfg.rounds);
    let verified = stop_and_check_all(&[s, r], Duration::from_secs(60));
    Ok(Row {
        policy: name.into(),
        repeat,
        random_before_ms,
        random_after_ms,
        stream_before_ms,
        stream_after_ms,
        random_promoted: to_r,
        stream_promoted: to_s,
        steps,
        verified,
    })
}

/// Median ms per round of both, measured at the same time.
fn both_ms(s: &Child, r: &Child, n: usize) -> (f64, f64) {
    // The first rounds after the fork take a write fault on every page
    // (the pages were shared with this process until it unmapped them):
    // not part of either measure.
    std::thread::scope(|sc| {
        sc.spawn(|| rounds_ms(s, 2));
        rounds_ms(r, 2);
    });
    std::thread::scope(|sc| {
        let h = sc.spawn(|| rounds_ms(s, n));
        let rm = rounds_ms(r, n);
        (h.join().expect("timing thread"), rm)
    })
}

/// Runs the experiment.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let p = pagewise_mech::probe::get();
    if !p.madv_collapse || !p.process_madvise {
        return Err(pagewise::Error::from(pagewise::MechError::Unsupported {
            feature: "MADV_COLLAPSE through process_madvise",
            why: format!("{} / {}", p.why("madv_collapse"), p.why("process_madvise")),
        }));
    }
    progress("measuring the page-walk cost");
    let cost = pagewise_thp::calibrate_walk_cost(64 << 20, 1 << 20)?;
    let walk_ns = cost.walk_ns.unwrap_or(30.0).max(1.0);
    let mut rows = Vec::new();
    // Repeat by repeat, the agent's runs and the kernel's policies in
    // turn, as in `thp`.
    let (ready, kernel_skipped) = crate::kernel::ThpPolicy::available();
    let mut kernel = Vec::new();
    for repeat in 0..cfg.repeats {
        for (name, policy) in POLICIES {
            progress(&format!("{name}, run {}", repeat + 1));
            rows.push(one(cfg, name, policy, repeat, walk_ns)?);
        }
        kernel.extend(kernel_rows(cfg, &ready, repeat, progress)?);
    }
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        walk_ns,
        rows,
        kernel,
        kernel_skipped,
        thp_knobs: crate::kernel::thp_knobs(),
    })
}

impl Report {
    /// Median (and min, max) of `f` over the runs of `policy`.
    pub fn stat(&self, policy: &str, f: fn(&Row) -> f64) -> (f64, f64, f64) {
        crate::median_min_max(
            self.rows
                .iter()
                .filter(|r| r.policy == policy)
                .map(f)
                .collect(),
        )
    }

    /// The table and the goals.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "pagewise bench thp-fair — {}\n(c) fairness: a random-update process and a streaming one, {} regions of 2 MiB each, one budget of {} huge pages; page walk {:.1} ns; window {} ms\n\n{:>12} {:>4} {:>14} {:>14} {:>9} {:>14} {:>14} {:>9} {:>9}\n",
            self.machine, c.regions, c.regions, self.walk_ns, c.window_ms,
            "policy", "run", "random ms b/a", "random speedup", "huge", "stream ms b/a", "stream speedup", "huge", "verified"
        );
        for r in &self.rows {
            s += &format!(
                "{:>12} {:>4} {:>6.1}/{:<7.1} {:>14.3} {:>9} {:>6.1}/{:<7.1} {:>14.3} {:>9} {:>9}\n",
                r.policy,
                r.repeat + 1,
                r.random_before_ms,
                r.random_after_ms,
                r.random_speedup(),
                r.random_promoted,
                r.stream_before_ms,
                r.stream_after_ms,
                r.stream_speedup(),
                r.stream_promoted,
                r.verified
            );
        }
        s += "\nmedian speedup (min–max):\n";
        for (name, _) in POLICIES {
            let (r, rl, rh) = self.stat(name, Row::random_speedup);
            let (t, tl, th) = self.stat(name, Row::stream_speedup);
            s += &format!(
                "  {name:>12}: random {r:.3} ({rl:.3}–{rh:.3}), stream {t:.3} ({tl:.3}–{th:.3})\n"
            );
        }
        let (pr, ..) = self.stat("pagewise", Row::random_speedup);
        let (fr, ..) = self.stat("first-come", Row::random_speedup);
        let (ps, ..) = self.stat("pagewise", Row::stream_speedup);
        let (fs, ..) = self.stat("first-come", Row::stream_speedup);
        s += &format!(
            "\nrandom process: pagewise's speedup is {:.2}x its speedup under first-come (goal at least 1.5x); stream process: {:+.1} % against first-come (goal: loses at most 2 %)\n",
            pr / fr,
            (ps / fs - 1.0) * 100.0
        );
        s += &self.kernel_summary();
        s
    }

    /// Median (and min, max) of `f` over the kernel runs of `policy`.
    pub fn kernel_stat(&self, policy: &str, f: fn(&KernelRow) -> f64) -> (f64, f64, f64) {
        crate::median_min_max(
            self.kernel
                .iter()
                .filter(|r| r.policy == policy)
                .map(f)
                .collect(),
        )
    }

    /// The kernel's policies beside the agent's: each process's time per
    /// round and its huge pages, and pagewise's after it spent the budget.
    fn kernel_summary(&self) -> String {
        let mut s = format!(
            "\nthe kernel's own policies, no agent, both processes started under the policy (the THP knobs left as the machine has them: {}); median (min–max) over {} runs:\n{:>26} {:>22} {:>10} {:>22} {:>10} {:>9}\n",
            self.thp_knobs.join(" "),
            self.config.repeats,
            "policy", "random ms", "huge MiB", "stream ms", "huge MiB", "verified"
        );
        let names = crate::in_order(self.kernel.iter().map(|r| r.policy.as_str()));
        let cell = |(m, lo, hi): (f64, f64, f64)| format!("{m:.1} ({lo:.1}–{hi:.1})");
        for name in &names {
            s += &format!(
                "{:>26} {:>22} {:>10.0} {:>22} {:>10.0} {:>9}\n",
                name,
                cell(self.kernel_stat(name, |r| r.random_ms)),
                self.kernel_stat(name, |r| r.random_huge_kib as f64 / 1024.0)
                    .0,
                cell(self.kernel_stat(name, |r| r.stream_ms)),
                self.kernel_stat(name, |r| r.stream_huge_kib as f64 / 1024.0)
                    .0,
                self.kernel
                    .iter()
                    .filter(|r| r.policy == *name)
                    .all(|r| r.verified)
            );
        }
        s += &format!(
            "{:>26} {:>22} {:>10.0} {:>22} {:>10.0} {:>9}\n",
            "pagewise, after",
            cell(self.stat("pagewise", |r| r.random_after_ms)),
            self.stat("pagewise", |r| r.random_promoted as f64).0 * 2.0,
            cell(self.stat("pagewise", |r| r.stream_after_ms)),
            self.stat("pagewise", |r| r.stream_promoted as f64).0 * 2.0,
            self.rows
                .iter()
                .filter(|r| r.policy == "pagewise")
                .all(|r| r.verified)
        );
        for why in &self.kernel_skipped {
            s += &format!("  skipped: {why}\n");
        }
        // What huge pages are worth to each process: all of its memory in
        // 2 MiB pages (always) against none (never), fresh processes.
        let never = crate::kernel::ThpPolicy::Never.name();
        let always = crate::kernel::ThpPolicy::Always.name();
        if names.contains(&never) && names.contains(&always) {
            let gain = |f: fn(&KernelRow) -> f64| {
                (self.kernel_stat(never, f).0 / self.kernel_stat(always, f).0 - 1.0) * 100.0
            };
            s += &format!(
                "all of a process's memory in huge pages (always) against none (never): random {:+.1} %, stream {:+.1} % faster\n",
                gain(|r| r.random_ms),
                gain(|r| r.stream_ms)
            );
        }
        s
    }

    /// Speedups per policy.
    pub fn charts(&self) -> Vec<(String, crate::svg::Chart)> {
        let series = [
            ("random", Row::random_speedup as fn(&Row) -> f64),
            ("stream", Row::stream_speedup),
        ]
        .iter()
        .map(|(label, f)| crate::svg::Series {
            label: label.to_string(),
            points: POLICIES
                .iter()
                .enumerate()
                .map(|(i, (name, _))| (i as f64, self.stat(name, *f).0))
                .collect(),
        })
        .collect();
        vec![(
            "thp-fair.svg".into(),
            crate::svg::Chart {
                title: "(c) speedup per process: 0 first-come, 1 utilisation, 2 pagewise".into(),
                x_label: "policy (0 first-come, 1 utilisation, 2 pagewise)".into(),
                y_label: "speedup (before / after)".into(),
                log_x: false,
                log_y: false,
                series,
            },
        )]
    }
}
