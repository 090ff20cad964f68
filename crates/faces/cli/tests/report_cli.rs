//! `pagewise report` of real runs, opened in Debian's headless Chromium
//! driven over the DevTools protocol:
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

/// Headless Chromium driven over the DevTools protocol on a pipe
/// (`--remote-debugging-pipe`: commands on its fd 3, replies and events on
/// its fd 4, each message ending with a NUL byte).
struct Browser {
    child: std::process::Child,
    to: std::fs::File,
    from: BufReader<std::fs::File>,
    next: u64,
    /// Exceptions the page threw, and errors it logged.
    errors: Vec<serde_json::Value>,
}

impl Browser {
    fn start() -> Browser {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use std::os::unix::process::CommandExt;
        let pipe = || {
            let mut fds = [0; 2];
            // SAFETY: `fds` has room for the two descriptors pipe2 returns.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            // SAFETY: both descriptors were just made and are ours alone.
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
        };
        let (cmd_r, cmd_w) = pipe();
        let (ev_r, ev_w) = pipe();
        let (r, w) = (cmd_r.as_raw_fd(), ev_w.as_raw_fd());
        let mut c = Command::new(chromium().unwrap());
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--remote-debugging-pipe",
            "about:blank",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: between fork and exec only fcntl(2) and dup2(2),
        // async-signal-safe, placing the two pipe ends where Chromium looks
        // for them (moved above 10 first: either may be 3 or 4 already).
        unsafe {
            c.pre_exec(move || {
                let (a, b) = (
                    libc::fcntl(r, libc::F_DUPFD, 10),
                    libc::fcntl(w, libc::F_DUPFD, 10),
                );
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = c.spawn().unwrap();
        drop((cmd_r, ev_w));
        Browser {
            child,
            to: std::fs::File::from(cmd_w),
            from: BufReader::new(std::fs::File::from(ev_r)),
            next: 0,
            errors: Vec::new(),
        }
    }

    /// The next message, the page's errors noted on the way.
    fn message(&mut self) -> serde_json::Value {
        let mut buf = Vec::new();
        self.from.read_until(0, &mut buf).unwrap();
        assert_eq!(buf.pop(), Some(0), "the browser closed its pipe");
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        let m = v["method"].as_str().unwrap_or("");
        if m == "Runtime.exceptionThrown"
            || (m == "Runtime.consoleAPICalled" && v["params"]["type"] == "error")
        {
            self.errors.push(v["params"].clone());
        }
        v
    }

    /// Sends `method` (to `session`, or the browser) and waits for its
    /// result.
    fn call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: serde_json::Value,
    ) -> serde_json::Value {
        use std::io::Write;
        self.next += 1;
        let id = self.next;
        let mut m = serde_json::json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            m["sessionId"] = s.into();
        }
        let mut bytes = serde_json::to_vec(&m).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let v = self.message();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Opens `url` in a new page and waits for its load event: the page's
    /// session.
    fn open(&mut self, url: &str) -> String {
        let t = self.call(
            None,
            "Target.createTarget",
            serde_json::json!({ "url": "about:blank" }),
        );
        let s = self.call(
            None,
            "Target.attachToTarget",
            serde_json::json!({ "targetId": t["targetId"], "flatten": true }),
        );
        let session = s["sessionId"].as_str().unwrap().to_string();
        self.call(Some(&session), "Page.enable", serde_json::json!({}));
        self.call(Some(&session), "Runtime.enable", serde_json::json!({}));
        self.call(
            Some(&session),
            "Page.navigate",
            serde_json::json!({ "url": url }),
        );
        while self.message()["method"] != "Page.loadEventFired" {}
        session
    }

    /// The value of `expr` evaluated in the page (a promise awaited).
    fn eval(&mut self, session: &str, expr: &str) -> serde_json::Value {
        let r = self.call(
            Some(session),
            "Runtime.evaluate",
            serde_json::json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
        r["result"]["value"].clone()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Counts, per plot section, the canvas pixels painted in a colour (not
/// transparent, not white) and the table cells: the test's own look at
/// what was drawn, apart from the page's script.
const COUNT_DRAWN: &str = "Array.from(document.querySelectorAll('section.plot')).map(s => \
  Array.from(s.querySelectorAll('canvas')).reduce((n, c) => { \
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let k = 0; \
    for (let i = 0; i < d.length; i += 4) \
      if (d[i + 3] > 0 && !(d[i] > 250 && d[i + 1] > 250 && d[i + 2] > 250)) k++; \
    return n + k; }, 0) + s.querySelectorAll('td').length)";

/// What the page drew: by its own account (`#pw-status`), by the test's
/// count per plot, and the errors it threw or logged.
fn drawn(page: &Path) -> (serde_json::Value, Vec<u64>, Vec<serde_json::Value>) {
    let mut b = Browser::start();
    let session = b.open(&format!("file://{}", page.display()));
    // uPlot draws after the page's script: two animation frames later.
    b.eval(
        &session,
        "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))",
    );
    let text = b.eval(&session, "document.getElementById('pw-status').textContent");
    let mut status: serde_json::Value = serde_json::from_str(text.as_str().unwrap()).unwrap();
    // The title as the page shows it (inputs' strings reach the page).
    status["title_shown"] = b.eval(&session, "document.getElementById('pw-title').textContent");
    let counted = b.eval(&session, COUNT_DRAWN);
    let counted = counted
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    (status, counted, std::mem::take(&mut b.errors))
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

/// A string that ended or commented out the page's data script.
const HOSTILE: &str = "a <!--<script> & \u{2028}\u{2029} </SCRIPT end";

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
    use pagewise_testkit::servers::{free_port, redis_args, wait_ready_within};
    let dir = temp_dir("report");
    std::fs::create_dir_all(&dir).unwrap();
    // Redis under load, tracked from outside.
    let port = free_port().unwrap();
    let mut server = Command::new("redis-server")
        .args(redis_args(port))
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
        // The steps (the last line says what was gained).
        steps = json_lines(&a.stdout)
            .into_iter()
            .filter(|l| l.get("t_ms").is_some())
            .collect();
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
        .args(["--title", HOSTILE])
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
    let (status, counted, errors) = drawn(&page);
    assert!(
        errors.is_empty(),
        "the page threw or logged errors: {errors:?}"
    );
    assert_eq!(
        status["errors"],
        serde_json::json!([]),
        "script errors: {status}"
    );
    assert_eq!(status["title_shown"], HOSTILE, "the title as given");
    let plots = status["plots"].as_array().unwrap();
    let want = 2 + 1 + 2 * drawn_traces + if agent.is_some() { 2 } else { 0 };
    assert_eq!(plots.len(), want, "{status}");
    assert_eq!(counted.len(), want, "a section per plot: {counted:?}");
    for (p, &seen) in plots.iter().zip(&counted) {
        // Every plot with something to show shows it in pixels of its own
        // series' colours (the page's count) and the test sees it drawn.
        if p["points"].as_u64().unwrap() > 0 {
            assert!(
                p["painted"].as_u64().unwrap() > 0 && seen > 0,
                "plot drawn with no pixel of its own: {p}, {seen} seen"
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
