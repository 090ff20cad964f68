//! The point: taken at the program's first read of its input.

use super::*;

/// Reads a whole small file of /proc (the point is taken once).
fn proc_text(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))
}

/// Takes the point at the program's first read of its input (not made
/// yet), then serves the first run.
///
/// # Safety
/// `ctx` is the frame of this SIGSYS; called once, before the point.
pub(super) unsafe fn point(ctx: *mut libc::c_void, t: &seccomp::Trapped) {
    // SAFETY: one thread is checked first thing in `take`, before any
    // other use; nothing else holds the state before the point.
    let s = unsafe { state() };
    let began = now_ns();
    // SAFETY: as this function's.
    if let Err(why) = unsafe { take(s, ctx) } {
        write_why(&s.board.refused_len, &s.board.refused, &[why.as_bytes()]);
        end_now();
    }
    s.board.point_ns.store(now_ns() - began, Ordering::Relaxed);
    let pid = sys(libc::SYS_getpid, [0; 6]) as i32;
    s.board.pid.store(pid, Ordering::Relaxed);
    s.board.set_stage(stage::IDLE);
    POINT_PID.store(pid, Ordering::Release);
    if !s.req.control_read && !read_control(s) {
        s.board.set_stage(stage::GONE);
        end_now();
    }
    s.board.set_stage(stage::OWES_PID);
    tell(s, pid as u32);
    s.board.set_stage(stage::RUNNING);
    s.run_started = now_ns();
    pass(ctx, t);
}

/// Reads the next control word; false when AFL++ closed the pipe.
pub(super) fn read_control(s: &Inside) -> bool {
    let mut w = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let r = sys(
            libc::SYS_read,
            a3(
                s.req.control as u64,
                w[got..].as_mut_ptr() as u64,
                (4 - got) as u64,
            ),
        );
        if r == -(libc::EINTR as i64) {
            continue;
        }
        if r <= 0 {
            return false;
        }
        got += r as usize;
    }
    true
}

/// Writes one word to AFL++'s status pipe; a fuzzer gone ends the program.
pub(super) fn tell(s: &Inside, word: u32) {
    let b = word.to_ne_bytes();
    loop {
        let r = sys(
            libc::SYS_write,
            a3(s.req.status as u64, b.as_ptr() as u64, 4),
        );
        if r == -(libc::EINTR as i64) {
            continue;
        }
        if r != 4 {
            s.board.set_stage(stage::GONE);
            end_now();
        }
        return;
    }
}

/// The point: see the module.
///
/// # Safety
/// `ctx` is the frame of this SIGSYS.
unsafe fn take(s: &mut Inside, ctx: *mut libc::c_void) -> Result<(), String> {
    let stat = proc_text("/proc/self/stat")?;
    let threads: u64 = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().nth(17))
        .and_then(|v| v.parse().ok())
        .ok_or("reading the thread count in /proc/self/stat")?;
    if threads != 1 {
        return Err(format!(
            "the program has {threads} threads at its first read (a reset inside it needs one)"
        ));
    }
    // SAFETY: a zeroed stack_t is valid storage.
    let mut cur: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: reads the thread's alternate stack into `cur`.
    unsafe { libc::sigaltstack(std::ptr::null(), &mut cur) };
    if cur.ss_sp as u64 != s.alt.0 {
        return Err("the program set an alternate signal stack of its own".into());
    }
    // Whatever calls the C library (which may allocate, and so move the
    // break and write its own data), made before memory is copied: the
    // copy, the break and the layout are then of one instant.
    own_descriptors(s)?;
    descriptors(s)?;
    let brk = sys(libc::SYS_brk, a1(0)) as u64;
    let (regions, total) = regions_of(s)?;
    if regions.is_empty() {
        return Err("the program has no private writable memory".into());
    }
    let copy = pagewise_sys::mem::mmap_anonymous(total as usize)
        .map_err(|e| format!("the point's copy ({total} bytes): {e}"))?;
    pagewise_mech::procfs::note_own_memory(copy as u64, total);
    let mut off = 0u64;
    for &(a, e, anon) in &regions {
        // SAFETY: a readable mapping of this process (private writable),
        // into the shim's copy made for it.
        let dst = unsafe { copy.add(off as usize) };
        // SAFETY: see above: both ranges are mapped and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(a as *const u8, dst, (e - a) as usize) };
        s.regions.push(Copied {
            start: a,
            end: e,
            copy: dst,
            anon,
        });
        off += e - a;
    }
    let t = now_ns();
    let collapsed = match s.req.huge_pages {
        true => collapse(&s.regions),
        false => 0,
    };
    s.board.collapsed_bytes.store(collapsed, Ordering::Relaxed);
    s.board.collapse_ns.store(now_ns() - t, Ordering::Relaxed);
    // SAFETY: the userfaultfd the shim holds for the life of the process.
    let uffd = unsafe { std::os::fd::BorrowedFd::borrow_raw(s.uffd) };
    for c in &s.regions {
        let len = c.end - c.start;
        pagewise_sys::uffd::register(uffd, c.start, len, pagewise_sys::uffd::REGISTER_MODE_WP)
            .and_then(|_| pagewise_sys::uffd::writeprotect(uffd, c.start, len, true))
            .map_err(|e| format!("write-protecting {:#x}..{:#x}: {e}", c.start, c.end))?;
    }
    // The regions, those that touch joined.
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for c in &s.regions {
        match spans.last_mut() {
            Some((_, e)) if *e == c.start => *e = c.end,
            _ => spans.push((c.start, c.end)),
        }
    }
    // The smallest spans are copied back whole at each reset, never
    // protected: cheaper than a walk of their own.
    for (a, e) in spans {
        if e - a <= WHOLE_MAX {
            pagewise_sys::uffd::writeprotect(uffd, a, e - a, false)
                .map_err(|e| format!("letting {a:#x} be written: {e}"))?;
            s.whole.push((a, e));
        } else {
            s.walked.push((a, e));
        }
    }
    s.brk = sys(libc::SYS_brk, a1(0)) as u64;
    if s.brk != brk {
        return Err("the break moved while the point was taken".into());
    }
    s.brk_low = s.brk;
    // SAFETY: the frame of this SIGSYS: its registers, flags, mask and
    // XSAVE area (its size as the kernel says in the area).
    unsafe {
        let uc = ctx as *mut libc::ucontext_t;
        s.gregs = (*uc).uc_mcontext.gregs;
        s.uc_flags = (*uc).uc_flags;
        s.sigmask = std::ptr::read(&(*uc).uc_sigmask as *const _ as *const u64);
        let fp = (*uc).uc_mcontext.fpregs as *const u8;
        let n = fp_size(fp);
        s.fp = std::slice::from_raw_parts(fp, n).to_vec();
    }
    Ok(())
}

