//! One run of programs under far-memory emulation: the instance its members
//! join or create, the command that starts each under the preload shim, and
//! the run's end.

use super::instance::{self, Access, Instance, Settings};
use crate::{Error, Result};
use pagewise_mech::shim::{ask, env, parsed, shim_command, Request};
use std::path::PathBuf;
use std::process::Command;

/// How the members of a far-memory run behave (see [`FarmemRun::command`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FarmemOptions {
    /// The eviction policy: a built-in name or a plugin's path.
    pub policy: String,
    /// The plugin's argument string.
    pub policy_args: String,
    /// Emulate thread stacks too.
    pub stacks: bool,
    /// Write each member's trace to `PATH.PID`.
    pub trace: Option<PathBuf>,
    /// Which thread serves faults.
    pub fault_path: crate::FaultPath,
    /// A debug mode: each member checks its books against the page tables
    /// every this many faults, and stops the program at the first
    /// disagreement (0: off; see `Hooks::check_books`).
    pub check: u64,
}

setters!(FarmemOptions {
    policy: String,
    policy_args: String,
    stacks: bool,
    trace: Option<PathBuf>,
    fault_path: crate::FaultPath,
    check: u64,
});

impl Default for FarmemOptions {
    fn default() -> Self {
        FarmemOptions {
            policy: "fifo".into(),
            policy_args: String::new(),
            stacks: false,
            trace: None,
            // As `farmem run`'s default.
            fault_path: crate::FaultPath::Inline,
            check: 0,
        }
    }
}

/// Far-memory emulation asked of the shim in a member of a run (see
/// [`FarmemRun::command`]); its variables are `env::FARMEM_*`, inherited
/// by the member's children (who join the run too).
#[doc(hidden)]
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FarmemRequest {
    /// The instance to join.
    pub instance: String,
    /// The tag the run's members share.
    pub tag: u32,
    /// How the member behaves.
    pub options: FarmemOptions,
}

