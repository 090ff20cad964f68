//! Snapshots of a buffer of this process, of another process, and stores
//! on disk.

use crate::track::Held;
use crate::{json, os_error, ranges};
use pagewise::snap::{DiskStore, ProcessSnapshots as Process, RestoreOptions, SnapshotOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Mutex;

/// Bytes of a snapshot read into a new `bytes`: `read(buf)` fills it.
fn read_bytes<'py>(
    py: Python<'py>,
    len: usize,
    read: impl FnOnce(&mut [u8]) -> pagewise::snap::Result<()> + Send,
) -> PyResult<Bound<'py, PyBytes>> {
    if len > 1 << 32 {
        return Err(PyValueError::new_err("read at most 4 GiB at once"));
    }
    let mut buf = vec![0u8; len];
    py.detach(|| read(&mut buf)).map_err(os_error)?;
    Ok(PyBytes::new(py, &buf))
}

/// A diff's page ranges, as `(start, pages)` pairs.
fn page_ranges<'py>(py: Python<'py>, d: &[pagewise::PageRange]) -> Bound<'py, PyBytes> {
    ranges(py, d.iter().map(|r| (r.start, r.pages)))
}

/// Snapshots of a buffer of this process: take, restore in place, read,
/// diff, save into a store.
#[pyclass(module = "pagewise._native")]
pub struct Snapshots {
    inner: Mutex<pagewise::snap::Snapshots>,
    held: Held,
}

impl Snapshots {
    fn lock(&self) -> std::sync::MutexGuard<'_, pagewise::snap::Snapshots> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl Snapshots {
    #[new]
    fn new(py: Python<'_>, address: u64, length: u64) -> PyResult<Snapshots> {
        let held = Held::new(address, length)?;
        let region = held.region;
        let s = py
            .detach(|| pagewise::snap::Snapshots::new(&[region], SnapshotOptions::default()))
            .map_err(os_error)?;
        Ok(Snapshots {
            inner: Mutex::new(s),
            held,
        })
    }

    /// The buffer's first address (ranges and `read` use addresses).
    #[getter]
    fn address(&self) -> u64 {
        self.held.region.start
    }

    /// Takes a snapshot; its id.
    fn take(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.lock().take()).map_err(os_error)
    }

    /// Puts snapshot `id` back into the buffer; what it did, as JSON.
    fn restore(&self, py: Python<'_>, id: u64) -> PyResult<String> {
        let st = py.detach(|| self.lock().restore(id)).map_err(os_error)?;
        json(&st)
    }

    /// `length` bytes at `address` as they were in snapshot `id`.
    fn read<'py>(
        &self,
        py: Python<'py>,
        id: u64,
        address: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        read_bytes(py, length, |b| self.lock().read(id, address, b))
    }

    /// The page ranges that differ between snapshots `a` and `b`.
    fn diff<'py>(&self, py: Python<'py>, a: u64, b: u64) -> PyResult<Bound<'py, PyBytes>> {
        let d = py.detach(|| self.lock().diff(a, b)).map_err(os_error)?;
        Ok(page_ranges(py, &d))
    }

    /// Saves snapshot `id` into the store at `path` (created if missing):
    /// what it wrote, as JSON.
    #[pyo3(signature = (id, path, label=""))]
    fn save(
        &self,
        py: Python<'_>,
        id: u64,
        path: std::path::PathBuf,
        label: &str,
    ) -> PyResult<String> {
        let st = py
            .detach(|| {
                let mut disk = DiskStore::create(&path, true)?;
                self.lock().save(id, &mut disk, label)
            })
            .map_err(os_error)?;
        json(&st)
    }
}

/// Snapshots of another process: take, restore in place (memory, layout
/// and threads' registers), read, diff, drop.
#[pyclass(module = "pagewise._native")]
pub struct ProcessSnapshots {
    inner: Mutex<Process>,
}

impl ProcessSnapshots {
    fn lock(&self) -> std::sync::MutexGuard<'_, Process> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl ProcessSnapshots {
    #[new]
    fn new(py: Python<'_>, pid: i32) -> PyResult<ProcessSnapshots> {
        let p = py.detach(|| Process::open(pid)).map_err(os_error)?;
        Ok(ProcessSnapshots {
            inner: Mutex::new(p),
        })
    }

    /// The process.
    #[getter]
    fn pid(&self) -> i32 {
        self.lock().pid()
    }

    /// Why only memory can be restored here, if so.
    #[getter]
    fn note(&self) -> Option<String> {
        self.lock().note().map(str::to_string)
    }

