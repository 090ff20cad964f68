//! The plots of each kind of input, as the page's script draws them: lines
//! and points (`x`, `series` of `values`), heatmaps (`x`, `rows`, `cells`
//! of 0 to 1) and tables.

use super::Input;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

const PAGE: u64 = 4096;
const HUGE: u64 = 2 << 20;
/// Mappings drawn one by one; the rest are summed as "other".
const TOP_MAPPINGS: usize = 8;
/// 2 MiB regions in a heatmap (those written most).
const TOP_REGIONS: usize = 128;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The plots of one input.
pub(super) fn of(path: &Path, input: &Input) -> Vec<Value> {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    match input {
        Input::Track(lines) => track(&name, lines),
        Input::Trace { pid, events } => trace(&name, *pid, events),
        Input::Agent(steps) => agent(&name, steps),
        Input::Inspect(rep) => inspect(&name, rep),
    }
}

/// `(start, pages)` ranges of a track line.
fn ranges(line: &Value) -> impl Iterator<Item = (u64, u64)> + '_ {
    line["ranges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| Some((r.get(0)?.as_u64()?, r.get(1)?.as_u64()?)))
}

/// The mappings of a track stream: its `regions` where it names them,
/// else the address runs its ranges fall in (gaps of 1 GiB or more apart).
fn mappings(lines: &[Value]) -> Vec<(u64, u64)> {
    if let Some(rs) = lines.iter().find_map(|l| l["regions"].as_array()) {
        let mut out: Vec<(u64, u64)> = rs
            .iter()
            .filter_map(|r| Some((r.get(0)?.as_u64()?, r.get(1)?.as_u64()?)))
            .map(|(s, len)| (s, s.saturating_add(len)))
            .collect();
        out.sort_unstable();
        if !out.is_empty() {
            return out;
        }
    }
    let mut spans: Vec<(u64, u64)> = lines
        .iter()
        .flat_map(ranges)
        .map(|(s, n)| (s, s.saturating_add(n.saturating_mul(PAGE))))
        .collect();
    spans.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in spans {
        match out.last_mut() {
            Some(last) if s < last.1.saturating_add(1 << 30) => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

fn track(name: &str, lines: &[Value]) -> Vec<Value> {
    let maps = mappings(lines);
    let which = |a: u64| {
        maps.partition_point(|m| m.0 <= a)
            .checked_sub(1)
            .filter(|&i| a < maps[i].1)
    };
    let x: Vec<f64> = lines.iter().map(|l| u(&l["t_ms"]) as f64 / 1e3).collect();
    // Pages per mapping per line, and per 2 MiB region per line.
    let mut per_map = vec![vec![0u64; lines.len()]; maps.len() + 1];
    let mut per_region: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (i, l) in lines.iter().enumerate() {
        for (start, pages) in ranges(l) {
            per_map[which(start).unwrap_or(maps.len())][i] += pages;
            let end = start.saturating_add(pages.saturating_mul(PAGE));
            let mut a = start;
            while a < end {
                let next = ((a / HUGE) + 1).saturating_mul(HUGE).min(end);
                per_region
                    .entry(a / HUGE)
                    .or_insert_with(|| vec![0; lines.len()])[i] += (next - a) / PAGE;
                a = next;
            }
        }
    }
    let mut order: Vec<usize> = (0..maps.len()).collect();
    order.sort_by_key(|&m| std::cmp::Reverse(per_map[m].iter().sum::<u64>()));
    let mut series: Vec<Value> = order
        .iter()
        .take(TOP_MAPPINGS)
        .filter(|&&m| per_map[m].iter().any(|&v| v > 0))
        .map(|&m| {
            let (s, e) = maps[m];
            json!({ "label": format!("{s:#x} ({:.1} MiB)", (e - s) as f64 / 1048576.0), "values": per_map[m] })
        })
        .collect();
    let mut other = per_map[maps.len()].clone();
    for &m in order.iter().skip(TOP_MAPPINGS) {
        for (o, v) in other.iter_mut().zip(&per_map[m]) {
            *o += v;
        }
    }
    if other.iter().any(|&v| v > 0) {
        series.push(json!({ "label": "other", "values": other }));
    }
    let mut rows: Vec<(u64, Vec<u64>)> = per_region.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.iter().sum::<u64>()));
    rows.truncate(TOP_REGIONS);
    rows.sort_by_key(|r| r.0);
    let cells: Vec<Vec<f64>> = rows
        .iter()
        .map(|(_, v)| v.iter().map(|&p| p as f64 / (HUGE / PAGE) as f64).collect())
        .collect();
    let labels: Vec<String> = rows
        .iter()
        .map(|(r, _)| format!("{:#x}", r * HUGE))
        .collect();
    vec![
        json!({ "id": format!("track-pages-{name}"), "kind": "lines",
                "title": format!("Dirty pages per collection, per mapping ({name})"),
                "xlabel": "s", "ylabel": "pages written", "x": x, "series": series }),
        json!({ "id": format!("track-heatmap-{name}"), "kind": "heatmap",
                "title": format!("Write coverage per 2 MiB region over time ({name})"),
                "note": format!("{} regions written most, by address; darker: more of the region's 512 pages written in that interval", rows.len()),
                "xlabel": "s", "x": x, "rows": labels, "cells": cells }),
    ]
}

/// Percentile `q` of sorted `v`.
fn pct(v: &[u64], q: f64) -> Option<f64> {
    (!v.is_empty()).then(|| v[((v.len() - 1) as f64 * q).round() as usize] as f64)
}

fn trace(name: &str, pid: Option<i64>, events: &[Value]) -> Vec<Value> {
    let end = events.iter().map(|e| u(&e["t_ns"])).max().unwrap_or(0);
    // About 200 intervals, none shorter than 1 ms.
    let step = (end / 200).max(1_000_000);
    let n = (end / step + 1) as usize;
    let kinds = ["fetch", "evict", "writeback", "soft"];
    let names = ["fetches", "evictions", "write-backs", "soft faults"];
    let mut counts = vec![vec![0u64; n]; kinds.len()];
    let mut lat: Vec<Vec<u64>> = vec![Vec::new(); n];
    for e in events {
        let b = ((u(&e["t_ns"]) / step) as usize).min(n - 1);
        if let Some(k) = kinds.iter().position(|k| e["kind"].as_str() == Some(k)) {
            counts[k][b] += 1;
            if k == 0 {
                lat[b].push(u(&e["ns"]));
            }
        }
    }
    let per_s = 1e9 / step as f64;
    let x: Vec<f64> = (0..n).map(|i| (i as u64 * step) as f64 / 1e9).collect();
    let series: Vec<Value> = names
        .iter()
        .zip(&counts)
        .filter(|(_, c)| c.iter().any(|&v| v > 0))
        .map(|(k, c)| json!({ "label": format!("{k}/s"), "values": c.iter().map(|&v| v as f64 * per_s).collect::<Vec<_>>() }))
        .collect();
    for l in &mut lat {
        l.sort_unstable();
    }
    let q =
        |p: f64| -> Vec<Option<f64>> { lat.iter().map(|l| pct(l, p).map(|v| v / 1e3)).collect() };
    let who = pid.map_or_else(|| name.to_string(), |p| format!("pid {p}"));
    vec![
        json!({ "id": format!("farmem-faults-{name}"), "kind": "lines",
                "title": format!("Far-memory events per second ({who})"),
                "xlabel": "s", "ylabel": "per second", "x": x, "series": series }),
        json!({ "id": format!("farmem-latency-{name}"), "kind": "lines",
                "title": format!("Fetch latency: room made and the link's wait ({who})"),
                "xlabel": "s", "ylabel": "µs", "x": x,
                "series": [ { "label": "median", "values": q(0.5) }, { "label": "99th percentile", "values": q(0.99) } ] }),
    ]
}

fn agent(name: &str, steps: &[Value]) -> Vec<Value> {
    let mut kinds: Vec<String> = Vec::new();
    for s in steps {
        for a in s["actions"].as_array().into_iter().flatten() {
            if let Some(k) = a["action"].as_str() {
                if !kinds.iter().any(|x| x == k) {
                    kinds.push(k.to_string());
                }
            }
        }
    }
    let x: Vec<f64> = steps.iter().map(|s| u(&s["t_ms"]) as f64 / 1e3).collect();
    let count = |s: &Value, k: &str| {
        s["actions"].as_array().map_or(0, |a| {
            a.iter().filter(|a| a["action"].as_str() == Some(k)).count() as u64
        })
    };
    let timeline: Vec<Value> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let v: Vec<Option<u64>> = steps
                .iter()
                .map(|s| (count(s, k) > 0).then_some(i as u64 + 1))
                .collect();
            json!({ "label": k, "values": v })
        })
        .collect();
    let running: Vec<Value> = kinds
        .iter()
        .map(|k| {
            let mut total = 0;
            let v: Vec<u64> = steps
                .iter()
                .map(|s| {
                    total += count(s, k);
                    total
                })
                .collect();
            json!({ "label": k, "values": v })
        })
        .collect();
    vec![
        json!({ "id": format!("agent-timeline-{name}"), "kind": "points",
                "title": format!("The agent's decisions, step by step ({name})"),
                "note": "one row per kind of decision: a point where a step made at least one",
                "xlabel": "s", "ylabel": "kind", "x": x, "series": timeline }),
        json!({ "id": format!("agent-running-{name}"), "kind": "lines",
                "title": format!("Decisions so far ({name})"),
                "xlabel": "s", "ylabel": "decisions", "x": x, "series": running }),
    ]
}

