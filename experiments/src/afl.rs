//! AFL++ fuzzing one target three ways, in one run: through pagewise's
//! reset (`pagewise snapshot afl`: the target built with `afl-cc` for
//! coverage, otherwise unmodified), through AFL++'s own fork server (the
//! same source built with a deferred `__AFL_INIT()` after its state is
//! written: AFL++'s best fork-server setting for a target with a costly
//! start), and in AFL++'s persistent mode (its recommended form:
//! `__AFL_LOOP` over inputs in shared memory, the target changed to reset
//! itself, which this one does not: the state drifts from input to
//! input).
//!
//! The target (`examples/afl/target.c`) writes `MiB` of state at start-up,
//! then, per input, reads and writes `k` pages of it chosen by the input's
//! hash and walks a small parser of the input. Each mode is run by
//! `afl-fuzz -V SECONDS` from the same seeds, the modes interleaved,
//! `repeats` times; the figures are `afl-fuzz`'s own (`fuzzer_stats`:
//! executions a second, stability, paths found), medians with their
//! lowest and highest. For pagewise's runs, what the fork server served
//! (resets, where their time went, resets that took the whole path) is
//! read from its `--stats`.

use crate::svg::{Chart, Series};
use crate::Spread;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The target's source, built three ways.
const TARGET_C: &str = include_str!("../../examples/afl/target.c");
const FLOOR_C: &str = include_str!("../c/afl_floor.c");
const LIBFUZZER_MAIN_C: &str = include_str!("../c/afl_libfuzzer_main.c");
const EXPAT_CONFIG_H: &str = include_str!("../c/expat_config.h");

/// The experiment's sizes.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// State written at start-up, MiB.
    pub mib: usize,
    /// Pages read and written per input.
    pub k: usize,
    /// Seconds of fuzzing per run (`afl-fuzz -V`).
    pub seconds: u64,
    /// Runs per mode.
    pub repeats: usize,
    /// Real parsers fuzzed too, each the four ways, from their Debian
    /// source ([`PARSERS`]).
    pub parsers: Vec<String>,
}

impl Config {
    /// A smoke run: one 4-second run per mode.
    pub fn quick() -> Self {
        Config {
            mib: 64,
            k: 16,
            seconds: 4,
            repeats: 1,
            parsers: vec!["cjson".into(), "expat".into()],
        }
    }

    /// The experiment: five 30-second runs per mode.
    pub fn full() -> Self {
        Config {
            mib: 64,
            k: 16,
            seconds: 30,
            repeats: 5,
            parsers: vec!["cjson".into(), "expat".into()],
        }
    }
}

/// A real parser: its Debian source package, its sources (relative to
/// the unpacked package) with its libFuzzer target, and seeds.
struct Parser {
    name: &'static str,
    sources: &'static [&'static str],
    /// Directories of the package searched for headers.
    includes: &'static [&'static str],
    /// Further compiler flags.
    flags: &'static str,
    seeds: &'static [&'static [u8]],
}

/// The real parsers the benchmark knows.
const PARSERS: &[Parser] = &[
    Parser {
        name: "cjson",
        sources: &["cJSON.c", "fuzzing/cjson_read_fuzzer.c"],
        includes: &["."],
        flags: "",
        // Its target reads four option bytes, then a document ended by NUL.
        seeds: &[
            b"1111{\"a\":[1,2,{\"b\":\"c\"}],\"d\":-1.5e3}\0",
            b"0000[true,false,null,\"x\\u0041\"]\0",
            b"0101{\"k\":{\"k\":{\"k\":[]}}}\0",
        ],
    },
    Parser {
        name: "expat",
        sources: &[
            "expat/lib/xmlparse.c",
            "expat/lib/xmlrole.c",
            "expat/lib/xmltok.c",
            "expat/fuzz/xml_parse_fuzzer.c",
        ],
        includes: &["expat/lib"],
        // Its configuration (`expat_config.h`, written beside the build)
        // and the encoding its target is built for.
        flags: "-DENCODING_FOR_FUZZING=UTF-8",
        seeds: &[
            b"<?xml version=\"1.0\"?><a b=\"c\"><d>text &amp; more</d><!-- x --></a>",
            b"<!DOCTYPE r [<!ENTITY e \"v\">]><r xmlns:p=\"u\"><p:x>&e;</p:x><![CDATA[y]]></r>",
            b"<l><i n=\"1\"/><i n=\"2\"/><i n=\"3\">&#65;</i></l>",
        ],
    },
];

