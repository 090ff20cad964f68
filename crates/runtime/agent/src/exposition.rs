//! Agents' metrics in the Prometheus exposition: OpenMetrics text, as the
//! `prometheus-client` crate encodes it (each family's help and type once,
//! a counter's samples ending in `_total`, `# EOF` last). Prometheus
//! scrapes it as OpenMetrics; node_exporter's textfile collector reads it
//! as the classic text format (where a counter's samples read as untyped,
//! their names and values the same).
//!
//! Every text says `pagewise_build_info` (the version and, where the
//! build was told it, the commit). The endpoint's text also says the
//! serving process's own `process_start_time_seconds`,
//! `process_cpu_seconds_total` and `process_resident_memory_bytes`, as
//! every Prometheus client's does ([`served`]); the metrics file does not,
//! since node_exporter's textfile collector would clash with its own.

use pagewise_mech::agent::{Agent, Metric};
use pagewise_mech::procfs;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The content type of [`render`]'s text, as the endpoint serves it to a
/// scraper that asks for OpenMetrics (Prometheus does).
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of [`classic`]'s text, served to any other client.
pub(crate) const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// [`render`]'s OpenMetrics text in Prometheus' classic text format, for
/// readers of that format (node_exporter's textfile collector,
/// `promtool check metrics`, a client that does not ask for OpenMetrics):
/// a counter's family takes the `_total` of its samples, and there is no
/// `# EOF`. The rest is alike in both. (The crate writes OpenMetrics
/// only; the difference is these two lines.)
pub(crate) fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        if line.starts_with("# HELP ") {
            if let Some(h) = help.replace(line) {
                out.push_str(h);
                out.push('\n');
            }
            continue;
        }
        if let Some(family) = line
            .strip_prefix("# TYPE ")
            .and_then(|t| t.strip_suffix(" counter"))
        {
            if let Some(h) = help.take() {
                let text = h.strip_prefix(&format!("# HELP {family} ")).unwrap_or("");
                out.push_str(&format!("# HELP {family}_total {text}\n"));
            }
            out.push_str(&format!("# TYPE {family}_total counter\n"));
            continue;
        }
        if let Some(h) = help.take() {
            out.push_str(h);
            out.push('\n');
        }
        out.push_str(line);
        out.push('\n');
    }
    if let Some(h) = help {
        out.push_str(h);
        out.push('\n');
    }
    out
}

/// A family's series, one per set of labels (none for a plain metric).
type Labels = Vec<(&'static str, String)>;

/// The metrics of each agent named (`pagewise_NAME_…`), in one text: each
/// name's series together, in the order names first appear.
pub fn render(groups: &[(&str, Vec<Metric>)]) -> String {
    let mut root = Registry::default();
    let build = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    build.get_or_create(&build_labels()).set(1.0);
    root.register(
        "pagewise_build_info",
        "The pagewise that serves these metrics: its version and commit (always 1)",
        build,
    );
    for (agent, metrics) in groups {
        let r = root.sub_registry_with_prefix(format!("pagewise_{agent}"));
        let mut names: Vec<&str> = Vec::new();
        for m in metrics {
            if !names.contains(&m.name) {
                names.push(m.name);
            }
        }
        for n in names {
            let of = || metrics.iter().filter(move |m| m.name == n);
            let first = of().next().expect("a name seen has a metric");
            // The crate ends the help with a full stop and a counter's
            // samples with `_total`: neither is said twice.
            let help = first.help.strip_suffix('.').unwrap_or(first.help);
            if first.kind == "counter" {
                let family = Family::<Labels, Counter<f64, AtomicU64>>::default();
                for m in of() {
                    family.get_or_create(&labels(m)).inc_by(m.value.max(0.0));
                }
                r.register(n.strip_suffix("_total").unwrap_or(n), help, family);
            } else {
                let family = Family::<Labels, Gauge<f64, AtomicU64>>::default();
                for m in of() {
                    family.get_or_create(&labels(m)).set(m.value);
                }
                r.register(n, help, family);
            }
        }
    }
    let mut text = String::new();
    encode(&mut text, &root).expect("writing to a String does not fail");
    text
}

/// `agent`'s metrics now, with those of the agents it is made of (the
/// node agent's), in the exposition.
pub fn exposition<A: Agent + ?Sized>(agent: &A) -> String {
    render(&agent.metric_groups())
}

/// The build's labels: `version`, and `revision` (the commit
/// `PAGEWISE_COMMIT` named when it was built, `unknown` otherwise).
fn build_labels() -> Labels {
    vec![
        ("version", env!("CARGO_PKG_VERSION").to_string()),
        (
            "revision",
            option_env!("PAGEWISE_COMMIT")
                .unwrap_or("unknown")
                .to_string(),
        ),
    ]
}

/// `text` ([`render`]'s) with the serving process's own metrics before its
/// end: when it started (seconds since the epoch), its CPU time and its
/// resident memory, as every Prometheus client library says them. A
/// figure the kernel does not give is left out.
pub(crate) fn served(text: &str) -> String {
    let me = std::process::id() as i32;
    let mut root = Registry::default();
    let mut gauge = |name: &str, help: &str, value: Option<f64>| {
        if let Some(v) = value {
            let g = Gauge::<f64, AtomicU64>::default();
            g.set(v);
            root.register(name, help, g);
        }
    };
    gauge(
        "process_start_time_seconds",
        "Start time of the process since the epoch, in seconds",
        start_time_seconds(),
    );
    gauge(
        "process_resident_memory_bytes",
        "Resident memory of the process, in bytes",
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|t| procfs::status_field(&t, "VmRSS"))
            .map(|kib| (kib * 1024) as f64),
    );
    if let Ok(cpu) = procfs::cpu_time(me) {
        let c = Counter::<f64, AtomicU64>::default();
        c.inc_by(cpu.as_secs_f64());
        root.register(
            "process_cpu_seconds",
            "User and system CPU time of the process, in seconds",
            c,
        );
    }
    let mut own = String::new();
    encode(&mut own, &root).expect("writing to a String does not fail");
    let body = text.strip_suffix("# EOF\n").unwrap_or(text);
    format!("{body}{own}")
}

