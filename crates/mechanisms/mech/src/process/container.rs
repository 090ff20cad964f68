//! Containers and cgroups as targets: the processes of a cgroup, the
//! container a process runs in, read from the cgroup paths the kernel
//! shows (`/proc/PID/cgroup`) with no runtime daemon asked (podman,
//! Docker, containerd and CRI-O name their cgroups after the container's
//! id, Kubernetes after the pod's uid), and a process's pid inside its own
//! pid namespace (`NSpid`). A container's name is the one thing the kernel
//! does not know: it is asked of the runtime (`podman inspect`, `docker
//! inspect`) only when the selector is not an id.

use crate::{Error, Result};

/// The container a process runs in, as its cgroup path names it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ContainerRef {
    /// `podman`, `docker`, `containerd` or `cri-o`.
    pub runtime: &'static str,
    /// The container's id (64 hexadecimal digits).
    pub id: String,
    /// The Kubernetes pod's uid, or podman pod's id, where the path says.
    pub pod: Option<String>,
}

impl ContainerRef {
    /// The id's first 12 digits, as the runtimes print it.
    pub fn short_id(&self) -> &str {
        &self.id[..self.id.len().min(12)]
    }
}

/// Whether `s` is a container id: 64 hexadecimal digits.
fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The container a cgroup path (as `/proc/PID/cgroup` shows it) names,
/// if any. A runtime's monitor (`libpod-conmon-…`, `crio-conmon-…`) is not
/// the container.
pub fn parse_cgroup_path(path: &str) -> Option<ContainerRef> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (last, parents) = parts.split_last()?;
    let leaf = last.strip_suffix(".scope").unwrap_or(last);
    let (runtime, id) = if let Some(id) = leaf.strip_prefix("libpod-") {
        ("podman", id)
    } else if let Some(id) = leaf.strip_prefix("docker-") {
        ("docker", id)
    } else if let Some(id) = leaf.strip_prefix("cri-containerd-") {
        ("containerd", id)
    } else if let Some(id) = leaf.strip_prefix("crio-") {
        ("cri-o", id)
    } else if parents.last() == Some(&"docker") {
        ("docker", leaf)
    } else if parents.iter().any(|p| p.starts_with("kubepods")) {
        ("containerd", leaf)
    } else {
        return None;
    };
    if !is_id(id) {
        return None;
    }
    let pod = parents.iter().rev().find_map(|p| {
        let p = p.strip_suffix(".slice").unwrap_or(p);
        if let Some(i) = p.rfind("-pod") {
            // kubepods-burstable-pod<uid with _>.slice
            return Some(p[i + 4..].replace('_', "-"));
        }
        if let Some(uid) = p.strip_prefix("pod") {
            return Some(uid.to_string());
        }
        p.strip_prefix("machine-libpod_pod_").map(str::to_string)
    });
    Some(ContainerRef {
        runtime,
        id: id.to_ascii_lowercase(),
        pod,
    })
}

/// The cgroup paths of process `pid` (`/proc/PID/cgroup`): one per
/// hierarchy, as `(controllers, path)`; v2's has no controllers.
pub fn cgroup_paths(pid: i32) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| Error::for_pid(pid, "reading its cgroups", e))?;
    Ok(parse_cgroup_file(&text))
}

/// The lines of a `/proc/PID/cgroup` file, as `(controllers, path)`.
pub fn parse_cgroup_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let _id = f.next()?;
            let controllers = f.next()?;
            let path = f.next()?;
            Some((controllers.to_string(), path.to_string()))
        })
        .collect()
}

/// Where the kubelet keeps a directory per pod on its node, named
/// `NAMESPACE_NAME_UID` (the pod's logs); `PAGEWISE_POD_LOGS` overrides it.
pub const POD_LOGS: &str = "/var/log/pods";

