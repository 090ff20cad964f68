//! What the agents' commands (`thp run`, `dedup run`) share: starting the
//! command to watch, stepping at an interval until SIGINT/SIGTERM, the
//! watched processes are gone or the steps are done, and publishing the
//! counters in the Prometheus text format to a file or over HTTP.

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How an agent's command runs.
pub struct Loop {
    /// Time between steps.
    pub interval: Duration,
    /// Stop after this many steps.
    pub steps: Option<u64>,
    /// Write the counters here after each step.
    pub metrics: Option<PathBuf>,
    /// Serve the counters over HTTP here.
    pub metrics_listen: Option<String>,
}

/// Starts `command` (if any) and returns it with the pids to watch.
pub fn start(pids: &[i32], command: &[String]) -> Result<(Vec<i32>, Option<std::process::Child>)> {
    let mut pids = pids.to_vec();
    if command.is_empty() {
        return Ok((pids, None));
    }
    let c = std::process::Command::new(&command[0])
        .args(&command[1..])
        .spawn()
        .with_context(|| format!("starting {}", command[0]))?;
    pids.push(c.id() as i32);
    Ok((pids, Some(c)))
}

/// Steps with `step` (which reports and returns the counters' text and
/// whether any watched process is left) until the end; returns the exit
/// status: the command's when it ended, else 0. On SIGINT/SIGTERM the
/// command is stopped.
pub fn drive(
    l: &Loop,
    stop: &AtomicBool,
    mut child: Option<std::process::Child>,
    first_metrics: String,
    mut step: impl FnMut() -> Result<(String, bool)>,
) -> Result<i32> {
    let served = Arc::new(Mutex::new(first_metrics));
    if let Some(addr) = &l.metrics_listen {
        serve_metrics(addr, served.clone())?;
    }
    let t0 = Instant::now();
    let mut n = 0u64;
    let status = loop {
        if stop.load(Ordering::SeqCst) {
            break 0;
        }
        if let Some(c) = child.as_mut() {
            if let Some(st) = c.try_wait()? {
                break pagewise::launch::exit_code(st);
            }
        }
        let due = t0 + l.interval * n as u32;
        while Instant::now() < due && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if stop.load(Ordering::SeqCst) {
            break 0;
        }
        let (text, watching) = step()?;
        n += 1;
        if let Some(path) = &l.metrics {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
        }
        *served.lock().expect("not poisoned") = text;
        if !watching || l.steps.is_some_and(|s| n >= s) {
            break 0;
        }
    };
    if let Some(mut c) = child {
        if stop.load(Ordering::SeqCst) {
            pagewise::launch::stop(&mut c, Duration::from_secs(5));
        }
    }
    Ok(status)
}

/// Serves `text` over HTTP at `addr` (any path), from a thread.
fn serve_metrics(addr: &str, text: Arc<Mutex<String>>) -> Result<()> {
    let l = std::net::TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut req = [0u8; 1024];
            let _ = s.read(&mut req);
            let body = text.lock().map(|t| t.clone()).unwrap_or_default();
            let _ = write!(
                s,
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(())
}
