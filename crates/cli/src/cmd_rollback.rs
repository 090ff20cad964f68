//! `pagewise snapshot serve`: a handle on a running process held for
//! repeated rollbacks, driven by one line per request on stdin and one
//! JSON line per answer on stdout, so that a fuzzer or a model checker in
//! any language can take snapshots of its target and reset it.

use anyhow::Result;
use pagewise::snap::{ProcessSnapshots, RestoreOptions, SnapId};
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};

/// What `snapshot serve` says about itself in `--help`.
pub const SERVE_HELP: &str = "\
Requests, one per line on stdin; one JSON line answers each on stdout:
  take                  snapshot the process now: {\"take\":{\"id\":N,...}}
  restore [N]           put snapshot N (default: the last taken) back
  restore-memory [N]    the same, memory and layout only (not registers)
  drop N                forget snapshot N
  list                  the snapshots held
  quit                  end (as end of input does)
A request that fails answers {\"error\":...,\"class\":...} and the next is
read; a process that ended ends the command (exit status 5).

What a restore puts back: every page of every private writable mapping,
the layout (mappings made, removed, moved, grown, shrunk or re-protected
since, and the program break) and every thread's registers, signal mask
and alternate signal stack. Not put back: file descriptors and the files
themselves (a restore reports the descriptors opened or closed since),
shared memory, pending signals. The process is stopped for each take and
restore, and left as it was found otherwise.";

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The process to hold.
    #[arg(long)]
    pid: i32,
}

/// One request, as read.
enum Request {
    Take,
    Restore(Option<SnapId>, bool),
    Drop(SnapId),
    List,
    Quit,
}

fn parse(line: &str) -> std::result::Result<Request, String> {
    let mut w = line.split_whitespace();
    let id = |s: Option<&str>| -> std::result::Result<Option<SnapId>, String> {
        s.map(|v| v.parse().map_err(|_| format!("{v:?} is not a snapshot id")))
            .transpose()
    };
    let req = match w.next() {
        Some("take") => Request::Take,
        Some("restore") => Request::Restore(id(w.next())?, false),
        Some("restore-memory") => Request::Restore(id(w.next())?, true),
        Some("drop") => Request::Drop(id(w.next())?.ok_or("drop needs a snapshot id")?),
        Some("list") => Request::List,
        Some("quit") | None => Request::Quit,
        Some(other) => return Err(format!("unknown request {other:?} (see --help)")),
    };
    match w.next() {
        Some(extra) => Err(format!("unexpected {extra:?} after the request")),
        None => Ok(req),
    }
}

fn class_name(e: &pagewise::Error) -> &'static str {
    match e.class() {
        pagewise::ErrorClass::BadInput => "bad-input",
        pagewise::ErrorClass::Unsupported => "unsupported",
        pagewise::ErrorClass::Permission => "permission",
        pagewise::ErrorClass::Gone => "gone",
        _ => "failed",
    }
}

pub fn serve(a: ServeArgs) -> Result<i32> {
    let handle = ProcessSnapshots::open(a.pid)?;
    // SIGINT and SIGTERM end the command between requests, never inside a
    // take or a restore (the lock is held for each).
    let busy = Arc::new(Mutex::new(()));
    pagewise_sys::signal::block(&[libc::SIGINT, libc::SIGTERM])?;
    {
        let busy = busy.clone();
        std::thread::spawn(move || {
            if pagewise_sys::signal::wait(&[libc::SIGINT, libc::SIGTERM]).is_ok() {
                let _held = busy.lock();
                // Exiting closes the userfaultfd: nothing stays registered
                // in the process.
                std::process::exit(0);
            }
        });
    }
    let mut h = handle;
    let mut out = std::io::stdout().lock();
    let hello = serde_json::json!({ "serving": a.pid, "note": h.note() });
    writeln!(out, "{}", crate::json::line(&hello)?)?;
    out.flush()?;
    let mut last: Option<SnapId> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let req = match parse(&line) {
            Ok(r) => r,
            Err(why) => {
                let e = serde_json::json!({ "error": why, "class": "bad-input" });
                writeln!(out, "{}", crate::json::line(&e)?)?;
                out.flush()?;
                continue;
            }
        };
        let answer = {
            let _held = busy.lock().unwrap_or_else(|e| e.into_inner());
            match req {
                Request::Quit => break,
                Request::Take => h.take().and_then(|id| {
                    last = Some(id);
                    Ok(serde_json::json!({ "take": {
                        "id": id,
                        "stats": h.take_stats(id)?,
                    }}))
                }),
                Request::Restore(id, memory_only) => match id.or(last) {
                    None => Err(pagewise::Error::NotFound("no snapshot taken yet".into())),
                    Some(id) => h
                        .restore(id, RestoreOptions::default().memory_only(memory_only))
                        .map(|r| serde_json::json!({ "restore": { "id": id, "report": r } })),
                },
                Request::Drop(id) => h.drop_snapshot(id).map(|()| {
                    if last == Some(id) {
                        last = h.ids().last().copied();
                    }
                    serde_json::json!({ "dropped": id })
                }),
                Request::List => Ok(serde_json::json!({ "snapshots": h.ids() })),
            }
        };
        match answer {
            Ok(v) => writeln!(out, "{}", crate::json::line(&v)?)?,
            Err(e) => {
                let gone = e.class() == pagewise::ErrorClass::Gone;
                let v = serde_json::json!({ "error": e.to_string(), "class": class_name(&e) });
                writeln!(out, "{}", crate::json::line(&v)?)?;
                out.flush()?;
                if gone {
                    return Err(e.into());
                }
            }
        }
        out.flush()?;
    }
    Ok(0)
}
