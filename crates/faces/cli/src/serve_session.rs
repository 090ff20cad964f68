//! `snapshot serve --session`: a process held at one point, put back
//! there at each `reset` request ([`pagewise::snap::ResetSession`]).

use crate::cmd_rollback::{class_name, Saved, ServeLine, Taken};
use anyhow::Result;
use pagewise::snap::ResetSession;
use std::io::{BufRead, Write};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// How often signals sent to the process are handed over while no request
/// comes.
const PUMP: Duration = Duration::from_millis(10);

enum Request {
    Reset,
    List,
    Save(std::path::PathBuf, String),
    Quit,
}

fn parse(line: &str, point: u64) -> std::result::Result<Request, String> {
    let mut w = line.split_whitespace();
    let req = match w.next() {
        Some("reset") => Request::Reset,
        Some("list") => Request::List,
        Some("save") => {
            match w.next().map(str::parse::<u64>) {
                Some(Ok(id)) if id == point => {}
                _ => {
                    return Err(format!(
                        "save needs the point's id ({point}) and a directory"
                    ))
                }
            }
            let dir = w.next().ok_or("save needs a directory")?;
            let label = w.by_ref().collect::<Vec<_>>().join(" ");
            return Ok(Request::Save(dir.into(), label));
        }
        Some("quit") | None => Request::Quit,
        Some(other) => {
            return Err(format!(
                "{other:?}: in a session the requests are reset, list, save and quit"
            ))
        }
    };
    match w.next() {
        Some(extra) => Err(format!("unexpected {extra:?} after the request")),
        None => Ok(req),
    }
}

fn say(out: &mut impl Write, v: &ServeLine) -> Result<()> {
    writeln!(out, "{}", crate::json::line(v)?)?;
    out.flush()?;
    Ok(())
}

pub fn serve(pid: i32) -> Result<i32> {
    let mut s = ResetSession::open(pid)?;
    // SIGINT and SIGTERM end the command between requests: the session is
    // dropped (the process let go, nothing left registered).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let stop = stop.clone();
        pagewise::agent::stop::on_stop_otherwise(move |_| {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        })?;
    }
    let mut out = std::io::stdout().lock();
    say(
        &mut out,
        &ServeLine::Serving {
            serving: pid,
            note: None,
        },
    )?;
    let point = s.point();
    say(
        &mut out,
        &ServeLine::Take {
            take: Taken {
                id: point,
                stats: s.snapshots().take_stats(point)?,
            },
        },
    )?;
    // Lines read apart, so that the process's signals are handed over
    // while none comes.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let line = match rx.recv_timeout(PUMP) {
            Ok(line) => line?,
            Err(RecvTimeoutError::Timeout) => {
                s.hand_over_signals()?;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let answer = match parse(&line, point) {
            Err(why) => {
                say(
                    &mut out,
                    &ServeLine::Error {
                        error: why,
                        class: "bad-input",
                    },
                )?;
                continue;
            }
            Ok(Request::Quit) => break,
            Ok(Request::Reset) => s.reset().map(|reset| ServeLine::Reset { reset }),
            Ok(Request::List) => Ok(ServeLine::Snapshots {
                snapshots: vec![point],
            }),
            Ok(Request::Save(dir, label)) => pagewise::snap::DiskStore::create(&dir, true)
                .and_then(|mut d| s.snapshots().save(point, &mut d, &label))
                .map(|stats| ServeLine::Saved {
                    saved: Saved {
                        id: point,
                        store: dir,
                        stats,
                    },
                }),
        };
        match answer {
            Ok(v) => say(&mut out, &v)?,
            Err(e) => {
                let gone = e.class() == pagewise::ErrorClass::Gone;
                say(
                    &mut out,
                    &ServeLine::Error {
                        error: e.to_string(),
                        class: class_name(&e),
                    },
                )?;
                if gone {
                    return Err(e.into());
                }
            }
        }
    }
    Ok(0)
}
