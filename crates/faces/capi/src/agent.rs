//! The node agent: huge pages and dedup for the containers a configuration
//! selects, run for a number of steps.

use super::*;

/// One step of the node agent, as a C caller sees it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct pw_agent_step {
    /// Since the agent started, ms.
    pub t_ms: u64,
    /// Processes watched.
    pub processes: u64,
    /// Containers they are in.
    pub containers: u64,
    /// 1 where the huge-page agent stepped, else 0.
    pub thp_stepped: c_int,
    /// 1 where the dedup agent stepped, else 0 (disabled, or waiting for
    /// KSM, which another pagewise holds).
    pub dedup_stepped: c_int,
}

/// Called once a step of the node agent, with the step and the caller's
/// `user`.
pub type pw_agent_step_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, step: *const pw_agent_step)>;

/// Runs the node agent (`pagewise agent --config`) with the TOML
/// configuration at `config` for `steps` steps (at least one): its
/// endpoint answers at the configuration's `listen` while it runs, each
/// step is handed to `on_step` (may be NULL) with `user`, and the agents
/// are ended and every system setting they changed put back before it
/// returns, whatever happened. `walk_ns` is what a page walk costs here
/// (0: the configuration's, else measured). The steps made go to `*made`
/// (may be NULL). A configuration that is wrong is `-EINVAL`, its fault
/// in `pw_last_error()`.
///
/// # Safety
/// `config` is a string; `on_step` is NULL or callable with `user` and a
/// step; `made` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pw_agent_run(
    config: *const c_char,
    steps: u64,
    walk_ns: f64,
    on_step: pw_agent_step_fn,
    user: *mut c_void,
    made: *mut u64,
) -> c_int {
    call("pw_agent_run", || {
        // SAFETY: the caller's contract.
        let config = unsafe { str_of(config, "config") }?;
        if steps == 0 {
            return Err(invalid("steps must be at least 1"));
        }
        let c = pw::agent::node::Config::read(std::path::Path::new(OsStr::from_bytes(
            config.to_bytes(),
        )))?;
        let walk = (walk_ns > 0.0).then_some(walk_ns);
        let n = pw::agent::node::run_steps(&c, steps, walk, |s| {
            let step = pw_agent_step {
                t_ms: s.t_ms,
                processes: s.processes as u64,
                containers: s.containers as u64,
                thp_stepped: c_int::from(s.thp.is_some()),
                dedup_stepped: c_int::from(s.dedup.is_some()),
            };
            if let Some(f) = on_step {
                // SAFETY: the caller's contract: `f` takes `user` and a step,
                // which lives for the call.
                unsafe { f(user, &step) };
            }
        })?;
        // SAFETY: the caller's contract.
        unsafe { put_opt(made, n) };
        Ok(())
    })
}
