//! pagewise: page-level memory management on a stock Linux kernel, from user space.
//!
//! The library is the product; the `pagewise` CLI, the preload shim and the C
//! API are thin layers over it. It has three layers (see `ARCHITECTURE.md`):
//!
//! **Capabilities**, each one system of the papers, at the crate root:
//!
//! | module | capability |
//! |---|---|
//! | [`track`] | dirty-page tracking (LDT): which pages were written since a consumer last asked |
//! | [`snap`] | same-page-merging snapshots (SimGrid); built on `track` |
//! | [`farmem`] | disaggregated-memory emulation (DiME) |
//! | [`inspect`] | residency, huge pages, bloat, duplicates and access coverage of any process |
//! | [`thp`] | huge-page policy (HawkEye) |
//! | [`dedup`] | deduplication with mixed pages (SmartMD) |
//!
//! A capability imports mechanisms, never another capability (except
//! `snap`, built on `track`).
//!
//! **The agent runtime** ([`agent`], the `pagewise-agent` crate), above
//! the capabilities: the one step loop that runs `thp`'s and `dedup`'s
//! agents, the node agent over a node's containers, their metrics and
//! endpoint.
//!
//! **Mechanisms** (the `pagewise-mech` crate), what every capability uses,
//! each in one place. Those a user may need are re-exported here: what
//! the kernel offers ([`probe`]), page-table walks ([`walk`]) and their
//! cost ([`walk_cost`]), userfaultfd write-protect ([`wp`]), access
//! coverage ([`access`]) and digests ([`hash`]). The rest (parsing `/proc`, stopping a process and acting
//! inside it, cgroups, the preload shim's contract) is reached through a
//! few hidden modules for pagewise's own faces ([`process`], [`system`],
//! [`shim`]), which may change without notice.
//!
//! Each capability has its own error enum, whose kinds carry the values
//! they are about (`snap::Error::NoSnapshot { id }`); failures of the
//! mechanisms under them are their `Mech` kind. [`Error`] holds any of
//! them for a caller using several. Every error says its class
//! ([`Failure::class`]): bad input, unsupported here, not permitted, the
//! process went away, busy now (try again later), or failed.

#![forbid(unsafe_code)]

pub use pagewise_dedup as dedup;
pub use pagewise_farmem as farmem;
pub use pagewise_inspect as inspect;
pub use pagewise_snap as snap;
pub use pagewise_thp as thp;
pub use pagewise_track as track;

#[doc(hidden)]
pub use pagewise_mech::workload;
pub use pagewise_mech::{access, hash, walk, walk_cost, wp};
mod error;
pub use error::{Error, Result};
pub use pagewise_mech::Error as MechError;
pub use pagewise_mech::{probe, ErrorClass, Failure, PageRange, Refusal, Region};
pub use pagewise_mech::{HUGE_PAGE_SIZE, PAGE_SIZE};

/// The agent runtime (`pagewise-agent`): the one step loop that runs an
/// [`Agent`](agent::Agent) or several ([`drive`](agent::drive),
/// [`run`](agent::run)), the node agent ([`node`](agent::node)), the
/// metrics in the Prometheus exposition and their endpoint, what a run
/// gained, the system settings agents change and put back, and the
/// program an agent watches.
pub use pagewise_agent as agent;

/// What pagewise reads of a process: whether it may be a target, its
/// mappings, residency, descriptors and CPU time, its memory (a page
/// walk, a read), and a consistent stop of it. For pagewise's own faces
/// and benchmarks; these may change without notice.
#[doc(hidden)]
pub mod process {
    pub use pagewise_mech::procfs::{
        check_target, cpu_time, is_alive, kernel_thread, ksm_stat, maps, open_fds, peak_rss_kib,
        pids, read_trimmed, reset_peak_rss, resident, status_field, writable, Descriptor,
        ExecIdentity, FdKind, KsmStat, Mapping, Resident, TaskCensus,
    };
    pub use pagewise_mech::remote::read;
    pub use pagewise_mech::stop::Stopped;

    /// Containers and cgroups as targets: their processes, the container
    /// a process is in, its pid inside its namespace.
    pub mod container {
        pub use pagewise_mech::container::{
            check_cgroup, container_of, in_containers, members, ns_pid, resolve_container,
            ContainerRef, Member, Selector,
        };
    }

    /// Whether pagewise may suspend a target's seccomp filters around the
    /// calls it makes inside it (the default), or must respect them.
    pub mod seccomp {
        pub use pagewise_mech::seccomp::{set_policy, Policy};
    }
}

/// The host around the targets: memory cgroups and zram swap for
/// experiments under a memory limit, kernel counters, this process's
/// capabilities, and files replaced whole. For pagewise's own faces and
/// benchmarks; these may change without notice.
#[doc(hidden)]
pub mod system {
    pub use pagewise_mech::cgroup::{
        memory_cgroup_dir, memory_use, MemoryCgroup, MemoryUse, ZramSwap,
    };
    pub use pagewise_mech::files::replace;
    pub use pagewise_mech::procfs::{has_capability, vmstat};
}

/// The preload shim's side of its contract with pagewise (what was asked
/// of it, the advice socket it serves, its own memory), and starting a
/// program under it. For the shim and pagewise's faces.
#[doc(hidden)]
pub mod shim {
    pub use pagewise_mech::inject::shim::{serve, start_advised, AdviseRequest, ShimAdvice};
    pub use pagewise_mech::inject::Inside;
    pub use pagewise_mech::procfs::{maps, note_own_memory, OWN_THREAD_STACK};
    pub use pagewise_mech::shim::{
        asked, contract_of_request, shim_command, shim_path, Request, BUILD, CONTRACT,
    };
}
