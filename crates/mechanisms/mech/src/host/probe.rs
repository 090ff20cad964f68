//! What this kernel offers: probed once per process, shared by every capability.
//!
//! [`get`] runs the probe the first time it is called and returns the same
//! answer afterwards; nothing else in pagewise probes the kernel on its own.
//! `pagewise probe` prints it.
//!
//! Each [`Feature`] has a stable name, whether pagewise can use it here, and
//! how that was found or why not; a backend or test that needs a missing
//! feature passes on [`Probe::why`]'s sentence. A feature is found by
//! using it once on the probe's own scratch memory, never by the kernel's
//! version number (distributions backport, and a setting can turn a
//! feature off):
//!
//! - **userfaultfd**: opened in turn as `userfaultfd(2)`, with
//!   `UFFD_USER_MODE_ONLY`, and through `/dev/userfaultfd`; the first that
//!   answers `UFFDIO_API` is the way pagewise opens it from then on, and
//!   each feature bit it reports is a feature `uffd.NAME` (`WP_ASYNC`,
//!   `MINOR_SHMEM`, `MOVE`, …). `vm.unprivileged_userfaultfd` is read to
//!   say why an unprivileged open failed.
//! - **`PAGEMAP_SCAN`**: the ioctl on `/proc/self/pagemap` must find the
//!   one page the probe wrote, as exactly one region.
//! - **soft-dirty**: a page written must show the bit, lose it through
//!   `clear_refs` and show it again when written again.
//! - **transparent huge pages**: the mode in `enabled`, and
//!   `MADV_COLLAPSE` on a filled, aligned 2 MiB (a refusal for want of
//!   memory now, `EAGAIN` or `ENOMEM`, still counts as present).
//! - **KSM, idle page tracking, DAMON**: their sysfs files (DAMON: the
//!   operations an existing context offers; the probe creates no kdamond,
//!   as that would change the system's state).
//! - **`process_madvise`**: an empty request on a pidfd of the probe's own
//!   process is accepted.
//! - **hardware counters**: `perf_event_open` of the instruction count.

use crate::procfs;
use pagewise_sys::{mem, pagemap, process, uffd, HUGE_PAGE_SIZE, PAGE_SIZE};
use serde::Serialize;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::OnceLock;

/// One feature: available or not, and why.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Feature {
    /// Stable name, such as `uffd.WP_ASYNC` or `pagemap_scan`.
    pub name: String,
    /// Whether pagewise can use it here.
    pub available: bool,
    /// How it was found, or why it is unavailable.
    pub detail: String,
}

/// How pagewise can open a userfaultfd here.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[non_exhaustive]
pub struct UffdAccess {
    /// Through the system call (`false`: only through `/dev/userfaultfd`).
    pub syscall: bool,
    /// Only with `UFFD_USER_MODE_ONLY` (unprivileged users when `vm.unprivileged_userfaultfd=0`).
    pub user_mode_only: bool,
}

/// The probe's answer.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Probe {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// How userfaultfd can be opened, if at all.
    pub uffd_access: Option<UffdAccess>,
    /// Feature bits the kernel's `UFFDIO_API` reported.
    pub uffd_features: u64,
    /// `PAGEMAP_SCAN` works on `/proc/self/pagemap`.
    pub pagemap_scan: bool,
    /// Soft-dirty bits are maintained (`CONFIG_MEM_SOFT_DIRTY`).
    pub soft_dirty: bool,
    /// THP mode: `always`, `madvise` or `never` (empty when THP is absent).
    pub thp_mode: String,
    /// `MADV_COLLAPSE` is accepted.
    pub madv_collapse: bool,
    /// KSM is built in (`/sys/kernel/mm/ksm`).
    pub ksm: bool,
    /// `prctl(PR_SET_MEMORY_MERGE)` is accepted.
    pub memory_merge: bool,
    /// The KSM advisor can pace ksmd (`/sys/kernel/mm/ksm/advisor_mode`,
    /// Linux 6.9).
    pub ksm_advisor: bool,
    /// `process_madvise(2)` exists.
    pub process_madvise: bool,
    /// Idle page tracking (`/sys/kernel/mm/page_idle/bitmap`).
    pub idle_page: bool,
    /// DAMON with virtual-address operations.
    pub damon_vaddr: bool,
    /// Hardware performance counters through `perf_event_open`.
    pub perf_hw: bool,
    /// Every feature with its detail, in report order.
    pub features: Vec<Feature>,
}

