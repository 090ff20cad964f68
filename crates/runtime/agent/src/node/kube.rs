//! What the Kubernetes API server says of the node's pods that the
//! kernel and the kubelet's files do not: the namespaces and pods
//! labelled to opt out of the agent ([`OPT_OUT`]`=true`).
//!
//! Asked from inside the agent's pod, as a pod asks: the API server's
//! address from `KUBERNETES_SERVICE_HOST`/`_PORT`, the pod's service
//! account token (read again at each ask: the kubelet rotates it) and CA
//! from `/var/run/secrets/kubernetes.io/serviceaccount`; the node's name
//! from `NODE_NAME` (the downward API). Two reads, both `list` with a
//! label selector (the pods' also with the node's field selector), each
//! bounded in time ([`WITHIN`]) and size ([`MAX_BODY`]); the role needs
//! `list` of namespaces and pods and nothing more. Until the first answer
//! the agent leaves every pod alone (it cannot know which opted out), and
//! says so in its notes and in `pagewise_node_kubernetes_api_up`.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

/// The label that opts a namespace or a pod out, with the value `true`.
pub const OPT_OUT: &str = "pagewise.io/opt-out";

/// Where a pod's service account is mounted.
const ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Longest a read of the API server may take.
const WITHIN: Duration = Duration::from_secs(5);

/// Largest answer read.
const MAX_BODY: u64 = 16 << 20;

/// The namespaces and pods (by uid) that opted out, as last read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OptOuts {
    pub namespaces: HashSet<String>,
    pub pods: HashSet<String>,
}

/// Least time between two reads of the API server.
const READ_EVERY: Duration = Duration::from_secs(10);

/// The opt-outs as the node agent knows them, read again at most every
/// [`READ_EVERY`].
pub(crate) struct Watch {
    /// Whether the agent runs in a cluster's pod and asks (then a pod is
    /// left alone until the opt-outs are known).
    asks: bool,
    api: Option<Api>,
    known: Option<OptOuts>,
    last: Option<std::time::Instant>,
    up: bool,
    /// The last failure said, so that it is said once.
    said: Option<String>,
}

impl Watch {
    /// The watch of a node agent whose configuration says `enabled`: it
    /// asks where the agent runs in a pod.
    pub fn new(enabled: bool, notes: &mut Vec<String>) -> Watch {
        let (asks, api) = match (enabled, Api::in_cluster()) {
            (true, Some(Ok(api))) => (true, Some(api)),
            (true, Some(Err(why))) => {
                notes.push(format!(
                    "kubernetes: no client of the API server ({why}): every pod is left alone"
                ));
                (true, None)
            }
            _ => (false, None),
        };
        Watch {
            asks,
            api,
            known: None,
            last: None,
            up: false,
            said: None,
        }
    }

    /// Reads the opt-outs again, unless read within [`READ_EVERY`]; a
    /// failure keeps what was known and is said once.
    pub fn refresh(&mut self, notes: &mut Vec<String>) {
        let Some(api) = &self.api else { return };
        if self.last.is_some_and(|t| t.elapsed() < READ_EVERY) {
            return;
        }
        self.last = Some(std::time::Instant::now());
        match api.opt_outs() {
            Ok(o) => {
                if self.known.as_ref() != Some(&o) {
                    notes.push(format!(
                        "kubernetes: opted out ({OPT_OUT}=true): namespaces {:?}, {} pod(s) of this node",
                        {
                            let mut n: Vec<&String> = o.namespaces.iter().collect();
                            n.sort();
                            n
                        },
                        o.pods.len()
                    ));
                }
                self.known = Some(o);
                self.up = true;
                self.said = None;
            }
            Err(why) => {
                if self.said.as_deref() != Some(&why) {
                    let then = match self.known {
                        Some(_) => "the last opt-outs read hold",
                        None => "every pod is left alone until it answers",
                    };
                    notes.push(format!("kubernetes: {why}; {then}"));
                    self.said = Some(why);
                }
                self.up = false;
            }
        }
    }

    /// Whether process `m` is left alone: it runs in a Kubernetes pod that
    /// opted out, or in its namespace, or in any pod while the opt-outs
    /// are not known yet.
    pub fn leaves(&self, m: &pagewise_mech::container::Member) -> bool {
        self.leaves_in(m.container.as_ref())
    }

    /// [`Watch::leaves`] of a process in `container`.
    fn leaves_in(&self, container: Option<&pagewise_mech::container::ContainerRef>) -> bool {
        if !self.asks {
            return false;
        }
        let Some(uid) = container.and_then(|c| c.pod.as_deref()) else {
            return false;
        };
        let Some(o) = &self.known else { return true };
        o.pods.contains(uid)
            || pagewise_mech::container::pod_names(uid)
                .is_some_and(|(ns, _)| o.namespaces.contains(&ns))
    }

    /// `pagewise_node_kubernetes_api_up`, where the agent asks.
    pub fn metric(&self) -> Option<pagewise_mech::agent::Metric> {
        self.asks.then(|| {
            pagewise_mech::agent::Metric::gauge(
                "kubernetes_api_up",
                "Whether the last read of the opt-outs from the API server answered.",
                if self.up { 1.0 } else { 0.0 },
            )
        })
    }
}

