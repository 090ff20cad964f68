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
//! each in one place. Those a user of the tool needs are re-exported
//! here: what the kernel offers ([`probe`]), access coverage ([`access`]),
//! the processes a tool selects ([`process`]), the preload shim's contract
//! ([`shim`]) and the self-checking workloads `pagewise demo` runs
//! ([`workload`]).
//!
//! This crate is the product's API: each module lists what the tool, the
//! C API, Python and the preload shim are built on, and what the book
//! shows a program using the library, and no more
//! (`api/*.txt` lists every item; `scripts/public-api` counts them). Each
//! capability's crate (`pagewise-snap`, ...) holds the whole of it, with
//! what its own tests and the experiments measure.
//!
//! Each capability has its own error enum, whose kinds carry the values
//! they are about (`snap::Error::NoSnapshot { id }`); failures of the
//! mechanisms under them are their `Mech` kind. [`Error`] holds any of
//! them for a caller using several. Every error says its class
//! ([`Failure::class`]): bad input, unsupported here, not permitted, the
//! process went away, busy now (try again later), or failed.

#![forbid(unsafe_code)]

mod error;
pub use error::{Error, Result};
pub use pagewise_mech::Error as MechError;
pub use pagewise_mech::{ErrorClass, Failure, PageRange, Region};
pub use pagewise_mech::{HUGE_PAGE_SIZE, PAGE_SIZE};

