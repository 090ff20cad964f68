//! Agents' metrics in the Prometheus exposition: OpenMetrics text, as the
//! `prometheus-client` crate encodes it (each family's help and type once,
//! a counter's samples ending in `_total`, `# EOF` last). Prometheus
//! scrapes it as OpenMetrics; node_exporter's textfile collector reads it
//! as the classic text format (where a counter's samples read as untyped,
//! their names and values the same).

use pagewise_mech::agent::{Agent, Metric};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The content type of [`render`]'s text, as the endpoint serves it.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A family's series, one per set of labels (none for a plain metric).
type Labels = Vec<(&'static str, String)>;

/// The metrics of each agent named (`pagewise_NAME_…`), in one text: each
/// name's series together, in the order names first appear.
pub fn render(groups: &[(&str, Vec<Metric>)]) -> String {
    let mut root = Registry::default();
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

fn labels(m: &Metric) -> Labels {
    m.process.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewise_mech::agent::process_labels;

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
            "pagewise_x_promoted{{pid=\"{me}\",ns_pid=\"7\",container=\"0123456789ab\",runtime=\"containerd\",pod=\"1a2b-c3\"}}"
        );
        assert_eq!(
            render(&[("x", m), ("y", other)]),
            format!(
                "# HELP pagewise_x_steps Steps taken.\n# TYPE pagewise_x_steps counter\n\
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
