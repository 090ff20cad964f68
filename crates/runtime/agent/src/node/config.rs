//! The node agent's configuration (`pagewise agent --config FILE`, TOML):
//! which containers it acts on, with what budget, and where it answers.
//!
//! ```toml
//! interval_ms = 2000          # a step of both agents every interval
//! window_ms = 200             # each agent's measuring window in a step
//! listen = "127.0.0.1:9464"   # /metrics and /healthz, from start-up
//! # listen_public = true      # needed for an address beyond loopback
//! # metrics_file = "/run/pagewise/agent.prom"
//! # per_process_metrics = true  # a series per process too (pid label)
//! # leave_namespaces = ["kube-system"]  # pods never acted on (the default)
//! # kubernetes_api = false    # do not ask which pods opted out (in a pod)
//!
//! [thp]                       # huge pages where they pay (thp run)
//! enabled = true
//! policy = "coverage"
//! budget_per_second = 16.0
//! cpu_share = 0.1
//! measure_per_step = 64       # candidates measured a step, longest ago first
//!
//! [dedup]                     # KSM where it costs no hot huge page (dedup run)
//! enabled = true
//! policy = "smartmd"
//! hot_backoff = 8             # a region hot step after step rests up to 8 steps
//!
//! [[select]]                  # every container, 64 huge pages each
//! all_containers = true
//! huge_pages = 64
//!
//! [[select]]                  # or one by id, id prefix or name; a cgroup; or
//!                             # a Kubernetes namespace (namespace = "shop")
//! container = "web"
//! dedup = false
//! ```
//!
//! Unknown keys are refused, named, so that a misspelt one is not silently
//! ignored.

use crate::{Error, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Largest configuration file read.
const MAX_CONFIG: u64 = 1 << 20;

/// The node agent's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Time from one step's start to the next's, ms.
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    /// Each agent's measuring window in a step, ms.
    #[serde(default = "default_window")]
    pub window_ms: u64,
    /// Where `/metrics` and `/healthz` are served.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Allow `listen` beyond loopback (the metrics name processes).
    #[serde(default)]
    pub listen_public: bool,
    /// Also write the metrics to this file after each step.
    pub metrics_file: Option<PathBuf>,
    /// A series per process (labelled with its `pid`) as well as per
    /// container: off by default, since each process the node ever ran
    /// would leave its own series in the scraper's store.
    #[serde(default)]
    pub per_process_metrics: bool,
    /// The huge-page agent.
    #[serde(default)]
    pub thp: ThpConfig,
    /// The dedup agent.
    #[serde(default)]
    pub dedup: DedupConfig,
    /// Which processes, in order: a process is taken by the first that
    /// selects it.
    #[serde(default)]
    pub select: Vec<Select>,
    /// Kubernetes namespaces whose pods are left alone whatever selects
    /// them (as the kubelet's directory of pod logs names their pods):
    /// `kube-system` unless said otherwise; `[]` leaves none.
    #[serde(default = "default_leave_namespaces")]
    pub leave_namespaces: Vec<String>,
    /// Run in a Kubernetes pod, ask the API server which namespaces and
    /// pods are labelled `pagewise.io/opt-out=true`, and leave them alone
    /// (and every pod until it has answered). `false`: do not ask.
    #[serde(default = "yes")]
    pub kubernetes_api: bool,
}

/// The huge-page agent's settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ThpConfig {
    /// Whether it runs.
    pub enabled: bool,
    /// `coverage`, `address` or `utilisation:F` (as `thp run --policy`).
    pub policy: String,
    /// Huge pages per second, over all containers.
    pub budget_per_second: f64,
    /// Share of one CPU the collapses of a step may take.
    pub cpu_share: f64,
    /// What a page walk costs here, ns (measured at start-up if not given).
    pub walk_ns: Option<f64>,
    /// Most candidate regions whose coverage a step measures, over all
    /// containers, those measured longest ago first (0: all of them).
    pub measure_per_step: usize,
}