impl Probe {
    /// Whether the kernel reported a userfaultfd feature bit.
    pub fn uffd_has(&self, bit: u64) -> bool {
        self.uffd_access.is_some() && self.uffd_features & bit == bit
    }

    /// Whether userfaultfd can answer a missing page with SIGBUS in the
    /// faulting thread (`UFFD_FEATURE_SIGBUS`: far memory's inline path).
    pub fn uffd_sigbus(&self) -> bool {
        self.uffd_has(pagewise_sys::uffd::feature::SIGBUS)
    }

    /// The detail line of a named feature.
    pub fn why(&self, name: &str) -> String {
        self.features
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.detail.clone())
            .unwrap_or_else(|| format!("{name} was not probed"))
    }
}

/// The probe, run on first use.
pub fn get() -> &'static Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    PROBE.get_or_init(run)
}

fn feat(out: &mut Vec<Feature>, name: &str, available: bool, detail: impl Into<String>) {
    out.push(Feature {
        name: name.to_string(),
        available,
        detail: detail.into(),
    });
}

/// The file that says whether the KSM advisor is there.
const KSM_ADVISOR: &str = "/sys/kernel/mm/ksm/advisor_mode";

fn kernel_release() -> String {
    procfs::read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default()
}

fn run() -> Probe {
    let mut f = Vec::new();

    // userfaultfd: system call, with or without user-mode-only, or the device.
    let unpriv = procfs::read_trimmed("/proc/sys/vm/unprivileged_userfaultfd").ok();
    let (access, features) = probe_uffd(&mut f, unpriv.as_deref());

    let pagemap_scan = probe_pagemap_scan(&mut f);
    let soft_dirty = probe_soft_dirty(&mut f);
    let (thp_mode, madv_collapse) = probe_thp(&mut f);

    let ksm = std::path::Path::new("/sys/kernel/mm/ksm/run").exists();
    feat(
        &mut f,
        "ksm",
        ksm,
        if ksm {
            "/sys/kernel/mm/ksm present".to_string()
        } else {
            "kernel built without CONFIG_KSM (/sys/kernel/mm/ksm missing)".to_string()
        },
    );
    let ksm_advisor = std::path::Path::new(KSM_ADVISOR).exists();
    feat(
        &mut f,
        "ksm.advisor",
        ksm_advisor,
        if ksm_advisor {
            format!("{KSM_ADVISOR} present")
        } else {
            format!("this kernel has no KSM advisor ({KSM_ADVISOR}, Linux 6.9+)")
        },
    );
    let memory_merge = match mem::prctl(mem::PR_GET_MEMORY_MERGE, 0) {
        Ok(v) => {
            feat(
                &mut f,
                "ksm.memory_merge",
                true,
                format!("PR_GET_MEMORY_MERGE answered {v}"),
            );
            true
        }
        Err(e) => {
            feat(
                &mut f,
                "ksm.memory_merge",
                false,
                format!("PR_GET_MEMORY_MERGE failed: {e} (needs Linux 6.4 and KSM)"),
            );
            false
        }
    };

    let process_madvise = match process::pidfd_open(std::process::id() as i32)
        .and_then(|fd| process::process_madvise(fd.as_raw_fd(), &[], mem::MADV_COLD))
    {
        Ok(_) => {
            feat(
                &mut f,
                "process_madvise",
                true,
                "process_madvise(2) accepted an empty request",
            );
            true
        }
        Err(e) => {
            feat(
                &mut f,
                "process_madvise",
                false,
                format!("process_madvise(2) failed: {e} (needs Linux 5.10)"),
            );
            false
        }
    };

    let idle_page = std::fs::File::open("/sys/kernel/mm/page_idle/bitmap").is_ok();
    feat(
        &mut f,
        "idle_page_tracking",
        idle_page,
        if idle_page {
            "/sys/kernel/mm/page_idle/bitmap readable"
        } else {
            "/sys/kernel/mm/page_idle/bitmap missing or unreadable (CONFIG_IDLE_PAGE_TRACKING, root)"
        },
    );

    let damon_vaddr = probe_damon(&mut f);

    let perf_hw = match mem::perf_event_open_hw(1) {
        Ok(_) => {
            feat(
                &mut f,
                "perf_hw_counters",
                true,
                "perf_event_open(PERF_COUNT_HW_INSTRUCTIONS) succeeded",
            );
            true
        }
        Err(e) => {
            feat(&mut f, "perf_hw_counters", false, format!("perf_event_open(PERF_COUNT_HW_INSTRUCTIONS) failed: {e} (no PMU in this VM, or perf_event_paranoid)"));
            false
        }
    };

    Probe {
        kernel: kernel_release(),
        uffd_access: access,
        uffd_features: features,
        pagemap_scan,
        soft_dirty,
        thp_mode,
        madv_collapse,
        ksm,
        memory_merge,
        ksm_advisor,
        process_madvise,
        idle_page,
        damon_vaddr,
        perf_hw,
        features: f,
    }
}