/// When this process started, in seconds since the epoch: its start in
/// clock ticks since boot (`/proc/self/stat`) after the boot's time
/// (`/proc/stat`'s `btime`). Read once.
fn start_time_seconds() -> Option<f64> {
    static START: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        let ticks = procfs::start_time(std::process::id() as i32)?;
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let btime: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        let hz = pagewise_sys::process::clock_ticks_per_second() as f64;
        Some(btime as f64 + ticks as f64 / hz)
    })
}

/// The metrics of processes folded into their containers': a series
/// labelled with a `pid` loses it and its `ns_pid`, and the series then
/// labelled alike add up (those of processes in no container into one
/// series without labels). A process's series would end with it and a
/// new pid's begin, one series a process the node ever ran; a container's
/// go on while it does.
pub(crate) fn per_container(metrics: Vec<Metric>) -> Vec<Metric> {
    let mut out: Vec<Metric> = Vec::with_capacity(metrics.len());
    for mut m in metrics {
        let Some(labels) = m.process.as_mut() else {
            out.push(m);
            continue;
        };
        if !labels.iter().any(|(k, _)| *k == "pid") {
            out.push(m);
            continue;
        }
        labels.retain(|(k, _)| *k != "pid" && *k != "ns_pid");
        match out
            .iter_mut()
            .find(|o| o.name == m.name && o.process == m.process)
        {
            Some(o) => o.value += m.value,
            None => out.push(m),
        }
    }
    out
}

