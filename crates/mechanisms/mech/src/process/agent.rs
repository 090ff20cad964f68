//! The frame every agent shares (`thp`'s promotion and `dedup`'s merging;
//! a third agent is one file that implements [`Agent`]):
//!
//! - the processes it watches ([`Targets`]): each checked before it is
//!   taken, held by a pidfd (so that a pid reused after its process ended
//!   is never acted on), and marked gone, never dropped, when it ends;
//! - their 2 MiB regions, found again every step ([`Targets::regions`]);
//! - the step's clock and CPU time ([`StepClock`]), the agent's own
//!   thread's and that of threads serving it;
//! - its counters and gauges ([`Metric`]), each with its help and, for one
//!   process or container, its labels.
//!
//! Each agent keeps its own per-process state (`T` in [`Targets`]), its own
//! step (a short list of named phases) and its own actions, each with its
//! reason. Every agent is driven the same way, by the runtime of
//! `pagewise-agent`: a step per interval until interrupted
//! (SIGINT/SIGTERM for the tool), the metrics after each, then
//! [`Agent::end`], then drop, which puts back every system setting the
//! agent changed.

use crate::walk::HugeRegion;
use crate::{procfs, walk};
use crate::{Error, Result};
use pagewise_sys::process;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

/// An agent: watches processes, and each step measures, decides and acts
/// under a budget, saying why.
pub trait Agent {
    /// What one step measured and did (one JSON object per step).
    type Step: serde::Serialize;
    /// One decision, with its reason.
    type Action: serde::Serialize;
    /// The agent's name: its metrics are `pagewise_NAME_…`.
    const NAME: &'static str;

    /// Watches one more process.
    fn add(&mut self, pid: i32) -> Result<()>;
    /// Whether any watched process is still there.
    fn watching(&self) -> bool;
    /// Measures, decides and acts once.
    fn step(&mut self) -> Result<Self::Step>;
    /// Takes back, in the processes still there, what the agent did that
    /// must not outlive it. System settings are put back when the agent
    /// is dropped.
    fn end(&mut self) -> Vec<Self::Action>;
    /// Its counters now (`pagewise-agent` renders them in the Prometheus
    /// exposition).
    fn metric_values(&self) -> Vec<Metric>;
    /// Its counters under each agent's name (`pagewise_NAME_…`): its own
    /// and, for an agent made of others (the node agent), theirs.
    fn metric_groups(&self) -> Vec<(&'static str, Vec<Metric>)> {
        vec![(Self::NAME, self.metric_values())]
    }
}

/// One counter or gauge of an agent.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Metric {
    /// Its name after `pagewise_AGENT_`.
    pub name: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// What it counts.
    pub help: &'static str,
    /// Its value.
    pub value: f64,
    /// Its labels, for one line per process or container: a process's
    /// ([`process_labels`]) or a container's ([`container_labels`]).
    pub process: Option<Vec<(&'static str, String)>>,
}

impl Metric {
    /// A counter (only grows).
    pub fn counter(name: &'static str, help: &'static str, value: f64) -> Metric {
        Metric {
            name,
            kind: "counter",
            help,
            value,
            process: None,
        }
    }

    /// A gauge (goes up and down).
    pub fn gauge(name: &'static str, help: &'static str, value: f64) -> Metric {
        Metric {
            kind: "gauge",
            ..Metric::counter(name, help, value)
        }
    }

    /// A gauge of one watched process, labelled with what the kernel
    /// says of it: its pid, and in a container its pid inside and its
    /// container's labels ([`process_labels`]).
    pub fn of_process<T>(
        name: &'static str,
        help: &'static str,
        t: &Watched<T>,
        value: f64,
    ) -> Metric {
        Metric::labelled(
            name,
            help,
            process_labels(t.pid, t.ns_pid, t.container.as_ref()),
            value,
        )
    }

