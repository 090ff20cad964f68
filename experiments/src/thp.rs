//! `pagewise bench thp`: HawkEye's experiment on the time saved per huge
//! page (b). A forked process runs GUPS-like random updates (`x ^= v`) over
//! 2 MiB regions of known, different access coverage:
//!
//! - *narrow* regions, first in address order: every update to one of them
//!   goes to one of its 4 hot pages;
//! - *wide* regions, after them: updates go to any of their 512 pages.
//!
//! Half the updates go to each kind. The narrow regions' hot pages fit in
//! the TLB; the wide regions' pages do not: a huge page saves page walks in
//! a wide region and next to nothing in a narrow one. Every region is
//! populated (base pages), so all are equally "utilised".
//!
//! Per policy and budget k (huge pages), a fresh process: its time per
//! round of updates is measured before any promotion, then the agent
//! ([`pagewise_thp::agent`]) runs with that policy until it has promoted k
//! regions (or gives up), and the time per round is measured again. The
//! time saved per huge page is (before - after) / k per round. Policies:
//! `coverage` (pagewise: coverage x walk cost), `address` (khugepaged's
//! order), `utilisation` (Ingens-like, threshold 0.9: every region passes,
//! fullest first, then by address).
//!
//! Self-check: the updates of round r come from a generator seeded with r,
//! and `x ^= v` undoes itself: at the end the process applies every round
//! again and checks that its memory is back to what it started with. A lost
//! or torn write during a collapse would fail it.

use crate::Machine;
use pagewise::{Error, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_agent::{drive, Cadence, Deadline, Uninterrupted};
use pagewise_mech::workload::AnonMemory;
use pagewise_thp::agent::{Action, Agent, Budget, Options, Policy};
use serde::Serialize;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The experiment's size.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Narrow regions (4 hot pages each).
    pub narrow: usize,
    /// Wide regions (all 512 pages).
    pub wide: usize,
    /// Updates per round.
    pub updates_per_round: u64,
    /// Rounds timed before and after promotion (median).
    pub rounds: usize,
    /// Budgets k to run.
    pub budgets: Vec<u64>,
    /// Repeats per policy and budget (fresh processes).
    pub repeats: usize,
    /// Seconds the agent watches a process that changes nothing (its cost).
    pub idle_seconds: u64,
}

impl Config {
    /// A short run.
    pub fn quick() -> Self {
        Config {
            narrow: 32,
            wide: 16,
            updates_per_round: 1 << 20,
            rounds: 5,
            budgets: vec![8],
            repeats: 1,
            idle_seconds: 3,
        }
    }
    /// The experiment.
    pub fn full() -> Self {
        Config {
            narrow: 32,
            wide: 16,
            updates_per_round: 1 << 21,
            rounds: 15,
            budgets: vec![4, 8, 16],
            repeats: 5,
            idle_seconds: 30,
        }
    }
}

/// One run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Policy.
    pub policy: String,
    /// Budget k.
    pub k: u64,
    /// Repeat number.
    pub repeat: usize,
    /// Median ms per round before promotion.
    pub before_ms: f64,
    /// Median ms per round after.
    pub after_ms: f64,
    /// Huge pages the agent promoted.
    pub promoted: u64,
    /// Of them, wide regions.
    pub promoted_wide: u64,
    /// (before - after) / promoted, ms per round per huge page.
    pub saved_ms_per_huge_page: f64,
    /// Agent steps taken.
    pub steps: u64,
    /// The process's own check after the run.
    pub verified: bool,
}