fn inspect(name: &str, rep: &Value) -> Vec<Value> {
    let mut regions: Vec<&Value> = rep["regions"].as_array().into_iter().flatten().collect();
    regions.sort_by_key(|r| std::cmp::Reverse(u(&r["resident_pages"])));
    let rows: Vec<Value> = regions
        .iter()
        .take(40)
        .map(|r| {
            json!([
                r["pid"],
                format!("{:#x}", u(&r["start"])),
                u(&r["len"]) / 1024,
                u(&r["resident_pages"]),
                u(&r["huge_pages"]),
                u(&r["zero_pages"]),
                r["path"].as_str().unwrap_or("")
            ])
        })
        .collect();
    vec![json!({ "id": format!("inspect-{name}"), "kind": "table",
                 "title": format!("Regions, most resident first ({name}: {} MiB resident)", u(&rep["rss_bytes"]) >> 20),
                 "columns": ["pid", "start", "KiB", "resident pages", "in huge pages", "zero pages", "mapping"],
                 "rows": rows })]
}

/// The far-memory traces as Chrome trace events: a fetch is a slice as
/// long as its latency, ending when its page was ready; an eviction, a
/// write-back and a soft fault are instants.
pub(super) fn chrome_trace(inputs: &[(std::path::PathBuf, Input)]) -> Value {
    let mut events = Vec::new();
    for (_, i) in inputs {
        let Input::Trace { pid, events: evs } = i else {
            continue;
        };
        let pid = pid.unwrap_or(0);
        events.push(json!({ "name": "process_name", "ph": "M", "pid": pid, "args": { "name": format!("far memory, pid {pid}") } }));
        for e in evs {
            let (t, ns) = (u(&e["t_ns"]), u(&e["ns"]));
            let kind = e["kind"].as_str().unwrap_or("?");
            let args = json!({ "addr": format!("{:#x}", u(&e["addr"])) });
            events.push(if kind == "fetch" {
                json!({ "name": "fetch", "cat": "farmem", "ph": "X", "pid": pid, "tid": 0,
                        "ts": t.saturating_sub(ns) as f64 / 1e3, "dur": ns as f64 / 1e3, "args": args })
            } else {
                json!({ "name": kind, "cat": "farmem", "ph": "i", "s": "t", "pid": pid, "tid": 0,
                        "ts": t as f64 / 1e3, "args": args })
            });
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ns" })
}
