//! The node agent's configuration (`pagewise agent --config FILE`, TOML):
//! which containers it acts on, with what budget, and where it answers.
//!
//! ```toml
//! interval_ms = 2000          # a step of both agents every interval
//! window_ms = 200             # each agent's measuring window in a step
//! listen = "127.0.0.1:9464"   # /metrics and /healthz, from start-up
//! # listen_public = true      # needed for an address beyond loopback
//! # metrics_file = "/run/pagewise/agent.prom"
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
//! [[select]]                  # or one by id, id prefix or name; or a cgroup
//! container = "web"
//! dedup = false
//! ```
//!
//! Unknown keys are refused, named, so that a misspelt one is not silently
//! ignored.

use anyhow::{Context, Result};
use pagewise::process::container::{ContainerRef, Member, Selector};
use serde::Deserialize;
use std::path::PathBuf;

/// Largest configuration file read.
const MAX_CONFIG: u64 = 1 << 20;

/// The node agent's configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
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
}

/// The huge-page agent's settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Select {
    /// Every process that runs in a container.
    #[serde(default)]
    pub all_containers: bool,
    /// A container: its id, a prefix of it, or its name.
    pub container: Option<String>,
    /// A cgroup, its sub-cgroups included.
    pub cgroup: Option<String>,
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

impl Config {
    /// Reads and checks the configuration at `path`.
    pub fn read(path: &std::path::Path) -> Result<Config> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(path)
            .with_context(|| format!("opening {}", path.display()))?
            .take(MAX_CONFIG)
            .read_to_string(&mut text)
            .with_context(|| format!("reading {}", path.display()))?;
        let c: Config = match toml::from_str(&text) {
            Ok(c) => c,
            Err(e) => crate::usage!("{}: {}", path.display(), e.to_string().trim_end()),
        };
        c.check(path)?;
        Ok(c)
    }

    fn check(&self, path: &std::path::Path) -> Result<()> {
        let p = path.display();
        if self.interval_ms == 0 || self.window_ms * 2 >= self.interval_ms {
            crate::usage!(
                "{p}: window_ms ({}) must be under half of interval_ms ({}): both agents measure in each step",
                self.window_ms,
                self.interval_ms
            );
        }
        if self.select.is_empty() {
            crate::usage!("{p}: no [[select]]: say which containers or cgroups to act on");
        }
        for (i, s) in self.select.iter().enumerate() {
            let given = [s.all_containers, s.container.is_some(), s.cgroup.is_some()];
            if given.iter().filter(|&&g| g).count() != 1 {
                crate::usage!(
                    "{p}: select #{}: give exactly one of all_containers, container, cgroup",
                    i + 1
                );
            }
            if let Some(cg) = &s.cgroup {
                if let Err(e) = pagewise::process::container::check_cgroup(cg) {
                    crate::usage!("{p}: select #{}: {e}", i + 1);
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
                crate::usage!(
                    "{p}: {key} = {v} is outside its domain (cpu_share: above 0, at most 1; \
                     budget_per_second: 0 to 1e6; walk_ns: above 0, at most 1e6)"
                );
            }
        }
        if self.interval_ms > 24 * 3600 * 1000 {
            crate::usage!("{p}: interval_ms = {} is more than a day", self.interval_ms);
        }
        if let Some(f) = &self.metrics_file {
            if let Err(why) = metrics_file_allowed(f) {
                crate::usage!("{p}: metrics_file = {:?}: {why}", f.display().to_string());
            }
        }
        if !self.listen_public {
            use std::net::ToSocketAddrs;
            let all: Vec<_> = self
                .listen
                .to_socket_addrs()
                .with_context(|| format!("{p}: listen = {:?}", self.listen))?
                .collect();
            if all.is_empty() || all.iter().any(|a| !a.ip().is_loopback()) {
                crate::usage!(
                    "{p}: listen = {:?} is not a loopback address: the metrics name the \
                     processes watched; add listen_public = true to serve them there",
                    self.listen
                );
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
pub fn metrics_file_allowed(f: &std::path::Path) -> std::result::Result<(), String> {
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

/// A process the configuration selects now, with what to do to it.
#[derive(Debug, Clone)]
pub struct SelectedProcess {
    /// The process, its pid inside and its container.
    pub member: Member,
    /// The group whose huge-page budget it draws on (its container, or
    /// the cgroup selected), and that budget.
    pub group: Option<(String, u64)>,
    /// Whether the huge-page agent acts on it.
    pub thp: bool,
    /// Whether the dedup agent acts on it.
    pub dedup: bool,
}

/// One selection resolved.
struct Rule {
    /// Whose processes (`None`: every container's).
    sel: Option<Selector>,
    /// The cgroup selected, as given.
    cgroup: Option<String>,
    /// Huge pages per container (or this cgroup).
    budget: Option<u64>,
    thp: bool,
    dedup: bool,
}

/// The selections resolved: containers named resolved to their ids once.
pub struct Selection {
    rules: Vec<Rule>,
}

impl Selection {
    /// Resolves the configuration's selections; a container named that
    /// does not run now is said, and looked for again at every step.
    pub fn new(c: &Config) -> Selection {
        let rules = c
            .select
            .iter()
            .map(|s| {
                let sel = match (&s.container, &s.cgroup) {
                    (Some(name), _) => Some(Selector::Container(
                        pagewise::process::container::resolve_container(name)
                            .unwrap_or_else(|_| name.clone()),
                    )),
                    (_, Some(cg)) => Some(Selector::Cgroup(cg.clone())),
                    _ => None,
                };
                Rule {
                    sel,
                    cgroup: s.cgroup.clone(),
                    budget: s.huge_pages,
                    // An agent the configuration disables acts on none.
                    thp: s.thp && c.thp.enabled,
                    dedup: s.dedup && c.dedup.enabled,
                }
            })
            .collect();
        Selection { rules }
    }

    /// The processes selected now, each by the first rule that selects it.
    pub fn chosen(&self) -> Vec<SelectedProcess> {
        let mut out: Vec<SelectedProcess> = Vec::new();
        for r in &self.rules {
            let members = match &r.sel {
                Some(s) => pagewise::process::container::members(s).unwrap_or_default(),
                None => pagewise::process::container::in_containers(),
            };
            for m in members {
                if out.iter().any(|o| o.member.pid == m.pid) {
                    continue;
                }
                let group_name = match (&m.container, &r.cgroup) {
                    (Some(c), _) => Some(group_of(c)),
                    (None, Some(cg)) => Some(format!("cgroup {cg}")),
                    (None, None) => None,
                };
                out.push(SelectedProcess {
                    group: r.budget.and_then(|b| group_name.map(|g| (g, b))),
                    member: m,
                    thp: r.thp,
                    dedup: r.dedup,
                });
            }
        }
        out
    }
}

/// A container's group name: its runtime and short id.
pub fn group_of(c: &ContainerRef) -> String {
    format!("{} {}", c.runtime, c.short_id())
}