/// One run of the workload under one of the kernel's own policies (no
/// agent): the memory populated under the policy, then timed.
#[derive(Debug, Clone, Serialize)]
pub struct KernelRow {
    /// The policy ([`crate::kernel::ThpPolicy::name`]).
    pub policy: String,
    /// Repeat number.
    pub repeat: usize,
    /// Median ms per round.
    pub ms_per_round: f64,
    /// The process's memory mapped by 2 MiB pages (`AnonHugePages`), KiB.
    pub anon_huge_kib: u64,
    /// Its resident set, KiB.
    pub rss_kib: u64,
    /// 64 KiB huge pages the kernel faulted in meanwhile (all processes:
    /// `hugepages-64kB/stats/anon_fault_alloc`).
    pub mthp_64k_faults: u64,
    /// The process's own check after the run.
    pub verified: bool,
}

/// The coverage measured from outside against ground truth, and what
/// measuring costs the process.
#[derive(Debug, Clone, Serialize)]
pub struct CoverageCheck {
    /// Windows measured.
    pub windows: u64,
    /// Pages the process touched in the windows, summed over regions (the
    /// narrow regions' 4 hot pages, the wide regions' 512).
    pub true_pages: u64,
    /// Pages measured as written.
    pub measured_pages: u64,
    /// Sum over regions of |measured - true| / sum of true.
    pub error: f64,
    /// ms per round without measuring, and while the agent measures every
    /// 300 ms (100 ms windows, nothing promoted).
    pub round_ms_alone: f64,
    /// As above, while measured.
    pub round_ms_measured: f64,
    /// round_ms_measured / round_ms_alone - 1.
    pub slowdown: f64,
}

/// What the agent costs while nothing changes: a process with 64 MiB of
/// populated base pages that writes nothing, watched with the default
/// interval (1 s) and window (200 ms).
#[derive(Debug, Clone, Serialize)]
pub struct IdleCost {
    /// Seconds watched.
    pub seconds: f64,
    /// Steps taken.
    pub steps: u64,
    /// CPU time of the agent's steps, ms.
    pub cpu_ms: f64,
    /// cpu_ms over the time watched, % of one CPU.
    pub cpu_percent: f64,
    /// Huge pages promoted (0: nothing was written).
    pub promoted: u64,
}

/// What the experiment measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine.
    pub machine: Machine,
    /// Configuration.
    pub config: Config,
    /// Page-walk cost measured, ns.
    pub walk_ns: f64,
    /// Runs.
    pub rows: Vec<Row>,
    /// The coverage method against ground truth.
    pub coverage: CoverageCheck,
    /// The agent's cost while nothing changes.
    pub idle: IdleCost,
    /// The kernel's own policies, in the same run.
    pub kernel: Vec<KernelRow>,
    /// The policies this kernel cannot run, with why.
    pub kernel_skipped: Vec<String>,
    /// The THP knobs no policy changed, as the machine had them.
    pub thp_knobs: Vec<String>,
}

/// The control page shared with the child: [0] rounds done, [1] stop,
/// [2] ns of the last round, [3] 1 when verified, 2 when not, [4] ready.
pub(crate) struct Ctl(pagewise_sys::mem::SharedAtomics);

impl Ctl {
    fn new() -> Result<Self> {
        pagewise_sys::mem::SharedAtomics::new(5)
            .map(Ctl)
            .map_err(|e| Error::os("mapping a shared page", e))
    }
    fn at(&self, i: usize) -> &AtomicU64 {
        self.0.at(i)
    }
}

pub(crate) struct Child {
    pub(crate) pid: i32,
    pub(crate) base: u64,
    ctl: Ctl,
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = pagewise_sys::process::kill(self.pid, libc::SIGKILL);
        let _ = pagewise_sys::process::wait_child(self.pid);
    }
}