    /// A gauge of one process, or of one container, with these labels
    /// (one line per set of labels).
    pub fn labelled(
        name: &'static str,
        help: &'static str,
        labels: Vec<(&'static str, String)>,
        value: f64,
    ) -> Metric {
        Metric {
            process: Some(labels),
            ..Metric::gauge(name, help, value)
        }
    }
}

/// The labels of a process's series: its `pid`, and in a container its
/// `ns_pid` and its container's ([`container_labels`]).
pub fn process_labels(
    pid: i32,
    ns_pid: Option<i32>,
    container: Option<&crate::container::ContainerRef>,
) -> Vec<(&'static str, String)> {
    let mut labels = vec![("pid", pid.to_string())];
    if let Some(c) = container {
        if let Some(n) = ns_pid {
            labels.push(("ns_pid", n.to_string()));
        }
        labels.extend(container_labels(c));
    }
    labels
}

/// The labels of a container's series, named as cAdvisor and
/// kube-state-metrics name theirs so that a query joins them:
/// `container_id` (`RUNTIME://ID`, as a pod's status says it) always;
/// `container`, its name, where the node's files say it (see
/// [`crate::container::container_name`]); `pod_uid` where its cgroup path
/// names a pod; for a Kubernetes pod whose node keeps the kubelet's pod
/// directories, `namespace` and `pod`, the pod's name (see
/// [`crate::container::pod_names`]).
pub fn container_labels(c: &crate::container::ContainerRef) -> Vec<(&'static str, String)> {
    let mut labels = Vec::new();
    if let Some(name) = crate::container::container_name(c) {
        labels.push(("container", name));
    }
    labels.push(("container_id", format!("{}://{}", c.runtime, c.id)));
    if let Some(uid) = &c.pod {
        labels.push(("pod_uid", uid.clone()));
        if let Some((namespace, name)) = crate::container::pod_names(uid) {
            labels.push(("namespace", namespace));
            labels.push(("pod", name));
        }
    }
    labels
}

/// A process an agent watches, and the agent's state of it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Watched<T> {
    /// The process.
    pub pid: i32,
    /// Held from the start: a pid reused by another process is never
    /// acted on.
    pub pidfd: OwnedFd,
    /// It ended (or its memory could no longer be read): not stepped again.
    pub gone: bool,
    /// Its pid inside its pid namespace, read when it was added.
    pub ns_pid: Option<i32>,
    /// The container it runs in, where its cgroup path names one.
    pub container: Option<crate::container::ContainerRef>,
    /// The agent's state of it.
    pub state: T,
    /// Its maps and page map, kept open from step to step (opened again
    /// after an `exec`, which leaves the old ones on a finished address
    /// space).
    open: Option<(procfs::MapsFile, walk::PageWalker)>,
    /// The mappings it serves the faults of itself (its own userfaultfd):
    /// no agent acts there (a read, a protection or a collapse would be an
    /// event its handler does not expect). A program may register memory
    /// at any time: read again at each step where it holds a userfaultfd
    /// or served some memory at the last look, and every `SERVED_EVERY`
    /// steps whatever it holds (a userfaultfd it made and
    /// handed to another process, for one). Its smaps cost a page-table
    /// walk (about 15 ms a GiB in memory), its descriptors far less.
    served: Vec<(u64, u64)>,
    /// Steps since `served` was last read.
    served_age: u32,
}

/// Steps between two reads of what a process serves itself, at most.
const SERVED_EVERY: u32 = 16;

/// A watched process as an agent's step names it: its host pid and, in a
/// container, its pid inside and the container.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Named {
    /// Process (its host pid).
    pub pid: i32,
    /// Its pid inside its pid namespace, where that is another.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<i32>,
    /// The container it runs in, where its cgroup path names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::container::ContainerRef>,
}

impl<T> Watched<T> {
    /// How a step names it (see [`Named`]).
    pub fn named(&self) -> Named {
        Named {
            pid: self.pid,
            ns_pid: self.ns_pid.filter(|&n| n != self.pid),
            container: self.container.clone(),
        }
    }

    /// Its page map, kept open from step to step, beside the agent's state
    /// of it.
    pub fn walker_and_state(&mut self) -> Result<(&mut walk::PageWalker, &mut T)> {
        let (_, walker) = opened(&mut self.open, self.pid)?;
        Ok((walker, &mut self.state))
    }