impl Default for ThpConfig {
    fn default() -> Self {
        ThpConfig {
            enabled: true,
            policy: "coverage".into(),
            budget_per_second: 16.0,
            cpu_share: 0.1,
            walk_ns: None,
            measure_per_step: 64,
        }
    }
}

/// The dedup agent's settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct DedupConfig {
    /// Whether it runs.
    pub enabled: bool,
    /// `smartmd`, `ksm-everywhere`, `no-splitting` or `ingens-like`.
    pub policy: String,
    /// Steps a region found hot step after step may go unwatched (1, 2,
    /// 4, ... up to this; 0: every region watched every step).
    pub hot_backoff: u8,
    /// Make memory mergeable only as whole mappings (see `dedup run
    /// --whole-mappings`).
    pub whole_mappings: bool,
}

impl Default for DedupConfig {
    fn default() -> Self {
        DedupConfig {
            enabled: true,
            policy: "smartmd".into(),
            hot_backoff: 8,
            whole_mappings: false,
        }
    }
}

/// One selection of processes, and what is done to them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Select {
    /// Every process that runs in a container.
    #[serde(default)]
    pub all_containers: bool,
    /// A container: its id, a prefix of it, or its name.
    pub container: Option<String>,
    /// A cgroup, its sub-cgroups included.
    pub cgroup: Option<String>,
    /// Every process of the Kubernetes pods in this namespace (as the
    /// kubelet's directory of pod logs names their pods; no API server is
    /// asked).
    pub namespace: Option<String>,
    /// Huge pages each container (or this cgroup) may be given in all.
    pub huge_pages: Option<u64>,
    /// Whether the huge-page agent acts on them.
    #[serde(default = "yes")]
    pub thp: bool,
    /// Whether the dedup agent acts on them.
    #[serde(default = "yes")]
    pub dedup: bool,
}

fn default_interval() -> u64 {
    2000
}
fn default_window() -> u64 {
    200
}
fn default_listen() -> String {
    "127.0.0.1:9464".into()
}
fn yes() -> bool {
    true
}
fn default_leave_namespaces() -> Vec<String> {
    vec!["kube-system".into()]
}

impl Config {
    /// What a page walk costs for a run, where it needs no measuring:
    /// `given` (the caller's), else the configuration's `thp.walk_ns`,
    /// else [`WALK_DEFAULT_NS`](crate::walk_cost::WALK_DEFAULT_NS) when the
    /// huge-page agent is off (nothing ranks by it). `None`: measure it
    /// ([`crate::walk_cost::measure`]).
    pub fn walk_ns_known(&self, given: Option<f64>) -> Option<f64> {
        given
            .or(self.thp.walk_ns)
            .or((!self.thp.enabled).then_some(crate::walk_cost::WALK_DEFAULT_NS))
    }

