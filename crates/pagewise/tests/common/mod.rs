//! Helpers shared by the integration tests.
#![allow(dead_code)]

use pagewise::track::BackendKind;

/// Runs `f` for every backend available in-process; prints skips with reasons.
pub fn for_each_backend(name: &str, skip: &[BackendKind], f: impl Fn(BackendKind)) {
    for kind in BackendKind::ALL {
        if skip.contains(&kind) {
            pagewise_testkit::skip!("[{kind}] does not apply to this backend");
            continue;
        }
        if let Err(why) = kind.available_in_process() {
            pagewise_testkit::skip!("[{kind}] {why}");
            continue;
        }
        f(kind);
        println!("ok   {name} [{kind}]");
    }
}

/// A mapping of one kind of memory, for the memory-type tests; unmapped when
/// dropped.
pub struct Mapped {
    pub addr: u64,
    pub len: usize,
    _file: Option<std::fs::File>,
}

impl Mapped {
    /// `pages` pages of `kind`, filled with a pattern; `None` (with the
    /// reason) where this machine cannot make it (hugetlb unconfigured).
    pub fn new(kind: pagewise::procfs::MemoryKind, pages: usize) -> Result<Self, String> {
        use pagewise::procfs::MemoryKind as K;
        use std::os::fd::AsRawFd;
        let mut len = pages * pagewise::PAGE_SIZE;
        let (flags, file) = match kind {
            K::PrivateAnonymous => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, None),
            K::Shared => {
                let name = c"pagewise-test";
                // SAFETY: memfd_create with a valid name and no flags.
                let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
                if fd < 0 {
                    return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
                }
                // SAFETY: a new descriptor that we own.
                let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                f.set_len(len as u64).map_err(|e| e.to_string())?;
                (libc::MAP_SHARED, Some(f))
            }
            K::FilePrivate => {
                let p = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
                    "mapped-{}-{addr}",
                    std::process::id(),
                    addr = pages
                ));
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&p)
                    .map_err(|e| e.to_string())?;
                let _ = std::fs::remove_file(&p);
                f.set_len(len as u64).map_err(|e| e.to_string())?;
                (libc::MAP_PRIVATE, Some(f))
            }
            K::Hugetlb => {
                let n: u64 = pagewise::procfs::read_trimmed("/proc/sys/vm/nr_hugepages")
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if n == 0 {
                    return Err("no hugetlb pages configured (vm.nr_hugepages is 0)".into());
                }
                len = len.next_multiple_of(pagewise::HUGE_PAGE_SIZE);
                (
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
                    None,
                )
            }
        };
        let fd = file.as_ref().map_or(-1, |f| f.as_raw_fd());
        // SAFETY: a new mapping at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        for i in 0..len / pagewise::PAGE_SIZE {
            // SAFETY: inside the mapping just made, readable and writable.
            unsafe { *(p as *mut u8).add(i * pagewise::PAGE_SIZE + 9) = (i as u8) | 1 };
        }
        Ok(Mapped {
            addr: p as u64,
            len,
            _file: file,
        })
    }

    pub fn region(&self) -> pagewise::Region {
        pagewise::Region::new(self.addr, self.len as u64).unwrap()
    }

    pub fn byte(&self, off: usize) -> u8 {
        // SAFETY: inside the mapping.
        unsafe { std::ptr::read_volatile((self.addr as *const u8).add(off)) }
    }

    pub fn set(&self, off: usize, v: u8) {
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile((self.addr as *mut u8).add(off), v) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: our own mapping, not referenced any more.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}
