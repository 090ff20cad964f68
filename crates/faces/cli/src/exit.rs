//! The exit status by class of failure, so that a script can tell "not
//! available here" from "failed" (`pagewise --help` and the README list
//! them). A command started with `-- CMD` ends with that command's own
//! status when it ran, as `time` and `strace` do.

use pagewise::ErrorClass;

/// The command line is wrong (clap's own errors exit with it too).
pub const USAGE: i32 = 2;
/// This kernel or machine lacks what the command needs.
pub const UNSUPPORTED: i32 = 3;
/// Not allowed: on a process, a store or a system setting.
pub const PERMISSION: i32 = 4;
/// The process it was about went away.
pub const GONE: i32 = 5;
/// Busy now, try again later: another tracer or agent holds what it
/// needs, a store is locked, a `vfork` is in progress.
pub const BUSY: i32 = 6;
/// Any other failure.
pub const FAILED: i32 = 1;

/// The text `pagewise --help` ends with.
pub const HELP: &str = "Exit status: 0 done (with -- CMD: the command's own status), \
1 failed, 2 wrong usage, 3 not supported on this kernel or machine, 4 not permitted, \
5 the process went away, 6 busy now (another tracer or agent holds it, a vfork in progress): \
try again later.";

/// A command line that is wrong, said in one line.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// What the command needs and the caller may not do, said in one line
/// (exit status [`PERMISSION`]).
#[derive(Debug)]
pub struct NotPermitted(pub String);

impl std::fmt::Display for NotPermitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotPermitted {}

/// Returns a [`Usage`] error from the enclosing function, formatted as
/// `format!` does.
#[macro_export]
macro_rules! usage {
    ($($t:tt)*) => {
        return Err(anyhow::Error::new($crate::exit::Usage(format!($($t)*))))
    };
}

/// The library's error `cause` is, if it is one: the umbrella, the
/// mechanisms' or a capability's own.
pub fn failure<'a>(
    cause: &'a (dyn std::error::Error + 'static),
) -> Option<&'a dyn pagewise::Failure> {
    macro_rules! as_failure {
        ($($t:ty),*) => {
            $(if let Some(e) = cause.downcast_ref::<$t>() {
                return Some(e);
            })*
        };
    }
    as_failure!(
        pagewise::Error,
        pagewise::MechError,
        pagewise::track::Error,
        pagewise::snap::Error,
        pagewise::farmem::Error,
        pagewise::agent::Error
    );
    None
}

/// The exit status for `e`: the class of the first error in its chain that
/// has one.
pub fn code_of(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if cause.downcast_ref::<Usage>().is_some() {
            return USAGE;
        }
        if cause.downcast_ref::<NotPermitted>().is_some() {
            return PERMISSION;
        }
        if let Some(pe) = failure(cause) {
            return match pe.class() {
                ErrorClass::BadInput => USAGE,
                ErrorClass::Unsupported => UNSUPPORTED,
                ErrorClass::Permission => PERMISSION,
                ErrorClass::Gone => GONE,
                ErrorClass::Busy => BUSY,
                _ => FAILED,
            };
        }
    }
    FAILED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_of_the_library_gives_its_class_as_the_exit_status() {
        use anyhow::Context;
        let cases: Vec<(anyhow::Error, i32)> = vec![
            (pagewise::MechError::ProcessExited(7).into(), GONE),
            (
                pagewise::track::Error::HeldElsewhere {
                    start: 0x1000,
                    end: 0x2000,
                }
                .into(),
                BUSY,
            ),
            (pagewise::snap::Error::NoRegion.into(), USAGE),
            (
                pagewise::snap::Error::Mech(pagewise::MechError::PermissionDenied {
                    pid: 7,
                    what: "ptrace".into(),
                })
                .into(),
                PERMISSION,
            ),
            (
                pagewise::Error::from(pagewise::snap::Error::ServesOwnFaults {
                    pid: 7,
                    mappings: 1,
                })
                .into(),
                UNSUPPORTED,
            ),
            (anyhow::anyhow!("no class"), FAILED),
        ];
        for (e, code) in cases {
            let said = e.to_string();
            assert_eq!(code_of(&e), code, "{said}");
            // Under a context too.
            let r: Result<(), anyhow::Error> = Err(e);
            let e = r.context("doing it").unwrap_err();
            assert_eq!(code_of(&e), code, "{said} (with a context)");
        }
    }
}