/// A Kubernetes pod's namespace and name, which the kernel does not know
/// (a cgroup path names the pod by its uid): read from the kubelet's
/// directory of pod logs ([`POD_LOGS`]), where the node has one; no API
/// server is asked. The directory is read again at most once a second,
/// when a uid is not found in what was read last.
pub fn pod_names(uid: &str) -> Option<(String, String)> {
    static READ: Names<(String, String)> = Names::new();
    READ.get(uid, || {
        let dir = std::env::var_os("PAGEWISE_POD_LOGS").unwrap_or_else(|| POD_LOGS.into());
        pods_in(std::path::Path::new(&dir))
    })
}

/// Names read from the node's files, keyed by an id: read again at most
/// once a second, when an id is not found in what was read last.
struct Names<V> {
    read: std::sync::Mutex<Option<(std::time::Instant, std::collections::HashMap<String, V>)>>,
}

impl<V: Clone> Names<V> {
    const fn new() -> Names<V> {
        Names {
            read: std::sync::Mutex::new(None),
        }
    }

    fn get(
        &self,
        id: &str,
        read: impl FnOnce() -> std::collections::HashMap<String, V>,
    ) -> Option<V> {
        let mut last = self.read.lock().unwrap_or_else(|p| p.into_inner());
        let stale = last.as_ref().is_none_or(|(at, names)| {
            !names.contains_key(id) && at.elapsed() >= std::time::Duration::from_secs(1)
        });
        if stale {
            *last = Some((std::time::Instant::now(), read()));
        }
        last.as_ref()?.1.get(id).cloned()
    }
}

/// Where the kubelet links each container's log as
/// `POD_NAMESPACE_CONTAINER-ID.log` (what log shippers read);
/// `PAGEWISE_CONTAINER_LOGS` overrides it.
pub const CONTAINER_LOGS: &str = "/var/log/containers";

/// Where podman (containers/storage, as root) lists its containers with
/// their names; `PAGEWISE_PODMAN_CONTAINERS` overrides it.
pub const PODMAN_CONTAINERS: &str =
    "/var/lib/containers/storage/overlay-containers/containers.json";

/// Largest list of podman's containers read.
const MAX_CONTAINERS_JSON: u64 = 16 << 20;

/// A container's name, as the kubelet or its runtime named it, read from
/// the node's files with no runtime asked: the kubelet's link to its log
/// ([`CONTAINER_LOGS`]: the name in the pod's spec, as cAdvisor says it),
/// else for podman's its list of containers ([`PODMAN_CONTAINERS`]).
/// `None` where neither says it.
pub fn container_name(c: &ContainerRef) -> Option<String> {
    static KUBELET: Names<String> = Names::new();
    static PODMAN: Names<String> = Names::new();
    let kubelet = KUBELET.get(&c.id, || {
        let dir =
            std::env::var_os("PAGEWISE_CONTAINER_LOGS").unwrap_or_else(|| CONTAINER_LOGS.into());
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| parse_container_log(e.file_name().to_str()?))
                    .map(|(_, _, name, id)| (id, name))
                    .collect()
            })
            .unwrap_or_default()
    });
    kubelet.or_else(|| {
        (c.runtime == "podman").then(|| {
            PODMAN.get(&c.id, || {
                let file = std::env::var_os("PAGEWISE_PODMAN_CONTAINERS")
                    .unwrap_or_else(|| PODMAN_CONTAINERS.into());
                podman_names(std::path::Path::new(&file))
            })
        })?
    })
}

