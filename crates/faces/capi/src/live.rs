//! Live pre-copy checkpoints and migration of another process.

use super::*;

/// Compression on the wire to a receiver: LZ4 where it saves an eighth.
pub const PW_COMPRESS_AUTO: u32 = 0;
/// Raw pages on the wire (zero pages still sent as such).
pub const PW_COMPRESS_NONE: u32 = 1;
/// LZ4 for every chunk.
pub const PW_COMPRESS_LZ4: u32 = 2;

/// How live checkpoints proceed. All zero: the defaults (50 ms, 30 passes,
/// no throttling).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_live_options {
    /// The longest the writers may be stopped, ms (0: 50).
    pub max_downtime_ms: f64,
    /// Passes before the writers are stopped whatever is left (0: 30).
    pub max_passes: u32,
    /// Non-zero: slow the writers down when they write faster than pages
    /// are copied.
    pub throttle: c_int,
}

/// What one live checkpoint did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_live_report {
    /// The snapshot saved (its id in the store or the receiver's store).
    pub save: pw_save_stats,
    /// Passes while the writers ran.
    pub passes: u32,
    /// Non-zero when the rest fitted the budget before the passes ran out.
    pub converged: c_int,
    /// Pages copied while the writers were stopped.
    pub final_pages: u64,
    /// Bytes copied in all.
    pub bytes_copied: u64,
    /// How long the writers were stopped, ms.
    pub downtime_ms: f64,
    /// From the stop to the destination holding the whole copy, ms.
    pub handover_ms: f64,
    /// From the start to the writers running again, ms.
    pub copy_ms: f64,
    /// The whole checkpoint, ms.
    pub total_ms: f64,
}

/// Called with `stop` non-zero to stop every thread that writes the
/// regions (return once they are stopped), and with 0 to let them run.
pub type pw_pause_fn = Option<unsafe extern "C" fn(user: *mut c_void, stop: c_int)>;

enum LiveDest {
    None,
    Store(Box<pw::snap::live::StoreSeries<DiskStore>>),
    Receiver(Box<pw::snap::wire::Sender>),
}

/// Live checkpoints (pre-copy) of another process or of regions of the
/// calling process, to a store or a receiver (`pagewise receive`).
pub struct pw_live {
    inner: pw::snap::live::Checkpointer<Box<dyn pw::snap::live::Source>>,
    dest: LiveDest,
}

impl pw_live {
    fn new(src: Box<dyn pw::snap::live::Source>, opts: *const pw_live_options) -> pw_live {
        pw_live {
            inner: pw::snap::live::Checkpointer::new(src, live_options(opts)),
            dest: LiveDest::None,
        }
    }
}

/// The caller's pause callback and its argument.
struct CPause {
    f: unsafe extern "C" fn(*mut c_void, c_int),
    user: *mut c_void,
}

// SAFETY: the callback is called only from the thread that calls
// `pw_live_checkpoint` on the handle (the handle's thread), as the header
// says; the pointer is the caller's to share.
unsafe impl Send for CPause {}

fn live_options(opts: *const pw_live_options) -> pw::snap::live::LiveOptions {
    // SAFETY: NULL or a readable options struct, by the caller's contract.
    let o = unsafe { opts.as_ref() }.copied().unwrap_or_default();
    let d = pw::snap::live::LiveOptions::default();
    pw::snap::live::LiveOptions::default()
        .max_downtime_ms(if o.max_downtime_ms > 0.0 {
            o.max_downtime_ms
        } else {
            d.max_downtime_ms
        })
        .max_passes(if o.max_passes > 0 {
            o.max_passes as usize
        } else {
            d.max_passes
        })
        .throttle(o.throttle != 0)
}

/// Live checkpoints of another process `pid` (its writable memory, tracked
/// with uffd-wp from outside, stopped with ptrace for the last pass).
/// `opts` may be NULL. Set a destination before the first checkpoint.
///
/// # Safety
/// `opts` is NULL or readable; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_live_process(
    pid: i32,
    opts: *const pw_live_options,
    out: *mut *mut pw_live,
) -> c_int {
    call("pw_live_process", || {
        let src = pw::snap::live::ProcessSource::new(pid)?;
        // SAFETY: the caller's contract.
        unsafe { give(out, pw_live::new(Box::new(src), opts)) }
    })
}