    /// Its 2 MiB regions ([`walk::huge_regions`]), through the maps and
    /// page map it keeps open.
    fn regions(&mut self) -> Result<Vec<walk::HugeRegion>> {
        let pid = self.pid;
        self.served_age += 1;
        if self.open.is_none()
            || self.served_age >= SERVED_EVERY
            || !self.served.is_empty()
            || procfs::owns_userfaultfd(pid)
        {
            self.served = procfs::self_served(pid).unwrap_or_default();
            self.served_age = 0;
        }
        let (maps, walker) = opened(&mut self.open, pid)?;
        let mut all = maps.read()?;
        if all.is_empty() {
            return Err(Error::for_pid(
                pid,
                "reading its maps",
                std::io::Error::from_raw_os_error(libc::ESRCH),
            ));
        }
        let served = &self.served;
        all.retain(|m| !served.iter().any(|&(s, e)| s < m.end && m.start < e));
        walk::huge_regions_in(&procfs::writable_anonymous_of(all), walker)
    }

    /// Collapses `[start, start + len)` into huge pages from outside
    /// (`process_madvise(MADV_COLLAPSE)` on the pidfd).
    pub fn collapse(&self, start: u64, len: usize) -> std::io::Result<()> {
        crate::inject::collapse(self.pidfd.as_raw_fd(), start, len)
    }
}

/// Process `pid`'s maps and page map in `open`, opened at the first call
/// and kept.
fn opened(
    open: &mut Option<(procfs::MapsFile, walk::PageWalker)>,
    pid: i32,
) -> Result<&mut (procfs::MapsFile, walk::PageWalker)> {
    let o = match open.take() {
        Some(o) => o,
        None => (
            procfs::MapsFile::open(pid)?,
            walk::PageWalker::new(Some(pid))?,
        ),
    };
    Ok(open.insert(o))
}

/// The processes an agent watches, in the order they were added.
#[derive(Debug)]
pub struct Targets<T> {
    list: Vec<Watched<T>>,
}

impl<T> Default for Targets<T> {
    fn default() -> Self {
        Targets { list: Vec::new() }
    }
}

impl<T> Targets<T> {
    /// Watches `pid` (which must exist and be one pagewise may act on),
    /// with the state `state` makes for it.
    pub fn add(&mut self, pid: i32, state: impl FnOnce(i32) -> Result<T>) -> Result<()> {
        procfs::check_target(pid)?;
        let pidfd = process::pidfd_open(pid).map_err(|e| Error::for_pid(pid, "pidfd_open", e))?;
        let state = state(pid)?;
        self.list.push(Watched {
            pid,
            pidfd,
            gone: false,
            ns_pid: crate::container::ns_pid(pid),
            container: crate::container::container_of(pid),
            state,
            open: None,
            served: Vec::new(),
            served_age: 0,
        });
        Ok(())
    }

    /// Stops watching `pid`: its entry, if it was watched, for the agent
    /// to put back what it changed there.
    pub fn release(&mut self, pid: i32) -> Option<Watched<T>> {
        let i = self.list.iter().position(|t| t.pid == pid)?;
        Some(self.list.remove(i))
    }

    /// Whether any is still there.
    pub fn watching(&self) -> bool {
        self.list.iter().any(|t| !t.gone)
    }

    /// Every process watched, gone ones too.
    pub fn all(&self) -> &[Watched<T>] {
        &self.list
    }

    /// Every process watched, gone ones too.
    pub fn all_mut(&mut self) -> &mut [Watched<T>] {
        &mut self.list
    }

    /// Those still there.
    pub fn live(&self) -> impl Iterator<Item = &Watched<T>> {
        self.list.iter().filter(|t| !t.gone)
    }

    /// Those still there.
    pub fn live_mut(&mut self) -> impl Iterator<Item = &mut Watched<T>> {
        self.list.iter_mut().filter(|t| !t.gone)
    }

