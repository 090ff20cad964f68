//! `pagewise receive`: the receiving end of a migration (`pagewise snapshot
//! --live --to HOST:PORT`), saving each complete copy into a store.
//! Connections are served concurrently, each in a thread of its own.

use anyhow::{Context, Result};
use pagewise::snap::wire::{Event, Key, Received, Receiver};
use pagewise::snap::DiskStore;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on, HOST:PORT (port 0: any free port, printed).
    /// An address other than loopback needs --key.
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// The store directory the snapshots are saved into (created if missing
    /// or empty; appended to otherwise).
    #[arg(long)]
    out: PathBuf,
    /// Authenticate every message with the shared secret in FILE (at least
    /// 16 bytes, owner-only; the sender's --key): senders without it are
    /// refused.
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// End after the first complete migration (a connection that saved a
    /// snapshot and ended cleanly), not the first connection.
    #[arg(long)]
    once: bool,
    /// Most memory the copies of all connections together may hold, MiB
    /// (default: half the memory available at start).
    #[arg(long, value_name = "MIB")]
    max_mib: Option<u64>,
    /// Give a connection up after this long without a byte, seconds.
    #[arg(long, value_name = "S", default_value_t = 60)]
    idle_seconds: u64,
    /// Give a connection up after this long in all, seconds.
    #[arg(long, value_name = "S", default_value_t = 3600)]
    max_seconds: u64,
    /// Most connections served at once (more are refused, EBUSY).
    #[arg(long, value_name = "N", default_value_t = 8)]
    max_connections: usize,
    /// Trust the 128-bit digest when a page matches a stored one, instead of
    /// comparing contents.
    #[arg(long)]
    no_verify: bool,
    /// One JSON object per connection on stdout (and one line with the
    /// address listened on first).
    #[arg(long)]
    json: bool,
}

/// The connections being served, to end them on SIGINT/SIGTERM.
type Live = Arc<Mutex<Vec<(u64, TcpStream)>>>;

/// `receive --json`: one object a line.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Line<'a> {
    /// First: the address listened on.
    Listening {
        /// The address and port.
        listening: String,
    },
    /// One connection served, to its end.
    Received(&'a Received),
}
impl crate::json::Printed for Line<'_> {}

pub fn run(a: Args) -> Result<i32> {
    let key = a.key.as_deref().map(Key::from_file).transpose()?;
    let listener =
        TcpListener::bind(&a.listen).with_context(|| format!("listening on {}", a.listen))?;
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() && key.is_none() {
        crate::usage!(
            "--listen {local} is not a loopback address: any peer could store a snapshot; \
             give both ends the same --key FILE"
        );
    }
    let store = DiskStore::create(&a.out, !a.no_verify)?;
    let mut rx = Receiver::new(store);
    if let Some(k) = key {
        rx = rx.with_key(k);
    }
    if let Some(m) = a.max_mib {
        rx.max_bytes = m.saturating_mul(1 << 20);
    }
    rx.idle = Duration::from_secs(a.idle_seconds.max(1));
    rx.max_time = Duration::from_secs(a.max_seconds.max(1));
    rx.max_connections = a.max_connections.max(1);
    let rx = Arc::new(rx);
    let stop = Arc::new(AtomicBool::new(false));
    let live: Live = Arc::new(Mutex::new(Vec::new()));
    // Wakes the accept by a connection of its own, on a thread of its own:
    // the connections' threads may not make sockets (see below).
    let (wake, woken) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if woken.recv().is_ok() {
            let _ = TcpStream::connect(local);
        }
    });
    let end = Arc::new(move |stop: &AtomicBool, live: &Live| {
        stop.store(true, Ordering::SeqCst);
        for (_, s) in live.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        let _ = wake.send(());
    });
    {
        // SIGINT and SIGTERM end the wait for a connection and the
        // connections in progress (their copies are discarded; the store
        // keeps its complete snapshots).
        let (stop, live, end) = (stop.clone(), live.clone(), end.clone());
        pagewise::agent::stop::on_stop_otherwise(move |_| end(&stop, &live))?;
    }
    if a.json {
        let first = Line::Listening {
            listening: local.to_string(),
        };
        println!("{}", crate::json::line(&first)?);
    } else {
        println!(
            "listening on {local}; saving into {} (SIGINT or SIGTERM ends)",
            a.out.display()
        );
    }
    let status = Arc::new(AtomicI32::new(0));
    let mut threads = Vec::new();
    for n in 0u64.. {
        let (stream, _) = listener.accept().context("accepting a connection")?;
        if stop.load(Ordering::SeqCst) {
            break;
        }
        live.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((n, stream.try_clone()?));
        let (rx, stop, live, status) = (rx.clone(), stop.clone(), live.clone(), status.clone());
        let (json, once, end) = (a.json, a.once, end.clone());
        let spawned = std::thread::Builder::new()
            .name("pagewise-receive".into())
            .spawn(move || {
                // A peer that took this thread over gets the store's calls
                // and its own socket's, nothing more (see Receiver::confine_thread).
                let r = Receiver::confine_thread()
                    .context("confining the connection's thread (seccomp)")
                    .and_then(|_| serve_one(&rx, stream, json, &stop));
                live.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(k, _)| *k != n);
                match r {
                    Ok(got) => {
                        if got.broken.is_some() {
                            let _ =
                                status.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
                        } else if once && !got.saved.is_empty() {
                            // Its status is this migration's.
                            status.store(-1, Ordering::SeqCst);
                            end(&stop, &live);
                        }
                    }
                    Err(e) => {
                        eprintln!("pagewise: {e}");
                        let _ = status.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
                    }
                }
            });
        threads.push(spawned.context("starting a connection's thread")?);
        threads.retain(|t| !t.is_finished());
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(status.load(Ordering::SeqCst).max(0))
}

/// Serves one connection and reports it.
fn serve_one(rx: &Receiver, stream: TcpStream, json: bool, stop: &AtomicBool) -> Result<Received> {
    let peer = stream
        .peer_addr()
        .map(|p| p.to_string())
        .unwrap_or_default();
    if !json {
        println!("{peer}: connected");
    }
    let bar = crate::progress::spinner(format!("receiving from {peer}"));
    let got = rx.serve(stream, &mut |e| match e {
        Event::Pass(n, pages) => {
            bar.set_message(format!("{peer}: pass {n}, {pages} pages received"))
        }
        Event::Saved(s) if !json => {
            bar.suspend(|| {
                println!(
                    "{peer}: snapshot {} saved: {} pages, {} new to the store",
                    s.id, s.pages, s.pages_new
                )
            });
        }
        _ => {}
    });
    bar.finish_and_clear();
    let got = got?;
    let kept = rx.store().ids()?.len();
    if json {
        println!("{}", crate::json::line(&Line::Received(&got))?);
    } else {
        match &got.broken {
            Some(why) => println!(
                "{peer}: {}; the store holds its {kept} complete snapshots",
                if stop.load(Ordering::SeqCst) {
                    "interrupted".to_string()
                } else {
                    why.clone()
                }
            ),
            None => println!(
                "{peer}: done: {} snapshots, {} pages in {} passes, {:.1} MiB on the wire",
                got.saved.len(),
                got.pages,
                got.passes,
                got.wire_bytes as f64 / 1048576.0
            ),
        }
    }
    Ok(got)
}
