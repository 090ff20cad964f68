//! `pagewise._native`: the library's capabilities for Python, a thin layer
//! like the C API. The Python package (`python/pagewise`) wraps it: its
//! records come back as JSON text and its page ranges as little-endian
//! `u64` pairs, which the package turns into dicts and numpy arrays (or
//! lists). Every call that waits on the kernel or another process releases
//! the GIL; every library error is an `OSError` with its errno.

#![forbid(unsafe_code)]

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod snap;
mod track;

/// A library error as Python's `OSError` (Python picks the subclass from
/// the errno: `ProcessLookupError` for ESRCH, `PermissionError`, ...).
pub(crate) fn os_error(e: impl pagewise::Failure) -> PyErr {
    PyOSError::new_err((e.errno(), e.to_string()))
}

/// A record of the library as JSON text.
pub(crate) fn json(v: &impl serde::Serialize) -> PyResult<String> {
    serde_json::to_string(v).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Page ranges as `(start, pages)` little-endian `u64` pairs.
pub(crate) fn ranges<'py>(
    py: Python<'py>,
    rs: impl IntoIterator<Item = (u64, u64)>,
) -> Bound<'py, PyBytes> {
    let mut b = Vec::new();
    for (start, pages) in rs {
        b.extend_from_slice(&start.to_le_bytes());
        b.extend_from_slice(&pages.to_le_bytes());
    }
    PyBytes::new(py, &b)
}

/// What this kernel offers, as JSON (`pagewise probe --json`).
#[pyfunction]
fn probe_json(py: Python<'_>) -> PyResult<String> {
    let p = py.detach(pagewise::probe::get);
    json(p)
}

/// Inspects processes (`pagewise inspect --json`): a JSON report.
#[pyfunction]
#[pyo3(signature = (pids, bloom_sample=false))]
fn inspect_json(py: Python<'_>, pids: Vec<i32>, bloom_sample: bool) -> PyResult<String> {
    let opts = pagewise::inspect::Options::default().bloom_sample(bloom_sample);
    let rep = py
        .detach(|| pagewise::inspect::inspect(&pids, opts, &mut |_, _| {}))
        .map_err(os_error)?;
    json(&rep)
}

/// Runs `cmd` under far-memory emulation (`pagewise farmem run`) and waits
/// for it: `(exit status, JSON report)`; the status is 128 + the signal
/// that killed it.
#[pyfunction]
#[pyo3(signature = (cmd, local_pages, latency_ns=0, bandwidth_bps=0, policy="fifo", fault_path="inline", trace=None))]
#[allow(clippy::too_many_arguments)]
fn farmem_run(
    py: Python<'_>,
    cmd: Vec<String>,
    local_pages: u64,
    latency_ns: u64,
    bandwidth_bps: u64,
    policy: &str,
    fault_path: &str,
    trace: Option<std::path::PathBuf>,
) -> PyResult<(i32, String)> {
    use pagewise::farmem::{instance::Settings, FarmemOptions, FarmemRun, FaultPath};
    if cmd.is_empty() || local_pages == 0 {
        return Err(PyValueError::new_err(
            "give a command and a local budget of at least one page",
        ));
    }
    let path: FaultPath = fault_path
        .parse()
        .map_err(|e| PyValueError::new_err(format!("fault_path {fault_path}: {e}")))?;
    let opts = FarmemOptions::default()
        .policy(policy.to_string())
        .fault_path(path)
        .trace(trace);
    let settings = Settings::default()
        .latency_ns(latency_ns)
        .bandwidth_bps(bandwidth_bps)
        .local_pages(local_pages);
    py.detach(|| {
        let run = FarmemRun::join_or_create(None, "py", Some(settings)).map_err(os_error)?;
        let status = run
            .command(&cmd, &opts)
            .map_err(os_error)
            .and_then(|mut c| {
                // Tied to this thread by the shim's command.
                c.status()
                    .map_err(|e| os_error(pagewise::Error::os(format!("running {}", cmd[0]), e)))
            });
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                run.finish();
                return Err(e);
            }
        };
        run.reap_dead_members();
        let rep = json(&run.report());
        run.finish();
        Ok((pagewise::agent::child::exit_code(status), rep?))
    })
}

/// Runs the node agent (`pagewise agent --config CONFIG`) for `steps`
/// steps: one JSON object per step. Its endpoint answers at the
/// configuration's `listen` while it runs; what it took and changed is
/// put back before it returns. `walk_ns` is what a page walk costs here
/// (else the configuration's, else measured).
#[pyfunction]
#[pyo3(signature = (config, steps, walk_ns=None))]
fn node_agent_run(
    py: Python<'_>,
    config: std::path::PathBuf,
    steps: u64,
    walk_ns: Option<f64>,
) -> PyResult<Vec<String>> {
    if steps == 0 {
        return Err(PyValueError::new_err("give at least one step"));
    }
    py.detach(|| {
        let c = pagewise::agent::node::Config::read(&config).map_err(os_error)?;
        let mut taken = Vec::new();
        pagewise::agent::node::run_steps(&c, steps, walk_ns, |s| taken.push(json(s)))
            .map_err(os_error)?;
        taken.into_iter().collect()
    })
}

/// The page size and the huge page size of this machine.
#[pyfunction]
fn page_sizes() -> (usize, usize) {
    (pagewise::PAGE_SIZE, pagewise::HUGE_PAGE_SIZE)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(probe_json, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_json, m)?)?;
    m.add_function(wrap_pyfunction!(farmem_run, m)?)?;
    m.add_function(wrap_pyfunction!(node_agent_run, m)?)?;
    m.add_function(wrap_pyfunction!(page_sizes, m)?)?;
    m.add_class::<track::Tracker>()?;
    m.add_class::<snap::Snapshots>()?;
    m.add_class::<snap::ProcessSnapshots>()?;
    m.add_class::<snap::ResetSession>()?;
    m.add_class::<snap::Store>()?;
    Ok(())
}