/// Builds parser `p`'s libFuzzer target with `flags` into `out`.
fn build_parser(dir: &Path, cc: &Path, p: &Parser, flags: &str, out: &Path) -> Result<()> {
    let src = pagewise_testkit::debian_source(p.name);
    let main = dir.join("libfuzzer_main.c");
    if !main.exists() {
        std::fs::write(&main, LIBFUZZER_MAIN_C)?;
        std::fs::write(dir.join("expat_config.h"), EXPAT_CONFIG_H)?;
    }
    let st = Command::new(cc)
        .args(["-O2", "-o"])
        .arg(out)
        .args(flags.split_whitespace())
        .args(p.flags.split_whitespace())
        .arg("-I")
        .arg(dir)
        .args(p.includes.iter().flat_map(|i| ["-I".into(), src.join(i)]))
        .arg(&main)
        .args(p.sources.iter().map(|f| src.join(f)))
        .env("AFL_QUIET", "1")
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("running {}", cc.display()))?;
    if !st.success() {
        bail!("{} {flags} failed on {}: {st}", cc.display(), p.name);
    }
    Ok(())
}

/// One real parser over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct ParserReport {
    /// Its Debian source package.
    pub name: String,
    /// Each mode.
    pub modes: Vec<ModeRow>,
}

/// One `afl-fuzz` run.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// `example` (`examples/afl/target.c`) or a real parser's name.
    pub target: String,
    /// `fork server`, `persistent`, `pagewise outside` or `pagewise inside`.
    pub mode: String,
    /// Which repeat.
    pub repeat: usize,
    /// `execs_per_sec`.
    pub execs_per_sec: f64,
    /// `execs_done`.
    pub execs_done: u64,
    /// `stability`, percent.
    pub stability_pct: f64,
    /// `corpus_count`.
    pub corpus_count: u64,
    /// `edges_found`.
    pub edges_found: u64,
    /// `saved_crashes`.
    pub saved_crashes: u64,
    /// `target_mode`.
    pub target_mode: String,
    /// pagewise's runs: what its fork server served (`--stats`).
    pub served: Option<serde_json::Value>,
}

/// One mode over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct ModeRow {
    /// The mode.
    pub mode: String,
    /// Executions a second.
    pub execs_per_sec: Spread,
    /// Stability, percent.
    pub stability_pct: Spread,
    /// Paths found (corpus size at the end).
    pub corpus_count: Spread,
    /// Edges found (`edges_found`).
    pub edges_found: Spread,
    /// Median executions a second over the fork server's.
    pub x_fork: f64,
    /// Median executions a second over persistent mode's.
    pub x_persistent: f64,
}

/// The kernel's costs that bound a reset made inside the program
/// (`experiments/c/afl_floor.c`), measured in the same run, at its start
/// and its end; and the executions a second they leave at most.
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    /// Each measurement, as the program printed it.
    pub samples: Vec<serde_json::Value>,
    /// Per execution, microseconds (the lower of the samples' sums): the
    /// walk of the state, the pages protected again, the program's faults
    /// on them, the pages copied back and two trapped calls.
    pub reset_floor_us: f64,
    /// Persistent mode's time per execution plus `reset_floor_us`, as
    /// executions a second: the most a reset inside the program can make.
    pub inside_max_execs_per_sec: f64,
    /// That, over persistent mode's executions a second.
    pub inside_max_x_persistent: f64,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The sizes.
    pub config: Config,
    /// `afl-fuzz`'s version.
    pub afl_version: String,
    /// Each mode.
    pub modes: Vec<ModeRow>,
    /// Every run.
    pub runs: Vec<Run>,
    /// The floor of a reset inside the program, where it was measured.
    pub floor: Option<Floor>,
    /// The real parsers, each the four ways.
    pub parsers: Vec<ParserReport>,
}

