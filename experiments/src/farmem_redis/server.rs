//! The servers under test and what drives them: started emulated, under
//! the system-wide emulator or plain; loaded with distinct values by a
//! client of our own; driven by the load generator; every value read back.

use super::*;

/// memaslap, under the name this system gives it.
pub(super) fn memaslap() -> Option<&'static str> {
    ["memcaslap", "memaslap"].into_iter().find(|c| which(c))
}

/// Operations/s of `requests` memaslap operations (90 % get, 10 % set,
/// values of `len` bytes, 2 threads, 16 connections, a window of 2000 keys
/// each).
pub(super) fn mc_load(port: u16, requests: u64, len: usize) -> Result<f64> {
    let bin = memaslap().context("memaslap is not installed")?;
    let out = Command::new(bin)
        .args([
            "-s",
            &format!("127.0.0.1:{port}"),
            "-T",
            "2",
            "-c",
            "16",
            "-w",
            "2k",
        ])
        .args(["-x", &requests.to_string(), "-X", &len.to_string()])
        .output()
        .with_context(|| format!("running {bin}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| l.split("TPS: ").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .next_back()
        .with_context(|| format!("{bin} printed no TPS: {text}"))
}

/// The major faults (page-ins: swap-ins from zram) and resident set of
/// process `pid` (`/proc/PID/stat`, `smaps_rollup`).
pub(super) fn faults_and_rss(pid: i32) -> (u64, u64) {
    let majflt = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| {
            let after = t.rsplit_once(')')?.1.to_string();
            after.split_whitespace().nth(9)?.parse().ok()
        })
        .unwrap_or(0);
    let rss = pagewise_testkit::host::resident(pid).map_or(0, |r| r.rss_kib);
    (majflt, rss)
}

/// A server (emulated or not) and where its far-memory statistics go.
pub(super) struct Server {
    redis: RedisServer,
    app: App,
    stats: Option<PathBuf>,
}

impl Server {
    fn start(
        app: App,
        em: Option<&Emulation>,
        stats: Option<PathBuf>,
        cg: Option<&MemoryCgroup>,
    ) -> Result<Server> {
        let port = free_port()?;
        let (prog, args) = app.server(port);
        let mut c = match em {
            None => {
                let mut c = Command::new(&prog);
                c.args(&args);
                c
            }
            Some(e) if e.system => {
                let mut c = Command::new(&prog);
                c.args(&args);
                crate::thp_redis::join_cgroup_at_exec(
                    &mut c,
                    cg.context("a system-wide emulation without its cgroup")?,
                )?;
                c
            }
            Some(e) => {
                let mut c = Command::new(crate::pagewise_tool()?);
                c.args(["farmem", "run", "--instance", &e.instance]);
                c.args([
                    "--local-percent",
                    &e.local_percent.to_string(),
                    "--latency-ns",
                    &e.latency_ns.to_string(),
                    "--fault-path",
                    &e.fault_path.to_string(),
                ]);
                if let Some(s) = &stats {
                    c.arg("--stats-json").arg(s);
                }
                c.arg("--").arg(&prog).args(&args);
                c
            }
        };
        // A process group of its own: if it must be killed, redis-server
        // under `farmem run` goes with it.
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        let child = c
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {prog}"))?;
        let s = Server {
            redis: RedisServer { child, port },
            app,
            stats,
        };
        // Emulated with a tenth of its memory local, it can take a while.
        wait_ready_within(port, std::time::Duration::from_secs(60))?;
        Ok(s)
    }

    /// Shuts the server down and returns its far-memory statistics.
    fn stop(mut self) -> Result<Option<serde_json::Value>> {
        if self.app == App::Memcached {
            // Its own shutdown (`-A`): the process exits, and `farmem run`
            // writes its statistics.
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.redis.port)) {
                let _ = s.write_all(b"shutdown\r\n");
            }
            pagewise_agent::child::wait_or_kill(
                &mut self.redis.child,
                std::time::Duration::from_secs(10),
            );
        }
        self.redis.shutdown();
        match &self.stats {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?;
                Ok(Some(serde_json::from_str(&text)?))
            }
            None => Ok(None),
        }
    }
}

/// GET requests/s over the key space, by redis-benchmark.
pub(super) fn get_rps(port: u16, keys: u64, requests: u64) -> Result<f64> {
    let (n, r) = (requests.to_string(), keys.to_string());
    let rps = redis_benchmark(
        port,
        &["-t", "get", "-n", &n, "-r", &r, "-c", "10"],
        &["GET"],
    )?;
    Ok(rps[0])
}

#[derive(Serialize, Clone)]
pub(super) struct Point {
    /// Which experiment and series.
    pub(super) series: String,
    pub(super) local_percent: Option<u64>,
    pub(super) latency_ns: Option<u64>,
    pub(super) get_rps: f64,
    pub(super) verified_keys: u64,
    pub(super) page_fault_count: u64,
    pub(super) remote_fetches: u64,
    pub(super) evictions: u64,
    pub(super) writebacks: u64,
    pub(super) injected_delay_ns: u64,
    pub(super) data_pages: u64,
    /// The server's major faults (the system-wide emulator's swap-ins).
    pub(super) major_faults: u64,
    /// The server's resident set at the end, KiB (not under pagewise).
    pub(super) rss_kib: u64,
    /// Killed by its memory cgroup's OOM killer (the system-wide
    /// emulator): no throughput, nothing verified.
    pub(super) oom_killed: bool,
}

