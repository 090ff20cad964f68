//! `pagewise report`: what the tools record, as one self-contained HTML
//! page of interactive plots (uPlot, MIT, shipped inside the page: no
//! network needed), and a Chrome/Perfetto trace of far-memory runs.
//!
//! Inputs are recognised by their content, one file each:
//! - a `track --json` stream: dirty pages over time per mapping, and a
//!   heatmap of write coverage per 2 MiB region over time;
//! - a `farmem run --trace` file (`FILE.PID`): far-memory faults and
//!   evictions over time, and the fetches' latency (median and 99th
//!   percentile per interval);
//! - an agent's `--json` log (`thp run`, `dedup run`): its decisions on a
//!   timeline, and their running count;
//! - an `inspect --json` report: its regions, largest first.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::{Path, PathBuf};

mod plots;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  pagewise track --json --interval-ms 200 --count 50 --pid 4242 > track.jsonl\n  pagewise farmem run --local-pages 1000 --trace t -- ./prog\n  pagewise report track.jsonl t.* --out report.html\n  pagewise report t.* --chrome-trace farmem.json   # for ui.perfetto.dev or chrome://tracing"
)]
pub struct Args {
    /// Files the tools wrote: a track --json stream, farmem run --trace
    /// files, a thp run or dedup run --json log, an inspect --json report.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Write the HTML page here.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Write the far-memory traces as a Chrome/Perfetto trace (JSON) here.
    #[arg(long, value_name = "FILE")]
    chrome_trace: Option<PathBuf>,
    /// The page's title.
    #[arg(long)]
    title: Option<String>,
}

/// The most a file may hold: these are the tools' own records.
const MAX_BYTES: u64 = 1 << 31;

/// One input, by what wrote it.
pub(crate) enum Input {
    Track(Vec<Value>),
    Trace {
        pid: Option<i64>,
        events: Vec<Value>,
    },
    Agent(Vec<Value>),
    Inspect(Value),
}

/// The JSON objects of `path`, one per line (a pretty-printed single
/// object is read whole); lines that are not JSON objects are counted.
fn objects(path: &Path) -> Result<(Vec<Value>, usize)> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    if f.metadata()?.len() > MAX_BYTES {
        bail!("{}: more than {} bytes", path.display(), MAX_BYTES);
    }
    let text = std::io::read_to_string(f).with_context(|| format!("reading {}", path.display()))?;
    if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(&text) {
        return Ok((vec![v], 0));
    }
    let (mut out, mut skipped) = (Vec::new(), 0);
    for line in std::io::Cursor::new(text).lines() {
        let line = line?;
        match serde_json::from_str::<Value>(line.trim()) {
            Ok(v @ Value::Object(_)) => out.push(v),
            _ if line.trim().is_empty() => {}
            _ => skipped += 1,
        }
    }
    Ok((out, skipped))
}

/// What wrote `path`, from its first objects; `None` for an empty file (a
/// process of a far-memory run that fetched nothing leaves one).
fn classify(path: &Path) -> Result<Option<Input>> {
    let (objs, skipped) = objects(path)?;
    if skipped > 0 {
        eprintln!(
            "pagewise: {}: {skipped} lines that are not JSON objects left out",
            path.display()
        );
    }
    let Some(first) = objs.first() else {
        eprintln!("pagewise: {}: empty, left out", path.display());
        return Ok(None);
    };
    let has = |k: &str| first.get(k).is_some();
    Ok(Some(if has("dirty_pages") && has("ranges") {
        Input::Track(objs)
    } else if has("t_ns") && has("addr") && has("kind") {
        let pid = path
            .extension()
            .and_then(|e| e.to_str())
            .and_then(|e| e.parse().ok());
        Input::Trace { pid, events: objs }
    } else if has("rss_bytes") && has("regions") {
        Input::Inspect(objs.into_iter().next().expect("one"))
    } else if objs
        .iter()
        .any(|o| o.get("actions").is_some() && o.get("t_ms").is_some())
    {
        Input::Agent(
            objs.into_iter()
                .filter(|o| o.get("t_ms").is_some())
                .collect(),
        )
    } else {
        bail!(
            "{}: not a track --json stream, a farmem trace, an agent's --json log or an inspect --json report",
            path.display()
        );
    }))
}

