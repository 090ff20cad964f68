//! Serving a kept dump's lazy pages to `criu lazy-pages --page-server`,
//! as `criu page-server --lazy-pages` serves them from images: each
//! `GET` (a task's pid, an address, a number of pages) is answered by an
//! `ADD_F` header with `PE_PRESENT` and at most the pages asked, those of
//! the run holding the address, then their bytes. Only pages the dump
//! marked lazy are served; a request for any other is the peer's fault,
//! and ends the session as it does CRIU's.

use std::collections::HashMap;
use std::io::{BufWriter, Read, Write};

use pagewise_mech::PAGE_SIZE;

use super::wire::{self, Dialect, Header};
use super::{first_header, images::record, read_all, Broken, Received, Stop};
use crate::disk::{DiskSnapshot, DiskStore};
use crate::Result;

/// One task's pages of the dump: its present runs (first address, pages,
/// index of the first in the snapshot, whether lazy), by address.
#[derive(Debug)]
struct Task {
    snapshot: DiskSnapshot,
    runs: Vec<(u64, u64, u64, bool)>,
}

/// The dump a server serves lazy pages of.
#[derive(Debug)]
pub(super) struct LazySource {
    pub(super) dump: u64,
    tasks: HashMap<u64, Task>,
}

impl LazySource {
    /// The task pagemaps of dump `dump` of `store`; a dump CRIU did not
    /// close is refused.
    pub(super) fn load(store: &DiskStore, dump: u64) -> Result<LazySource> {
        let rec = record(store.dir(), dump)?;
        super::images::closed(&rec)?;
        let mut tasks = HashMap::new();
        for pm in rec.pagemaps.iter().filter(|p| !p.shmem) {
            let snapshot = store.load(pm.snapshot)?;
            let mut runs = Vec::new();
            let mut index = 0;
            for r in pm.runs.iter().filter(|r| r.flags & wire::PE_PRESENT != 0) {
                runs.push((r.vaddr, r.nr_pages, index, r.flags & wire::PE_LAZY != 0));
                index += r.nr_pages;
            }
            tasks.insert(pm.id, Task { snapshot, runs });
        }
        Ok(LazySource { dump, tasks })
    }

    /// Answers one `GET`; the pages sent.
    fn answer(
        &self,
        store: &DiskStore,
        h: &Header,
        d: Dialect,
        out: &mut impl Write,
    ) -> std::result::Result<u64, Stop> {
        let task = self.tasks.get(&h.dst_id).ok_or_else(|| {
            Broken(format!(
                "a request for task {}, which dump {} does not hold",
                h.dst_id, self.dump
            ))
        })?;
        let page = PAGE_SIZE as u64;
        let i = task.runs.partition_point(|&(start, ..)| start <= h.vaddr);
        let run = i.checked_sub(1).map(|i| task.runs[i]);
        let Some((start, nr, first, true)) = run
            .filter(|&(start, nr, ..)| h.vaddr < start + nr * page && h.vaddr.is_multiple_of(page))
        else {
            return Err(Broken(format!(
                "a request for {:#x} of task {}, where dump {} holds no lazy page",
                h.vaddr, h.dst_id, self.dump
            ))
            .into());
        };
        let skip = (h.vaddr - start) / page;
        let n = h.nr_pages.min(nr - skip);
        if n == 0 {
            return Err(Broken(format!("a request for no page at {:#x}", h.vaddr)).into());
        }
        let reply = Header {
            op: wire::OP_ADD_F,
            flags: wire::PE_PRESENT,
            nr_pages: n,
            vaddr: h.vaddr,
            dst_id: h.dst_id,
        };
        out.write_all(&reply.encode(d))?;
        // The header goes alone (its own TLS record over TLS): CRIU's lazy
        // daemon reads it, then waits for the socket to be readable again
        // before it reads the pages; pages in the header's record would
        // sit in its TLS buffer unseen (seen: the first answer waited for
        // the connection's end).
        out.flush()?;
        let mut buf = vec![0u8; PAGE_SIZE];
        for k in first + skip..first + skip + n {
            store.read_page(task.snapshot.entries[k as usize], &mut buf)?;
            out.write_all(&buf)?;
        }
        out.flush()?;
        Ok(n)
    }
}

/// A lazy-pages session: `GET`s answered from `src`, to CRIU's `CLOSE`.
pub(super) fn serve_lazy_session<S: Read + Write>(
    store: &DiskStore,
    src: &LazySource,
    s: &mut S,
    got: &mut Received,
) -> std::result::Result<(), Stop> {
    let Some((dialect, mut head)) = first_header(s)? else {
        return Ok(());
    };
    got.dialect = Some(dialect);
    got.dump = Some(src.dump);
    loop {
        let h = Header::decode(dialect, &head);
        match h.op {
            wire::OP_GET => {
                // Through a buffer (a call per 64 KiB, not per page);
                // `answer` flushes it.
                let mut out = BufWriter::with_capacity(1 << 16, &mut *s);
                got.served_pages += src.answer(store, &h, dialect, &mut out)?;
                got.requests += 1;
            }
            wire::OP_CLOSE | wire::OP_FORCE_CLOSE => {
                got.closed = true;
                s.write_all(&0i32.to_ne_bytes())?;
                s.flush()?;
                return Ok(());
            }
            op => {
                return Err(Broken(format!(
                    "a command {op:#x} to a server serving dump {}'s lazy pages (it takes GET and CLOSE)",
                    src.dump
                ))
                .into())
            }
        }
        if read_all(s, &mut head)? < head.len() {
            return Err(Broken("the peer closed the connection before CLOSE".into()).into());
        }
    }
}
