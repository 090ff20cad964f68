//! Asking a process's filters before acting: whether every call of a
//! whole operation would be allowed, so that an operation the filters
//! would cut short half-way is refused before its first call.

use super::Remote;
use crate::Result;

impl Remote<'_> {
    /// Refuses, as the first of them would be when made, where the calling
    /// thread's filters (respected, see [`crate::seccomp`]) refuse one of
    /// `calls`, each asked with arguments 0 (a filter that looks at the
    /// arguments may still refuse a call when it is made). Nothing is
    /// made; under suspended filters, or none, every call passes.
    pub fn check_calls(&self, calls: &[libc::c_long]) -> Result<()> {
        let pid = self.stopped.pid();
        let ip = self.syscall_at + 2;
        calls
            .iter()
            .try_for_each(|&nr| self.seccomp.check_call(pid, nr, [0; 6], ip))
    }
}