/// The API server, as this pod reaches it.
pub(crate) struct Api {
    agent: ureq::Agent,
    base: String,
    token: PathBuf,
    node: String,
}

impl Api {
    /// The API server of the cluster this process runs in as a pod:
    /// `None` outside one (no `KUBERNETES_SERVICE_HOST`), else the client
    /// or why there is none (no token, no CA, no `NODE_NAME`).
    pub fn in_cluster() -> Option<Result<Api, String>> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
        Some(Self::connect(&host))
    }

    fn connect(host: &str) -> Result<Api, String> {
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let node = std::env::var("NODE_NAME")
            .map_err(|_| "NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)")?;
        let dir = PathBuf::from(
            std::env::var("PAGEWISE_SERVICE_ACCOUNT").unwrap_or_else(|_| ACCOUNT.into()),
        );
        let ca = std::fs::read(dir.join("ca.crt"))
            .map_err(|e| format!("{}: {e}", dir.join("ca.crt").display()))?;
        let certs: Vec<_> = ureq::tls::parse_pem(&ca)
            .filter_map(|item| match item.ok()? {
                ureq::tls::PemItem::Certificate(c) => Some(c),
                _ => None,
            })
            .collect();
        if certs.is_empty() {
            return Err(format!("{}: no certificate", dir.join("ca.crt").display()));
        }
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
            .build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .timeout_global(Some(WITHIN))
            .http_status_as_error(false)
            .build()
            .into();
        // An IPv6 address is bracketed in a URL.
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        Ok(Api {
            agent,
            base: format!("https://{host}:{port}"),
            token: dir.join("token"),
            node,
        })
    }

    /// The namespaces and this node's pods labelled to opt out now.
    pub fn opt_outs(&self) -> Result<OptOuts, String> {
        let selector = format!("labelSelector={}%3Dtrue", OPT_OUT.replace('/', "%2F"));
        let namespaces = self.list(&format!("/api/v1/namespaces?{selector}"))?;
        let pods = self.list(&format!(
            "/api/v1/pods?{selector}&fieldSelector=spec.nodeName%3D{}",
            self.node
        ))?;
        Ok(OptOuts {
            namespaces: names(&namespaces, "name"),
            pods: names(&pods, "uid"),
        })
    }

    /// One `list`: its JSON.
    fn list(&self, path: &str) -> Result<serde_json::Value, String> {
        let token = std::fs::read_to_string(&self.token)
            .map_err(|e| format!("{}: {e}", self.token.display()))?;
        let url = format!("{}{path}", self.base);
        let mut answer = self
            .agent
            .get(&url)
            .header("Authorization", &format!("Bearer {}", token.trim()))
            // Metadata only: names, uids and labels are all it needs.
            .header(
                "Accept",
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
            )
            .call()
            .map_err(|e| format!("GET {url}: {e}"))?;
        let status = answer.status();
        let body = answer
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_string()
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !status.is_success() {
            let why = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or_default();
            return Err(format!("GET {url}: {status} {why}"));
        }
        serde_json::from_str(&body).map_err(|e| format!("GET {url}: not a list: {e}"))
    }
}

/// The `metadata.FIELD` of each item of a `list` answer.
fn names(list: &serde_json::Value, field: &str) -> HashSet<String> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"][field].as_str().map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the agent asks: a pod is left alone until the opt-outs are
    /// known, then only if it opted out; a process in no pod never is.
    #[test]
    fn pods_are_left_alone_until_known_then_as_labelled() {
        let in_pod = |uid: &str| {
            pagewise_mech::container::parse_cgroup_path(&format!(
                "/kubepods/besteffort/pod{uid}/{}",
                "a".repeat(64)
            ))
        };
        let (opted, other) = (in_pod("11111111-2222"), in_pod("33333333-4444"));
        assert!(opted
            .as_ref()
            .is_some_and(|c| c.pod.as_deref() == Some("11111111-2222")));
        let mut w = Watch {
            asks: true,
            api: None,
            known: None,
            last: None,
            up: false,
            said: None,
        };
        assert!(
            w.leaves_in(opted.as_ref()) && w.leaves_in(other.as_ref()),
            "unknown: every pod left alone"
        );
        assert!(!w.leaves_in(None), "a process in no container");
        w.known = Some(OptOuts {
            namespaces: HashSet::new(),
            pods: HashSet::from(["11111111-2222".to_string()]),
        });
        assert!(w.leaves_in(opted.as_ref()));
        assert!(!w.leaves_in(other.as_ref()));
        w.asks = false;
        assert!(
            !w.leaves_in(opted.as_ref()),
            "not asking: the labels are not read"
        );
    }

    #[test]
    fn a_lists_items_are_named_by_their_metadata() {
        let list = serde_json::json!({
            "kind": "PodList",
            "items": [
                {"metadata": {"name": "a", "uid": "1"}},
                {"metadata": {"name": "b"}},
                {"spec": {}},
            ]
        });
        assert_eq!(names(&list, "uid"), HashSet::from(["1".to_string()]));
        assert_eq!(
            names(&list, "name"),
            HashSet::from(["a".to_string(), "b".to_string()])
        );
        assert!(names(&serde_json::json!({"items": null}), "name").is_empty());
    }
}
