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
//! coverage ([`access`]) and digests ([`hash`]); the processes a tool
//! selects ([`process`]), the preload shim's contract ([`shim`]) and the
//! self-checking workloads the examples, tests and `pagewise demo` run
//! ([`workload`]).
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

/// The processes pagewise acts on, as a tool selects them: whether one may
/// be a target and is still there, its writable memory, the containers
/// and cgroups whose processes it takes, and whether pagewise may suspend
/// a target's seccomp filters around the calls it makes inside it.
pub mod process {
    pub use pagewise_mech::container::{
        check_cgroup, container_of, members, ns_pid, resolve_container, ContainerRef, Member,
        Selector,
    };
    pub use pagewise_mech::procfs::{check_target, is_alive, writable};
    pub use pagewise_mech::seccomp::{set_policy as set_seccomp_policy, Policy as SeccompPolicy};
}

/// The preload shim's side of its contract with pagewise (what was asked
/// of it, the advice socket it serves, its own memory kept out of what it
/// reports), where its file is, and starting a program under it to be
/// advised from inside.
pub mod shim {
    pub use pagewise_mech::inject::shim::{serve, start_advised, AdviseRequest};
    pub use pagewise_mech::inject::Inside;
    pub use pagewise_mech::procfs::{maps, note_own_memory, OWN_THREAD_STACK};
    pub use pagewise_mech::shim::{
        asked, contract_of_request, shim_path, Request, BUILD, CONTRACT,
    };
}
