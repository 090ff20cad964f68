//! A reset: memory, the break, mappings, descriptors and registers put
//! back at the point.

use super::*;

/// Puts memory, the break, mappings, descriptors and registers back at
/// the point.
///
/// # Safety
/// `ctx` is the frame of this SIGSYS; the program is single-threaded.
pub(super) unsafe fn reset(s: &mut Inside, ctx: *mut libc::c_void) -> Result<(), &'static [u8]> {
    let b = s.board;
    let t0 = now_ns();
    let given_back = put_back_break(s)?;
    s.runs.clear();
    s.brk_low = s.brk;
    for &(a, n) in &s.made {
        sys(libc::SYS_munmap, [a, n, 0, 0, 0, 0]);
    }
    s.made.clear();
    let t1 = now_ns();
    // The pages written since the point.
    for k in 0..s.walked.len() {
        let (mut from, end) = s.walked[k];
        loop {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                start: from,
                end,
                vec: s.scan.as_mut_ptr() as u64,
                vec_len: s.scan.len() as u64,
                // WRITTEN alone: adding WPALLOWED (a mapping's category)
                // makes the kernel's walk 2.3x slower (41 against 18 µs over
                // 64 MiB here); every span is registered.
                category_mask: pagemap::category::WRITTEN,
                return_mask: pagemap::category::WRITTEN,
                ..Default::default()
            };
            let n = sys(
                libc::SYS_ioctl,
                a3(
                    s.pagemap as u64,
                    pagemap::PAGEMAP_SCAN,
                    &mut arg as *mut PmScanArg as u64,
                ),
            );
            if n < 0 {
                return Err(b"PAGEMAP_SCAN failed");
            }
            let n = n as usize;
            for r in &s.scan[..n] {
                if s.runs.len() == s.runs.capacity() {
                    return Err(b"too many runs of written pages");
                }
                s.runs.push((r.start, r.end));
            }
            match pagemap::next_scan_start(from, &arg, &s.scan[..n]) {
                Some(next) if n == s.scan.len() => from = next,
                _ => break,
            }
        }
    }
    let t2 = now_ns();
    let mut pages = 0u64;
    // Protected again, but the pages found written at the last reset too
    // (a stack, a C library's data: written by every run, they would cost
    // a protection and a fault each time); all of them every HOT_ROUNDS
    // resets, so that a page no longer written cools down.
    s.round += 1;
    if s.round.is_multiple_of(HOT_ROUNDS) {
        s.last.clear();
    }
    let mut j = 0;
    for i in 0..s.runs.len() {
        let (a, e) = s.runs[i];
        pages += (e - a) / PAGE;
        copy_back(s, a, e);
        // The parts of [a, e) not written at the last reset.
        let mut at = a;
        while at < e {
            while j < s.last.len() && s.last[j].1 <= at {
                j += 1;
            }
            let (hot_a, hot_e) = s.last.get(j).copied().unwrap_or((u64::MAX, u64::MAX));
            if hot_a <= at {
                at = hot_e.min(e);
                continue;
            }
            let end = hot_a.min(e);
            protect(s.uffd, at, end);
            at = end;
        }
    }
    for i in 0..s.whole.len() {
        let (a, e) = s.whole[i];
        copy_back(s, a, e);
        pages += (e - a) / PAGE;
    }
    if let Some((a, e)) = given_back {
        copy_back(s, a, e);
        protect(s.uffd, a, e);
        pages += (e - a) / PAGE;
    }
    std::mem::swap(&mut s.last, &mut s.runs);
    if s.crash_changed != 0 {
        catch_again(s.crash_changed);
        s.crash_changed = 0;
    }
    // Descriptors opened since closed; offsets back.
    for &(lo, hi) in &s.gaps {
        sys(libc::SYS_close_range, a3(lo as u64, hi as u64, 0));
    }
    for &(fd, pos) in &s.offsets {
        sys(libc::SYS_lseek, a3(fd as u64, pos, libc::SEEK_SET as u64));
    }
    // SAFETY: the frame of this SIGSYS becomes the point's: registers,
    // flags, mask and XSAVE area (the same size: the same process).
    unsafe {
        let uc = ctx as *mut libc::ucontext_t;
        (*uc).uc_mcontext.gregs = s.gregs;
        (*uc).uc_flags = s.uc_flags as _;
        std::ptr::write(&mut (*uc).uc_sigmask as *mut _ as *mut u64, s.sigmask);
        let fp = (*uc).uc_mcontext.fpregs as *mut u8;
        if fp_size(fp) == s.fp.len() {
            std::ptr::copy_nonoverlapping(s.fp.as_ptr(), fp, s.fp.len());
        } else {
            return Err(b"the XSAVE area changed size");
        }
    }
    let t3 = now_ns();
    b.walk_ns.fetch_add(t2 - t1, Ordering::Relaxed);
    b.copy_ns
        .fetch_add((t3 - t2) + (t1 - t0), Ordering::Relaxed);
    b.pages_dirty.fetch_add(pages, Ordering::Relaxed);
    Ok(())
}

