//! Where a benchmark's progress and report go: the flags every experiment
//! takes (`--json`, `--out`) and the progress line on stderr.

use anyhow::{Context, Result};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// Progress on stderr: a spinner with the step's message on a terminal;
/// nothing otherwise, or one line per step with
/// `PAGEWISE_PROGRESS_LINES=1` (a benchmark's log); nothing when `quiet`.
pub fn progress(quiet: bool) -> impl FnMut(&str) {
    let tty = std::io::stderr().is_terminal();
    let lines = std::env::var_os("PAGEWISE_PROGRESS_LINES").is_some_and(|v| v == "1");
    let t0 = std::time::Instant::now();
    let spinner = (tty && !quiet).then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {elapsed:>4} [{pos:>3}] {msg}")
                .expect("a valid template"),
        );
        b.enable_steady_tick(std::time::Duration::from_millis(120));
        b
    });
    let mut n = 0u32;
    move |msg: &str| {
        n += 1;
        match &spinner {
            Some(b) => {
                b.set_position(n.into());
                b.set_message(msg.to_string());
            }
            // Not a terminal: nothing, unless lines are asked for (a log
            // of a long run): PAGEWISE_PROGRESS_LINES=1.
            None if !quiet && lines => {
                let mut e = std::io::stderr();
                let _ = writeln!(e, "[{n:>3}] {:>6.1}s {msg}", t0.elapsed().as_secs_f64());
            }
            None => {}
        }
    }
}

/// Where a benchmark's report goes: every experiment takes these flags.
#[derive(clap::Args, Clone, Debug)]
pub struct Output {
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write report.json, summary.txt and SVG plots into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl Output {
    /// Prints a report (JSON or its summary) and writes it with its plots
    /// into `out`; the exit code.
    pub fn emit(
        &self,
        report: &impl serde::Serialize,
        summary: String,
        charts: Vec<(String, crate::svg::Chart)>,
    ) -> Result<i32> {
        // Every report says where, when and how it was measured.
        let p = crate::provenance::now();
        let mut v = serde_json::to_value(report)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("provenance".into(), serde_json::to_value(&p)?);
        }
        let summary = format!(
            "commit {}; {} to {}; load {:.2} -> {:.2}; {} ({})\ncommand: {}\n{summary}",
            p.commit.as_deref().unwrap_or("unknown"),
            p.started,
            p.ended,
            p.load.0,
            p.load.1,
            p.host,
            p.kernel_build,
            p.command
        );
        if self.json {
            println!("{}", serde_json::to_string(&v)?);
        } else {
            print!("{summary}");
        }
        if let Some(dir) = &self.out {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&v)?)?;
            std::fs::write(dir.join("summary.txt"), summary)?;
            for (name, chart) in charts {
                std::fs::write(dir.join(&name), chart.render())?;
            }
            eprintln!("pagewise: wrote {}", dir.display());
        }
        Ok(0)
    }
}