/// Builds (in `dir`) and runs `afl_floor.c` for `mib` MiB of state and
/// `k` pages written per input: its JSON line.
pub(crate) fn measure_floor(mib: usize, k: usize, dir: &Path) -> Result<serde_json::Value> {
    let bin = dir.join("afl_floor");
    if !bin.exists() {
        crate::compile_c(dir, "afl_floor", FLOOR_C, &["-O2"])?;
    }
    let out = Command::new(&bin)
        .args([mib.to_string(), k.to_string()])
        .output()
        .context("running afl_floor")?;
    anyhow::ensure!(
        out.status.success(),
        "afl_floor failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The modes: name, `afl-cc` flags, and the options of `pagewise
/// snapshot afl` where pagewise serves it (the reset from outside, with
/// ptrace, and the reset inside the program, by the preload shim).
const MODES: [(&str, &str, Option<&[&str]>); 4] = [
    ("fork server", "-DDEFERRED", None),
    ("persistent", "-DPERSISTENT", None),
    ("pagewise outside", "", Some(&["--outside"])),
    ("pagewise inside", "", Some(&[])),
];

/// `tool`, refused with how to install it where it is not on `PATH`.
fn need(tool: &str) -> Result<PathBuf> {
    anyhow::ensure!(
        crate::redis::which(tool),
        "{tool} is not installed (Debian: apt install afl++)"
    );
    Ok(PathBuf::from(tool))
}

fn build(dir: &Path, cc: &Path, flags: &str, name: &str) -> Result<PathBuf> {
    let out = dir.join(name);
    let st = Command::new(cc)
        .args(["-O2", "-o"])
        .arg(&out)
        .args(flags.split_whitespace())
        .arg(dir.join("target.c"))
        .env("AFL_QUIET", "1")
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("running {}", cc.display()))?;
    if !st.success() {
        bail!("{} {flags} failed on the target: {st}", cc.display());
    }
    Ok(out)
}

/// `fuzzer_stats` as key and value.
fn stats(path: &Path) -> Result<Vec<(String, String)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect())
}

fn field<T: std::str::FromStr>(all: &[(String, String)], key: &str) -> Result<T> {
    let v = all
        .iter()
        .find(|(k, _)| k == key)
        .with_context(|| format!("fuzzer_stats has no {key}"))?;
    v.1.trim_end_matches('%')
        .parse()
        .map_err(|_| anyhow::anyhow!("fuzzer_stats: {key} = {:?}", v.1))
}

