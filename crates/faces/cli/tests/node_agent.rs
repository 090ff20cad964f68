//! The node agent (`pagewise agent --config FILE`) against podman
//! containers started with the runtime's defaults: it answers `/healthz`
//! and `/metrics` before its first step, follows every container's
//! processes (their series folded into their container's, labelled as
//! cAdvisor labels its own; a series per process when asked), gives each
//! container its own budget of huge pages, and on SIGTERM puts back every
//! system setting it changed and says so. A configuration with a misspelt
//! key or an impossible window is refused, named.

#[macro_use]
mod support;
use pagewise_testkit::container::{shell, shell_with};
use support::*;

fn tmp() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// A free port on loopback (bound and let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One agent at a time: a second waits until the first puts KSM's
/// settings back before it steps.
static ONE_AGENT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The agent's metrics at `port` once it has taken `steps` steps (or
/// after 30 s, whatever they say then).
fn metrics_after_steps(port: u16, steps: f64) -> String {
    let mut text = String::new();
    for _ in 0..300 {
        text = pagewise_testkit::http_get(port, "/metrics").unwrap_or_default();
        if pagewise_testkit::metric_value(&text, "pagewise_node_steps_total")
            .is_some_and(|s| s >= steps)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    text
}

fn config(port: u16, body: &str) -> PathBuf {
    let p = temp_dir(&format!("agent-{port}.toml"));
    std::fs::write(&p, format!("listen = \"127.0.0.1:{port}\"\n{body}")).unwrap();
    p
}

#[test]
fn the_node_agent_watches_containers_and_puts_back_what_it_changed() {
    need_support!();
    let _one = ONE_AGENT.lock().unwrap_or_else(|p| p.into_inner());
    let Some((a, _gone_a, _pa)) = shell(tmp(), "agent-a", "sleep 60 & sleep 60 & echo ready; wait")
    else {
        return;
    };
    let Some((b, _gone_b, _pb)) = shell(tmp(), "agent-b", "sleep 60 & echo ready; wait") else {
        return;
    };
    let id = |name: &str| {
        let out = ok(Command::new("podman").args(["inspect", "--format", "{{.Id}}", name]));
        String::from_utf8_lossy(&out.stdout).trim()[..12].to_string()
    };
    let (ida, idb) = (id(&a), id(&b));
    let ksm_run = std::fs::read_to_string("/sys/kernel/mm/ksm/run").unwrap();
    let port = free_port();
    let cfg = config(
        port,
        &format!(
            "interval_ms = 800\nwindow_ms = 100\n[thp]\nwalk_ns = 30.0\n[[select]]\ncontainer = \"{a}\"\nhuge_pages = 5\n\
             [[select]]\ncontainer = \"{b}\"\nhuge_pages = 7\n"
        ),
    );
    let mut agent = Command::new(BIN)
        .args(["agent", "--config"])
        .arg(&cfg)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Answering from start-up (how soon: `pagewise bench node`).
    let t0 = Instant::now();
    let mut first = None;
    for _ in 0..500 {
        if let (Some(h), Some(m)) = (
            pagewise_testkit::http_get(port, "/healthz"),
            pagewise_testkit::http_get(port, "/metrics"),
        ) {
            first = Some((h, m));
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (health, metrics) = first.expect("/healthz and /metrics never answered");
    assert_eq!(health, "ok\n");
    assert_eq!(
        pagewise_testkit::metric_value(&metrics, "pagewise_node_up"),
        Some(1.0),
        "{metrics}"
    );
    println!(
        "ok   answering {} ms after the start, at step {:?}",
        t0.elapsed().as_millis(),
        pagewise_testkit::metric_value(&metrics, "pagewise_node_steps_total")
    );
    // Then steps: both containers' processes watched.
    let text = metrics_after_steps(port, 3.0);
    assert!(
        pagewise_testkit::metric_value(&text, "pagewise_node_steps_total")
            .is_some_and(|s| s >= 3.0),
        "{text}"
    );
    assert_eq!(
        pagewise_testkit::metric_value(&text, "pagewise_node_processes"),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        pagewise_testkit::metric_value(&text, "pagewise_node_containers"),
        Some(2.0),
        "{text}"
    );
    // Every family has its help and its type; no series names a pid (a
    // process's are folded into its container's); every series of a
    // container names it by its podman name and its id; at most 50 series
    // per container.
    let mut per_container = std::collections::BTreeMap::new();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        // A counter's samples end in `_total`, its family's name does not
        // (OpenMetrics).
        let sample = l.split(['{', ' ']).next().unwrap();
        let family = sample
            .strip_suffix("_total")
            .filter(|f| text.contains(&format!("# TYPE {f} counter\n")))
            .unwrap_or(sample);
        assert!(
            text.contains(&format!("# HELP {family} "))
                && text.contains(&format!("# TYPE {family} ")),
            "{family} has no help or type"
        );
        assert!(!l.contains("pid=\""), "a series of one process: {l}");
        if let Some(c) = l.split("container_id=\"podman://").nth(1) {
            let c = c[..12].to_string();
            let name = if c == ida { &a } else { &b };
            assert!(
                l.contains(&format!("container=\"{name}\"")),
                "a container's series without its name: {l}"
            );
            *per_container.entry(c).or_insert(0) += 1;
        }
    }
    assert_eq!(
        per_container.keys().cloned().collect::<Vec<_>>(),
        {
            let mut v = vec![ida.clone(), idb.clone()];
            v.sort();
            v
        },
        "{text}"
    );
    assert!(
        per_container.values().all(|&n| n <= 50),
        "{per_container:?}"
    );
    for (name, budget) in [(&a, 5), (&b, 7)] {
        let series = text
            .lines()
            .find(|l| {
                l.starts_with("pagewise_node_container_huge_budget_bytes{")
                    && l.contains(&format!("container=\"{name}\""))
            })
            .unwrap_or_else(|| panic!("no budget of {name}: {text}"));
        let bytes = series.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
        assert_eq!(
            bytes,
            (budget << 21) as f64,
            "{series}: {budget} huge pages"
        );
    }
    // Whose build, and the serving process's own figures.
    assert!(
        text.lines()
            .any(|l| l.starts_with("pagewise_build_info{version=\"")),
        "{text}"
    );
    let started = pagewise_testkit::metric_value(&text, "process_start_time_seconds")
        .unwrap_or_else(|| panic!("no process_start_time_seconds: {text}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - 120.0..=now).contains(&started),
        "the agent started at {started}, now is {now}"
    );
    assert!(
        text.contains("pagewise_node_ksm_merging_bytes{container=")
            || pagewise_testkit::host::ksm_stat(std::process::id() as i32).is_none(),
        "no ksm_stat series where the kernel has ksm_stat: {text}"
    );
    // SIGTERM: ends, puts back what it changed, says so.
    pagewise_sys::process::kill(agent.id() as i32, libc::SIGTERM).unwrap();
    let st = agent.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(agent.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(st.code(), Some(143), "{err}");
    assert!(err.contains("agent stopped after"), "{err}");
    assert!(
        err.contains("settings put back: ") && err.contains("/sys/kernel/mm/ksm/run="),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string("/sys/kernel/mm/ksm/run").unwrap(),
        ksm_run,
        "KSM's run is not as it was"
    );
    assert!(
        pagewise_testkit::http_get(port, "/healthz").is_none(),
        "still answering after SIGTERM"
    );
    let _ = std::fs::remove_file(&cfg);
}

/// A container of a Kubernetes pod (its cgroup under
/// `kubepods/besteffort/pod<UID>`, as the kubelet's cgroupfs driver makes
/// it), on a node whose kubelet directory says `shop_web-0_<UID>` and
/// whose link to the container's log says `web-0_shop_app-<ID>.log`: its
/// series carry the pod's uid, its namespace, its name and the
/// container's; asked for, a series per process, each with its pid.
#[test]
fn a_pods_series_carry_its_namespace_and_name() {
    need_support!();
    let _one = ONE_AGENT.lock().unwrap_or_else(|p| p.into_inner());
    let uid = format!("0f6e3f1a-1b2c-4d5e-8f90-{:012x}", std::process::id());
    let parent = format!("/kubepods/besteffort/pod{uid}");
    let more = ["--cgroup-parent".to_string(), parent.clone()];
    let Some((name, gone, _p)) = shell_with(tmp(), "agent-pod", "echo ready; sleep 60", &more)
    else {
        return;
    };
    let logs = temp_dir("pod-logs");
    std::fs::create_dir_all(logs.join(format!("shop_web-0_{uid}"))).unwrap();
    let id = String::from_utf8_lossy(
        &ok(Command::new("podman").args(["inspect", "--format", "{{.Id}}", &name])).stdout,
    )
    .trim()
    .to_string();
    let links = temp_dir("container-logs");
    std::fs::create_dir_all(&links).unwrap();
    std::fs::write(links.join(format!("web-0_shop_app-{id}.log")), "").unwrap();
    let port = free_port();
    let cfg = config(
        port,
        &format!(
            "interval_ms = 500\nwindow_ms = 100\nper_process_metrics = true\n\
             [thp]\nwalk_ns = 30.0\n[[select]]\ncontainer = \"{name}\"\nhuge_pages = 2\n"
        ),
    );
    let mut agent = Command::new(BIN)
        .args(["agent", "--config"])
        .arg(&cfg)
        .env("PAGEWISE_POD_LOGS", &logs)
        .env("PAGEWISE_CONTAINER_LOGS", &links)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let text = metrics_after_steps(port, 2.0);
    let _ = pagewise_sys::process::kill(agent.id() as i32, libc::SIGTERM);
    let _ = agent.wait();
    // Selected by its pod's namespace, the container's processes are
    // those selected by its name; another namespace selects none.
    // `agent --check` of a configuration with `top` lines and one
    // selection: the processes it says, sorted.
    let check_with = |logs: &Path, top: &str, select: &str| -> Vec<String> {
        let cfg = config(port, &format!("{top}\n[[select]]\n{select}\n"));
        let out = Command::new(BIN)
            .args(["agent", "--check", "--config"])
            .arg(&cfg)
            .env("PAGEWISE_POD_LOGS", logs)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&cfg);
        assert!(out.status.success(), "{top} {select}: {out:?}");
        let mut said: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        said.sort();
        said
    };
    let check_in = |logs: &Path, select: &str| check_with(logs, "", select);
    let check = |select: &str| check_in(&logs, select);
    let by_name = check(&format!("container = \"{name}\""));
    assert!(
        !by_name.is_empty(),
        "the container's processes are selected"
    );
    assert_eq!(check("namespace = \"shop\""), by_name, "by namespace");
    assert_eq!(check("namespace = \"other\""), Vec::<String>::new());
    // A namespace left alone is, whatever selects it; kube-system is by
    // default.
    let left = |top: &str, select: &str| check_with(&logs, top, select);
    let shop = left("leave_namespaces = [\"shop\"]", "namespace = \"shop\"");
    assert!(!shop.contains(&by_name[0]), "shop left alone: {shop:?}");
    let none_left = left("leave_namespaces = []", "namespace = \"shop\"");
    assert!(
        none_left.contains(&by_name[0]),
        "none left alone: {none_left:?}"
    );
    let system = temp_dir("pod-logs-system");
    std::fs::create_dir_all(system.join(format!("kube-system_web-0_{uid}"))).unwrap();
    let in_system = check_in(&system, "all_containers = true");
    assert!(
        !in_system.iter().any(|l| by_name.contains(l)),
        "a kube-system pod's processes are left alone by default: {in_system:?}"
    );
    let _ = std::fs::remove_dir_all(&system);
    drop(gone);
    // The cgroups the test's parent made, emptied with the container.
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = std::fs::remove_dir(h.path().join(parent.trim_start_matches('/')));
    }
    let want = format!(
        "container=\"app\",container_id=\"podman://{id}\",pod_uid=\"{uid}\",namespace=\"shop\",pod=\"web-0\""
    );
    let labelled: Vec<&str> = text.lines().filter(|l| l.contains(&want)).collect();
    assert!(
        labelled
            .iter()
            .any(|l| l.starts_with("pagewise_node_ksm_merging_bytes{pid=")),
        "a process's series: {text}"
    );
    assert!(
        labelled
            .iter()
            .any(|l| l.starts_with("pagewise_node_container_huge_budget_bytes{container=")),
        "the container's series: {text}"
    );
    assert!(
        text.lines()
            .filter(|l| l.contains(&format!("pod_uid=\"{uid}\"")))
            .all(|l| l.contains(&want)),
        "every series of the pod names it: {text}"
    );
    println!("ok   {} series carry {want}", labelled.len());
}

#[test]
fn a_bad_configuration_is_refused_and_named() {
    need_support!();
    let port = free_port();
    // Places a metrics file may not go: through a symbolic link to a
    // directory, and into one others may write.
    use std::os::unix::fs::PermissionsExt;
    let base = temp_dir("agent-metrics-places");
    let (real, link, open) = (base.join("real"), base.join("link"), base.join("open"));
    for d in [&real, &open] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let sel = "[[select]]\nall_containers = true\n";
    let metrics = |f: String| format!("metrics_file = {f:?}\n{sel}");
    let thp = |kv: &str| format!("[thp]\n{kv}\n{sel}");
    let bad = [
        (
            thp("cpu_share = nan"),
            "thp.cpu_share = NaN is outside its domain",
        ),
        (thp("cpu_share = -0.1"), "thp.cpu_share = -0.1"),
        (thp("cpu_share = 2.0"), "thp.cpu_share = 2"),
        (thp("budget_per_second = -1.0"), "thp.budget_per_second"),
        (thp("budget_per_second = inf"), "thp.budget_per_second"),
        (thp("walk_ns = 0.0"), "thp.walk_ns"),
        (metrics("/etc/passwd".into()), "must end in .prom"),
        (metrics("agent.prom".into()), "absolute path"),
        (
            metrics(link.join("agent.prom").display().to_string()),
            "through a symbolic link",
        ),
        (
            metrics(open.join("agent.prom").display().to_string()),
            "no one else may write",
        ),
        (
            metrics(real.display().to_string() + "/x/agent.prom"),
            "No such file",
        ),
    ];
    let older = [
        (
            "intervall_ms = 5\n[[select]]\nall_containers = true\n",
            "intervall_ms",
        ),
        (
            "window_ms = 1500\n[[select]]\nall_containers = true\n",
            "window_ms",
        ),
        ("", "[[select]]"),
        (
            "[[select]]\nall_containers = true\ncontainer = \"x\"\n",
            "exactly one",
        ),
    ];
    let older = older.map(|(b, w)| (b.to_string(), w));
    for (body, want) in bad.into_iter().chain(older) {
        let cfg = config(port, &body);
        let out = agent_check(&cfg);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{body:?}: {err}");
        assert!(err.contains(want), "{body:?}: {err}");
        let _ = std::fs::remove_file(&cfg);
    }
    // Where it may go: a directory of root's.
    let cfg = config(
        port,
        &metrics(real.join("agent.prom").display().to_string()),
    );
    let out = agent_check(&cfg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `agent --check --config CFG`, run to its end.
fn agent_check(cfg: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(["agent", "--check", "--config"])
        .arg(cfg)
        .output()
        .unwrap()
}

/// Regression: `agent --check` listed dedup for processes where the
/// configuration disables the dedup agent. A process in a container is
/// listed with thp alone when `[dedup] enabled = false`.
#[test]
fn agent_check_lists_only_the_agents_that_run() {
    need_support!();
    let Some((c, _gone, _p)) = shell(tmp(), "agent-check", "echo ready; read x") else {
        return;
    };
    let port = free_port();
    let cfg = config(
        port,
        &format!("[dedup]\nenabled = false\n[[select]]\ncontainer = \"{c}\"\n"),
    );
    let out = agent_check(&cfg);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains(": thp"), "{said}");
    assert!(!said.contains("dedup"), "dedup is disabled: {said}");
}

/// Regression: `agent --config` exited 6 when another pagewise held KSM,
/// and a DaemonSet would restart it for ever. Now it runs the huge-page
/// agent alone, says why dedup waits (in its log and in
/// `pagewise_node_agent_running{agent="dedup"} 0`), and takes KSM once it
/// is free.
#[test]
fn the_node_agent_runs_without_ksm_and_takes_it_when_free() {
    need_support!();

    let _one = ONE_AGENT.lock().unwrap_or_else(|p| p.into_inner());
    let mut target = Command::new("sleep").arg("120").spawn().unwrap();
    // Another pagewise holds KSM.
    let mut holder = Command::new(BIN)
        .args([
            "dedup",
            "run",
            "--json",
            "--interval-ms",
            "400",
            "--window-ms",
            "100",
        ])
        .args(["--pid", &target.id().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let hpid = holder.id() as i32;
    let mut hout = BufReader::new(holder.stdout.take().unwrap());
    let first = pagewise_testkit::line_within(&mut hout, hpid).unwrap_or_default();
    assert!(first.starts_with('{'), "the holder stepped: {first}");
    let port = free_port();
    let cfg = config(
        port,
        "interval_ms = 300\nwindow_ms = 50\n[thp]\nwalk_ns = 30.0\n[[select]]\nall_containers = true\n",
    );
    let mut agent = Command::new(BIN)
        .args(["agent", "--config"])
        .arg(&cfg)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let apid = agent.id() as i32;
    let mut log = BufReader::new(agent.stderr.take().unwrap());
    let mut said = String::new();
    let mut wait_for = |what: &str, said: &mut String| loop {
        let l = pagewise_testkit::line_within(&mut log, apid).unwrap_or_default();
        said.push_str(&l);
        said.push('\n');
        if l.contains(what) {
            return;
        }
        assert!(!l.is_empty(), "the agent never said {what:?}: {said}");
    };
    wait_for("the dedup agent waits", &mut said);
    // Running meanwhile, dedup said not to.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let metrics = loop {
        let m = pagewise_testkit::http_get(port, "/metrics").unwrap_or_default();
        if m.contains("pagewise_node_agent_running") {
            break m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no agent_running metric: {m}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        metrics.contains("pagewise_node_agent_running{agent=\"dedup\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("pagewise_node_agent_running{agent=\"thp\"} 1"),
        "{metrics}"
    );
    assert_eq!(agent.try_wait().unwrap(), None, "the agent runs on: {said}");
    // The holder ends; the agent takes KSM.
    pagewise_sys::process::kill(hpid, libc::SIGTERM).unwrap();
    let _ = holder.wait();
    wait_for("KSM is free now", &mut said);
    pagewise_sys::process::kill(apid, libc::SIGTERM).unwrap();
    let st = agent.wait().unwrap();
    for l in log.lines().map_while(|l| l.ok()) {
        said += &l;
        said += "\n";
    }
    assert_eq!(st.code(), Some(143), "{said}");
    assert!(said.contains("settings put back"), "{said}");
    let _ = target.kill();
    let _ = target.wait();
    println!("ok   dedup waited for KSM, then ran:\n{said}");
}

/// Kills a program the test started when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `s` as a URL's query value.
fn url_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The queries the dashboard's panels and the agent chapter's `promql`
/// blocks use.
fn queries_used() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/pagewise.json")).unwrap(),
    )
    .unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let title = p["title"].as_str().unwrap();
            out.push((
                format!("panel {title:?}"),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    let book = std::fs::read_to_string(root.join("docs/book/src/agent.md")).unwrap();
    let mut inside = false;
    for l in book.lines() {
        if l.starts_with("```") {
            inside = l == "```promql";
        } else if inside && !l.trim().is_empty() {
            out.push(("agent.md".to_string(), l.trim().to_string()));
        }
    }
    out
}

/// Debian's Prometheus scrapes the agent watching two podman containers:
/// the target is up with no scrape error, `promtool check metrics` has
/// nothing to say of the text, and every query of the dashboard
/// (`deploy/grafana/pagewise.json`) and of the agent chapter returns
/// series.
#[test]
fn a_real_prometheus_scrapes_the_agent_and_every_query_answers() {
    need_support!();
    let installed = |p: &str| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !installed("prometheus") || !installed("promtool") {
        return pagewise_testkit::skip!(
            "prometheus is not installed (Debian's prometheus, with promtool)"
        );
    }
    let _one = ONE_AGENT.lock().unwrap_or_else(|p| p.into_inner());
    let Some((a, _gone_a, _pa)) = shell(tmp(), "scrape-a", "sleep 60 & echo ready; wait") else {
        return;
    };
    let Some((b, _gone_b, _pb)) = shell(tmp(), "scrape-b", "sleep 60 & echo ready; wait") else {
        return;
    };
    let port = free_port();
    let cfg = config(
        port,
        &format!(
            "interval_ms = 500\nwindow_ms = 100\n[thp]\nwalk_ns = 30.0\n[[select]]\ncontainer = \"{a}\"\nhuge_pages = 3\n\
             [[select]]\ncontainer = \"{b}\"\nhuge_pages = 4\n"
        ),
    );
    let mut agent = Killed(
        Command::new(BIN)
            .args(["agent", "--config"])
            .arg(&cfg)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let text = metrics_after_steps(port, 2.0);
    assert_eq!(
        pagewise_testkit::metric_value(&text, "pagewise_node_containers"),
        Some(2.0),
        "{text}"
    );
    // What promtool says of the text a client without preference gets.
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(lint.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    drop(lint.stdin.take());
    let said = lint.wait_with_output().unwrap();
    assert!(
        said.status.success() && said.stdout.is_empty() && said.stderr.is_empty(),
        "promtool check metrics: {} {}{}",
        said.status,
        String::from_utf8_lossy(&said.stdout),
        String::from_utf8_lossy(&said.stderr)
    );
    println!(
        "ok   promtool check metrics: clean, {} lines",
        text.lines().count()
    );

    let dir = Scratch::new("prometheus");
    let prom_port = free_port();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: pagewise\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let _prometheus = Killed(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let api = |path: &str| -> Option<serde_json::Value> {
        serde_json::from_str(&pagewise_testkit::http_get(prom_port, path)?).ok()
    };
    // Up, and scraped at least five times (a rate over the window needs
    // two samples).
    let mut target = serde_json::Value::Null;
    let mut scrapes = 0.0;
    for _ in 0..600 {
        if let Some(t) = api("/api/v1/targets") {
            target = t["data"]["activeTargets"][0].clone();
        }
        let q = format!(
            "/api/v1/query?query={}",
            url_encoded("count_over_time(up{job=\"pagewise\"}[5m])")
        );
        scrapes = api(&q)
            .and_then(|v| v["data"]["result"][0]["value"][1].as_str()?.parse().ok())
            .unwrap_or(0.0);
        if target["health"] == "up" && scrapes >= 5.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        target["health"] == "up" && scrapes >= 5.0,
        "waited 60 s for Prometheus to scrape the agent up five times: {scrapes} scrapes, target {target}; its log: {}",
        std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
    );
    assert_eq!(target["lastError"], "", "a scrape error: {target}");
    println!("ok   Prometheus scraped the agent {scrapes} times, up, no error");
    // Every query used returns series.
    let mut empty = Vec::new();
    let queries = queries_used();
    for (whose, q) in &queries {
        let got = api(&format!("/api/v1/query?query={}", url_encoded(q)));
        let n = got
            .as_ref()
            .and_then(|v| v["data"]["result"].as_array().map(Vec::len))
            .unwrap_or(0);
        if n == 0 {
            empty.push(format!("{whose}: {q} -> {got:?}"));
        } else {
            println!("ok   {whose}: {q}: {n} series");
        }
    }
    assert!(empty.is_empty(), "queries without series: {empty:#?}");
    assert!(queries.len() >= 12, "{queries:?}");
    let _ = pagewise_sys::process::kill(agent.0.id() as i32, libc::SIGTERM);
    let st = agent.0.wait().unwrap();
    assert_eq!(st.code(), Some(143));
    let _ = std::fs::remove_file(&cfg);
}
