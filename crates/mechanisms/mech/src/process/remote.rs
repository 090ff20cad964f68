//! Another process's memory, read and written: the one place pagewise
//! copies bytes out of a process it did not start, or into it.
//!
//! Memory is read with `process_vm_readv`, except two kinds of page, read
//! through `/proc/PID/mem`:
//!
//! - pages the process does not map exclusively (pagemap bit 56 clear on a
//!   present anonymous page: shared copy-on-write with a parent or child
//!   since `fork`, or a KSM page): `process_vm_readv` pins the pages it
//!   copies, and the kernel gives a pin its own copy of a page that is not
//!   exclusive, so a reader would turn every page a forked server shares
//!   with its child into two. `/proc/PID/mem` copies without a pin;
//! - pages not in memory (neither present nor swapped): where the process
//!   serves the faults of that memory with a userfaultfd of its own, a
//!   `process_vm_readv` there is a fault its handler receives (a read fault
//!   it never asked for), while a read of `/proc/PID/mem` is one the kernel
//!   refuses without an event (it cannot wait for a handler). Such a page
//!   reads as zeros. Elsewhere both fault the page in alike.
//!
//! A page in memory when its pagemap entry is read and dropped before it is
//! copied (the program evicts it at that instant) is the one read that can
//! still reach such a handler.
//!
//! Memory is written with `process_vm_writev`: a page at a time
//! ([`write_exact`], [`write`](fn@write)) or in batches of up to 1,024 pages, each
//! its own local buffer ([`Writer`], the rollback's page writer). A write
//! unshares what it writes, as any write does.

use crate::procfs;
use crate::{Error, Result, PAGE_SIZE};
use pagewise_sys::{pagemap, process};
use std::fs::File;
use std::os::fd::AsFd;

/// Reads `buf.len()` bytes (whole pages) of process `pid` at `addr`. Pages
/// unmapped meanwhile read as zeros; returns how many bytes were really read.
/// A process that is exiting (its memory already gone) is
/// [`Error::ProcessExited`]. Any length: `process_vm_readv` moves at most
/// about 2 GiB per call, and a read is continued until it is whole or meets
/// an unmapped page.
pub fn read(pid: i32, addr: u64, buf: &mut [u8]) -> Result<usize> {
    let mut through_mem = Vec::new();
    pages_through_mem(pid, &[(addr, buf.len())], &mut through_mem);
    if through_mem.is_empty() {
        return read_from(pid, addr, buf, 0);
    }
    read_around(pid, addr, buf, &through_mem)
}

/// Reads many ranges of process `pid`, each into its own buffer, up to 1024
/// ranges per system call; errors as [`read`], and a range that is
/// not wholly mapped is read as far as it is and zero-filled after.
pub fn read_many(pid: i32, parts: &mut [(u64, &mut [u8])]) -> Result<()> {
    let spans: Vec<(u64, usize)> = parts.iter().map(|(a, b)| (*a, b.len())).collect();
    let mut shared = Vec::new();
    pages_through_mem(pid, &spans, &mut shared);
    if !shared.is_empty() {
        // Parts with a page read through `/proc/PID/mem` are read on their
        // own, around it; the others together.
        let mut rest: Vec<(u64, &mut [u8])> = Vec::with_capacity(parts.len());
        for (addr, buf) in parts.iter_mut() {
            let end = *addr + buf.len() as u64;
            let lo = shared.partition_point(|&p| p + PAGE_SIZE as u64 <= *addr);
            if shared.get(lo).is_some_and(|&p| p < end) {
                read_around(pid, *addr, buf, &shared)?;
            } else {
                rest.push((*addr, &mut buf[..]));
            }
        }
        return read_scatter(pid, &mut rest);
    }
    read_scatter(pid, parts)
}

/// [`read_many`] with `process_vm_readv` alone.
fn read_scatter(pid: i32, parts: &mut [(u64, &mut [u8])]) -> Result<()> {
    for batch in parts.chunks_mut(1024) {
        let want: usize = batch.iter().map(|(_, b)| b.len()).sum();
        let got = match process::process_vm_readv_scatter(pid, batch) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                return Err(Error::ProcessExited(pid));
            }
            // Anything else: part by part, below.
            Err(_) => 0,
        };
        if got == want {
            continue;
        }
        // Short: the parts past `got` one at a time, with read_remote's
        // handling of what is no longer mapped.
        let mut skip = got;
        for (addr, buf) in batch.iter_mut() {
            if skip >= buf.len() {
                skip -= buf.len();
                continue;
            }
            read_from(pid, *addr, buf, skip)?;
            skip = 0;
        }
    }
    Ok(())
}