fn probe_uffd(f: &mut Vec<Feature>, unpriv: Option<&str>) -> (Option<UffdAccess>, u64) {
    let base = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let attempts = [
        (false, false, "userfaultfd(2)"),
        (false, true, "userfaultfd(2) with UFFD_USER_MODE_ONLY"),
        (true, false, "/dev/userfaultfd"),
    ];
    let mut errors = Vec::new();
    for (dev, umo, label) in attempts {
        let flags = base | if umo { uffd::UFFD_USER_MODE_ONLY } else { 0 };
        let r = if dev {
            uffd::userfaultfd_from_device(flags)
        } else {
            uffd::userfaultfd(flags)
        };
        match r {
            Ok(fd) => match uffd::api(fd.as_fd(), 0) {
                Ok(api) => {
                    let access = UffdAccess {
                        syscall: !dev,
                        user_mode_only: umo,
                    };
                    feat(
                        f,
                        "userfaultfd",
                        true,
                        format!("{label} works; UFFDIO_API features {:#x}", api.features),
                    );
                    for (name, bit) in uffd::feature::NAMED {
                        let has = api.features & bit == *bit;
                        feat(
                            f,
                            &format!("uffd.{name}"),
                            has,
                            if has {
                                "reported by UFFDIO_API".to_string()
                            } else {
                                format!("not reported by UFFDIO_API on Linux {}", kernel_release())
                            },
                        );
                    }
                    return (Some(access), api.features);
                }
                Err(e) => errors.push(format!("{label}: UFFDIO_API failed: {e}")),
            },
            Err(e) => errors.push(format!("{label}: {e}")),
        }
    }
    let hint = match unpriv {
        Some("0") => " (vm.unprivileged_userfaultfd=0: run as root or with CAP_SYS_PTRACE)",
        None => " (kernel built without CONFIG_USERFAULTFD?)",
        _ => "",
    };
    feat(
        f,
        "userfaultfd",
        false,
        format!("{}{hint}", errors.join("; ")),
    );
    for (name, _) in uffd::feature::NAMED {
        feat(f, &format!("uffd.{name}"), false, "userfaultfd unavailable");
    }
    (None, 0)
}

/// A private anonymous scratch mapping for probes, unmapped on drop.
struct Scratch(mem::OwnedMapping);

impl Scratch {
    fn new(len: usize) -> std::io::Result<Self> {
        mem::OwnedMapping::new(len, PAGE_SIZE, 0).map(Scratch)
    }
    fn addr(&self) -> u64 {
        self.0.addr()
    }
    fn touch(&self, off: usize) {
        self.0.write_byte(off, 1)
    }
}

fn probe_pagemap_scan(f: &mut Vec<Feature>) -> bool {
    let r = (|| -> std::io::Result<usize> {
        let s = Scratch::new(PAGE_SIZE)?;
        s.touch(0);
        let pm = std::fs::File::open("/proc/self/pagemap")?;
        let mut arg = pagemap::PmScanArg {
            start: s.addr(),
            end: s.addr() + PAGE_SIZE as u64,
            category_mask: pagemap::category::PRESENT,
            return_mask: pagemap::category::PRESENT,
            ..Default::default()
        };
        let mut out = [pagemap::PageRegion::default(); 1];
        pagemap::pagemap_scan(pm.as_fd(), &mut arg, &mut out)
    })();
    match r {
        Ok(1) => {
            feat(
                f,
                "pagemap_scan",
                true,
                "PAGEMAP_SCAN found the probe's present page",
            );
            true
        }
        Ok(n) => {
            feat(
                f,
                "pagemap_scan",
                false,
                format!("PAGEMAP_SCAN answered {n} regions for one present page"),
            );
            false
        }
        Err(e) => {
            feat(
                f,
                "pagemap_scan",
                false,
                format!("PAGEMAP_SCAN failed: {e} (needs Linux 6.7)"),
            );
            false
        }
    }
}