impl Request for FarmemRequest {
    const KEY: &'static str = env::FARMEM_INSTANCE;
    const VARS: &'static [&'static str] = &[
        env::FARMEM_INSTANCE,
        env::FARMEM_TAG,
        env::FARMEM_POLICY,
        env::FARMEM_POLICY_ARGS,
        env::FARMEM_STACKS,
        env::FARMEM_FAULT_PATH,
        env::FARMEM_TRACE,
        env::FARMEM_CHECK,
    ];
    const INHERITED: bool = true;
    fn encode(&self, set: &mut dyn FnMut(&'static str, String)) {
        let o = &self.options;
        set(env::FARMEM_INSTANCE, self.instance.clone());
        set(env::FARMEM_TAG, self.tag.to_string());
        set(env::FARMEM_POLICY, o.policy.clone());
        set(env::FARMEM_POLICY_ARGS, o.policy_args.clone());
        set(env::FARMEM_STACKS, u8::from(o.stacks).to_string());
        set(env::FARMEM_FAULT_PATH, o.fault_path.to_string());
        if let Some(t) = &o.trace {
            set(env::FARMEM_TRACE, t.display().to_string());
        }
        if o.check > 0 {
            set(env::FARMEM_CHECK, o.check.to_string());
        }
    }
    fn decode(
        get: &dyn Fn(&'static str) -> Option<String>,
    ) -> std::result::Result<Option<Self>, String> {
        let Some(instance) = get(env::FARMEM_INSTANCE) else {
            return Ok(None);
        };
        let stacks = match get(env::FARMEM_STACKS).as_deref() {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => {
                return Err(format!(
                    "{}={v:?} is not 0 or 1: nothing of this request is done",
                    env::FARMEM_STACKS
                ))
            }
        };
        let d = FarmemOptions::default();
        let options = FarmemOptions {
            policy: get(env::FARMEM_POLICY).unwrap_or(d.policy),
            policy_args: get(env::FARMEM_POLICY_ARGS).unwrap_or_default(),
            stacks,
            trace: get(env::FARMEM_TRACE).map(PathBuf::from),
            // Not said: the engine's default.
            fault_path: parsed(get, env::FARMEM_FAULT_PATH)?.unwrap_or_default(),
            check: parsed(get, env::FARMEM_CHECK)?.unwrap_or(0),
        };
        Ok(Some(FarmemRequest {
            instance,
            tag: parsed(get, env::FARMEM_TAG)?.unwrap_or(0),
            options,
        }))
    }
}

/// The instance one run of programs under far-memory emulation uses, and the
/// tag (this process's id) its members carry.
pub struct FarmemRun {
    inst: Instance,
    tag: u32,
}

impl FarmemRun {
    /// Joins the instance `name` if it exists, or creates it (`name`, or a
    /// fresh name starting with `prefix`) with `want`, calibrating the fault
    /// floor first. Joining with settings other than the instance's is
    /// refused; `want: None` only joins. Instances whose processes all died
    /// are swept first.
    pub fn join_or_create(
        name: Option<&str>,
        prefix: &str,
        want: Option<Settings>,
    ) -> Result<Self> {
        Instance::sweep();
        let tag = std::process::id();
        if let Some(n) = name.filter(|n| instance::exists(n)) {
            let inst = Instance::open(n, Access::Join)?;
            if let Some(w) = want {
                let s = inst.settings();
                let budget_differs =
                    (w.local_pages, w.local_percent) != (s.local_pages, s.local_percent);
                let link_differs =
                    (w.latency_ns, w.bandwidth_bps) != (s.latency_ns, s.bandwidth_bps);
                if budget_differs || link_differs {
                    return Err(Error::InstanceConflict { name: n.into() });
                }
            }
            return Ok(FarmemRun { inst, tag });
        }
        let Some(want) = want else {
            return Err(Error::NeedsSettings {
                name: name.unwrap_or(prefix).to_string(),
            });
        };
        want.check()?;
        let name = name
            .map(str::to_string)
            .unwrap_or_else(|| instance::unpredictable_name(prefix));
        use crate::FaultPath;
        let cal = crate::calibrate(2000, FaultPath::Thread)?;
        // The inline path where the kernel has it (else it is never used).
        let inline = if pagewise_mech::probe::get().uffd_has(pagewise_sys::uffd::feature::SIGBUS) {
            crate::calibrate(2000, FaultPath::Inline)?
        } else {
            cal
        };
        let inst = match Instance::create(
            &name,
            want,
            (cal.floor_ns, cal.unseen_ns),
            (inline.floor_ns, inline.unseen_ns),
        ) {
            Ok(i) => i,
            // Another run created it meanwhile: join it.
            Err(_) if instance::exists(&name) => Instance::open(&name, Access::Join)?,
            Err(e) => return Err(e),
        };
        Ok(FarmemRun { inst, tag })
    }

    /// A private instance (fresh name from `prefix`) that only watches:
    /// latency 0 and a budget nothing reaches, no calibration. For sampling
    /// which pages a program touches.
    pub fn watch_only(prefix: &str) -> Result<Self> {
        // The program's shim will need a userfaultfd that serves the
        // kernel's faults too; one this process cannot open, it cannot
        // either (same user): said now, not as a program that seems gone.
        pagewise_mech::fault::open(0)?;
        Instance::sweep();
        let settings = Settings {
            latency_ns: 0,
            bandwidth_bps: 0,
            local_pages: 1 << 40,
            local_percent: 0,
        };
        let inst = Instance::create(
            &instance::unpredictable_name(prefix),
            settings,
            (0, 0),
            (0, 0),
        )?;
        Ok(FarmemRun {
            inst,
            tag: std::process::id(),
        })
    }

    /// The instance.
    pub fn instance(&self) -> &Instance {
        &self.inst
    }

    /// The tag this run's members carry.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// `cmd` set up to run under the shim as a member of this run.
    pub fn command(&self, cmd: &[String], opts: &FarmemOptions) -> Result<Command> {
        let mut c = shim_command(cmd)?;
        ask(
            &mut c,
            &FarmemRequest {
                instance: self.inst.name().to_string(),
                tag: self.tag,
                options: opts.clone(),
            },
        );
        Ok(c)
    }

    /// What this run's members did (those still running, and what the
    /// departed left).
    pub fn report(&self) -> super::Report {
        self.inst.report(Some(self.tag))
    }

    /// Members of this run that died without leaving (killed) leave now.
    pub fn reap_dead_members(&self) {
        for m in self.inst.members() {
            if m.tag == self.tag && !pagewise_mech::procfs::is_alive(m.pid) {
                self.inst.leave_pid(m.pid);
            }
        }
    }

    /// Ends the run: reaps dead members, frees the slots its departed
    /// members kept for their counts, and removes the instance if no live
    /// member is left (the last one out; another may have done so).
    pub fn finish(self) {
        self.reap_dead_members();
        self.inst.release_retired(self.tag);
        // A served instance stays for its server's next members.
        if self.inst.members().iter().all(|m| !m.live) && !crate::serve::is_served(self.inst.name())
        {
            let _ = self.inst.remove();
        }
    }
}

impl FarmemRun {
    /// Removes the instance, whatever members it still has (a private
    /// instance whose program was stopped).
    pub fn remove(self) {
        let _ = self.inst.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_far_memory_request_goes_through_its_variables_unchanged() {
        let asked = FarmemRequest {
            instance: "inst".into(),
            tag: 42,
            options: FarmemOptions::default()
                .policy("lru".into())
                .policy_args("a b".into())
                .stacks(true)
                .fault_path(crate::FaultPath::Thread)
                .trace(Some("/tmp/t".into()))
                .check(64),
        };
        let got = pagewise_mech::shim::round_trip(&asked).unwrap().unwrap();
        assert_eq!(format!("{got:?}"), format!("{asked:?}"));
    }
}
