//! Counters in the Prometheus text format, as the agents export them.

/// Appends one metric in the Prometheus text format (its help, its type
/// and its value) to `out`.
pub fn prometheus_metric(out: &mut String, name: &str, kind: &str, help: &str, v: f64) {
    *out += &format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n");
}