/// One `afl-fuzz` run of `cmd` for `cfg.seconds`.
#[allow(clippy::too_many_arguments)]
fn fuzz(
    cfg: &Config,
    dir: &Path,
    target: &str,
    mode: &str,
    cmd: &[PathBuf],
    args: &[String],
    pagewise: Option<&[&str]>,
    repeat: usize,
) -> Result<Run> {
    let afl = need("afl-fuzz")?;
    let tag = format!("{target}-{}-{repeat}", mode.replace(' ', "-"));
    let out = dir.join(format!("out-{tag}"));
    let _ = std::fs::remove_dir_all(&out);
    let log = std::fs::File::create(dir.join(format!("{tag}.log")))?;
    let served = dir.join("served.json");
    let _ = std::fs::remove_file(&served);
    let mut c = Command::new(afl);
    c.arg("-i")
        .arg(dir.join(format!("in-{target}")))
        .arg("-o")
        .arg(&out)
        .args(["-V", &cfg.seconds.to_string(), "--"]);
    if let Some(options) = pagewise {
        c.arg(crate::pagewise_tool()?)
            .args(["snapshot", "afl"])
            .args(options)
            .arg("--stats")
            .arg(&served)
            .arg("--");
    }
    c.args(cmd)
        .args(args)
        .env("AFL_NO_UI", "1")
        .env("AFL_SKIP_CPUFREQ", "1")
        .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if pagewise.is_some() {
        // afl-fuzz looks for AFL++'s marks in the program it runs, which
        // is pagewise here.
        c.env("AFL_SKIP_BIN_CHECK", "1");
    }
    pagewise_agent::child::tie(&mut c);
    let mut child = c.spawn().context("starting afl-fuzz")?;
    let limit = Duration::from_secs(cfg.seconds + 120);
    let Some(st) = pagewise_agent::child::wait_for(&mut child, limit) else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("afl-fuzz ({mode}) did not end within {} s", limit.as_secs());
    };
    if !st.success() {
        bail!(
            "afl-fuzz ({target}, {mode}) failed ({st}): see {}",
            dir.join(format!("{tag}.log")).display()
        );
    }
    let s = stats(&out.join("default/fuzzer_stats"))?;
    let served = if pagewise.is_some() {
        let text = std::fs::read_to_string(&served).context("reading pagewise's --stats")?;
        Some(serde_json::from_str(&text)?)
    } else {
        None
    };
    Ok(Run {
        target: target.to_string(),
        mode: mode.to_string(),
        repeat,
        execs_per_sec: field(&s, "execs_per_sec")?,
        execs_done: field(&s, "execs_done")?,
        stability_pct: field(&s, "stability")?,
        corpus_count: field(&s, "corpus_count")?,
        edges_found: field(&s, "edges_found")?,
        saved_crashes: field(&s, "saved_crashes")?,
        target_mode: s
            .iter()
            .find(|(k, _)| k == "target_mode")
            .map(|(_, v)| v.clone())
            .unwrap_or_default(),
        served,
    })
}

