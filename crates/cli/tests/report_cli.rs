//! `pagewise report` of real runs, opened in Debian's headless Chromium:
//! a track --json stream of Redis under load, a farmem run --trace of a
//! real program, a thp run log and an inspect report. The page must load
//! without a script error, draw every plot (its own pixels counted in the
//! browser) with as many points as the inputs hold, and need no network;
//! the Chrome trace must hold every fetch of the far-memory traces.

mod support;
use support::*;

/// Debian's headless browser, if installed (scripts/setup.sh installs it).
fn chromium() -> Option<PathBuf> {
    which("chromium").or_else(|| which("chromium-browser"))
}

/// What the page reports it drew, read from the DOM Chromium dumps after
/// its scripts ran.
fn drawn(page: &Path) -> serde_json::Value {
    let browser = chromium().unwrap();
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--virtual-time-budget=15000",
            "--dump-dom",
        ])
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let start = dom.find("<pre id=\"pw-status\">").unwrap_or_else(|| {
        panic!(
            "no status in the page: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    }) + "<pre id=\"pw-status\">".len();
    let end = start + dom[start..].find("</pre>").unwrap();
    let text = dom[start..end]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn by_id_points(plots: &[serde_json::Value], prefix: &str) -> u64 {
    plots
        .iter()
        .filter(|p| p["id"].as_str().unwrap().starts_with(prefix))
        .map(|p| p["points"].as_u64().unwrap())
        .sum()
}

/// Non-zero (2 MiB region, line) cells of a track stream: what the heatmap
/// must draw (the stream below writes fewer than 128 regions).
fn heat_cells(lines: &[serde_json::Value]) -> usize {
    let mut cells = std::collections::BTreeSet::new();
    for (i, l) in lines.iter().enumerate() {
        for r in l["ranges"].as_array().unwrap() {
            let (s, n) = (r[0].as_u64().unwrap(), r[1].as_u64().unwrap());
            for p in 0..n {
                cells.insert((i, (s + p * PAGE) >> 21));
            }
        }
    }
    cells.len()
}

#[test]
fn report_of_real_runs_draws_every_plot_without_network() {
    if chromium().is_none() {
        pagewise_testkit::skip!("chromium is not installed (scripts/setup.sh installs it)");
        return;
    }
    if let Some(why) = unsupported() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    if which("redis-server").is_none() || which("redis-benchmark").is_none() {
        pagewise_testkit::skip!(
            "redis-server or redis-benchmark is not installed (scripts/setup.sh installs them)"
        );
        return;
    }
    use pagewise_bench::redis::{free_port, server_args, wait_ready_within};
    let dir = temp_dir("report");
    std::fs::create_dir_all(&dir).unwrap();
    // Redis under load, tracked from outside.
    let port = free_port().unwrap();
    let mut server = Command::new("redis-server")
        .args(server_args(port))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_ready_within(port, Duration::from_secs(20)).unwrap();
    let mut load = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-n",
            "200000",
            "-t",
            "set",
            "-r",
            "100000",
            "-d",
            "256",
            "-q",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let track = Command::new(BIN)
        .args([
            "track",
            "--json",
            "--interval-ms",
            "100",
            "--count",
            "20",
            "--pid",
        ])
        .arg(server.id().to_string())
        .output()
        .unwrap();
    let _ = load.kill();
    let _ = load.wait();
    let inspect = Command::new(BIN)
        .args(["inspect", "--regions", "--json", "--pid"])
        .arg(server.id().to_string())
        .output()
        .unwrap();
    let thp = pagewise_sys::process::geteuid() == 0;
    let agent = thp.then(|| {
        Command::new(BIN)
            .args([
                "thp",
                "run",
                "--json",
                "--steps",
                "3",
                "--interval-ms",
                "300",
                "--pid",
            ])
            .arg(server.id().to_string())
            .output()
            .unwrap()
    });
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        track.status.success(),
        "{}",
        String::from_utf8_lossy(&track.stderr)
    );
    let track_lines = json_lines(&track.stdout);
    assert_eq!(track_lines.len(), 20);
    assert!(
        track_lines[0]["regions"].is_array(),
        "the first line names the mappings"
    );
    std::fs::write(dir.join("track.jsonl"), &track.stdout).unwrap();
    std::fs::write(dir.join("inspect.json"), &inspect.stdout).unwrap();
    let mut inputs = vec![dir.join("track.jsonl"), dir.join("inspect.json")];
    let mut steps = Vec::new();
    if let Some(a) = &agent {
        assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
        std::fs::write(dir.join("thp.jsonl"), &a.stdout).unwrap();
        steps = json_lines(&a.stdout);
        inputs.push(dir.join("thp.jsonl"));
    } else {
        pagewise_testkit::skip!("thp run needs root here: the agent's timeline is not drawn");
    }
    // A real program under far memory, traced.
    let inst = instance_dir("report");
    let fm = farmem(&inst)
        .args([
            "run",
            "--local-pages",
            "64",
            "--latency-ns",
            "2000",
            "--trace",
        ])
        .arg(dir.join("t"))
        .args(["--", "sh", "-c", "seq 1 60000 | sort -n | tail -1"])
        .output()
        .unwrap();
    assert!(
        fm.status.success(),
        "{}",
        String::from_utf8_lossy(&fm.stderr)
    );
    // Each process of the run wrote one; one that saw no event an empty one.
    let traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("t."))
        .collect();
    let drawn_traces = traces
        .iter()
        .filter(|t| std::fs::metadata(t).unwrap().len() > 0)
        .count();
    assert!(!traces.is_empty(), "no trace written");
    let fetches: usize = traces
        .iter()
        .map(|t| {
            std::fs::read_to_string(t)
                .unwrap()
                .lines()
                .filter(|l| l.contains("\"kind\":\"fetch\""))
                .count()
        })
        .sum();
    inputs.extend(traces.iter().cloned());
    // The report and the Chrome trace.
    let (page, chrome) = (dir.join("report.html"), dir.join("trace.json"));
    let r = Command::new(BIN)
        .arg("report")
        .args(&inputs)
        .arg("--out")
        .arg(&page)
        .arg("--chrome-trace")
        .arg(&chrome)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    for needle in [
        "<script src",
        "<link ",
        "src=\"http",
        "href=\"http",
        "url(http",
    ] {
        assert!(
            !html.contains(needle),
            "the page reaches for the network: {needle}"
        );
    }
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&chrome).unwrap()).unwrap();
    let slices = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "fetch")
        .count();
    assert_eq!(slices, fetches, "a slice per fetch of the traces");
    // What the browser drew.
    let status = drawn(&page);
    assert_eq!(
        status["errors"],
        serde_json::json!([]),
        "script errors: {status}"
    );
    let plots = status["plots"].as_array().unwrap();
    let want = 2 + 1 + 2 * drawn_traces + if agent.is_some() { 2 } else { 0 };
    assert_eq!(plots.len(), want, "{status}");
    for p in plots {
        // Every plot with something to show shows it in its own pixels.
        if p["points"].as_u64().unwrap() > 0 {
            assert!(
                p["painted"].as_u64().unwrap() > 0,
                "plot drawn with no pixel of its own: {p}"
            );
        }
    }
    assert!(
        by_id_points(plots, "track-pages") > 0 && by_id_points(plots, "farmem-faults") > 0,
        "{status}"
    );
    let by_id = |prefix: &str| {
        plots
            .iter()
            .find(|p| p["id"].as_str().unwrap().starts_with(prefix))
            .unwrap()
    };
    assert_eq!(
        by_id("track-heatmap")["points"].as_u64().unwrap() as usize,
        heat_cells(&track_lines)
    );
    if !steps.is_empty() {
        let acted: usize = steps
            .iter()
            .map(|s| {
                let kinds: std::collections::BTreeSet<&str> = s["actions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|a| a["action"].as_str())
                    .collect();
                kinds.len()
            })
            .sum();
        assert_eq!(
            by_id("agent-timeline")["points"].as_u64().unwrap() as usize,
            acted
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&inst);
}
