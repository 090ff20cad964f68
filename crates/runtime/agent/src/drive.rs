//! The one step loop: a step every interval until it is interrupted, the
//! program it watches ends, no watched process is left, its steps are done
//! or its reporter is done; the counters published after each step, to a
//! file (for node_exporter's textfile collector) and over HTTP.
//!
//! [`run`] drives anything that steps ([`Stepping`], object-safe: the node
//! agent steps both agents in one); [`drive`] one [`Agent`] with a
//! reporter of its typed steps. The tool (`thp run`, `dedup run`,
//! `agent --config`), the bindings and the benchmarks step every agent
//! through them.

use crate::endpoint::{Endpoint, Published};
use pagewise_mech::agent::Agent;
use pagewise_mech::{files, Error};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How an agent is driven: when it steps and where its counters go.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Cadence {
    /// Time from one step's start to the next's (zero: back to back).
    pub interval: Duration,
    /// Stop after this many steps.
    pub steps: Option<u64>,
    /// Write the counters in the Prometheus text format here after each
    /// step (whole, through a fresh file).
    pub metrics_file: Option<PathBuf>,
    /// Serve the counters over HTTP at this address, from a thread of its
    /// own, for as long as the drive lasts.
    pub metrics_listen: Option<String>,
    /// Publish the counters here instead: to an endpoint that answers
    /// already (the node agent's, from its start-up on).
    pub published: Option<Published>,
}

pagewise_mech::setters!(Cadence {
    interval: Duration,
    steps: Option<u64>,
    metrics_file: Option<PathBuf>,
    metrics_listen: Option<String>,
    published: Option<Published>,
});

/// What may end a drive between steps: for the tool, SIGINT and SIGTERM.
pub trait Interrupt {
    /// Whether the drive must end now.
    fn requested(&self) -> bool;
    /// Sleeps `d` unless interrupted; whether it was.
    fn sleep(&self, d: Duration) -> bool;
}

/// Never interrupted: a drive ends by its program, its processes, its
/// steps or its reporter.
#[derive(Debug, Clone, Copy, Default)]
pub struct Uninterrupted;

impl Interrupt for Uninterrupted {
    fn requested(&self) -> bool {
        false
    }
    fn sleep(&self, d: Duration) -> bool {
        std::thread::sleep(d);
        false
    }
}