/// The containers podman's list names: id → its first name. A list
/// that cannot be read or parsed names none.
fn podman_names(file: &std::path::Path) -> std::collections::HashMap<String, String> {
    use std::io::Read;
    #[derive(serde::Deserialize)]
    struct Entry {
        id: String,
        #[serde(default)]
        names: Vec<String>,
    }
    let mut text = String::new();
    let read = std::fs::File::open(file)
        .and_then(|f| f.take(MAX_CONTAINERS_JSON).read_to_string(&mut text));
    let entries: Vec<Entry> = match read {
        Ok(_) => serde_json::from_str(&text).unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    entries
        .into_iter()
        .filter(|e| is_id(&e.id))
        .filter_map(|e| Some((e.id, e.names.into_iter().next()?)))
        .collect()
}

/// A kubelet container log link's name, `POD_NAMESPACE_CONTAINER-ID.log`,
/// as (pod, namespace, container, id): the names DNS names (none holds
/// `_`), the id 64 hexadecimal digits; anything else is not one.
fn parse_container_log(file: &str) -> Option<(String, String, String, String)> {
    let stem = file.strip_suffix(".log")?;
    let (names, id) = stem.rsplit_once('-')?;
    if !is_id(id) {
        return None;
    }
    let (pod, namespace, container) = parse_pod_dir(names)?;
    Some((pod, namespace, container, id.to_ascii_lowercase()))
}

/// The pods a directory of kubelet pod directories names: uid → (namespace,
/// name). Entries of another form are left out.
fn pods_in(dir: &std::path::Path) -> std::collections::HashMap<String, (String, String)> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| parse_pod_dir(e.file_name().to_str()?))
                .map(|(ns, name, uid)| (uid, (ns, name)))
                .collect()
        })
        .unwrap_or_default()
}

/// A kubelet pod log directory's name, `NAMESPACE_NAME_UID`, as
/// (namespace, name, uid): each part a DNS name's characters (so none
/// holds `_`), at most 253 bytes; anything else is not one.
pub fn parse_pod_dir(dir: &str) -> Option<(String, String, String)> {
    let mut parts = dir.splitn(3, '_');
    let (ns, name, uid) = (parts.next()?, parts.next()?, parts.next()?);
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 253
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    (ok(ns) && ok(name) && ok(uid)).then(|| (ns.to_string(), name.to_string(), uid.to_string()))
}

/// The container process `pid` runs in, if any.
pub fn container_of(pid: i32) -> Option<ContainerRef> {
    cgroup_paths(pid)
        .ok()?
        .iter()
        .find_map(|(_, p)| parse_cgroup_path(p))
}

/// Process `pid`'s pid in the innermost pid namespace it is in (the last
/// of `NSpid`); its host pid where it is in the host's.
pub fn ns_pid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// A process of a selected cgroup or container.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Member {
    /// Its pid on the host (what pagewise acts on, and stores).
    pub pid: i32,
    /// Its pid inside its own pid namespace.
    pub ns_pid: Option<i32>,
    /// Its container, where its cgroup path names one.
    pub container: Option<ContainerRef>,
}

impl Member {
    /// Process `pid` as a member: its pid inside and its container, as the
    /// kernel says them now.
    pub fn of(pid: i32) -> Member {
        Member {
            pid,
            ns_pid: ns_pid(pid),
            container: container_of(pid),
        }
    }
}

/// Which processes: those of a cgroup, or of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Selector {
    /// A cgroup: a directory under `/sys/fs/cgroup`, or a path as
    /// `/proc/PID/cgroup` shows it; its sub-cgroups included.
    Cgroup(String),
    /// A container: its id, a prefix of it, or its name.
    Container(String),
}

/// Whether a process's cgroup lines are selected.
type Wanted = dyn Fn(&[(String, String)]) -> bool;

/// The processes `sel` selects now, in pid order (kernel threads and this
/// process never).
pub fn members(sel: &Selector) -> Result<Vec<Member>> {
    let me = std::process::id() as i32;
    let want: Box<Wanted> = match sel {
        Selector::Cgroup(path) => {
            check_cgroup(path)?;
            let shown = shown_path(path);
            Box::new(move |lines| {
                lines.iter().any(|(_, p)| {
                    p == &shown || p.starts_with(&format!("{}/", shown.trim_end_matches('/')))
                })
            })
        }
        Selector::Container(which) => {
            let id = resolve_container(which)?;
            Box::new(move |lines| {
                lines
                    .iter()
                    .any(|(_, p)| parse_cgroup_path(p).is_some_and(|c| c.id == id))
            })
        }
    };
    let mut out = Vec::new();
    for pid in crate::procfs::pids() {
        if pid == me || is_kernel_thread(pid) {
            continue;
        }
        let Ok(lines) = cgroup_paths(pid) else {
            continue;
        };
        if want(&lines) {
            out.push(Member {
                pid,
                ns_pid: ns_pid(pid),
                container: lines.iter().find_map(|(_, p)| parse_cgroup_path(p)),
            });
        }
    }
    out.sort_by_key(|m| m.pid);
    Ok(out)
}