/// Pages two ranges of pagemap are read in one go across, at most.
const PAGEMAP_GAP: u64 = 64;

/// The files of the process last read from this thread: its pagemap and
/// its memory (kept open: reads of a process come in series).
struct Opened {
    pid: i32,
    pagemap: File,
    mem: File,
}

thread_local! {
    static OPENED: std::cell::RefCell<Option<Opened>> = const { std::cell::RefCell::new(None) };
}

/// `f` with the pagemap and memory of `pid`, opened (again) as needed: a
/// file of a process that ended reads nothing, and is opened again once
/// (the pid may be another process's now). `None` where they cannot be
/// opened or read.
fn with_opened<T>(pid: i32, mut f: impl FnMut(&Opened) -> std::io::Result<T>) -> Option<T> {
    OPENED.with(|o| {
        let mut o = o.borrow_mut();
        for fresh in [false, true] {
            if fresh || o.as_ref().is_none_or(|x| x.pid != pid) {
                let dir = procfs::proc_dir(Some(pid));
                *o = Some(Opened {
                    pid,
                    pagemap: File::open(dir.join("pagemap")).ok()?,
                    mem: File::open(dir.join("mem")).ok()?,
                });
            }
            if let Ok(v) = f(o.as_ref()?) {
                return Some(v);
            }
        }
        *o = None;
        None
    })
}

/// The frame of the zero page, where pagemap shows frames (root): its
/// pages are mapped by everyone and never copied by a pin.
fn zero_frame() -> Option<u64> {
    static ZERO: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *ZERO.get_or_init(|| {
        let page = crate::anon::AnonMemory::new(PAGE_SIZE).ok()?;
        // A read of a fresh private mapping maps the zero page there.
        let mut b = [0u8; 1];
        page.read_into(0, &mut b);
        let pm = File::open("/proc/self/pagemap").ok()?;
        let mut e = [0u64; 1];
        pagemap::read_entries(pm.as_fd(), page.addr(), &mut e).ok()?;
        Some(e[0] & pagemap::entry::PFN_MASK).filter(|&f| f != 0)
    })
}

/// Fills `out` (sorted) with the addresses of the pages of `spans`
/// (address, bytes) to read through `/proc/PID/mem` (see the module's
/// documentation): present, anonymous and not mapped exclusively (not the
/// zero page), or neither present nor swapped; empty where none is, or
/// pagemap cannot be read.
fn pages_through_mem(pid: i32, spans: &[(u64, usize)], out: &mut Vec<u64>) {
    out.clear();
    let page = PAGE_SIZE as u64;
    let mut pages: Vec<(u64, u64)> = spans
        .iter()
        .filter(|&&(_, n)| n > 0)
        .map(|&(a, n)| (a / page, (a + n as u64).div_ceil(page)))
        .collect();
    pages.sort_unstable();
    // Runs of pages read in one go.
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (a, b) in pages {
        match runs.last_mut() {
            Some(last) if a <= last.1 + PAGEMAP_GAP => last.1 = last.1.max(b),
            _ => runs.push((a, b)),
        }
    }
    let zero = zero_frame();
    use pagemap::entry::{EXCLUSIVE, FILE, PFN_MASK, PRESENT, SWAPPED};
    let mut entries = Vec::new();
    for (a, b) in runs {
        entries.resize((b - a) as usize, 0);
        let read = with_opened(pid, |o| {
            pagemap::read_entries(o.pagemap.as_fd(), a * page, &mut entries)
        });
        if read.is_none() {
            continue;
        }
        for (i, &e) in entries.iter().enumerate() {
            let shared = e & PRESENT != 0 && e & (EXCLUSIVE | FILE) == 0;
            let absent = e & (PRESENT | SWAPPED) == 0;
            if absent || (shared && zero != Some(e & PFN_MASK)) {
                out.push((a + i as u64) * page);
            }
        }
    }
}

