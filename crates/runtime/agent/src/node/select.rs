//! Which processes the node agent acts on: its configuration's
//! selections resolved, each process taken by the first that selects it.

use super::config::Config;
use pagewise_mech::container::{ContainerRef, Member, Selector};

/// A process the configuration selects now, with what to do to it.
#[derive(Debug, Clone)]
#[non_exhaustive]
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
    /// The Kubernetes namespace whose pods' processes are selected.
    namespace: Option<String>,
    /// Huge pages per container (or this cgroup).
    budget: Option<u64>,
    thp: bool,
    dedup: bool,
}

/// The selections resolved: containers named resolved to their ids once.
pub struct Selection {
    rules: Vec<Rule>,
    /// Namespaces whose pods no rule takes.
    leave: Vec<String>,
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
                        pagewise_mech::container::resolve_container(name)
                            .unwrap_or_else(|_| name.clone()),
                    )),
                    (_, Some(cg)) => Some(Selector::Cgroup(cg.clone())),
                    _ => None,
                };
                Rule {
                    sel,
                    cgroup: s.cgroup.clone(),
                    namespace: s.namespace.clone(),
                    budget: s.huge_pages,
                    // An agent the configuration disables acts on none.
                    thp: s.thp && c.thp.enabled,
                    dedup: s.dedup && c.dedup.enabled,
                }
            })
            .collect();
        Selection {
            rules,
            leave: c.leave_namespaces.clone(),
        }
    }

    /// The processes selected now, each by the first rule that selects it,
    /// but for those of pods in the namespaces left alone and those
    /// `leave` says (pods that opted out).
    pub fn chosen(&self, leave: impl Fn(&Member) -> bool) -> Vec<SelectedProcess> {
        let mut out: Vec<SelectedProcess> = Vec::new();
        for r in &self.rules {
            let members = match &r.sel {
                Some(s) => pagewise_mech::container::members(s).unwrap_or_default(),
                None => {
                    let mut all = pagewise_mech::container::in_containers();
                    if let Some(ns) = &r.namespace {
                        all.retain(|m| in_namespace(m, ns));
                    }
                    all
                }
            };
            for m in members {
                if out.iter().any(|o| o.member.pid == m.pid)
                    || self.leave.iter().any(|ns| in_namespace(&m, ns))
                    || leave(&m)
                {
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

/// Whether process `m` runs in a Kubernetes pod of namespace `ns`.
fn in_namespace(m: &Member, ns: &str) -> bool {
    m.container
        .as_ref()
        .and_then(|c| c.pod.as_deref())
        .and_then(pagewise_mech::container::pod_names)
        .is_some_and(|(namespace, _)| namespace == ns)
}

/// A container's group name: its runtime and short id.
pub(crate) fn group_of(c: &ContainerRef) -> String {
    format!("{} {}", c.runtime, c.short_id())
}
