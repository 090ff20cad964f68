//! The kinds of the mechanisms' structured errors, each with the values it
//! is about: a process that cannot be stopped or acted inside
//! ([`Refusal`]). It lives here, beside [`Error`](super::Error) that
//! carries it, so that the vocabulary every module uses depends on no
//! module above it; `mech::stop` re-exports it.

/// Why pagewise could not stop a process or act inside it: a refusal
/// before anything was done (the process cannot be acted in here), or a
/// stop or a call that did not complete (worth trying again). Each says
/// which process and thread.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The process runs under seccomp filters that pagewise can neither
    /// suspend nor pass for a call it must make inside it.
    #[error(
        "{feature} is not available: process {pid} runs under seccomp filters: {}",
        seccomp_why(call, answer, why)
    )]
    Seccomp {
        /// What needed the call.
        feature: &'static str,
        /// The process.
        pid: i32,
        /// The call.
        call: String,
        /// What the filters answer the call with, where they could be read.
        answer: Option<crate::seccomp::Action>,
        /// Why pagewise could not step around them.
        why: String,
    },
    /// Another tracer holds the process.
    #[error("process {pid} is traced by process {tracer} (a debugger or another tool): {feature} must stop it under ptrace itself, and a process has one tracer")]
    Traced {
        /// What needed to stop it.
        feature: &'static str,
        /// The process.
        pid: i32,
        /// Its tracer.
        tracer: u64,
    },
    /// Its user stopped it (job control or a debugger).
    #[error("{feature} is not available: process {pid} is stopped (job control or a debugger): it cannot make {call} until it runs again")]
    JobStopped {
        /// What needed the call.
        feature: &'static str,
        /// The process.
        pid: i32,
        /// The call.
        call: String,
    },
    /// Calls inside another process are made on x86-64 only.
    #[error("system calls inside another process is not available: implemented for x86-64 only")]
    NotX86_64,
    /// A thread's mode (64- or 32-bit) could not be read.
    #[error("system calls inside another process is not available: the mode (64- or 32-bit) of thread {tid} of process {pid} cannot be read: {why}")]
    ModeUnknown {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
        /// What the kernel said.
        why: String,
    },
    /// A thread runs 32-bit code.
    #[error("system calls inside another process is not available: thread {tid} of process {pid} runs 32-bit code (code segment {cs:#x}): a call made in it would enter the 32-bit system-call table; only 64-bit processes are acted in")]
    Compat32 {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
        /// Its code segment.
        cs: u64,
    },
    /// A thread switched to 32-bit code while stopped.
    #[error("system calls inside another process is not available: thread {tid} of process {pid} switched to 32-bit code")]
    SwitchedTo32 {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
    /// A signal came before each try of a call.
    #[error("process {pid}: a signal arrived before each of {tries} tries of a system call made in it (each was delivered); try again")]
    Signals {
        /// The process.
        pid: i32,
        /// Tries made.
        tries: u32,
    },
    /// A call made in a thread did not return.
    #[error("a system call made in thread {tid} of process {pid} did not return")]
    NoReturn {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
    /// A thread stopped otherwise than the call's step.
    #[error("thread {tid} of process {pid} stopped with signal {sig} at {rip:#x} while a system call was made in it")]
    StrangeStop {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
        /// The signal.
        sig: i32,
        /// Where.
        rip: u64,
    },
    /// A thread waits for a child it vforked.
    #[error("thread {tid} of process {pid} is waiting for a child it vforked to exec or exit, and cannot be stopped until then; try again later")]
    InVfork {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
    /// A thread did not stop in time.
    #[error("thread {tid} of process {pid} did not stop in time (an uninterruptible wait, such as a vfork parent's)")]
    NotStopping {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
    /// A cgroup to freeze is frozen already, by someone else (`podman
    /// pause`): it is left as it is.
    #[error("{} is frozen already ({file} reads {state}): it is left frozen (thaw it, e.g. `podman unpause`, and try again)", dir.display())]
    FrozenAlready {
        /// The cgroup's directory.
        dir: std::path::PathBuf,
        /// The freezer's file.
        file: &'static str,
        /// What it reads.
        state: String,
    },
    /// A cgroup did not freeze in time (a process of it in an
    /// uninterruptible wait).
    #[error("{} did not freeze within {ms} ms (a process of it in an uninterruptible wait?); it was thawed again", dir.display())]
    NotFreezing {
        /// The cgroup's directory.
        dir: std::path::PathBuf,
        /// How long it was given.
        ms: u64,
    },
    /// A group of processes (a container) gained processes faster than
    /// they could be stopped.
    #[error("the group makes processes faster than they can be stopped: {held} held after {rounds} listings; try again")]
    GroupGrowing {
        /// Processes held when it gave up.
        held: usize,
        /// Listings made.
        rounds: usize,
    },
    /// Threads were made faster than they could be found and stopped: the
    /// kernel counts more threads than were held when the time ran out.
    #[error(
        "process {pid} makes threads faster than they can be stopped: {held} held, the kernel \
         counts {counted}, after {ms} ms; try again"
    )]
    ThreadsUncounted {
        /// The process.
        pid: i32,
        /// Threads held.
        held: usize,
        /// Threads the kernel counts (`Threads:` in its status).
        counted: usize,
        /// How long it tried.
        ms: u64,
    },
    /// A thread took signal after signal on its way into a stop.
    #[error(
        "thread {tid} of process {pid} took {n} signals in a row on its way into a stop; try again"
    )]
    SignalStorm {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
        /// Signals handed back.
        n: u32,
    },
    /// A thread has not yet left the wait that kept it from stopping before.
    #[error("thread {tid} of process {pid} has not yet left the wait that kept it from stopping the last time; try again later")]
    Straggler {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
}

impl Refusal {
    /// Whether the refusal is for now (another tracer holds the process,
    /// a `vfork` is in progress, a thread would not stop): trying again
    /// later may succeed. The class of the error.
    pub(crate) fn is_passing(&self) -> bool {
        matches!(
            self,
            Refusal::Traced { .. }
                | Refusal::InVfork { .. }
                | Refusal::NotStopping { .. }
                | Refusal::FrozenAlready { .. }
                | Refusal::NotFreezing { .. }
                | Refusal::GroupGrowing { .. }
                | Refusal::ThreadsUncounted { .. }
                | Refusal::SignalStorm { .. }
                | Refusal::Straggler { .. }
                | Refusal::Signals { .. }
        )
    }

    /// Whether the process cannot be acted in here at all (rather than
    /// this time): the class of the error.
    pub(crate) fn is_permanent(&self) -> bool {
        matches!(
            self,
            Refusal::Seccomp { .. }
                | Refusal::JobStopped { .. }
                | Refusal::NotX86_64
                | Refusal::ModeUnknown { .. }
                | Refusal::Compat32 { .. }
                | Refusal::SwitchedTo32 { .. }
        )
    }
}

/// The end of [`Refusal::Seccomp`]'s message.
fn seccomp_why(call: &str, answer: &Option<crate::seccomp::Action>, why: &str) -> String {
    match answer {
        Some(a) => format!("they answer {call} with {a}, and {why}"),
        None => format!("{call} made inside it could be refused or kill it, and {why}"),
    }
}
