//! pagewise's agent runtime: what runs an agent, one or several at once.
//!
//! An agent (`thp`'s promotion, `dedup`'s merging) is a type that
//! implements [`Agent`]: it watches processes and, each step, measures,
//! decides and acts under a budget. This crate runs agents:
//!
//! - [`drive`]: the one step loop. A step per interval until an
//!   [`Interrupt`] (SIGINT/SIGTERM for the tool), the end of the program
//!   watched, of every process watched or of the steps asked; the metrics
//!   published after each. It drives any [`Stepping`] (an object-safe
//!   step: one agent with its reporter, or several at once); `thp run`,
//!   `dedup run`, the node agent, the bindings and the benchmarks all
//!   step through it.
//! - [`node`]: the node agent (`pagewise agent --config`): both agents
//!   over the containers and cgroups its configuration selects, processes
//!   followed as they come, a huge-page budget per container, and the
//!   node's own metrics.
//! - [`exposition`]: an agent's metrics in the Prometheus exposition
//!   (OpenMetrics text, by the `prometheus-client` crate), written to a
//!   file after each step and served by the [`Endpoint`] (`/metrics`,
//!   `/healthz`, `/readyz`) from a thread under a seccomp filter of its
//!   own.
//! - [`gains`]: what a run gained (memory, huge pages, KSM) against the
//!   machine's settings before it.
//! - [`settings`]: the system settings agents change, journaled first and
//!   put back when they end, fail or are killed; [`child`]: the program an
//!   agent starts and watches; [`stop`]: how a tool's run ends on SIGINT
//!   or SIGTERM, with the program it started.

#![forbid(unsafe_code)]

mod drive;
mod endpoint;
mod error;
mod exposition;
pub mod gains;
pub mod node;
pub mod stop;
pub mod walk_cost;

pub use drive::{drive, run, Cadence, Deadline, Ended, Interrupt, Stepping, Uninterrupted};
pub use endpoint::{Endpoint, Published};
pub use error::{Error, Result};
pub use exposition::exposition;
pub(crate) use exposition::{per_container, render, served, CLASSIC_CONTENT_TYPE, CONTENT_TYPE};
pub use pagewise_mech::agent::{Agent, Metric, Named};
pub use stop::StopSignals;

/// The program an agent (or a tool) starts and watches: tied to its
/// starter, stopped within a bound, its exit as a code.
pub mod child {
    pub use pagewise_mech::child::{
        exit_code, signal_then_kill, stop, tie, wait_for, wait_or_kill,
    };
}

/// System settings changed for a run, journaled first and put back when
/// it ends, fails or is killed (the next run repairs a killed one).
pub mod settings {
    pub use pagewise_mech::settings::{current, put_back_own, take_put_back, SettingGuard};

    /// What a run that was killed left behind, put back: every setting
    /// whose journal's owner is gone, and the advice dedup agents that
    /// died gave inside processes still running. What was done, one line
    /// each (also said on stderr). Every `pagewise` command runs it at its
    /// start.
    pub fn recover() -> Vec<String> {
        let mut said = pagewise_dedup::recover_advice();
        said.extend(pagewise_mech::settings::recover());
        said
    }
}