/// Every process that runs in a container (its cgroup path names one), in
/// pid order (kernel threads and this process never).
pub fn in_containers() -> Vec<Member> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    for pid in crate::procfs::pids() {
        if pid == me {
            continue;
        }
        let Ok(lines) = cgroup_paths(pid) else {
            continue;
        };
        if let Some(c) = lines.iter().find_map(|(_, p)| parse_cgroup_path(p)) {
            if !is_kernel_thread(pid) {
                out.push(Member {
                    pid,
                    ns_pid: ns_pid(pid),
                    container: Some(c),
                });
            }
        }
    }
    out
}

/// Whether `pid` is a kernel thread (a child of `kthreadd`, or it).
fn is_kernel_thread(pid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    pid == 2 || crate::procfs::status_field(&status, "PPid") == Some(2)
}

/// Refuses a cgroup path that names no existing cgroup: a directory under
/// `/sys/fs/cgroup` must hold `cgroup.procs` (on a v1 host,
/// `/sys/fs/cgroup` itself and a path under it that is no hierarchy's are
/// none, where they used to become `/`, the whole node); a path as
/// `/proc/PID/cgroup` shows it must be a cgroup in some hierarchy.
pub fn check_cgroup(path: &str) -> Result<()> {
    let refuse = |why: &str| {
        Err(Error::NotACgroup {
            path: path.to_string(),
            why: why.to_string(),
        })
    };
    let is_cgroup = |d: &std::path::Path| d.join("cgroup.procs").is_file();
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return refuse("not an absolute path without '..'");
    }
    let root = std::path::Path::new("/sys/fs/cgroup");
    if let Some(rest) = path.strip_prefix("/sys/fs/cgroup") {
        if !rest.is_empty() && !rest.starts_with('/') {
            return refuse("no such directory");
        }
        let d = std::path::Path::new(path);
        if !d.is_dir() {
            return refuse("no such directory");
        }
        if !is_cgroup(d) {
            return refuse("a directory that holds no cgroup.procs");
        }
        return Ok(());
    }
    // As /proc/PID/cgroup shows it: v2 at the root, or in a v1
    // hierarchy (or v2's `unified` of a hybrid host).
    let tail = path.trim_start_matches('/');
    let mut places = vec![root.join(tail)];
    if let Ok(rd) = std::fs::read_dir(root) {
        places.extend(rd.filter_map(|e| Some(e.ok()?.path().join(tail))));
    }
    if places.iter().any(|d| d.is_dir() && is_cgroup(d)) {
        Ok(())
    } else {
        refuse("no cgroup of that path in any hierarchy under /sys/fs/cgroup")
    }
}

/// A cgroup path as `/proc/PID/cgroup` shows it: a directory of a cgroup
/// file system loses its mount point (`/sys/fs/cgroup`, then a v1
/// hierarchy's directory, such as `memory` or `cpu,cpuacct`, or `unified`).
fn shown_path(path: &str) -> String {
    let Some(rest) = path.strip_prefix("/sys/fs/cgroup") else {
        return path.to_string();
    };
    let rest = rest.trim_start_matches('/');
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists()
        || std::path::Path::new("/sys/fs/cgroup/unified").is_dir();
    let rest = match (v1, rest.split_once('/')) {
        (true, Some((_, tail))) => tail,
        (true, None) => "",
        (false, _) => rest,
    };
    format!("/{rest}")
}

