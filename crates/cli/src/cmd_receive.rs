//! `pagewise receive`: the receiving end of a migration (`pagewise snapshot
//! --live --to HOST:PORT`), saving each complete copy into a store.

use anyhow::{Context, Result};
use pagewise::snap::wire::{Event, Receiver};
use pagewise::snap::DiskStore;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on, HOST:PORT (port 0: any free port, printed).
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// The store directory the snapshots are saved into (created if missing
    /// or empty; appended to otherwise).
    #[arg(long)]
    out: PathBuf,
    /// End after the first connection.
    #[arg(long)]
    once: bool,
    /// Trust the 128-bit digest when a page matches a stored one, instead of
    /// comparing contents.
    #[arg(long)]
    no_verify: bool,
    /// One JSON object per connection on stdout (and one line with the
    /// address listened on first).
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<i32> {
    // SIGINT and SIGTERM are taken by one thread, which ends the wait for a
    // connection and the connection in progress (its copy is discarded; the
    // store keeps its complete snapshots).
    pagewise_sys::signal::block(&[libc::SIGINT, libc::SIGTERM])?;
    let listener =
        TcpListener::bind(&a.listen).with_context(|| format!("listening on {}", a.listen))?;
    let local = listener.local_addr()?;
    let store = DiskStore::create(&a.out, !a.no_verify)?;
    let mut rx = Receiver::new(store);
    let stop = Arc::new(AtomicBool::new(false));
    let current: Arc<Mutex<Option<TcpStream>>> = Arc::new(Mutex::new(None));
    {
        let (stop, current) = (stop.clone(), current.clone());
        std::thread::spawn(move || {
            if pagewise_sys::signal::wait(&[libc::SIGINT, libc::SIGTERM]).is_ok() {
                stop.store(true, Ordering::SeqCst);
                if let Some(s) = current.lock().expect("not poisoned").as_ref() {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
                // Wakes the accept.
                let _ = TcpStream::connect(local);
            }
        });
    }
    if a.json {
        println!("{}", serde_json::json!({ "listening": local.to_string() }));
    } else {
        println!(
            "listening on {local}; saving into {} (SIGINT or SIGTERM ends)",
            a.out.display()
        );
    }
    let mut status = 0;
    loop {
        let (stream, _) = listener.accept().context("accepting a connection")?;
        if stop.load(Ordering::SeqCst) {
            break;
        }
        *current.lock().expect("not poisoned") = Some(stream.try_clone()?);
        let peer = stream
            .peer_addr()
            .map(|p| p.to_string())
            .unwrap_or_default();
        if !a.json {
            println!("{peer}: connected");
        }
        let bar = crate::progress::spinner(format!("receiving from {peer}"));
        let json = a.json;
        let r = rx.serve(stream, &mut |e| match e {
            Event::Pass(n, pages) => {
                bar.set_message(format!("{peer}: pass {n}, {pages} pages received"))
            }
            Event::Saved(s) => {
                if !json {
                    bar.suspend(|| {
                        println!(
                            "{peer}: snapshot {} saved: {} pages, {} new to the store",
                            s.id, s.pages, s.pages_new
                        )
                    });
                }
            }
        });
        bar.finish_and_clear();
        *current.lock().expect("not poisoned") = None;
        let got = r?;
        let kept = rx.store().ids()?.len();
        if a.json {
            println!("{}", serde_json::to_string(&got)?);
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
        if got.broken.is_some() {
            status = 1;
        }
        if a.once || stop.load(Ordering::SeqCst) {
            break;
        }
    }
    Ok(status)
}