/// Access coverage: which base pages of each 2 MiB region a process touches
/// over an interval (HawkEye's access map), and why a means is unavailable.
pub mod access {
    pub use pagewise_mech::access::{idle_page_unavailable, idle_pages, CoverageReport, Method};
}
/// The agent runtime (`pagewise-agent`): the one step loop that runs an
/// [`Agent`](agent::Agent) ([`drive`](agent::drive)), the node agent
/// ([`node`](agent::node)), what a run gained, the system settings agents
/// change and put back, and the program an agent watches.
pub mod agent {
    pub use pagewise_agent::{drive, Agent, Cadence, Ended, Error};
    /// The program a tool starts and an agent watches: tied to the tool's
    /// life, stopped with a grace period, its exit status.
    pub mod child {
        pub use pagewise_agent::child::{exit_code, stop, tie, wait_for};
    }
    /// What an agent's run gained.
    pub mod gains {
        pub use pagewise_agent::gains::{Gains, Ledger, KSM_SETTINGS, THP_SETTINGS};
    }
    /// The node agent (`pagewise agent --config FILE`).
    pub mod node {
        pub use pagewise_agent::node::{describe, run, run_steps, Config, Node, Selection, Step};
    }
    /// System settings changed for a run, journaled first and put back when
    /// the run ends, fails or is killed.
    pub mod settings {
        pub use pagewise_agent::settings::{current, recover, take_put_back};
    }
    /// How a tool's run ends on SIGINT or SIGTERM (`StopSignals`), with the program it started (the
    /// book's "Command-line conventions" say the same to users).
    pub mod stop {
        pub use pagewise_agent::stop::{default_sigpipe, on_stop_otherwise, StopSignals, GRACE};
    }
    /// What a page walk costs here, measured for the huge-page agent's ranking before it starts.
    pub mod walk_cost {
        pub use pagewise_agent::walk_cost::{measure, WalkCost, WALK_DEFAULT_NS, WALK_WITHIN};
    }
}
/// Deduplication with mixed pages (SmartMD, from user space): the agent that
/// chooses, per 2 MiB region, where KSM may merge.
pub mod dedup {
    pub use pagewise_dedup::{Action, Agent, Options, Policy, Step, Thresholds, FREQ_MAX};
}
/// Disaggregated-memory emulation (DiME) on a stock kernel: a local page
/// budget, a link model and replacement policies over userfaultfd.
pub mod farmem {
    pub use pagewise_farmem::{
        calibrate, Calibration, Config, Error, FarMemory, FarmemOptions, FarmemRequest, FarmemRun,
        FaultPath, Hooks, Placement, Report, Stats,
    };
    /// The link model: latency, bandwidth, and transfers queued on the link.
    pub mod link {
        pub use pagewise_farmem::link::LinkConfig;
    }
    /// Far-memory emulation of an unmodified program from inside it (`pagewise farmem run`).
    pub mod in_process {
        pub use pagewise_farmem::in_process::{
            held_call, init, inline_path, never_blocked, AroundFork,
        };
    }
    /// Named far-memory instances shared between processes (DiME's `/proc/dime_config`).
    pub mod instance {
        pub use pagewise_farmem::instance::{dir, exists, Access, Instance, Settings};
    }
    /// Replacement policies.
    pub mod policy {
        pub use pagewise_farmem::policy::{
            by_name, Plugin, Policy, PolicyOps, NAMES, POLICY_ABI_VERSION,
        };
    }
    /// Access coverage from the far-memory engine, driven from outside.
    pub mod sampler {
        pub use pagewise_farmem::sampler::{of, sample};
    }
    /// Far memory for programs in containers.
    pub mod serve {
        pub use pagewise_farmem::serve::{
            instance_socket_dir, socket_dir, Event, Server, MOST_AT_ONCE,
        };
    }
}
/// What a process's memory holds, per mapping and per 2 MiB region:
/// residency, huge pages, bloat, duplicates and access coverage.
pub mod inspect {
    pub use pagewise_inspect::{inspect, Options, RegionReport, Report};
}
/// What this kernel offers, probed once per process and shared by every
/// capability.
pub mod probe {
    pub use pagewise_mech::probe::{get, Probe};
}
/// Same-page-merging snapshots (SimGrid), built on [`track`]: snapshots of
/// own regions and of another process, the durable store, lazy restore,
/// live pre-copy and migration, rollback of a running process in place.
pub mod snap {
    pub use pagewise_snap::{
        DiskSnapshot, DiskStats, DiskStore, Error, LazyOptions, LazyRestore, LazyStats, PageId,
        PageStore, ProcessSnapshots, ResetReport, ResetSession, RestoreOptions, RestoreReport,
        RestoreStats, Result, SaveStats, SnapId, SnapshotInfo, SnapshotOptions, Snapshots,
        StoreStats, TakeStats,
    };
    /// What a rollback did with the target's descriptors.
    pub mod fds {
        pub use pagewise_snap::fds::{FdNote, FdReport};
    }
    /// A stored snapshot's pages written out for other tools.
    pub mod extract {
        pub use pagewise_snap::extract::{core, raw, Placed};
    }
    /// A page server CRIU dumps into: each dump's pages kept in a store.
    pub mod criu {
        pub use pagewise_snap::criu::{
            export, restore_in_place, Exported, InPlace, PageServer, PagemapReceived, Received,
            Run, Tls,
        };
    }
    /// Live checkpoints with pre-copy (LDT's first use; QEMU's migration loop).
    pub mod live {
        pub use pagewise_snap::live::{
            Checkpointer, Destination, LiveOptions, LiveReport, OwnRegions, ProcessSource, Source,
            StoreSeries,
        };
    }
    /// Rollback of another process in place: AFL++'s fork server and whole
    /// groups (the session itself is [`ProcessSnapshots`]).
    pub mod process {
        /// AFL++'s fork server, served by a reset session (`serve`).
        pub mod afl {
            pub use pagewise_snap::process::afl::{
                serve, take_descriptors, ServeOptions, ServeStats, CONTROL_FD, STATUS_FD,
            };
        }
        /// Resets made inside the program by the preload shim (the shim's
        /// side of `afl::serve`).
        pub mod inside {
            pub use pagewise_snap::process::inside::{
                init, stage, Board, ResetRequest, BOARD_BYTES,
            };
        }
        /// Putting a whole group back: a container's processes, snapshotted at
        /// one instant, held stopped and put back together.
        pub mod group {
            pub use pagewise_snap::process::group::{restore_group, MemberRestore};
        }
    }
    /// Snapshots of another process into a durable store.
    pub mod remote {
        pub use pagewise_snap::remote::{
            send_saved, snapshot_process, GroupSnapshot, Incremental, IncrementalGroup,
            ProcessSnapshot,
        };
    }
    /// Memory migration: a live checkpoint's passes streamed over TCP from a
    /// `Sender` to a `Receiver`, which saves them as a snapshot.
    pub mod wire {
        pub use pagewise_snap::wire::{Compression, Event, Key, Received, Receiver, Sender};
    }
}
/// Huge-page policy (HawkEye): the promotion agent and pre-zeroed huge pages.
pub mod thp {
    pub use pagewise_thp::calibrate_walk_cost;
    /// The huge-page agent (HawkEye's promotion, from user space).
    pub mod agent {
        pub use pagewise_thp::agent::{
            may_collapse_in_others, Action, Agent, Budget, Options, Policy, Pressure, Recovery,
            Step,
        };
    }
    /// Pre-zeroed huge pages (HawkEye's asynchronous pre-zeroing, from user space).
    pub mod prezero {
        pub use pagewise_thp::prezero::{
            start_prezeroed, PrezeroOptions, PrezeroRequest, Prezeroer,
        };
    }
}
/// Dirty-page tracking (LDT): which pages were written since a consumer last
/// asked, by the best backend this kernel offers.
pub mod track {
    pub use pagewise_track::{
        start_tracked, BackendKind, CollectStats, Collection, ConsumerId, DirtyTracker, Error,
        Result, TrackRequest, Tracked,
    };
    /// The wire format between `pagewise track` and the preload shim inside the tracked program,
    /// over a `socketpair(AF_UNIX, SOCK_STREAM)` whose shim end is passed as the fd number in
    /// `TRACK_FD` (see `start_tracked`).
    pub mod protocol {
        pub use pagewise_track::protocol::{collect, greet, read_collection, Served};
    }
}
/// Self-checking workloads: anonymous memory written in known patterns, and
/// the inspector's known layout (`pagewise demo`, `pagewise workload`).
pub mod workload {
    pub use pagewise_mech::workload::{AnonMemory, Layout, LayoutTruth, Rng};
}
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
    pub use pagewise_mech::shim::{asked, contract_of_request, shim_path, Request};
}