/// The full id of the container `which` names: itself if it is one, the
/// only id of a running container it is a prefix of (4 hexadecimal digits
/// at least), or, for a name, the runtime's answer (`podman inspect`, then
/// `docker inspect`).
pub fn resolve_container(which: &str) -> Result<String> {
    let lower = which.to_ascii_lowercase();
    if is_id(&lower) {
        return Ok(lower);
    }
    if lower.len() >= 4 && lower.bytes().all(|b| b.is_ascii_hexdigit()) {
        let mut ids: Vec<String> = crate::procfs::pids()
            .into_iter()
            .filter_map(container_of)
            .map(|c| c.id)
            .filter(|id| id.starts_with(&lower))
            .collect();
        ids.sort();
        ids.dedup();
        match ids.len() {
            1 => return Ok(ids.remove(0)),
            0 => {}
            count => {
                return Err(Error::AmbiguousContainer {
                    which: which.to_string(),
                    count,
                })
            }
        }
    }
    for runtime in ["podman", "docker"] {
        let Ok(out) = std::process::Command::new(runtime)
            .args(["inspect", "--format", "{{.Id}}", which])
            .stderr(std::process::Stdio::null())
            .output()
        else {
            continue;
        };
        let id = String::from_utf8_lossy(&out.stdout)
            .trim()
            .to_ascii_lowercase();
        if out.status.success() && is_id(&id) {
            return Ok(id);
        }
    }
    Err(Error::NoSuchContainer {
        which: which.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path that names no cgroup is refused, with the reason; one this
    /// process is in is taken (written both ways).
    #[test]
    fn a_cgroup_path_that_is_not_a_cgroup_is_refused() {
        for bad in [
            "/sys/fs/cgroup/no-such-cgroup",
            "/sys/fs/cgroupx",
            "/sys/fs/cgroup/../../etc",
            "/no-such-slice/x.scope",
            "relative/path",
        ] {
            let e = check_cgroup(bad).unwrap_err();
            assert!(matches!(e, Error::NotACgroup { .. }), "{bad}: {e}");
            assert!(members(&Selector::Cgroup(bad.into())).is_err(), "{bad}");
        }
        let v1 = std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists();
        if v1 {
            // The v2 layout's path on a v1 host: no cgroup, not the root.
            let e = check_cgroup("/sys/fs/cgroup/system.slice");
            assert!(
                e.is_err()
                    || std::path::Path::new("/sys/fs/cgroup/system.slice/cgroup.procs").exists()
            );
            assert!(
                check_cgroup("/sys/fs/cgroup").is_err(),
                "v1's tmpfs is no cgroup"
            );
        }
        let own = cgroup_paths(std::process::id() as i32).unwrap();
        let (hier, shown) = own
            .iter()
            .find(|(h, _)| h == "memory" || h.is_empty())
            .unwrap();
        assert!(check_cgroup(shown).is_ok(), "{shown}");
        let dir = if hier.is_empty() || !v1 {
            format!("/sys/fs/cgroup{}", shown.trim_end_matches('/'))
        } else {
            format!("/sys/fs/cgroup/{hier}{}", shown.trim_end_matches('/'))
        };
        assert!(check_cgroup(&dir).is_ok(), "{dir}");
    }

    const ID: &str = "f98d96efb83a43a768b4fd663d576d8253d52ebc6fe7bba69ff232d57317ead8";

    /// A kubelet's link to a container's log names the pod, its namespace
    /// and the container, then the id; podman's list names its containers.
    #[test]
    fn a_containers_name_is_read_from_the_kubelets_links_and_podmans_list() {
        assert_eq!(
            parse_container_log(&format!(
                "coredns-5d78c9869d-x7k2p_kube-system_coredns-{ID}.log"
            )),
            Some((
                "coredns-5d78c9869d-x7k2p".into(),
                "kube-system".into(),
                "coredns".into(),
                ID.into()
            ))
        );
        for bad in [
            format!("a_b_c-{ID}"),
            format!("a_b-{ID}.log"),
            format!("a_b_c-{}.log", &ID[1..]),
            format!("a_b_C-{ID}.log"),
            "a_b_c.log".to_string(),
        ] {
            assert_eq!(parse_container_log(&bad), None, "{bad:?}");
        }
        let file =
            std::env::temp_dir().join(format!("pagewise-podman-{}.json", std::process::id()));
        std::fs::write(
            &file,
            format!(
                r#"[{{"id":"{ID}","names":["web","alias"],"image":"x"}},{{"id":"short","names":["no"]}},{{"id":"{}","names":[]}}]"#,
                "0".repeat(64)
            ),
        )
        .unwrap();
        let names = podman_names(&file);
        assert_eq!(names.len(), 1, "{names:?}");
        assert_eq!(names[ID], "web");
        std::fs::write(&file, "[{").unwrap();
        assert!(podman_names(&file).is_empty(), "a broken list names none");
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn a_pods_namespace_and_name_are_read_from_the_kubelets_directories() {
        let uid = "0f6e3f1a-1b2c-4d5e-8f90-123456789abc";
        assert_eq!(
            parse_pod_dir(&format!("kube-system_coredns-5d78c9869d-x7k2p_{uid}")),
            Some((
                "kube-system".into(),
                "coredns-5d78c9869d-x7k2p".into(),
                uid.into()
            ))
        );
        let long = format!("{}_b_c", "x".repeat(254));
        for bad in [
            "", "a_b", "a__c", "A_b_c", "a_b_c d", "a_b_c/d", "a_b_c_d", &long,
        ] {
            assert_eq!(parse_pod_dir(bad), None, "{bad:?}");
        }
        let dir = std::env::temp_dir().join(format!("pagewise-pods-{}", std::process::id()));
        std::fs::create_dir_all(dir.join(format!("web_web-0_{uid}"))).unwrap();
        std::fs::create_dir_all(dir.join("not-a-pod")).unwrap();
        let pods = pods_in(&dir);
        assert_eq!(pods.len(), 1, "{pods:?}");
        assert_eq!(pods[uid], ("web".to_string(), "web-0".to_string()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_runtimes_cgroup_names_give_the_container() {
        for (path, runtime, pod) in [
            (format!("/libpod_parent/libpod-{ID}"), "podman", None),
            (format!("/machine.slice/libpod-{ID}.scope"), "podman", None),
            (
                format!("/machine.slice/machine-libpod_pod_abc123.slice/libpod-{ID}.scope"),
                "podman",
                Some("abc123"),
            ),
            (format!("/docker/{ID}"), "docker", None),
            (format!("/system.slice/docker-{ID}.scope"), "docker", None),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b_3c4d.slice/cri-containerd-{ID}.scope"
                ),
                "containerd",
                Some("1a2b-3c4d"),
            ),
            (
                format!("/kubepods/besteffort/pod1a2b-3c4d/{ID}"),
                "containerd",
                Some("1a2b-3c4d"),
            ),
            (
                format!("/kubepods.slice/kubepods-pod9f.slice/crio-{ID}.scope"),
                "cri-o",
                Some("9f"),
            ),
        ] {
            let c = parse_cgroup_path(&path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!((c.runtime, c.id.as_str()), (runtime, ID), "{path}");
            assert_eq!(c.pod.as_deref(), pod, "{path}");
        }
        for path in [
            "/".to_string(),
            "/user.slice/user-0.slice/session-1.scope".to_string(),
            format!("/libpod_parent/libpod-conmon-{ID}"),
            format!("/system.slice/crio-conmon-{ID}.scope"),
            "/docker/not-an-id".to_string(),
        ] {
            assert_eq!(parse_cgroup_path(&path), None, "{path}");
        }
    }

    #[test]
    fn a_cgroup_file_reads_line_by_line() {
        let lines = parse_cgroup_file("4:memory:/a/b\n1:cpu,cpuacct:/a\n0::/a/b/c\n");
        assert_eq!(
            lines,
            vec![
                ("memory".to_string(), "/a/b".to_string()),
                ("cpu,cpuacct".to_string(), "/a".to_string()),
                (String::new(), "/a/b/c".to_string()),
            ]
        );
    }
}