/// Interrupted once the flag is set (by another thread, say): a drive in a
/// thread of its own ends within 50 ms of it.
impl Interrupt for std::sync::atomic::AtomicBool {
    fn requested(&self) -> bool {
        self.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn sleep(&self, d: Duration) -> bool {
        sleep_looking(d, || self.requested())
    }
}

/// Sleeps `d`, looking at `requested` every 50 ms; whether it was.
fn sleep_looking(d: Duration, requested: impl Fn() -> bool) -> bool {
    let until = Instant::now() + d;
    loop {
        if requested() {
            return true;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// Interrupted at an instant: a drive for a fixed time.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Instant);

impl Interrupt for Deadline {
    fn requested(&self) -> bool {
        Instant::now() >= self.0
    }
    fn sleep(&self, d: Duration) -> bool {
        let left = self.0.saturating_duration_since(Instant::now());
        std::thread::sleep(d.min(left));
        d >= left
    }
}

impl<T: Interrupt + ?Sized> Interrupt for &T {
    fn requested(&self) -> bool {
        (**self).requested()
    }
    fn sleep(&self, d: Duration) -> bool {
        (**self).sleep(d)
    }
}

/// Interrupted when either is (a flag or a deadline, say), looked at
/// every 50 ms while asleep.
impl<A: Interrupt, B: Interrupt> Interrupt for (A, B) {
    fn requested(&self) -> bool {
        self.0.requested() || self.1.requested()
    }
    fn sleep(&self, d: Duration) -> bool {
        sleep_looking(d, || self.requested())
    }
}

/// Why a drive ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The interrupt asked for it.
    Interrupted,
    /// The program started to be watched ended, with this status.
    ProgramExited(ExitStatus),
    /// No watched process is left.
    NothingWatched,
    /// [`Cadence::steps`] were made.
    StepsDone,
    /// The reporter said it has what it needs.
    ReportDone,
}

/// What the loop steps: one agent and its reporter, or several agents at
/// once. Object-safe, so that a caller holds any of them alike.
pub trait Stepping<E> {
    /// Measures, decides and acts once, and reports it; `Break` ends the
    /// drive ([`Ended::ReportDone`]).
    fn step(&mut self) -> Result<ControlFlow<()>, E>;
    /// Whether any watched process is still there.
    fn watching(&self) -> bool;
    /// The counters now, in the exposition (as [`crate::exposition`] renders an agent's).
    fn exposition(&self) -> String;
}

/// One agent and the reporter of its steps, as the loop steps them.
struct Reported<'a, A, F> {
    agent: &'a mut A,
    report: F,
}

impl<A, E, F> Stepping<E> for Reported<'_, A, F>
where
    A: Agent,
    E: From<Error>,
    F: FnMut(&mut A, A::Step) -> Result<ControlFlow<()>, E>,
{
    fn step(&mut self) -> Result<ControlFlow<()>, E> {
        let step = self.agent.step()?;
        (self.report)(self.agent, step)
    }
    fn watching(&self) -> bool {
        self.agent.watching()
    }
    fn exposition(&self) -> String {
        crate::exposition(&*self.agent)
    }
}

/// Steps `agent` at `cadence` until one of [`Ended`] happens; each step is
/// handed to `report` with the agent (which it may set up for the next
/// step; it may end the drive) and the counters are
/// published after it. `program`, when given, is a child watched among the
/// agent's processes: its end ends the drive. The caller then ends the
/// agent ([`Agent::end`]) and drops it, which puts its settings back.
pub fn drive<A: Agent, E: From<Error>>(
    agent: &mut A,
    cadence: &Cadence,
    interrupt: &dyn Interrupt,
    program: Option<&mut Child>,
    report: impl FnMut(&mut A, A::Step) -> Result<ControlFlow<()>, E>,
) -> Result<Ended, E> {
    run(&mut Reported { agent, report }, cadence, interrupt, program)
}

/// Steps `s` at `cadence` until one of [`Ended`] happens, the counters
/// published after each step (see [`drive`], which steps one agent
/// through it).
pub fn run<E: From<Error>>(
    s: &mut dyn Stepping<E>,
    cadence: &Cadence,
    interrupt: &dyn Interrupt,
    mut program: Option<&mut Child>,
) -> Result<Ended, E> {
    let (served, _endpoint) = match &cadence.published {
        Some(p) => (p.clone(), None),
        None => {
            let p = Published::new(cadence.interval, crate::served(&s.exposition()));
            let e = match &cadence.metrics_listen {
                Some(addr) => Some(Endpoint::start(addr, p.clone())?),
                None => None,
            };
            (p, e)
        }
    };
    let t0 = Instant::now();
    let mut n = 0u32;
    loop {
        if interrupt.requested() {
            return Ok(Ended::Interrupted);
        }
        if let Some(c) = program.as_mut() {
            let exited = c
                .try_wait()
                .map_err(|e| Error::os("waiting for the watched program", e))?;
            if let Some(st) = exited {
                return Ok(Ended::ProgramExited(st));
            }
        }
        let due = t0 + cadence.interval * n;
        if interrupt.sleep(due.saturating_duration_since(Instant::now())) {
            return Ok(Ended::Interrupted);
        }
        let flow = s.step()?;
        let (text, watching) = (s.exposition(), s.watching());
        n = n.saturating_add(1);
        if let Some(path) = &cadence.metrics_file {
            files::replace(path, crate::exposition::classic(&text).as_bytes())?;
        }
        served.stepped(crate::served(&text));
        if flow.is_break() {
            return Ok(Ended::ReportDone);
        }
        if !watching {
            return Ok(Ended::NothingWatched);
        }
        if cadence.steps.is_some_and(|s| u64::from(n) >= s) {
            return Ok(Ended::StepsDone);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewise_mech::agent::Metric;

    /// Counts its steps; watches until `watch_for` steps were made.
    struct Counter {
        steps: u64,
        watch_for: u64,
    }

    impl Agent for Counter {
        type Step = u64;
        type Action = ();
        const NAME: &'static str = "counter";
        fn add(&mut self, _: i32) -> pagewise_mech::Result<()> {
            Ok(())
        }
        fn watching(&self) -> bool {
            self.steps < self.watch_for
        }
        fn step(&mut self) -> pagewise_mech::Result<u64> {
            self.steps += 1;
            Ok(self.steps)
        }
        fn end(&mut self) -> Vec<()> {
            Vec::new()
        }
        fn metric_values(&self) -> Vec<Metric> {
            vec![Metric::counter("steps", "steps made", self.steps as f64)]
        }
    }

    fn run(c: &mut Counter, cadence: &Cadence, stop_at: Option<u64>) -> (Ended, Vec<u64>) {
        let mut seen = Vec::new();
        let ended = drive(c, cadence, &Uninterrupted, None, |_, s: u64| {
            seen.push(s);
            Ok::<_, Error>(if Some(s) == stop_at {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            })
        })
        .unwrap();
        (ended, seen)
    }

    #[test]
    fn a_drive_ends_for_its_reason_after_exactly_its_steps() {
        let mut c = Counter {
            steps: 0,
            watch_for: 100,
        };
        let (ended, seen) = run(&mut c, &Cadence::default().steps(Some(7)), None);
        assert_eq!((ended, seen), (Ended::StepsDone, (1..=7).collect()));
        let mut c = Counter {
            steps: 0,
            watch_for: 4,
        };
        let (ended, seen) = run(&mut c, &Cadence::default(), None);
        assert_eq!((ended, seen), (Ended::NothingWatched, (1..=4).collect()));
        let mut c = Counter {
            steps: 0,
            watch_for: 100,
        };
        let (ended, seen) = run(&mut c, &Cadence::default().steps(Some(50)), Some(3));
        assert_eq!((ended, seen), (Ended::ReportDone, vec![1, 2, 3]));
    }

    #[test]
    fn a_drive_ends_at_its_deadline_or_when_its_flag_is_set() {
        let mut c = Counter {
            steps: 0,
            watch_for: u64::MAX,
        };
        let every = Cadence::default().interval(Duration::from_millis(10));
        // A deadline at once: interrupted before any step.
        let at = Deadline(Instant::now());
        let ended = drive(&mut c, &every, &at, None, |_, _| {
            Ok::<_, Error>(ControlFlow::Continue(()))
        });
        assert_eq!((ended.unwrap(), c.steps), (Ended::Interrupted, 0));
        // A flag set by the reporter at the third step (as another thread
        // would): no fourth step.
        let flag = std::sync::atomic::AtomicBool::new(false);
        let ended = drive(&mut c, &every, &flag, None, |_, s: u64| {
            if s == 3 {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            Ok::<_, Error>(ControlFlow::Continue(()))
        });
        assert_eq!((ended.unwrap(), c.steps), (Ended::Interrupted, 3));
    }

    #[test]
    fn the_counters_are_written_after_every_step_at_the_cadence() {
        let dir = std::env::temp_dir().join(format!("pagewise-drive-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("counter.prom");
        let mut c = Counter {
            steps: 0,
            watch_for: 100,
        };
        let cadence = Cadence::default()
            .steps(Some(3))
            .interval(Duration::from_millis(20))
            .metrics_file(Some(file.clone()));
        let t0 = Instant::now();
        let (ended, _) = run(&mut c, &cadence, None);
        assert_eq!(ended, Ended::StepsDone);
        // Steps at 0, 20 and 40 ms: the third is not due before 40 ms.
        assert!(
            t0.elapsed() >= Duration::from_millis(40),
            "{:?}",
            t0.elapsed()
        );
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("pagewise_counter_steps_total 3.0"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