pub fn run(a: Args) -> Result<i32> {
    if a.out.is_none() && a.chrome_trace.is_none() {
        crate::usage!("say where to write: --out FILE.html, --chrome-trace FILE.json, or both");
    }
    let mut inputs: Vec<(PathBuf, Input)> = Vec::new();
    for p in &a.inputs {
        if let Some(i) = classify(p)? {
            inputs.push((p.clone(), i));
        }
    }
    if let Some(path) = &a.chrome_trace {
        let t = plots::chrome_trace(&inputs);
        let n = t["traceEvents"].as_array().map_or(0, Vec::len);
        if n == 0 {
            crate::usage!("--chrome-trace: none of the inputs is a farmem run --trace file");
        }
        std::fs::write(path, serde_json::to_vec(&t)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("pagewise: {n} trace events written to {}", path.display());
    }
    if let Some(path) = &a.out {
        let mut all = Vec::new();
        for (p, i) in &inputs {
            all.extend(plots::of(p, i));
        }
        let title = a.title.clone().unwrap_or_else(|| {
            let names: Vec<String> = a.inputs.iter().map(|p| p.display().to_string()).collect();
            format!("pagewise report: {}", names.join(", "))
        });
        let page = page(&json!({ "title": title, "plots": all }))?;
        std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "pagewise: {} plots written to {}",
            all.len(),
            path.display()
        );
    }
    Ok(0)
}

const UPLOT_JS: &str = include_str!("../assets/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../assets/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../assets/uPlot.LICENSE");
const REPORT_JS: &str = include_str!("../assets/report.js");

/// `data` as JSON that no input can end or comment out the script element
/// it is put in: `<`, `>` and `&` (which begin `</script`, `<!--` and
/// `-->`) and U+2028/U+2029 (line ends to older script parsers) written
/// as `\uXXXX`, which JSON reads back as the same characters. They occur
/// in strings only: JSON's own syntax has none of them.
fn script_safe_json(data: &Value) -> Result<String> {
    let text = serde_json::to_string(data)?;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The page: the data as JSON, uPlot and the drawing script inline.
fn page(data: &Value) -> Result<String> {
    let data = script_safe_json(data)?;
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n\
         <title>pagewise report</title>\n\
         <!-- uPlot {version}, shipped inside this page under its licence:\n{license}-->\n\
         <style>{UPLOT_CSS}\n\
         body {{ font: 14px system-ui, sans-serif; margin: 20px; color: #222; }}\n\
         section.plot {{ margin: 24px 0; }} h2 {{ font-size: 16px; }} p.note {{ color: #555; }}\n\
         table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: right; }}\n\
         #pw-status {{ display: none; }}</style>\n\
         </head><body>\n<h1 id=\"pw-title\"></h1>\n<div id=\"pw-plots\"></div>\n<pre id=\"pw-status\"></pre>\n\
         <script type=\"application/json\" id=\"pw-data\">{data}</script>\n\
         <script>{UPLOT_JS}</script>\n<script>{REPORT_JS}</script>\n</body></html>\n",
        version = "1.6.32",
        license = UPLOT_LICENSE.replace("--", "- -"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hostile strings anywhere in the data neither end nor comment out
    /// the script that holds it, and read back as they were.
    #[test]
    fn no_input_ends_or_comments_out_the_data() {
        let hostile = "<!--<script>x</script>--> & \u{2028}\u{2029} </SCRIPT";
        let v = json!({ "title": hostile, "plots": [{ "title": hostile, "x": [1] }] });
        let html = page(&v).unwrap();
        let start = html.find("id=\"pw-data\">").unwrap() + "id=\"pw-data\">".len();
        let end = start + html[start..].find("</script>").unwrap();
        let data = &html[start..end];
        for bad in ["<", ">", "&", "\u{2028}", "\u{2029}"] {
            assert!(!data.contains(bad), "{bad:?} in the data: {data}");
        }
        let back: Value = serde_json::from_str(data).unwrap();
        assert_eq!(back, v);
    }
}