    /// Reads and checks the configuration at `path`.
    pub fn read(path: &Path) -> Result<Config> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_CONFIG).read_to_string(&mut text))
            .map_err(|e| {
                Error::Mech(pagewise_mech::Error::os(
                    format!("reading {}", path.display()),
                    e,
                ))
            })?;
        Config::parse(&text, path)
    }

    /// Reads and checks a configuration's text (`path` names it in what
    /// is said of it).
    pub(crate) fn parse(text: &str, path: &Path) -> Result<Config> {
        let bad = |why: String| Error::Config {
            path: path.display().to_string(),
            why,
        };
        let c: Config =
            toml::from_str(text).map_err(|e| bad(e.to_string().trim_end().to_string()))?;
        c.check().map_err(bad)?;
        Ok(c)
    }

    /// What is wrong with it, if anything.
    fn check(&self) -> std::result::Result<(), String> {
        if self.interval_ms == 0 || self.window_ms * 2 >= self.interval_ms {
            return Err(format!(
                "window_ms ({}) must be under half of interval_ms ({}): both agents measure in each step",
                self.window_ms, self.interval_ms
            ));
        }
        if self.select.is_empty() {
            return Err("no [[select]]: say which containers or cgroups to act on".into());
        }
        for (i, s) in self.select.iter().enumerate() {
            let given = [
                s.all_containers,
                s.container.is_some(),
                s.cgroup.is_some(),
                s.namespace.is_some(),
            ];
            if given.iter().filter(|&&g| g).count() != 1 {
                return Err(format!(
                    "select #{}: give exactly one of all_containers, container, cgroup, namespace",
                    i + 1
                ));
            }
            if let Some(cg) = &s.cgroup {
                if let Err(e) = pagewise_mech::container::check_cgroup(cg) {
                    return Err(format!("select #{}: {e}", i + 1));
                }
            }
        }
        let t = &self.thp;
        for (key, v, ok) in [
            (
                "thp.cpu_share",
                t.cpu_share,
                t.cpu_share > 0.0 && t.cpu_share <= 1.0,
            ),
            (
                "thp.budget_per_second",
                t.budget_per_second,
                t.budget_per_second >= 0.0 && t.budget_per_second <= 1e6,
            ),
            (
                "thp.walk_ns",
                t.walk_ns.unwrap_or(1.0),
                t.walk_ns.is_none_or(|w| w > 0.0 && w <= 1e6),
            ),
        ] {
            // NaN fails every comparison, so it is refused with the rest.
            if !ok || !v.is_finite() {
                return Err(format!(
                    "{key} = {v} is outside its domain (cpu_share: above 0, at most 1; \
                     budget_per_second: 0 to 1e6; walk_ns: above 0, at most 1e6)"
                ));
            }
        }
        if self.thp.enabled {
            pagewise_thp::agent::Policy::parse(&self.thp.policy)
                .map_err(|why| format!("[thp] {why}"))?;
        }
        if self.dedup.enabled && pagewise_dedup::Policy::parse(&self.dedup.policy).is_none() {
            return Err(format!(
                "[dedup] policy = {:?}: smartmd, ksm-everywhere, no-splitting or ingens-like",
                self.dedup.policy
            ));
        }
        if self.interval_ms > 24 * 3600 * 1000 {
            return Err(format!(
                "interval_ms = {} is more than a day",
                self.interval_ms
            ));
        }
        if let Some(f) = &self.metrics_file {
            if let Err(why) = metrics_file_allowed(f) {
                return Err(format!(
                    "metrics_file = {:?}: {why}",
                    f.display().to_string()
                ));
            }
        }
        if !self.listen_public {
            use std::net::ToSocketAddrs;
            let all: Vec<_> = self
                .listen
                .to_socket_addrs()
                .map_err(|e| format!("listen = {:?}: {e}", self.listen))?
                .collect();
            if all.is_empty() || all.iter().any(|a| !a.ip().is_loopback()) {
                return Err(format!(
                    "listen = {:?} is not a loopback address: the metrics name the \
                     processes watched; add listen_public = true to serve them there",
                    self.listen
                ));
            }
        }
        Ok(())
    }
}

/// Where the agent, as root, may write its metrics file: a name ending in
/// `.prom` (the textfile collector's), in an existing directory reached
/// through no symbolic link, owned by root (or the agent's user) and
/// writable by no one else, the file itself (where it exists) a regular
/// file. The write is atomic (a new file renamed over the old one), so a
/// symbolic link planted at the name is replaced, never followed.
pub(crate) fn metrics_file_allowed(f: &Path) -> std::result::Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !f.is_absolute() {
        return Err("give an absolute path".into());
    }
    if f.extension().is_none_or(|e| e != "prom") {
        return Err("the name must end in .prom (the textfile collector's files)".into());
    }
    let dir = f.parent().ok_or("no directory")?;
    let real = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if real != dir {
        return Err(format!(
            "{} is reached through a symbolic link (it is {})",
            dir.display(),
            real.display()
        ));
    }
    let md = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let me = pagewise_sys::process::geteuid();
    if !md.is_dir() || (md.uid() != 0 && md.uid() != me) || md.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "{} must be a directory of root's that no one else may write (owner uid {}, mode {:o})",
            dir.display(),
            md.uid(),
            md.permissions().mode() & 0o7777
        ));
    }
    match std::fs::symlink_metadata(f) {
        Ok(m) if !m.is_file() => Err("exists and is not a regular file".into()),
        _ => Ok(()),
    }
}