/// [`read`] of a range holding pages to read through `/proc/PID/mem`
/// (`shared`, sorted page addresses): those so, the rest with
/// `process_vm_readv`; stops, zero-filling the rest, at the first page no
/// longer mapped. A page `/proc/PID/mem` refuses in a range still mapped
/// (one not in memory whose faults the process serves itself) reads as
/// zeros.
fn read_around(pid: i32, addr: u64, buf: &mut [u8], shared: &[u64]) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    let page = PAGE_SIZE as u64;
    let end = addr + buf.len() as u64;
    let mut at = addr;
    while at < end {
        let this = at / page * page;
        let is_shared = shared.binary_search(&this).is_ok();
        // The run of pages of the same kind from `at`.
        let mut stop = (this + page).min(end);
        while stop < end && shared.binary_search(&stop).is_ok() == is_shared {
            stop = (stop + page).min(end);
        }
        let (from, to) = ((at - addr) as usize, (stop - addr) as usize);
        let n = if is_shared {
            with_opened(pid, |o| {
                let mut done = 0;
                while from + done < to {
                    match o.mem.read_at(&mut buf[from + done..to], at + done as u64) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        // Refused part way: what was read stands.
                        Err(_) if done > 0 => break,
                        Err(e) => return Err(e),
                    }
                }
                Ok(done)
            })
            .unwrap_or(0)
        } else {
            read_from(pid, at, &mut buf[from..to], 0)?
        };
        if n < to - from {
            if procfs::is_ending(pid) {
                return Err(Error::ProcessExited(pid));
            }
            let whole = (from + n) / PAGE_SIZE * PAGE_SIZE;
            let failed = addr + whole as u64;
            if let Some(m_end) = is_shared.then(|| mapped_until(pid, failed)).flatten() {
                // Refused, not unmapped: a page not in memory of a mapping
                // whose faults the process serves, as is every other such
                // page of the run in that mapping. Zeros, and on after.
                let next = ((stop.min(m_end) - addr) as usize).max(whole + PAGE_SIZE);
                buf[whole..next].fill(0);
                at = addr + next as u64;
                continue;
            }
            buf[whole..].fill(0);
            return Ok(whole);
        }
        at = stop;
    }
    Ok(buf.len())
}

/// The end of the mapping of `pid` that `addr` lies in, if one does (its
/// maps read again: only after a read was refused).
fn mapped_until(pid: i32, addr: u64) -> Option<u64> {
    let maps = procfs::maps(Some(pid)).ok()?;
    maps.iter()
        .find(|m| m.start <= addr && addr < m.end)
        .map(|m| m.end)
}

/// [`read`] of `buf` at `addr`, whose first `got` bytes are read.
fn read_from(pid: i32, addr: u64, buf: &mut [u8], mut got: usize) -> Result<usize> {
    while got < buf.len() {
        let at = addr + got as u64;
        match process::process_vm_read(pid, at, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            // Nothing mapped at `at` any more: unmapped meanwhile, or the
            // process is tearing its memory down on its way out.
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                if procfs::is_ending(pid) {
                    return Err(Error::ProcessExited(pid));
                }
                break;
            }
            // No task with this pid, or one whose memory is already gone: it
            // is in exit(), before /proc shows it as a zombie.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                return Err(Error::ProcessExited(pid));
            }
            Err(e) => {
                return Err(Error::for_pid(
                    pid,
                    format!("process_vm_readv at {at:#x}"),
                    e,
                ))
            }
        }
    }
    let whole = got / PAGE_SIZE * PAGE_SIZE;
    buf[whole..].fill(0);
    Ok(whole)
}

/// Reads exactly `buf.len()` bytes of process `pid` at `at`: a short read is
/// [`Error::Unmapped`].
pub fn read_exact(pid: i32, at: u64, buf: &mut [u8]) -> Result<()> {
    match process::process_vm_read(pid, at, buf) {
        Ok(n) if n == buf.len() => Ok(()),
        Ok(n) => Err(Error::Unmapped {
            pid,
            addr: at,
            len: buf.len() as u64,
            done: n as u64,
            write: false,
        }),
        Err(e) => Err(Error::for_pid(pid, format!("reading {at:#x}"), e)),
    }
}

/// Writes `buf` into process `pid` at `at`; returns how many bytes were
/// written (short where the range stops being mapped).
pub fn write(pid: i32, at: u64, buf: &[u8], what: &str) -> Result<usize> {
    not_ours(pid)?;
    // SAFETY: `pid` is another process (not_ours): no Rust reference of
    // this process points into what the kernel writes.
    unsafe { process::process_vm_write(pid, at, buf) }
        .map_err(|e| Error::for_pid(pid, what.to_string(), e))
}