/// Runs the experiment.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let cc = need("afl-cc")?;
    need("afl-fuzz")?;
    let dir = std::env::temp_dir().join(format!("pagewise-bench-afl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("in-example"))?;
    let r = run_in(cfg, &cc, &dir, progress);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn run_in(cfg: &Config, cc: &Path, dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let (cc, dir) = (cc.to_path_buf(), dir.to_path_buf());
    std::fs::write(dir.join("target.c"), TARGET_C)?;
    std::fs::write(dir.join("in-example/hello"), b"hello")?;
    std::fs::write(
        dir.join("in-example/bytes"),
        [0u8, 1, 2, 3, 250, 251, 252, 253],
    )?;
    progress("building the target three ways with afl-cc");
    let mut by_flags: Vec<(&str, PathBuf)> = Vec::new();
    let mut built = Vec::new();
    for (i, (mode, flags, pagewise)) in MODES.iter().enumerate() {
        let bin = match by_flags.iter().find(|(f, _)| f == flags) {
            Some((_, b)) => b.clone(),
            None => {
                let b = build(&dir, &cc, flags, &format!("target{i}"))?;
                by_flags.push((flags, b.clone()));
                b
            }
        };
        built.push((*mode, bin, *pagewise));
    }
    // Each parser the four ways: (parser, [(mode, binary, options)]).
    let mut parsers = Vec::new();
    for name in &cfg.parsers {
        let p = PARSERS
            .iter()
            .find(|p| p.name == name)
            .with_context(|| format!("no parser {name} (known: cjson, expat)"))?;
        anyhow::ensure!(
            pagewise_testkit::debian_source(p.name)
                .join(p.sources[0])
                .exists(),
            "{}'s Debian source is not at {} (scripts/setup.sh unpacks it)",
            p.name,
            pagewise_testkit::debian_source(p.name).display()
        );
        progress(&format!("building {} three ways with afl-cc", p.name));
        let seeds = dir.join(format!("in-{}", p.name));
        std::fs::create_dir_all(&seeds)?;
        for (i, seed) in p.seeds.iter().enumerate() {
            std::fs::write(seeds.join(format!("seed{i}")), seed)?;
        }
        let mut bins: Vec<(&str, PathBuf, Option<&[&str]>)> = Vec::new();
        for (mode, flags, pagewise) in MODES.iter() {
            let out = dir.join(format!("{}-{}", p.name, flags.trim_start_matches("-D")));
            if !out.exists() {
                build_parser(&dir, &cc, p, flags, &out)?;
            }
            bins.push((*mode, out, *pagewise));
        }
        parsers.push((p.name, bins));
    }
    // afl-fuzz's first line names its version ("afl-fuzz++4.04c based on…").
    let version = Command::new(need("afl-fuzz")?)
        .arg("-h")
        .output()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            text.split_whitespace()
                .find_map(|w| w.split("afl-fuzz").nth(1).map(str::to_string))
                .map(|v| {
                    v.trim_start_matches("++")
                        .trim_end_matches("\u{1b}[0m")
                        .to_string()
                })
                .unwrap_or_default()
        })
        .unwrap_or_default();
    progress("measuring the floor of a reset inside the program");
    let mut samples = vec![measure_floor(cfg.mib, cfg.k, &dir)?];
    let mut runs = Vec::new();
    let t0 = Instant::now();
    let example_args = [cfg.mib.to_string(), cfg.k.to_string()];
    for repeat in 0..cfg.repeats {
        let all = std::iter::once(("example", &built, &example_args[..]))
            .chain(parsers.iter().map(|(n, b)| (*n, b, &[][..])));
        for (target, bins, args) in all {
            for (mode, bin, pagewise) in bins.iter() {
                progress(&format!(
                    "{target}, {mode}, run {} of {} ({} s each; {:.0} s so far)",
                    repeat + 1,
                    cfg.repeats,
                    cfg.seconds,
                    t0.elapsed().as_secs_f64()
                ));
                runs.push(fuzz(
                    cfg,
                    &dir,
                    target,
                    mode,
                    std::slice::from_ref(bin),
                    args,
                    *pagewise,
                    repeat,
                )?);
            }
        }
    }
    let median_of = |mode: &str| {
        let v: Vec<f64> = runs
            .iter()
            .filter(|r| r.mode == mode && r.target == "example")
            .map(|r| r.execs_per_sec)
            .collect();
        Spread::of(v).median
    };
    samples.push(measure_floor(cfg.mib, cfg.k, &dir)?);
    let persistent = median_of("persistent");
    let reset_floor_us = samples
        .iter()
        .map(|v| {
            let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            f("walk_us") + f("protect_us") + f("fault_us") + f("copy_us") + 2.0 * f("trap_us")
        })
        .fold(f64::INFINITY, f64::min);
    let max = 1e6 / (1e6 / persistent + reset_floor_us);
    let floor = Some(Floor {
        samples,
        reset_floor_us,
        inside_max_execs_per_sec: max,
        inside_max_x_persistent: max / persistent,
    });
    let modes = mode_rows(&runs, "example");
    let parsers = parsers
        .iter()
        .map(|(name, _)| ParserReport {
            name: name.to_string(),
            modes: mode_rows(&runs, name),
        })
        .collect();
    Ok(Report {
        config: cfg.clone(),
        afl_version: version,
        modes,
        runs,
        floor,
        parsers,
    })
}

/// Each mode of `target` over its runs, against its own fork server and
/// persistent mode.
fn mode_rows(runs: &[Run], target: &str) -> Vec<ModeRow> {
    let of_mode = |mode: &str, f: &dyn Fn(&Run) -> f64| {
        Spread::of(
            runs.iter()
                .filter(|r| r.mode == mode && r.target == target)
                .map(f)
                .collect(),
        )
    };
    let fork = of_mode("fork server", &|r| r.execs_per_sec).median;
    let persistent = of_mode("persistent", &|r| r.execs_per_sec).median;
    MODES
        .iter()
        .map(|(mode, _, _)| {
            let eps = of_mode(mode, &|r| r.execs_per_sec);
            ModeRow {
                mode: mode.to_string(),
                x_fork: eps.median / fork,
                x_persistent: eps.median / persistent,
                execs_per_sec: eps,
                stability_pct: of_mode(mode, &|r| r.stability_pct),
                corpus_count: of_mode(mode, &|r| r.corpus_count as f64),
                edges_found: of_mode(mode, &|r| r.edges_found as f64),
            }
        })
        .collect()
}

