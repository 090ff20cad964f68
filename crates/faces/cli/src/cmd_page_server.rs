//! `pagewise page-server`: a page server CRIU dumps into
//! (`criu dump --page-server`), keeping each dump's pages in a store.
//! Sessions are served one at a time, on a thread confined to the
//! connection's and the store's calls.

use anyhow::{Context, Result};
use pagewise::snap::criu::{PageServer, Received};
use pagewise::snap::DiskStore;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// The store directory the dumps' pages are kept in (created if
    /// missing or empty; appended to otherwise).
    #[arg(long)]
    store: PathBuf,
    /// Address to listen on, HOST:PORT (port 0: any free port, printed).
    /// Loopback only without --tls: CRIU's plain connections carry no
    /// authentication.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:27027")]
    listen: String,
    /// Speak CRIU's TLS (`criu dump --tls`): each peer must show a
    /// certificate signed by --tls-cacert, and may then connect from any
    /// address --listen reaches.
    #[arg(long)]
    tls: bool,
    /// The authority peers' certificates must be signed by (PEM), as
    /// CRIU's --tls-cacert (its defaults are CRIU's).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/etc/pki/CA/cacert.pem",
        requires = "tls"
    )]
    tls_cacert: PathBuf,
    /// The server's certificate (PEM), as CRIU's --tls-cert.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/etc/pki/criu/cert.pem",
        requires = "tls"
    )]
    tls_cert: PathBuf,
    /// The server's private key (PEM), as CRIU's --tls-key.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/etc/pki/criu/private/key.pem",
        requires = "tls"
    )]
    tls_key: PathBuf,
    /// End after the first session (as `criu page-server` does).
    #[arg(long)]
    once: bool,
    /// Give a session up after this long without a byte, seconds.
    #[arg(long, value_name = "S", default_value_t = 60)]
    idle_seconds: u64,
    /// Trust the 128-bit digest when a page matches a stored one, instead
    /// of comparing contents.
    #[arg(long)]
    no_verify: bool,
    /// Serve the lazy pages of dump N of the store (its number, as the
    /// server said it) to `criu lazy-pages --page-server`, instead of
    /// keeping dumps: `criu restore --lazy-pages` then fetches them.
    #[arg(long, value_name = "N")]
    lazy: Option<u64>,
    /// One JSON object per session on stdout (and one line with the
    /// address listened on first).
    #[arg(long)]
    json: bool,
}

/// `page-server --json`: one object a line.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Line<'a> {
    /// First: the address listened on.
    Listening {
        /// The address and port.
        listening: String,
    },
    /// One session served, to its end.
    Received(&'a Received),
}
impl crate::json::Printed for Line<'_> {}

pub fn run(a: Args) -> Result<i32> {
    let listener =
        TcpListener::bind(&a.listen).with_context(|| format!("listening on {}", a.listen))?;
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() && !a.tls {
        crate::usage!(
            "--listen {local} is not a loopback address: CRIU's plain page-server connections \
             carry no authentication, and any peer could write into the store (use --tls)"
        );
    }
    // Read before a connection is taken: a file wrong is said at once.
    let tls = match a.tls {
        true => Some(pagewise::snap::criu::Tls::from_files(
            &a.tls_cacert,
            &a.tls_cert,
            &a.tls_key,
        )?),
        false => None,
    };
    let mut server = match a.lazy {
        // Serving lazy pages only reads the store.
        Some(dump) => {
            let mut s = PageServer::new(DiskStore::open(&a.store)?);
            s.serve_lazy(dump)?;
            s
        }
        None => PageServer::new(DiskStore::create(&a.store, !a.no_verify)?),
    };
    server.idle = Duration::from_secs(a.idle_seconds.max(1));
    let stop = Arc::new(AtomicBool::new(false));
    let live: Arc<Mutex<Option<TcpStream>>> = Arc::new(Mutex::new(None));
    {
        // SIGINT and SIGTERM end the wait for a session and the session in
        // progress (the store keeps the pagemaps it completed).
        let (stop, live) = (stop.clone(), live.clone());
        pagewise::agent::stop::on_stop_otherwise(move |_| {
            stop.store(true, Ordering::SeqCst);
            if let Some(s) = live.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            // Wakes the accept below.
            let _ = TcpStream::connect(local);
        })?;
    }
    if a.json {
        let first = Line::Listening {
            listening: local.to_string(),
        };
        println!("{}", crate::json::line(&first)?);
    } else if let Some(d) = a.lazy {
        println!(
            "listening on {local}; serving the lazy pages of dump {d} of {} (SIGINT or SIGTERM ends)",
            a.store.display()
        );
    } else {
        println!(
            "listening on {local}; keeping CRIU's dumps in {} (SIGINT or SIGTERM ends)",
            a.store.display()
        );
    }
    // The sessions' thread: confined before it reads a peer's byte.
    // Each connection comes with a second handle, kept while it is served
    // so that SIGTERM can end it, and closed with it.
    let (give, take) = std::sync::mpsc::sync_channel::<(TcpStream, TcpStream)>(0);
    let (json, store, serving) = (a.json, a.store.clone(), live.clone());
    let worker = std::thread::Builder::new()
        .name("pagewise-page-server".into())
        .spawn(move || -> Result<Vec<Received>> {
            PageServer::confine_thread().context("confining the sessions' thread (seccomp)")?;
            let mut all = Vec::new();
            for (s, handle) in take {
                *serving.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
                let got = match &tls {
                    Some(t) => server.serve_tls(s, t),
                    None => server.serve(s),
                };
                *serving.lock().unwrap_or_else(|e| e.into_inner()) = None;
                let got = got?;
                say(&got, json, &store)?;
                all.push(got);
            }
            Ok(all)
        })
        .context("starting the sessions' thread")?;
    let mut status = 0;
    loop {
        let (stream, _) = listener.accept().context("accepting a connection")?;
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let handle = stream.try_clone()?;
        if give.send((stream, handle)).is_err() {
            break;
        }
        if a.once {
            break;
        }
    }
    drop(give);
    match worker.join() {
        Ok(Ok(all)) => {
            if all.iter().any(|r| r.broken.is_some()) {
                status = 1;
            }
        }
        Ok(Err(e)) => return Err(e),
        Err(_) => anyhow::bail!("the sessions' thread panicked"),
    }
    Ok(status)
}

/// Says what one session brought.
fn say(got: &Received, json: bool, store: &std::path::Path) -> Result<()> {
    if json {
        println!("{}", crate::json::line(&Line::Received(got))?);
        return Ok(());
    }
    let what = match got.dump {
        Some(n) if got.requests > 0 => format!(
            "lazy pages of dump {n}: {} requests, {} pages served",
            got.requests, got.served_pages
        ),
        Some(n) => format!(
            "dump {n} ({}/criu/dump-{n}.json): {} pagemaps, {} pages, {:.1} MiB new to the store",
            store.display(),
            got.pagemaps.len(),
            got.present_pages,
            got.stored_bytes as f64 / 1048576.0
        ),
        None => "a session that sent no pagemap".to_string(),
    };
    match &got.broken {
        Some(why) => println!("{what}; broken: {why}"),
        None => println!("{what}"),
    }
    Ok(())
}