/// Puts the break back at the point's; pages given back since are mapped
/// again and registered (filled from the point's copy by the caller): the
/// range given back, if any.
fn put_back_break(s: &mut Inside) -> Result<Option<(u64, u64)>, &'static [u8]> {
    // Not called during the run (by the C library): the point's still.
    if s.brk_called {
        let cur = sys(libc::SYS_brk, a1(0)) as u64;
        if cur != s.brk && sys(libc::SYS_brk, a1(s.brk)) as u64 != s.brk {
            return Err(b"the break could not be put back");
        }
        s.brk_called = false;
    }
    let heap_end = s.brk.next_multiple_of(PAGE);
    let low = s.brk_low.next_multiple_of(PAGE);
    if low < heap_end {
        let mut reg = pagewise_sys::uffd::UffdioRegister {
            range: pagewise_sys::uffd::UffdioRange {
                start: low,
                len: heap_end - low,
            },
            mode: pagewise_sys::uffd::REGISTER_MODE_WP,
            ioctls: 0,
        };
        let r = sys(
            libc::SYS_ioctl,
            a3(
                s.uffd as u64,
                pagewise_sys::uffd::UFFDIO_REGISTER,
                &mut reg as *mut _ as u64,
            ),
        );
        if r != 0 {
            return Err(b"the heap given back could not be registered again");
        }
    }
    Ok((low < heap_end).then_some((low, heap_end)))
}

/// How often every page written is protected again (see `reset`).
const HOT_ROUNDS: u64 = 64;

/// Write-protects `[a, e)` again (registered).
fn protect(uffd: i32, a: u64, e: u64) {
    let mut wp = pagewise_sys::uffd::UffdioWriteprotect {
        range: pagewise_sys::uffd::UffdioRange {
            start: a,
            len: e - a,
        },
        mode: pagewise_sys::uffd::WRITEPROTECT_MODE_WP,
    };
    sys(
        libc::SYS_ioctl,
        a3(
            uffd as u64,
            pagewise_sys::uffd::UFFDIO_WRITEPROTECT,
            &mut wp as *mut _ as u64,
        ),
    );
}

/// Copies `[a, e)` back from the point's copy; what lies outside every
/// mapping of the point (a stack grown since) is given back as zeros.
fn copy_back(s: &Inside, a: u64, e: u64) {
    let mut at = a;
    let mut i = s.regions.partition_point(|c| c.end <= at);
    while at < e {
        match s.regions.get(i) {
            Some(c) if c.start <= at => {
                let end = e.min(c.end);
                // SAFETY: `[at, end)` lies in a mapping of the point (still
                // mapped: unmapping it ends the program instead) and in its
                // copy.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        c.copy.add((at - c.start) as usize),
                        at as *mut u8,
                        (end - at) as usize,
                    )
                };
                at = end;
                i += 1;
            }
            next => {
                let end = next.map_or(e, |c| c.start.min(e));
                sys(
                    libc::SYS_madvise,
                    a3(at, end - at, libc::MADV_DONTNEED as u64),
                );
                at = end;
            }
        }
    }
}