fn probe_soft_dirty(f: &mut Vec<Feature>) -> bool {
    let r = (|| -> std::io::Result<(bool, bool)> {
        let s = Scratch::new(PAGE_SIZE)?;
        let pm = std::fs::File::open("/proc/self/pagemap")?;
        let mut e = [0u64; 1];
        s.touch(0);
        pagemap::read_entries(pm.as_fd(), s.addr(), &mut e)?;
        let after_write = e[0] & pagemap::entry::SOFT_DIRTY != 0;
        std::fs::write("/proc/self/clear_refs", pagemap::CLEAR_REFS_SOFT_DIRTY)?;
        pagemap::read_entries(pm.as_fd(), s.addr(), &mut e)?;
        let cleared = e[0] & pagemap::entry::SOFT_DIRTY == 0;
        s.touch(0);
        pagemap::read_entries(pm.as_fd(), s.addr(), &mut e)?;
        Ok((
            after_write && cleared,
            e[0] & pagemap::entry::SOFT_DIRTY != 0,
        ))
    })();
    match r {
        Ok((true, true)) => {
            feat(
                f,
                "soft_dirty",
                true,
                "pagemap bit 55 set by a write and cleared by clear_refs",
            );
            true
        }
        Ok(_) => {
            feat(
                f,
                "soft_dirty",
                false,
                "pagemap bit 55 never set by a write: kernel built without CONFIG_MEM_SOFT_DIRTY",
            );
            false
        }
        Err(e) => {
            feat(
                f,
                "soft_dirty",
                false,
                format!("probing pagemap/clear_refs failed: {e}"),
            );
            false
        }
    }
}

fn probe_thp(f: &mut Vec<Feature>) -> (String, bool) {
    let mode = procfs::read_trimmed("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|t| procfs::bracketed_choice(&t).map(str::to_string))
        .unwrap_or_default();
    feat(
        f,
        "thp",
        !mode.is_empty() && mode != "never",
        if mode.is_empty() {
            "no /sys/kernel/mm/transparent_hugepage (CONFIG_TRANSPARENT_HUGEPAGE)".to_string()
        } else {
            format!("mode {mode}")
        },
    );
    let collapse = (|| -> std::io::Result<()> {
        let s = Scratch::new(2 * HUGE_PAGE_SIZE)?;
        let aligned = (s.addr() + HUGE_PAGE_SIZE as u64 - 1) & !(HUGE_PAGE_SIZE as u64 - 1);
        let off = (aligned - s.addr()) as usize;
        for p in (0..HUGE_PAGE_SIZE).step_by(PAGE_SIZE) {
            s.touch(off + p);
        }
        mem::advise(aligned, HUGE_PAGE_SIZE, mem::MADV_COLLAPSE)
    })();
    let ok = match &collapse {
        Ok(()) => true,
        Err(e) => matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ENOMEM)),
    };
    feat(
        f,
        "madv_collapse",
        ok,
        match collapse {
            Ok(()) => "MADV_COLLAPSE collapsed a probe range".to_string(),
            Err(e) if ok => format!("MADV_COLLAPSE accepted but could not collapse now: {e}"),
            Err(e) => format!("MADV_COLLAPSE rejected: {e} (needs Linux 6.1 and THP)"),
        },
    );
    (mode, ok)
}

fn probe_damon(f: &mut Vec<Feature>) -> bool {
    let root = std::path::Path::new("/sys/kernel/mm/damon/admin/kdamonds");
    if !root.exists() {
        feat(
            f,
            "damon_vaddr",
            false,
            "no DAMON sysfs interface (CONFIG_DAMON_SYSFS)",
        );
        return false;
    }
    // Ask any existing context which operation sets the kernel has; creating a
    // kdamond to ask would change system state, so the probe does not.
    let avail = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| d.path().join("contexts/0/avail_operations"))
        .find_map(|p| procfs::read_trimmed(p).ok());
    match avail {
        Some(a) if a.split_whitespace().any(|o| o == "vaddr") => {
            feat(f, "damon_vaddr", true, format!("DAMON operations: {a}"));
            true
        }
        Some(a) => {
            feat(
                f,
                "damon_vaddr",
                false,
                format!("DAMON offers only: {a} (CONFIG_DAMON_VADDR missing)"),
            );
            false
        }
        None => {
            feat(
                f,
                "damon_vaddr",
                false,
                "DAMON sysfs present but no context to read avail_operations from",
            );
            false
        }
    }
}