fn labels(m: &Metric) -> Labels {
    m.process.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewise_mech::agent::process_labels;

    /// Processes' series add up into their container's, those of no
    /// container into one; series without a pid are left as they are.
    #[test]
    fn processes_fold_into_their_containers() {
        let c = |id: &str| {
            pagewise_mech::container::parse_cgroup_path(&format!(
                "/machine.slice/libpod-{}.scope",
                id.repeat(64)
            ))
        };
        let (a, b) = (c("a"), c("b"));
        let of = |pid, c: &Option<pagewise_mech::container::ContainerRef>, v| {
            Metric::labelled("bytes", "B.", process_labels(pid, Some(1), c.as_ref()), v)
        };
        let folded = per_container(vec![
            Metric::gauge("up", "Up.", 1.0),
            of(10, &a, 1.0),
            of(11, &a, 2.0),
            of(12, &b, 4.0),
            of(13, &None, 8.0),
            of(14, &None, 16.0),
            Metric::labelled("kept", "K.", vec![("agent", "thp".into())], 1.0),
        ]);
        let got: Vec<(String, f64)> = folded
            .iter()
            .map(|m| (format!("{}{:?}", m.name, m.process), m.value))
            .collect();
        let id = |x: &str| format!("podman://{}", x.repeat(64));
        assert_eq!(
            got,
            vec![
                ("upNone".to_string(), 1.0),
                (
                    format!("bytesSome([(\"container_id\", \"{}\")])", id("a")),
                    3.0
                ),
                (
                    format!("bytesSome([(\"container_id\", \"{}\")])", id("b")),
                    4.0
                ),
                ("bytesSome([])".to_string(), 24.0),
                ("keptSome([(\"agent\", \"thp\")])".to_string(), 1.0),
            ]
        );
    }

    /// In the classic format a counter's family is named as its samples
    /// and the text has no end mark; gauges and labels are as they were.
    #[test]
    fn openmetrics_reads_as_the_classic_text_format() {
        let text = render(&[(
            "x",
            vec![
                Metric::counter("steps_total", "Steps taken.", 3.0),
                Metric::labelled("bytes", "B.", vec![("container", "a".into())], 2.0),
            ],
        )]);
        let c = classic(&text);
        assert!(
            c.contains(
                "# HELP pagewise_x_steps_total Steps taken.\n# TYPE pagewise_x_steps_total counter\n\
                 pagewise_x_steps_total 3.0\n"
            ),
            "{c}"
        );
        assert!(
            c.contains("# HELP pagewise_x_bytes B.\n# TYPE pagewise_x_bytes gauge\npagewise_x_bytes{container=\"a\"} 2.0\n"),
            "{c}"
        );
        assert!(!c.contains("# EOF"), "{c}");
        assert_eq!(c.lines().count(), text.lines().count() - 1);
    }

    /// The endpoint's text adds the serving process's own figures before
    /// the end; the rest is the text as it was.
    #[test]
    fn the_endpoint_says_the_process_own_figures() {
        let text = render(&[("x", vec![Metric::gauge("up", "Up.", 1.0)])]);
        let served = served(&text);
        let body = text.strip_suffix("# EOF\n").unwrap();
        assert!(served.starts_with(body), "{served}");
        assert!(served.ends_with("# EOF\n"), "{served}");
        let value = |name: &str| {
            served
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {name}: {served}"))
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(
            started <= now && started > now - 3600.0,
            "{started} against {now}"
        );
        assert!(value("process_resident_memory_bytes") > 0.0);
        assert!(value("process_cpu_seconds_total") >= 0.0);
    }

    #[test]
    fn metrics_render_as_openmetrics_text() {
        let me = std::process::id() as i32;
        let container = pagewise_mech::container::parse_cgroup_path(
            "/kubepods.slice/kubepods-pod1a2b_c3.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope",
        );
        let labelled = |v| {
            Metric::labelled(
                "promoted",
                "Huge pages promoted.",
                process_labels(me, Some(7), container.as_ref()),
                v,
            )
        };
        let odd = Metric::labelled(
            "odd",
            "A label to escape.",
            vec![("x", "a\"b\\c\nd".to_string())],
            1.0,
        );
        let m = vec![
            Metric::counter("steps_total", "Steps taken.", 3.0),
            Metric::gauge("watched", "Processes watched.", 1.0),
            labelled(7.0),
            labelled(8.0),
            odd,
        ];
        let other = vec![Metric::gauge("up", "Up.", 1.0)];
        let line = format!(
            "pagewise_x_promoted{{pid=\"{me}\",ns_pid=\"7\",container_id=\"containerd://{}\",pod_uid=\"1a2b-c3\"}}",
            "0123456789abcdef".repeat(4)
        );
        let build = format!(
            "# HELP pagewise_build_info The pagewise that serves these metrics: its version and commit (always 1).\n\
             # TYPE pagewise_build_info gauge\n\
             pagewise_build_info{{version=\"{}\",revision=\"{}\"}} 1.0\n",
            env!("CARGO_PKG_VERSION"),
            option_env!("PAGEWISE_COMMIT").unwrap_or("unknown")
        );
        assert_eq!(
            render(&[("x", m), ("y", other)]),
            format!(
                "{build}# HELP pagewise_x_steps Steps taken.\n# TYPE pagewise_x_steps counter\n\
                 pagewise_x_steps_total 3.0\n# HELP pagewise_x_watched Processes watched.\n\
                 # TYPE pagewise_x_watched gauge\npagewise_x_watched 1.0\n\
                 # HELP pagewise_x_promoted Huge pages promoted.\n# TYPE pagewise_x_promoted gauge\n\
                 {line} 8.0\n\
                 # HELP pagewise_x_odd A label to escape.\n# TYPE pagewise_x_odd gauge\n\
                 pagewise_x_odd{{x=\"a\\\"b\\\\c\\nd\"}} 1.0\n\
                 # HELP pagewise_y_up Up.\n# TYPE pagewise_y_up gauge\npagewise_y_up 1.0\n# EOF\n"
            )
        );
    }
}
