//! Whole containers and cgroups as targets (`--container`, `--cgroup`):
//! the processes they hold, each named by its host pid, its pid inside its
//! namespace and its container.

type Result<T, E = anyhow::Error> = std::result::Result<T, E>;
use pagewise::process::{self as container, Member, Selector};

/// The flags that select processes by container or cgroup.
#[derive(clap::Args, Debug, Default)]
pub struct Groups {
    /// Every process of this container: its id, a prefix of the id, or its
    /// name (repeat for more). Found from the cgroup paths the kernel shows
    /// (`/proc/PID/cgroup`: podman, Docker, containerd, CRI-O); a name is
    /// asked of podman or docker.
    #[arg(long = "container", value_name = "ID|NAME")]
    pub containers: Vec<String>,
    /// Every process of this cgroup, its sub-cgroups included: a directory
    /// under /sys/fs/cgroup, or a path as /proc/PID/cgroup shows it
    /// (repeat for more).
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<String>,
    /// The selectors, each container resolved to its full id once (a name
    /// is asked of the runtime once, not at every step), with how each is
    /// said (`container web`, `cgroup /a/b`).
    #[arg(skip)]
    resolved: std::sync::OnceLock<Vec<(String, Selector)>>,
}

impl Groups {
    /// Whether any is given.
    pub fn given(&self) -> bool {
        !(self.containers.is_empty() && self.cgroups.is_empty())
    }

    /// The selectors given, in order, resolved on first use.
    fn selectors(&self) -> Result<&[(String, Selector)]> {
        if let Some(s) = self.resolved.get() {
            return Ok(s);
        }
        let mut sels = Vec::new();
        for c in &self.containers {
            let id = container::resolve_container(c)?;
            sels.push((format!("container {c}"), Selector::Container(id)));
        }
        for c in &self.cgroups {
            container::check_cgroup(c)?;
            sels.push((format!("cgroup {c}"), Selector::Cgroup(c.clone())));
        }
        Ok(self.resolved.get_or_init(|| sels))
    }

    /// The host pids selected now, each once, in order (nothing said); the
    /// selectors must have been resolved ([`Groups::add_to`]).
    pub fn pids(&self) -> Result<Vec<i32>, pagewise::MechError> {
        let mut out = Vec::new();
        for (_, sel) in self.resolved.get().map(Vec::as_slice).unwrap_or_default() {
            for m in container::members(sel)? {
                if !out.contains(&m.pid) {
                    out.push(m.pid);
                }
            }
        }
        Ok(out)
    }

    /// The processes selected now, each once, in order (nothing said); the
    /// selectors must have been resolved ([`Groups::add_to`]).
    pub fn members_now(&self) -> Vec<Member> {
        let mut out: Vec<Member> = Vec::new();
        for (_, sel) in self.resolved.get().map(Vec::as_slice).unwrap_or_default() {
            for m in container::members(sel).unwrap_or_default() {
                if !out.iter().any(|o| o.pid == m.pid) {
                    out.push(m);
                }
            }
        }
        out
    }

    /// The processes selected now that `known` does not hold, each added
    /// to it and, with `say`, said on stderr (for following a container's
    /// processes as they come); a selector that fails now (a container
    /// gone) holds none.
    pub fn newcomers(&self, known: &mut Vec<i32>, say: bool) -> Vec<i32> {
        let mut out = Vec::new();
        for (what, sel) in self.selectors().unwrap_or_default() {
            for m in container::members(sel).unwrap_or_default() {
                if !known.contains(&m.pid) {
                    known.push(m.pid);
                    if say {
                        eprintln!(
                            "pagewise: following pid {}{}, new in {what}",
                            m.pid,
                            inside(&m)
                        );
                    }
                    out.push(m.pid);
                }
            }
        }
        out
    }

    /// The host pids of every process selected, each once, after `pids`;
    /// says on stderr what each selector holds. A selector that holds no
    /// process is an error.
    pub fn add_to(&self, pids: &mut Vec<i32>) -> Result<()> {
        for (what, sel) in self.selectors()? {
            let members = container::members(sel)?;
            if members.is_empty() {
                anyhow::bail!("{what} holds no process");
            }
            let named: Vec<String> = members
                .iter()
                .map(|m| {
                    let of = match &m.container {
                        Some(c) if !matches!(sel, Selector::Container(_)) => {
                            format!(" in {} {}", c.runtime, c.short_id())
                        }
                        _ => String::new(),
                    };
                    format!("{}{}{of}", m.pid, inside(m))
                })
                .collect();
            let runtime = match (sel, members[0].container.as_ref()) {
                (Selector::Container(_), Some(c)) => match &c.pod {
                    Some(pod) => format!(" ({} {}, pod {pod})", c.runtime, c.short_id()),
                    None => format!(" ({} {})", c.runtime, c.short_id()),
                },
                _ => String::new(),
            };
            eprintln!("pagewise: {what}{runtime}: pid {}", named.join(", "));
            for m in members {
                if !pids.contains(&m.pid) {
                    pids.push(m.pid);
                }
            }
        }
        Ok(())
    }
}

/// ` (N inside)`: a process's pid inside its namespace, where it differs.
fn inside(m: &Member) -> String {
    match m.ns_pid {
        Some(n) if n != m.pid => format!(" ({n} inside)"),
        _ => String::new(),
    }
}
