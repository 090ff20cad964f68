//! pagewise's benchmarks: the experiments of the papers, run against their
//! baselines in the same run, reported as ratios (`pagewise bench`, CI's
//! smoke runs). Not part of the library.

pub mod cli;
pub mod dump;
pub mod farmem;
pub mod farmem_redis;
pub mod inspect;
pub mod redis;
pub mod snap;
pub mod svg;
pub mod track;

use serde::Serialize;

/// The machine a result was measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Kernel release.
    pub kernel: String,
    /// CPU model name.
    pub cpu: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Memory in GiB.
    pub mem_gib: f64,
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} CPUs, {:.1} GiB), Linux {}",
            self.cpu, self.cpus, self.mem_gib, self.kernel
        )
    }
}

impl Machine {
    /// Describes this machine.
    pub fn this() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Machine {
            kernel: pagewise::probe::get().kernel.clone(),
            cpu,
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            mem_gib: pagewise::procfs::status_field(&meminfo, "MemTotal").unwrap_or(0) as f64
                / 1048576.0,
        }
    }
}

/// Median of a non-empty sample.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