    /// The 2 MiB regions of each process still there, with its index. A
    /// process whose maps or page map cannot be read is marked gone and
    /// handed to `gone` with why.
    pub fn regions(&mut self, mut gone: impl FnMut(i32, &Error)) -> Vec<(usize, Vec<HugeRegion>)> {
        let mut out = Vec::new();
        for (i, t) in self.list.iter_mut().enumerate().filter(|(_, t)| !t.gone) {
            let mut found = t.regions();
            if found.is_err() && t.open.take().is_some() {
                // The files kept from an earlier step may be on the address
                // space the process had before an `exec`.
                found = t.regions();
            }
            match found {
                Ok(rs) => out.push((i, rs)),
                Err(e) => {
                    t.gone = true;
                    gone(t.pid, &e);
                }
            }
        }
        out
    }
}

impl<T> std::ops::Index<usize> for Targets<T> {
    type Output = Watched<T>;
    fn index(&self, i: usize) -> &Watched<T> {
        &self.list[i]
    }
}

impl<T> std::ops::IndexMut<usize> for Targets<T> {
    fn index_mut(&mut self, i: usize) -> &mut Watched<T> {
        &mut self.list[i]
    }
}

/// CPU time of the calling thread, ms.
pub fn thread_cpu_ms() -> f64 {
    process::thread_cpu_ns() as f64 / 1e6
}

/// A step's clock: its wall time and the CPU time the agent spent in it,
/// its own thread's and, given at both ends, that of threads serving it.
#[derive(Debug, Clone, Copy)]
pub struct StepClock {
    t0: Instant,
    cpu0: f64,
}

impl StepClock {
    /// Starts a step; `others_ms` is the CPU time of the threads serving
    /// the agent so far.
    pub fn start(others_ms: f64) -> StepClock {
        StepClock {
            t0: Instant::now(),
            cpu0: thread_cpu_ms() + others_ms,
        }
    }

    /// CPU time spent since the start, ms; `others_ms` as at the start.
    pub fn cpu_ms(&self, others_ms: f64) -> f64 {
        (thread_cpu_ms() + others_ms - self.cpu0).max(0.0)
    }

    /// Wall time since the start, ms.
    pub fn elapsed_ms(&self) -> f64 {
        self.t0.elapsed().as_secs_f64() * 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Write};

    /// The maps and page map kept open from step to step are opened again
    /// when the process replaces its address space by `exec`: its regions
    /// then are those of the new program, as a fresh read finds them.
    #[test]
    fn regions_are_found_again_after_an_exec() {
        if !crate::probe::get().pagemap_scan {
            pagewise_testkit::report_skip("the kernel has no PAGEMAP_SCAN (Linux 6.7+)");
            return;
        }
        let program = "import mmap, sys\n\
            m = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE)\n\
            m[:] = b'x' * (8 << 20)\n\
            print('ready', flush=True)\n\
            sys.stdin.read()\n";
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read x; exec python3 -c \"$0\"", program])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut t: Targets<()> = Targets::default();
        t.add(pid, |_| Ok(())).unwrap();
        let before = t.regions(|p, e| panic!("pid {p} gone before its exec: {e}"));
        assert_eq!(before.len(), 1, "the shell's regions read");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "python3 mapped and wrote its buffer");
        let after = t.regions(|p, e| panic!("pid {p} taken for gone after its exec: {e}"));
        let mut w = walk::PageWalker::new(Some(pid)).unwrap();
        let fresh = walk::huge_regions(pid, &mut w).unwrap();
        drop(stdin);
        let _ = child.wait();
        assert_eq!(after[0].1, fresh, "the regions a fresh read finds");
        let full = fresh.iter().filter(|r| r.resident == 512).count();
        assert!(full >= 3, "the 8 MiB buffer's whole regions, found {full}");
        println!(
            "ok   after exec: {} regions, {full} of them all in memory, as read afresh",
            fresh.len()
        );
    }

    #[test]
    fn a_process_that_is_not_there_is_refused() {
        let mut t: Targets<()> = Targets::default();
        assert!(t.add(i32::MAX, |_| Ok(())).is_err());
        assert!(!t.watching());
        t.add(std::process::id() as i32, |_| Ok(())).unwrap();
        assert!(t.watching() && t.live().count() == 1);
    }
}