/// Keeps the point's state in huge pages where it can (before it is
/// registered: the kernel collapses no page that is write-protected):
/// each 2 MiB block of an anonymous region that is populated whole is
/// collapsed (`MADV_COLLAPSE`; a block with a hole is left, which the
/// collapse would fill). A file's private mapping is left: its file's
/// cached pages, which other processes share, would be collapsed. The
/// reset's walk then reads one entry for such a block until a run writes
/// it (the write splits its mapping into pages, each still protected but
/// the one written). Not a byte changes; a block the kernel refuses is
/// left as it is. The bytes collapsed.
fn collapse(regions: &[Copied]) -> u64 {
    const HUGE: u64 = pagewise_mech::HUGE_PAGE_SIZE as u64;
    let Ok(mut walker) = pagewise_mech::walk::PageWalker::new(None) else {
        return 0;
    };
    let mut runs = Vec::new();
    let mut done = 0;
    for c in regions.iter().filter(|c| c.anon) {
        let (lo, hi) = (c.start.next_multiple_of(HUGE), c.end / HUGE * HUGE);
        let Ok(r) = pagewise_mech::Region::new(lo, hi.saturating_sub(lo)) else {
            continue;
        };
        if walker.populated(r, &mut runs).is_err() {
            continue;
        }
        for &(a, b) in &runs {
            let mut at = a.next_multiple_of(HUGE);
            while at + HUGE <= b {
                let advice = pagewise_sys::mem::MADV_COLLAPSE;
                if pagewise_sys::mem::advise(at, HUGE as usize, advice).is_ok() {
                    done += HUGE;
                }
                at += HUGE;
            }
        }
    }
    done
}

/// The largest span copied back whole at each reset instead of walked:
/// a `PAGEMAP_SCAN` call costs about what copying four pages does (1 to 2
/// µs here), and a page written then costs a protection and a fault more.
const WHOLE_MAX: u64 = 4 * PAGE;