/// Live checkpoints of `n` regions of the calling process (private,
/// writable, mapped while the handle lives), tracked with uffd-wp inside.
/// `pause(user, 1)` must stop every thread that writes them and return once
/// they are stopped; `pause(user, 0)` lets them run. It is called from the
/// thread that calls `pw_live_checkpoint`. `opts` may be NULL.
///
/// # Safety
/// `regions` holds `n` regions; `pause` is valid code until the handle is
/// freed; `opts` is NULL or readable; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn pw_live_regions(
    regions: *const pw_region,
    n: usize,
    pause: pw_pause_fn,
    user: *mut c_void,
    opts: *const pw_live_options,
    out: *mut *mut pw_live,
) -> c_int {
    call("pw_live_regions", || {
        // SAFETY: the caller's contract.
        let rs = unsafe { regions_of(regions, n) }?;
        let f = pause.ok_or_else(|| invalid("pause is NULL"))?;
        let cp = CPause { f, user };
        let src = pw::snap::live::OwnRegions::new(&rs, move |stop| {
            let cp = &cp;
            // SAFETY: the caller vouches for the callback and its argument.
            unsafe { (cp.f)(cp.user, c_int::from(stop)) }
        })?;
        // SAFETY: the caller's contract.
        unsafe { give(out, pw_live::new(Box::new(src), opts)) }
    })
}

/// Saves the checkpoints into the durable store in directory `dir` (created
/// if missing; each snapshot after the first takes unchanged pages over from
/// the one before). Replaces any destination set before; the next
/// checkpoint copies everything.
///
/// # Safety
/// `l` is a live handle; `dir` is a string.
#[no_mangle]
pub unsafe extern "C" fn pw_live_to_store(
    l: *mut pw_live,
    dir: *const c_char,
    verify: c_int,
) -> c_int {
    call("pw_live_to_store", || {
        // SAFETY: the caller's contract.
        let (l, dir) = unsafe { (obj(l, "live")?, str_of(dir, "dir")?) };
        let store = DiskStore::create(OsStr::from_bytes(dir.to_bytes()), verify != 0)?;
        l.dest = LiveDest::Store(Box::new(pw::snap::live::StoreSeries::new(store)));
        l.inner.restart();
        Ok(())
    })
}

/// Streams the checkpoints to `pagewise receive` listening at `host_port`
/// ("HOST:PORT"), with compression `PW_COMPRESS_*`. Replaces any
/// destination set before; the next checkpoint copies everything.
///
/// # Safety
/// `l` is a live handle; `host_port` is a string.
#[no_mangle]
pub unsafe extern "C" fn pw_live_to_receiver(
    l: *mut pw_live,
    host_port: *const c_char,
    compression: u32,
) -> c_int {
    call("pw_live_to_receiver", || {
        // SAFETY: the caller's contract.
        let (l, addr) = unsafe { (obj(l, "live")?, str_of(host_port, "host_port")?) };
        let c = match compression {
            PW_COMPRESS_AUTO => pw::snap::wire::Compression::Auto,
            PW_COMPRESS_NONE => pw::snap::wire::Compression::None,
            PW_COMPRESS_LZ4 => pw::snap::wire::Compression::Lz4,
            other => return Err(invalid(format!("compression {other}: PW_COMPRESS_*"))),
        };
        let addr = addr
            .to_str()
            .map_err(|_| invalid("host_port is not UTF-8"))?;
        l.dest = LiveDest::Receiver(Box::new(pw::snap::wire::Sender::connect(addr, c)?));
        l.inner.restart();
        Ok(())
    })
}

/// Takes the next live checkpoint to the destination, labelled `label` (may
/// be NULL); what it did goes to `*report` (may be NULL). After the first,
/// a checkpoint starts from the pages written since the one before.
///
/// # Safety
/// `l` is a live handle; `label` is NULL or a string; `report` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pw_live_checkpoint(
    l: *mut pw_live,
    label: *const c_char,
    report: *mut pw_live_report,
) -> c_int {
    call("pw_live_checkpoint", || {
        // SAFETY: the caller's contract.
        let l = unsafe { obj(l, "live") }?;
        // SAFETY: the caller's contract.
        let label = unsafe { label_of(label) };
        let dest: &mut dyn pw::snap::live::Destination = match &mut l.dest {
            LiveDest::None => {
                return Err(invalid(
                    "no destination: call pw_live_to_store or pw_live_to_receiver first",
                ))
            }
            LiveDest::Store(s) => &mut **s,
            LiveDest::Receiver(r) => &mut **r,
        };
        let r = l.inner.checkpoint(dest, &label, &mut |_| {}, &mut || {})?;
        let c = pw_live_report {
            save: save_stats(&r.save),
            passes: r.passes.len() as u32,
            converged: c_int::from(r.converged),
            final_pages: r.final_pages,
            bytes_copied: r.bytes_copied,
            downtime_ms: r.downtime_ms,
            handover_ms: r.handover_ms,
            copy_ms: r.copy_ms,
            total_ms: r.total_ms,
        };
        // SAFETY: the caller's contract.
        unsafe { put_opt(report, c) };
        Ok(())
    })
}

/// Stops tracking and frees the handle (NULL is ignored): nothing stays
/// registered in the process; a receiver's connection is closed (a snapshot
/// it had not finished is discarded there).
///
/// # Safety
/// `l` is NULL or a handle not freed yet.
#[no_mangle]
pub unsafe extern "C" fn pw_live_free(l: *mut pw_live) {
    // SAFETY: the caller's contract: a handle this library made, freed once.
    unsafe { free_handle(l) }
}