/// The memory cgroup of system-wide emulation `e`, made for this run when
/// it is the first server of its group: limited to `e.local_percent` of
/// the data set for each server of `servers` in the group.
pub(super) fn system_group<'g>(
    groups: &'g mut Vec<(String, MemoryCgroup)>,
    e: &Emulation,
    s: &Scale,
    servers: &[Option<Emulation>],
) -> Result<&'g MemoryCgroup> {
    if let Some(i) = groups.iter().position(|(n, _)| *n == e.instance) {
        return Ok(&groups[i].1);
    }
    let members = servers
        .iter()
        .flatten()
        .filter(|o| o.system && o.instance == e.instance)
        .count() as u64;
    let data = s.data_bytes.load(std::sync::atomic::Ordering::Relaxed);
    if data == 0 {
        bail!("the data set's size is not known yet (the baseline runs first)");
    }
    let limit = (data * e.local_percent / 100 * members).max(4 << 20);
    let cg = MemoryCgroup::create(
        &format!("pagewise-farmem-{}-{}", e.instance, std::process::id()),
        limit,
    )?;
    groups.push((e.instance.clone(), cg));
    Ok(&groups.last().expect("just pushed").1)
}

/// [`run_once`] `s.repeats` times; for each server the run with the median
/// throughput.
pub(super) fn run_together(
    label: &str,
    servers: &[Option<Emulation>],
    s: &Scale,
    dir: &std::path::Path,
) -> Result<Vec<Point>> {
    let mut runs = Vec::new();
    for _ in 0..s.repeats {
        runs.push(run_once(label, servers, s, dir)?);
    }
    let mut out = Vec::new();
    for i in 0..servers.len() {
        let mut col: Vec<Point> = runs.iter().map(|r| r[i].clone()).collect();
        col.sort_by(|a, b| a.get_rps.total_cmp(&b.get_rps));
        out.push(col[col.len() / 2].clone());
    }
    Ok(out)
}

/// Runs `servers` at once (each: its emulation or none), fills and loads
/// them concurrently, verifies them; one point per server.
pub(super) fn run_once(
    label: &str,
    servers: &[Option<Emulation>],
    s: &Scale,
    dir: &std::path::Path,
) -> Result<Vec<Point>> {
    let mut groups: Vec<(String, MemoryCgroup)> = Vec::new();
    let mut started = Vec::new();
    for (i, em) in servers.iter().enumerate() {
        let stats = em
            .as_ref()
            .filter(|e| !e.system)
            .map(|_| dir.join(format!("stats-{}-{i}.json", std::process::id())));
        if let Some(p) = &stats {
            let _ = std::fs::remove_file(p);
        }
        let cg = match em {
            Some(e) if e.system => Some(system_group(&mut groups, e, s, servers)?),
            _ => None,
        };
        started.push(Server::start(s.app, em.as_ref(), stats, cg)?);
    }
    let results: Vec<Result<(f64, u64)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = started
            .iter()
            .map(|srv| {
                let port = srv.redis.port;
                sc.spawn(move || -> Result<(f64, u64)> {
                    fill(s.app.kv(), port, s.keys, s.value_bytes)?;
                    let rps = s.app.load(port, s.keys, s.requests, s.value_bytes)?;
                    let ok = verify(s.app.kv(), port, s.keys, s.value_bytes, 200)?;
                    Ok((rps, ok))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| bail!("load thread panicked")))
            .collect()
    });
    let mut out = Vec::new();
    for ((srv, em), r) in started.into_iter().zip(servers).zip(results) {
        // A server the system-wide emulator's cgroup killed for want of
        // memory is a result, not a failure of the benchmark.
        let oom = em.as_ref().filter(|e| e.system).map_or(0, |e| {
            groups
                .iter()
                .find(|(n, _)| *n == e.instance)
                .map_or(0, |(_, g)| g.oom_kills())
        });
        let (rps, ok) = match r {
            Ok(v) => v,
            Err(_) if oom > 0 => (0.0, 0),
            Err(e) => return Err(e),
        };
        // The server itself: the child, unless pagewise runs it.
        let (major_faults, rss_kib) = match em {
            Some(e) if !e.system => (0, 0),
            _ => faults_and_rss(srv.redis.child.id() as i32),
        };
        if em.is_none() {
            s.data_bytes
                .fetch_max(rss_kib << 10, std::sync::atomic::Ordering::Relaxed);
        }
        let st = if oom > 0 { None } else { srv.stop()? };
        let g = |k: &str| st.as_ref().and_then(|v| v[k].as_u64()).unwrap_or(0);
        out.push(Point {
            series: label.to_string(),
            local_percent: em.as_ref().map(|e| e.local_percent),
            latency_ns: em.as_ref().map(|e| e.latency_ns),
            get_rps: rps,
            verified_keys: ok,
            page_fault_count: g("page_fault_count"),
            remote_fetches: g("remote_fetches"),
            evictions: g("evictions"),
            writebacks: g("writebacks"),
            injected_delay_ns: g("injected_delay_ns"),
            data_pages: g("data_pages"),
            major_faults,
            rss_kib,
            oom_killed: oom > 0,
        });
    }
    Ok(out)
}