impl Report {
    /// The report as text.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "AFL++ {} on a target with {} MiB of state, {} pages per input; {} runs of {} s per mode",
            self.afl_version, self.config.mib, self.config.k, self.config.repeats, self.config.seconds
        );
        let _ = writeln!(
            s,
            "{:<17} {:>10} {:>21} {:>10} {:>8} {:>8} {:>6} {:>6}",
            "mode", "execs/s", "[min..max]", "stability", "x fork", "x pers.", "paths", "edges"
        );
        let row = |s: &mut String, m: &ModeRow| {
            let _ = writeln!(
                s,
                "{:<17} {:>10.0} {:>21} {:>9.1}% {:>8.2} {:>8.2} {:>6.0} {:>6.0}",
                m.mode,
                m.execs_per_sec.median,
                format!("[{:.0}..{:.0}]", m.execs_per_sec.min, m.execs_per_sec.max),
                m.stability_pct.median,
                m.x_fork,
                m.x_persistent,
                m.corpus_count.median,
                m.edges_found.median
            );
        };
        for m in &self.modes {
            row(&mut s, m);
        }
        for p in &self.parsers {
            let _ = writeln!(s, "{} (Debian's source, its libFuzzer target):", p.name);
            for m in &p.modes {
                row(&mut s, m);
            }
        }
        if let Some(f) = &self.floor {
            let _ = writeln!(
                s,
                "floor of a reset inside the program: {:.1} µs an execution (walk, protect, faults, copy, 2 traps: {}), so at most {:.0} execs/s = {:.2}x persistent mode",
                f.reset_floor_us,
                f.samples.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" then "),
                f.inside_max_execs_per_sec,
                f.inside_max_x_persistent
            );
        }
        for r in self.runs.iter().filter(|r| r.served.is_some()) {
            let v = r.served.as_ref().expect("filtered");
            let _ = writeln!(
                s,
                "{} {} run {}: {} runs, {} reset inside, {} whole-path, {} failed, {:.1} pages, reset {:.1} µs (check {:.1} walk {:.1} copy {:.1}), program {:.1} µs",
                r.target,
                r.mode,
                r.repeat,
                v["runs"],
                v["inside_resets"],
                v["full_resets"],
                v["failed_resets"],
                v["pages_dirty"].as_f64().unwrap_or(f64::NAN),
                v["reset_us"].as_f64().unwrap_or(f64::NAN),
                v["reset_phases"]["check_us"].as_f64().unwrap_or(f64::NAN),
                v["reset_phases"]["walk_us"].as_f64().unwrap_or(f64::NAN),
                v["reset_phases"]["copy_us"].as_f64().unwrap_or(f64::NAN),
                v["run_us"].as_f64().unwrap_or(f64::NAN),
            );
        }
        s
    }

    /// Executions a second per mode, every run.
    pub fn charts(&self) -> Vec<(String, Chart)> {
        let series = MODES
            .iter()
            .map(|(mode, _, _)| Series {
                label: mode.to_string(),
                points: self
                    .runs
                    .iter()
                    .filter(|r| r.mode == *mode && r.target == "example")
                    .map(|r| (r.repeat as f64 + 1.0, r.execs_per_sec))
                    .collect(),
            })
            .collect();
        vec![(
            "execs.svg".into(),
            Chart {
                title: format!(
                    "AFL++ executions a second, {} MiB of state, {} pages per input",
                    self.config.mib, self.config.k
                ),
                x_label: "run".into(),
                y_label: "executions a second".into(),
                log_x: false,
                log_y: true,
                series,
            },
        )]
    }
}
