//! What tests and experiments read of the host and its processes, beside
//! what the library offers its users: resident memory, CPU time, a
//! process's memory read from outside and a consistent stop of it, KSM's
//! figures, the kernel's counters, and memory cgroups with zram swap for
//! runs under a memory limit. Tests and experiments take these from here,
//! never from the mechanisms' crate, so that the faces and the harness
//! name the same few doors.

pub use pagewise_mech::cgroup::{memory_cgroup_dir, memory_use, MemoryCgroup, MemoryUse, ZramSwap};
pub use pagewise_mech::container::ns_pid;
pub use pagewise_mech::procfs::{
    cpu_time, is_alive, kernel_thread, ksm_stat, maps, open_fds, peak_rss_kib, read_trimmed,
    reset_peak_rss, resident, status_field, vmstat, writable, Mapping, Resident,
};
pub use pagewise_mech::remote::read;
pub use pagewise_mech::shim::{shim_path, BUILD, CONTRACT};
pub use pagewise_mech::stop::Stopped;
