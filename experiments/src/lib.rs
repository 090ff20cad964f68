//! pagewise's benchmarks: the experiments of the papers, run against their
//! baselines in the same run, reported as ratios (`pagewise bench`, CI's
//! smoke runs). Not part of the library.

pub mod afl;
pub mod checkpoint;
pub mod cli;
pub mod criu;
pub mod dedup;
pub mod dedup_redis;
pub mod dump;
pub mod farmem;
pub mod farmem_redis;
pub mod inspect;
pub mod kernel;
pub mod live;
pub mod node;
pub mod outside;
pub mod prezero;
pub mod provenance;
pub mod redis;
pub mod report;
pub mod reset;
mod reset_inside;
pub mod reset_walk;
pub mod rollback;
pub mod snap;
pub mod sparse;
pub mod svg;
pub mod thp;
pub mod thp_fair;
pub mod thp_redis;
pub mod thp_redis_get;
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
            kernel: pagewise_mech::probe::get().kernel.clone(),
            cpu,
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            mem_gib: pagewise_testkit::host::status_field(&meminfo, "MemTotal").unwrap_or(0) as f64
                / 1048576.0,
        }
    }
}

/// A measure's median with its lowest and highest.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Lowest.
    pub min: f64,
    /// Highest.
    pub max: f64,
}

impl Spread {
    /// Of a non-empty sample.
    pub fn of(v: Vec<f64>) -> Spread {
        let (median, min, max) = median_min_max(v);
        Spread { median, min, max }
    }
}

/// Median, min and max of a non-empty sample.
pub fn median_min_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (median(&mut v), lo, hi)
}

/// `v` as a percentage of `of`, one decimal, or `-` where there is no
/// `of` to compare with.
pub fn pct(v: f64, of: f64) -> String {
    if of > 0.0 {
        format!("{:.1}%", v / of * 100.0)
    } else {
        "-".into()
    }
}

/// Each distinct name once, in the order it first comes (the policies of
/// a report's rows, as they ran).
pub fn in_order<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for n in names {
        if !v.contains(&n) {
            v.push(n);
        }
    }
    v
}

/// How a summary says whether a goal was reached.
pub fn met(yes: bool) -> &'static str {
    if yes {
        "met"
    } else {
        "not met"
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

/// The memory-bandwidth baseline of every "× read once" ratio: seconds to
/// read `mem` once, sequentially on one core, summing 64-byte lines; the
/// median of `reps` passes.
pub fn read_once_s(mem: &pagewise_mech::workload::AnonMemory, reps: usize) -> f64 {
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = std::time::Instant::now();
        // SAFETY: the mapping is ours and fully inside `mem`; u64 reads are aligned.
        let words =
            unsafe { std::slice::from_raw_parts(mem.as_ptr() as *const u64, mem.len() / 8) };
        let mut acc = 0u64;
        for c in words.chunks_exact(8) {
            acc = acc.wrapping_add(c[0] ^ c[1] ^ c[2] ^ c[3] ^ c[4] ^ c[5] ^ c[6] ^ c[7]);
        }
        std::hint::black_box(acc);
        times.push(t0.elapsed().as_secs_f64());
    }
    median(&mut times)
}

/// Compiles C `source` (an experiment's own program, embedded in it) into
/// `dir/name` with `cc` and the flags `flags`: the program's path.
pub(crate) fn compile_c(
    dir: &std::path::Path,
    name: &str,
    source: &str,
    flags: &[&str],
) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    let src = dir.join(format!("{name}.c"));
    let bin = dir.join(name);
    std::fs::write(&src, source)?;
    let st = std::process::Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .context("running cc")?;
    anyhow::ensure!(st.success(), "cc failed on {name}.c: {st}");
    Ok(bin)
}

/// The `pagewise` tool, which some benchmarks run (a program tracked by
/// `pagewise track`, under `pagewise farmem run`, a `pagewise workload`):
/// `$PAGEWISE` if set, else `pagewise` beside this program (where `cargo
/// build` and `make install` put both).
pub fn pagewise_tool() -> anyhow::Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("PAGEWISE") {
        return Ok(p.into());
    }
    let me = std::env::current_exe()?;
    let beside = me.with_file_name("pagewise");
    anyhow::ensure!(
        beside.exists(),
        "the pagewise tool is not beside {} (build it, or set PAGEWISE to its path)",
        me.display()
    );
    Ok(beside)
}

/// An experiment's own check that failed (a result would be wrong, a
/// thread it started died, what it needs is missing), as the library's
/// error: what failed, said in full.
pub(crate) fn check_failed(what: impl Into<String>) -> pagewise::Error {
    pagewise::Error::os(what, std::io::Error::other("the experiment stopped"))
}