    /// Takes a snapshot (the process is stopped while its memory is read);
    /// its id.
    fn take(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.lock().take()).map_err(os_error)
    }

    /// Puts snapshot `id` back into the process; what it did, as JSON.
    /// Descriptors opened since are closed inside the process unless
    /// `keep_new_fds`; a restore where one the snapshot had is gone for
    /// good is refused unless `ignore_missing_fds`.
    #[pyo3(signature = (id, memory_only=false, keep_new_fds=false, ignore_missing_fds=false))]
    fn restore(
        &self,
        py: Python<'_>,
        id: u64,
        memory_only: bool,
        keep_new_fds: bool,
        ignore_missing_fds: bool,
    ) -> PyResult<String> {
        let opts = RestoreOptions::default()
            .memory_only(memory_only)
            .keep_new_fds(keep_new_fds)
            .ignore_missing_fds(ignore_missing_fds);
        let r = py
            .detach(|| self.lock().restore(id, opts))
            .map_err(os_error)?;
        json(&r)
    }

    /// `length` bytes at `address` as they were in snapshot `id`.
    fn read<'py>(
        &self,
        py: Python<'py>,
        id: u64,
        address: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        read_bytes(py, length, |b| self.lock().read(id, address, b))
    }

    /// The page ranges that differ between snapshots `a` and `b`.
    fn diff<'py>(&self, py: Python<'py>, a: u64, b: u64) -> PyResult<Bound<'py, PyBytes>> {
        let d = py.detach(|| self.lock().diff(a, b)).map_err(os_error)?;
        Ok(page_ranges(py, &d))
    }

    /// The regions of snapshot `id`, `(start, pages)` pairs.
    fn regions<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyBytes>> {
        let rs = self.lock().regions(id).map_err(os_error)?;
        let ps = pagewise::PAGE_SIZE as u64;
        Ok(ranges(py, rs.iter().map(|r| (r.start, r.len / ps))))
    }

    /// Forgets snapshot `id`.
    #[pyo3(name = "drop")]
    fn drop_snapshot(&self, id: u64) -> PyResult<()> {
        self.lock().drop_snapshot(id).map_err(os_error)
    }

    /// The snapshots held, oldest first.
    fn ids(&self) -> Vec<u64> {
        self.lock().ids()
    }
}

/// A reset session: another process held at one point and put back there
/// at each `reset()` (only the pages written since; the whole restore
/// where its layout, descriptors or threads changed). Usable only from
/// the thread that made it (ptrace is a thread's).
#[pyclass(module = "pagewise._native", unsendable)]
pub struct ResetSession {
    inner: pagewise::snap::ResetSession,
}

#[pymethods]
impl ResetSession {
    #[new]
    fn new(pid: i32) -> PyResult<ResetSession> {
        let inner = pagewise::snap::ResetSession::open(pid).map_err(os_error)?;
        Ok(ResetSession { inner })
    }

    /// The process.
    #[getter]
    fn pid(&self) -> i32 {
        self.inner.pid()
    }

    /// The point's snapshot id.
    #[getter]
    fn point(&self) -> u64 {
        self.inner.point()
    }

    /// Puts the process back at its point; what it did, as JSON.
    #[pyo3(signature = (full=false))]
    fn reset(&mut self, full: bool) -> PyResult<String> {
        let r = match full {
            true => self.inner.reset_full(),
            false => self.inner.reset(),
        };
        json(&r.map_err(os_error)?)
    }

    /// Hands over the signals sent to the process since it was let run;
    /// how many.
    fn pump(&mut self) -> PyResult<usize> {
        self.inner.hand_over_signals().map_err(os_error)
    }

    /// `length` bytes at `address` as the point holds them.
    fn read<'py>(
        &self,
        py: Python<'py>,
        address: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let point = self.inner.point();
        read_bytes(py, length, |b| {
            self.inner.snapshots().read(point, address, b)
        })
    }
}

/// A snapshot store on disk, opened to read.
#[pyclass(module = "pagewise._native")]
pub struct Store {
    inner: Mutex<DiskStore>,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, DiskStore> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl Store {
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Store> {
        let s = py.detach(|| DiskStore::open(&path)).map_err(os_error)?;
        Ok(Store {
            inner: Mutex::new(s),
        })
    }

    /// Every snapshot's record, as JSON.
    fn list_json(&self, py: Python<'_>) -> PyResult<String> {
        let l = py.detach(|| self.lock().list()).map_err(os_error)?;
        json(&l)
    }

    /// The store's figures (`pagewise snapshot inspect`), as JSON.
    fn stats_json(&self, py: Python<'_>) -> PyResult<String> {
        let s = py.detach(|| self.lock().stats()).map_err(os_error)?;
        json(&s)
    }

    /// The page ranges that differ between snapshots `a` and `b`.
    fn diff<'py>(&self, py: Python<'py>, a: u64, b: u64) -> PyResult<Bound<'py, PyBytes>> {
        let d = py.detach(|| self.lock().diff(a, b)).map_err(os_error)?;
        Ok(page_ranges(py, &d))
    }
}