/// xorshift64*.
pub(crate) fn next(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// One round of updates over `mem` (round `r`).
fn round(mem: &AnonMemory, cfg: &Config, r: u64) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (r.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
    let words_per_page = PAGE_SIZE / 8;
    for _ in 0..cfg.updates_per_round {
        let a = next(&mut x);
        let b = next(&mut x);
        let wide = a & 1 == 1;
        let (region, page) = if wide {
            (
                cfg.narrow + (a >> 1) as usize % cfg.wide,
                (b >> 9) as usize % 512,
            )
        } else {
            ((a >> 1) as usize % cfg.narrow, (b >> 9) as usize % 4)
        };
        let word = (b as usize) % words_per_page;
        let w = (region * HUGE_PAGE_SIZE + page * PAGE_SIZE) / 8 + word;
        mem.write_word(w, mem.read_word(w) ^ b);
    }
}

fn start(cfg: &Config) -> Result<Child> {
    let regions = cfg.narrow + cfg.wide;
    let mem = AnonMemory::new(regions * HUGE_PAGE_SIZE)?;
    // No advice: base pages at first touch (THP in `madvise` mode).
    for i in 0..mem.len() / 8 {
        mem.write_word(i, i as u64);
    }
    let (c1, c2) = (cfg.clone(), cfg.clone());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    spawn_worker(
        mem,
        cpus.checked_sub(1).filter(|_| cpus > 1),
        move |m, r| round(m, &c1, r),
        move |m, rounds| {
            // Undo every round and check.
            for k in 0..rounds {
                round(m, &c2, k);
            }
            let words = (c2.narrow + c2.wide) * HUGE_PAGE_SIZE / 8;
            (0..words).all(|i| m.read_word(i) == i as u64)
        },
    )
}

/// Forks a worker over `mem` (already written), pinned to `cpu` if given
/// (the agent runs on the others: fewer migrations, steadier rounds): it
/// runs `round(r)` for r = 0, 1, ... and publishes each round's time until
/// told to stop, then `check(rounds done)` and publishes the result. This
/// process's copy of `mem` is unmapped.
pub(crate) fn spawn_worker(
    mem: AnonMemory,
    cpu: Option<usize>,
    round: impl Fn(&AnonMemory, u64),
    check: impl Fn(&AnonMemory, u64) -> bool,
) -> Result<Child> {
    let ctl = Ctl::new()?;
    let base = mem.addr();
    // SAFETY: the child runs its rounds over its own memory, reads the
    // clock and the shared page, and exits: no allocation, no lock.
    let pid = unsafe {
        pagewise_sys::process::fork_child(|| {
            let c = |i: usize| ctl.at(i);
            if let Some(cpu) = cpu {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            c(4).store(1, Ordering::SeqCst);
            let mut r = 0u64;
            while c(1).load(Ordering::SeqCst) == 0 {
                let t = Instant::now();
                round(&mem, r);
                c(2).store(t.elapsed().as_nanos() as u64, Ordering::SeqCst);
                r += 1;
                c(0).store(r, Ordering::SeqCst);
            }
            c(3).store(if check(&mem, r) { 1 } else { 2 }, Ordering::SeqCst);
            0
        })
    }
    .map_err(|e| Error::os("fork of the target", e))?;
    drop(mem); // the child has its own copy
    let child = Child { pid, base, ctl };
    let t0 = Instant::now();
    while child.ctl.at(4).load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(child)
}

impl Child {
    /// Rounds the worker has completed.
    pub(crate) fn rounds(&self) -> u64 {
        self.ctl.at(0).load(Ordering::SeqCst)
    }

    /// Tells the worker to stop and waits (up to 60 s) for its check.
    pub(crate) fn stop_and_check(&self) -> bool {
        stop_and_check_all(std::slice::from_ref(self), Duration::from_secs(60))
    }
}

/// Tells every worker to stop at once (a worker told later would go on
/// and have more rounds to undo), then waits up to `within` for all their
/// checks; whether every one found its memory as it wrote it.
pub(crate) fn stop_and_check_all(children: &[Child], within: Duration) -> bool {
    stop_and_check_each(children, within)
        .iter()
        .all(|c| *c == Some(true))
}

/// As [`stop_and_check_all`], each worker's answer: whether it found its
/// memory as it wrote it, `None` when it was gone without an answer
/// (killed, by the OOM killer say) or gave none in time.
pub(crate) fn stop_and_check_each(children: &[Child], within: Duration) -> Vec<Option<bool>> {
    for c in children {
        c.ctl.at(1).store(1, Ordering::SeqCst);
    }
    let t0 = Instant::now();
    let answer = |c: &Child| match c.ctl.at(3).load(Ordering::SeqCst) {
        0 => None,
        v => Some(v == 1),
    };
    let done = |c: &Child| answer(c).is_some() || !pagewise_mech::procfs::is_alive(c.pid);
    while !children.iter().all(done) && t0.elapsed() < within {
        std::thread::sleep(Duration::from_millis(5));
    }
    children.iter().map(answer).collect()
}

/// Median ms of the next `n` rounds.
pub(crate) fn rounds_ms(c: &Child, n: usize) -> f64 {
    let mut v = Vec::new();
    let mut seen = c.ctl.at(0).load(Ordering::SeqCst);
    while v.len() < n {
        std::thread::sleep(Duration::from_millis(1));
        let now = c.ctl.at(0).load(Ordering::SeqCst);
        if now > seen {
            seen = now;
            v.push(c.ctl.at(2).load(Ordering::SeqCst) as f64 / 1e6);
        }
    }
    crate::median(&mut v)
}

fn one(
    cfg: &Config,
    policy: Policy,
    name: &str,
    k: u64,
    repeat: usize,
    walk_ns: f64,
) -> Result<Row> {
    let c = start(cfg)?;
    let before_ms = rounds_ms(&c, cfg.rounds);
    let opts = Options::default()
        .interval(Duration::from_millis(300))
        .window(Duration::from_millis(100))
        .policy(policy)
        .budget(
            Budget::default()
                .total(Some(k))
                .per_second(1000.0)
                .cpu_share(1.0),
        )
        .walk_ns(walk_ns)
        .recovery(None);
    let mut agent = Agent::new(&[c.pid], opts)?;
    let mut promoted = Vec::new();
    let mut steps = 0;
    // Back to back, until k huge pages were promoted (10 steps at most).
    let cadence = Cadence::default().steps(Some(10));
    drive(&mut agent, &cadence, &Uninterrupted, None, |_, s| {
        steps += 1;
        for a in s.actions {
            if let Action::Promoted { start, .. } = a {
                promoted.push(start);
            }
        }
        Ok::<_, Error>(if promoted.len() as u64 >= k {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    })?;
    drop(agent);
    let after_ms = rounds_ms(&c, cfg.rounds);
    let verified = c.stop_and_check();
    let wide_from = c.base + (cfg.narrow * HUGE_PAGE_SIZE) as u64;
    let n = promoted.len() as u64;
    Ok(Row {
        policy: name.to_string(),
        k,
        repeat,
        before_ms,
        after_ms,
        promoted: n,
        promoted_wide: promoted
            .iter()
            .filter(|&&s| {
                s >= wide_from && s < c.base + ((cfg.narrow + cfg.wide) * HUGE_PAGE_SIZE) as u64
            })
            .count() as u64,
        saved_ms_per_huge_page: if n > 0 {
            (before_ms - after_ms) / n as f64
        } else {
            0.0
        },
        steps,
        verified,
    })
}

/// Rounds completed and the time they took, over `d` (mean ms per round).
fn mean_round_ms(
    c: &Child,
    d: Duration,
    during: impl FnOnce(Deadline) -> Result<()>,
) -> Result<f64> {
    let r0 = c.ctl.at(0).load(Ordering::SeqCst);
    let t0 = Instant::now();
    let until = t0 + d;
    during(Deadline(until))?;
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    let r1 = c.ctl.at(0).load(Ordering::SeqCst);
    Ok(t0.elapsed().as_secs_f64() * 1e3 / (r1 - r0).max(1) as f64)
}

/// The coverage method against the workload's known coverage, and the
/// process's slowdown while it is measured.
fn coverage_check(cfg: &Config, walk_ns: f64) -> Result<CoverageCheck> {
    let c = start(cfg)?;
    rounds_ms(&c, 2);
    let opts = Options::default()
        .interval(Duration::from_millis(300))
        .window(Duration::from_millis(100))
        .policy(Policy::Coverage)
        .budget(
            Budget::default()
                .total(Some(0))
                .per_second(0.0)
                .cpu_share(0.0),
        )
        .walk_ns(walk_ns)
        .recovery(None);
    let alone = mean_round_ms(&c, Duration::from_secs(3), |_| Ok(()))?;
    let mut agent = Agent::new(&[c.pid], opts)?;
    let (mut windows, mut truth, mut measured, mut diff) = (0u64, 0u64, 0u64, 0u64);
    let wide_from = c.base + (cfg.narrow * HUGE_PAGE_SIZE) as u64;
    let end = c.base + ((cfg.narrow + cfg.wide) * HUGE_PAGE_SIZE) as u64;
    let every = Cadence::default().interval(Duration::from_millis(300));
    let measured_ms = mean_round_ms(&c, Duration::from_secs(3), |until| {
        drive(&mut agent, &every, &until, None, |_, s| {
            windows += 1;
            for cand in s
                .candidates
                .iter()
                .filter(|x| x.start >= c.base && x.start < end)
            {
                let t = if cand.start >= wide_from { 512 } else { 4 };
                let m = cand.touched.unwrap_or(0);
                truth += t;
                measured += m;
                diff += m.abs_diff(t);
            }
            Ok::<_, Error>(ControlFlow::Continue(()))
        })
        .map(|_| ())
    })?;
    c.ctl.at(1).store(1, Ordering::SeqCst);
    Ok(CoverageCheck {
        windows,
        true_pages: truth,
        measured_pages: measured,
        error: diff as f64 / truth.max(1) as f64,
        round_ms_alone: alone,
        round_ms_measured: measured_ms,
        slowdown: measured_ms / alone - 1.0,
    })
}

/// The agent's CPU time over `seconds` watching a process that writes
/// nothing.
fn idle_cost(seconds: u64, walk_ns: f64) -> Result<IdleCost> {
    let mem = AnonMemory::new(64 << 20)?;
    mem.write_pass(1, 1);
    // SAFETY: the child only sleeps until it is killed.
    let pid = unsafe {
        pagewise_sys::process::fork_child(|| loop {
            std::thread::sleep(Duration::from_secs(1));
        })
    }
    .map_err(|e| Error::os("fork of the target", e))?;
    let c = Child {
        pid,
        base: mem.addr(),
        ctl: Ctl::new()?,
    };
    let opts = Options::default().walk_ns(walk_ns);
    let interval = opts.interval;
    let mut agent = Agent::new(&[c.pid], opts)?;
    let t0 = Instant::now();
    let until = Deadline(t0 + Duration::from_secs(seconds));
    drive(
        &mut agent,
        &Cadence::default().interval(interval),
        &until,
        None,
        |_, _| Ok::<_, Error>(ControlFlow::Continue(())),
    )?;
    let secs = t0.elapsed().as_secs_f64();
    let k = agent.counters();
    drop(mem);
    Ok(IdleCost {
        seconds: secs,
        steps: k.steps,
        cpu_ms: k.cpu_ms,
        cpu_percent: k.cpu_ms / (secs * 1e3) * 100.0,
        promoted: k.promoted,
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
    progress("coverage from outside against ground truth");
    let coverage = coverage_check(cfg, walk_ns)?;
    progress("the agent's cost while nothing changes");
    let idle = idle_cost(cfg.idle_seconds, walk_ns)?;
    let mut rows = Vec::new();
    let policies = [
        (Policy::Coverage, "coverage"),
        (Policy::AddressOrder, "address"),
        (Policy::Utilisation(0.9), "utilisation"),
    ];
    // Repeat by repeat, the agent's runs and the kernel's policies in
    // turn: this VM's round time drifts over minutes, and the comparison
    // must not be between two stretches of it.
    let (ready, kernel_skipped) = crate::kernel::ThpPolicy::available();
    let mut kernel = Vec::new();
    for repeat in 0..cfg.repeats {
        for &k in &cfg.budgets {
            for &(policy, name) in &policies {
                progress(&format!("k = {k}, {name}, run {}", repeat + 1));
                rows.push(one(cfg, policy, name, k, repeat, walk_ns)?);
            }
        }
        kernel.extend(kernel_rows(cfg, &ready, repeat, progress)?);
    }
    Ok(Report {
        machine: Machine::this(),
        config: cfg.clone(),
        walk_ns,
        rows,
        coverage,
        idle,
        kernel,
        kernel_skipped,
        thp_knobs: crate::kernel::thp_knobs(),
    })
}

/// The workload under each of the kernel's `policies`, a fresh process
/// each (repeat `repeat`).
fn kernel_rows(
    cfg: &Config,
    policies: &[crate::kernel::ThpPolicy],
    repeat: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<KernelRow>> {
    crate::kernel::under_each(policies, repeat, progress, |policy| {
        let faults = crate::kernel::mthp_64k_faults();
        let c = start(cfg)?;
        let ms_per_round = rounds_ms(&c, cfg.rounds);
        let held = pagewise_testkit::host::resident(c.pid)?;
        let verified = c.stop_and_check();
        Ok(KernelRow {
            policy: policy.name().to_string(),
            repeat,
            ms_per_round,
            anon_huge_kib: held.anon_huge_kib,
            rss_kib: held.rss_kib,
            mthp_64k_faults: crate::kernel::mthp_64k_faults().saturating_sub(faults),
            verified,
        })
    })
}

impl Report {
    /// Median saved per huge page of `policy` at budget `k`.
    fn saved(&self, policy: &str, k: u64) -> (f64, f64, f64) {
        crate::median_min_max(
            self.rows
                .iter()
                .filter(|r| r.policy == policy && r.k == k)
                .map(|r| r.saved_ms_per_huge_page)
                .collect(),
        )
    }

    /// The table.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "pagewise bench thp — {}\n(b) time saved per huge page: {} narrow regions (4 hot pages each) then {} wide ones (512), {} updates per round; page walk {:.1} ns\n\n{:>12} {:>4} {:>6} {:>10} {:>10} {:>9} {:>6} {:>14} {:>9}\n",
            self.machine, c.narrow, c.wide, c.updates_per_round, self.walk_ns,
            "policy", "k", "run", "before ms", "after ms", "promoted", "wide", "saved ms/huge", "verified"
        );
        for r in &self.rows {
            s += &format!(
                "{:>12} {:>4} {:>6} {:>10.1} {:>10.1} {:>9} {:>6} {:>14.3} {:>9}\n",
                r.policy,
                r.k,
                r.repeat + 1,
                r.before_ms,
                r.after_ms,
                r.promoted,
                r.promoted_wide,
                r.saved_ms_per_huge_page,
                r.verified
            );
        }
        s += "\nmedian saved per huge page, ms per round (min–max), and coverage against address order:\n";
        for &k in &c.budgets {
            let (cov, cl, ch) = self.saved("coverage", k);
            let (adr, al, ah) = self.saved("address", k);
            let (uti, ul, uh) = self.saved("utilisation", k);
            s += &format!(
                "  k = {k:>2}: coverage {cov:.3} ({cl:.3}–{ch:.3}), address {adr:.3} ({al:.3}–{ah:.3}), utilisation {uti:.3} ({ul:.3}–{uh:.3}); coverage/address {}\n",
                if adr > 0.0 { format!("{:.1}x", cov / adr) } else { format!("(address order saved {adr:.3} ms)") }
            );
        }
        let cv = &self.coverage;
        s += &format!(
            "\ncoverage from outside (pages written, uffd-wp in the process) against the known coverage, {} windows of 100 ms: {} pages measured against {} touched, error {:.2} %; the process's round {:.2} ms alone, {:.2} ms while measured every 300 ms: slowdown {:.1} %\n",
            cv.windows, cv.measured_pages, cv.true_pages, cv.error * 100.0, cv.round_ms_alone, cv.round_ms_measured, cv.slowdown * 100.0
        );
        let i = &self.idle;
        s += &format!(
            "the agent watching a process of 64 MiB that writes nothing, every 1 s (200 ms windows), for {:.0} s: {} steps, {:.1} ms of CPU, {:.2} % of one CPU, {} promoted\n",
            i.seconds, i.steps, i.cpu_ms, i.cpu_percent, i.promoted
        );
        s += &self.kernel_summary();
        s += "\ngoals: at least 2x the run time saved per huge page of address-order promotion, at the same budget; every run verified; the agent at most 2 % of one CPU while nothing changes.\n";
        s
    }

    /// The kernel's policies beside the agent's best: ms per round and the
    /// memory in huge pages.
    fn kernel_summary(&self) -> String {
        let mut s = format!(
            "\nthe kernel's own policies, no agent (the THP knobs left as the machine has them: {}); median (min–max) over {} runs:\n{:>26} {:>24} {:>16} {:>10} {:>14} {:>9}\n",
            self.thp_knobs.join(" "),
            self.config.repeats,
            "policy", "ms per round", "2 MiB pages MiB", "RSS MiB", "64K faults", "verified"
        );
        let names = crate::in_order(self.kernel.iter().map(|r| r.policy.as_str()));
        for name in names {
            let of = |f: &dyn Fn(&KernelRow) -> f64| {
                crate::median_min_max(
                    self.kernel
                        .iter()
                        .filter(|r| r.policy == name)
                        .map(f)
                        .collect(),
                )
            };
            let (m, lo, hi) = of(&|r| r.ms_per_round);
            s += &format!(
                "{:>26} {:>24} {:>16.0} {:>10.0} {:>14.0} {:>9}\n",
                name,
                format!("{m:.1} ({lo:.1}–{hi:.1})"),
                of(&|r| r.anon_huge_kib as f64 / 1024.0).0,
                of(&|r| r.rss_kib as f64 / 1024.0).0,
                of(&|r| r.mthp_64k_faults as f64).0,
                self.kernel
                    .iter()
                    .filter(|r| r.policy == name)
                    .all(|r| r.verified)
            );
        }
        for why in &self.kernel_skipped {
            s += &format!("  skipped: {why}\n");
        }
        if let Some(&k) = self.config.budgets.iter().max() {
            let (m, lo, hi) = crate::median_min_max(
                self.rows
                    .iter()
                    .filter(|r| r.policy == "coverage" && r.k == k)
                    .map(|r| r.after_ms)
                    .collect(),
            );
            s += &format!(
                "  the agent (coverage, k = {k} huge pages): {m:.1} ({lo:.1}–{hi:.1}) ms per round after promotion\n"
            );
        }
        s
    }

    /// Saved per huge page against k, per policy.
    pub fn charts(&self) -> Vec<(String, crate::svg::Chart)> {
        let series = ["coverage", "address", "utilisation"]
            .iter()
            .map(|p| crate::svg::Series {
                label: p.to_string(),
                points: self
                    .config
                    .budgets
                    .iter()
                    .map(|&k| (k as f64, self.saved(p, k).0))
                    .collect(),
            })
            .collect();
        vec![(
            "thp.svg".into(),
            crate::svg::Chart {
                title: "(b) run time saved per huge page promoted".into(),
                x_label: "budget k (huge pages)".into(),
                y_label: "ms saved per round per huge page".into(),
                log_x: true,
                log_y: false,
                series,
            },
        )]
    }
}