/// The shim's descriptors made: its userfaultfd and pagemap file and
/// `/proc/self/task`, out of the program's way (the program's next open
/// gets the number it would get without the shim).
fn own_descriptors(s: &mut Inside) -> Result<(), String> {
    let wp = pagewise_mech::wp::UffdWp::open().map_err(|e| e.to_string())?;
    // The threads, counted at the end of each run (1 µs).
    // SAFETY: a valid path and flags.
    s.tasks = unsafe {
        libc::open(
            c"/proc/self/task".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if s.tasks < 0 {
        return Err(format!(
            "opening /proc/self/task: {}",
            std::io::Error::last_os_error()
        ));
    }
    s.tasks = moved_high(s.tasks);
    // One thread now (checked first thing in `take`).
    s.one_thread_links = super::task_links(s.tasks);
    if s.one_thread_links == 0 {
        return Err(format!(
            "reading /proc/self/task: {}",
            std::io::Error::last_os_error()
        ));
    }
    {
        use std::os::fd::AsRawFd;
        let (u, p) = wp.descriptors();
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) of descriptors `wp` holds; the
        // duplicates outlive it (closed with the process).
        let dup = |fd: i32| unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, SHIM_FDS) };
        s.uffd = dup(u.as_raw_fd());
        s.pagemap = dup(p.as_raw_fd());
    }
    drop(wp);
    if s.uffd < 0 || s.pagemap < 0 {
        return Err(format!(
            "moving the userfaultfd out of the program's way: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The point's descriptors: their numbers (the shim's with them: a reset
/// closes any other), the ranges of numbers between them, and the offsets
/// of the regular files.
fn descriptors(s: &mut Inside) -> Result<(), String> {
    // The descriptors, the shim's with them (its userfaultfd, the pagemap,
    // AFL++'s pipes): a reset closes any other.
    let mut fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| format!("listing /proc/self/fd: {e}"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    // The directory's own descriptor, closed since.
    // SAFETY: fcntl(F_GETFD) reads a descriptor's flags.
    fds.retain(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0);
    let mut prev: i64 = -1;
    for &fd in &fds {
        if fd as i64 > prev + 1 {
            s.gaps.push(((prev + 1) as u32, (fd - 1) as u32));
        }
        prev = fd as i64;
    }
    s.gaps.push(((prev + 1) as u32, u32::MAX));
    for &fd in &fds {
        // The standard output and error may be a shell's file too: their
        // offsets are the shell's as well. The input's is afl-fuzz's: it
        // writes each input and sets the offset to its start (a program
        // started again after a run takes its point where that run left
        // the offset).
        if fd == 1 || fd == 2 || fd == s.req.input {
            continue;
        }
        // The shim's own (the board's memory file, the pagemap): none of
        // the program's calls moves their offsets.
        let own = [
            s.uffd,
            s.pagemap,
            s.tasks,
            s.req.control,
            s.req.status,
            s.req.board,
        ];
        if own.contains(&fd) {
            continue;
        }
        // SAFETY: a zeroed stat is valid storage.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat into `st`.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
            continue;
        }
        // SAFETY: lseek reads the offset.
        let pos = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
        if pos >= 0 {
            s.offsets.push((fd, pos as u64));
        }
    }
    s.fds = fds;
    Ok(())
}

/// A part of the program's private writable memory: start, end, and
/// whether it is anonymous.
type Part = (u64, u64, bool);

/// The private writable memory of the program, and its size in all;
/// every mapping noted in `s.mappings`.
fn regions_of(s: &mut Inside) -> Result<(Vec<Part>, u64), String> {
    let maps = pagewise_mech::procfs::maps(None).map_err(|e| e.to_string())?;
    let own = pagewise_mech::procfs::own_memory();
    // The shim's own file (this code's) and the zero-filled data after it:
    // its state, never the program's.
    let here = on_sigsys as *const () as u64;
    let shim = maps.iter().find(|m| m.start <= here && here < m.end);
    let shim_file = shim.map(|m| (m.inode, m.path.clone()));
    let shim_data_end = shim_file.as_ref().and_then(|f| {
        maps.iter()
            .filter(|m| m.write && (m.inode, m.path.clone()) == *f)
            .map(|m| m.end)
            .max()
    });
    let is_own = |m: &pagewise_mech::procfs::Mapping| {
        shim_file
            .as_ref()
            .is_some_and(|f| (m.inode, &m.path) == (f.0, &f.1))
            || (Some(m.start) == shim_data_end && m.is_anonymous())
            || m.is_pagewise()
    };
    let mut regions = Vec::new();
    let mut total = 0u64;
    for m in &maps {
        s.mappings.push((m.start, m.end));
        if !m.write || m.shared || m.path == "[vsyscall]" || is_own(m) {
            continue;
        }
        // The shim's own ranges taken out: the kernel merges a mapping of
        // the program with one of the shim's next to it (its heap, say)
        // into one line of the maps, and a mapping that met the shim's
        // was once left out whole (the program's 8 MiB beside the
        // shim's heap went untracked).
        for (a, e) in pagewise_mech::procfs::outside_ranges(m.start, m.end, &own) {
            regions.push((a, e, m.is_anonymous()));
            total += e - a;
        }
    }
    s.mappings.sort_unstable();
    Ok((regions, total))
}

/// The size of the `XSAVE` area at `fp` in a signal frame: the extended
/// size its software-reserved bytes give (`FP_XSTATE_MAGIC1`), else the
/// legacy 512.
///
/// # Safety
/// `fp` is a signal frame's FP state.
pub(super) unsafe fn fp_size(fp: *const u8) -> usize {
    // struct _fpx_sw_bytes at offset 464: magic1, extended_size.
    // SAFETY: the legacy area is 512 bytes, these lie inside it.
    let (magic, size) = unsafe {
        (
            std::ptr::read_unaligned(fp.add(464) as *const u32),
            std::ptr::read_unaligned(fp.add(468) as *const u32),
        )
    };
    if magic == 0x4650_5853 && (512..=65536).contains(&size) {
        size as usize
    } else {
        512
    }
}