/// Refuses `pid` where it is this process (by its thread group): pagewise
/// writes its own memory through Rust, never through here. A process that
/// shares its memory with pagewise otherwise (`CLONE_VM` without a thread
/// group) is never one pagewise acts on.
fn not_ours(pid: i32) -> Result<()> {
    let me = std::process::id() as i32;
    if pid == me || pagewise_sys::signal::is_own_thread(pid) {
        return Err(Error::SelfTarget { pid });
    }
    Ok(())
}

/// Writes all of `buf` into process `pid` at `at`: a short write is
/// [`Error::Unmapped`].
pub fn write_exact(pid: i32, at: u64, buf: &[u8]) -> Result<()> {
    not_ours(pid)?;
    // SAFETY: as in `write`.
    match unsafe { process::process_vm_write(pid, at, buf) } {
        Ok(n) if n == buf.len() => Ok(()),
        Ok(n) => Err(Error::Unmapped {
            pid,
            addr: at,
            len: buf.len() as u64,
            done: n as u64,
            write: true,
        }),
        Err(e) => Err(Error::for_pid(pid, format!("writing {at:#x}"), e)),
    }
}

/// Whole pages written into another process in batches of
/// `process_vm_writev` (1,024 pages a call, each its own local buffer;
/// adjacent pages make one remote range). Call [`Writer::flush`] at the end.
#[derive(Debug)]
pub struct Writer<'s> {
    pid: i32,
    local: Vec<&'s [u8]>,
    remote: Vec<(u64, usize)>,
}

impl<'s> Writer<'s> {
    /// Pages per call: `IOV_MAX`.
    pub const BATCH: usize = 1024;

    /// A writer into process `pid`; refused where `pid` is this process.
    pub fn new(pid: i32) -> Result<Self> {
        not_ours(pid)?;
        Ok(Writer {
            pid,
            local: Vec::with_capacity(Self::BATCH),
            remote: Vec::with_capacity(Self::BATCH),
        })
    }

    /// Writes `page` (one page) at `addr`, when the batch is full or at
    /// [`flush`](Self::flush).
    pub fn push(&mut self, addr: u64, page: &'s [u8]) -> Result<()> {
        debug_assert_eq!(page.len(), PAGE_SIZE);
        if self.local.len() == Self::BATCH {
            self.flush()?;
        }
        self.local.push(page);
        match self.remote.last_mut() {
            Some((a, l)) if *a + *l as u64 == addr => *l += PAGE_SIZE,
            _ => self.remote.push((addr, PAGE_SIZE)),
        }
        Ok(())
    }

    /// Writes what is batched; a short write (a page no longer mapped) is
    /// [`Error::Unmapped`].
    pub fn flush(&mut self) -> Result<()> {
        if self.local.is_empty() {
            return Ok(());
        }
        let want = self.local.len() * PAGE_SIZE;
        // SAFETY: `pid` is another process (checked in `new`).
        let n = unsafe { process::process_vm_writev_gather(self.pid, &self.local, &self.remote) }
            .map_err(|e| Error::for_pid(self.pid, "process_vm_writev", e))?;
        if n != want {
            return Err(Error::Unmapped {
                pid: self.pid,
                addr: self.remote[0].0,
                len: want as u64,
                done: n as u64,
                write: true,
            });
        }
        self.local.clear();
        self.remote.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process and each of its threads are refused by pid; another
    /// process is not (its write fails for the address, not for whose it
    /// is).
    #[test]
    fn writes_into_pagewise_itself_are_refused() {
        let me = std::process::id() as i32;
        assert!(matches!(
            write_exact(me, 0x1000, &[0]),
            Err(Error::SelfTarget { .. })
        ));
        let (tx, rx) = std::sync::mpsc::channel();
        let (hold, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(pagewise_sys::process::gettid()).unwrap();
            let _ = wait.recv();
        });
        let tid = rx.recv().unwrap();
        assert_ne!(tid, me);
        let r = write(tid, 0x1000, &[0], "a test write");
        assert!(
            matches!(r, Err(Error::SelfTarget { pid }) if pid == tid),
            "{r:?}"
        );
        assert!(matches!(Writer::new(tid), Err(Error::SelfTarget { .. })));
        drop(hold);
        t.join().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let r = write_exact(child.id() as i32, 0x1000, &[0]);
        assert!(
            r.is_err() && !matches!(r, Err(Error::SelfTarget { .. })),
            "{r:?}"
        );
        let _ = child.kill();
        let _ = child.wait();
    }
}
