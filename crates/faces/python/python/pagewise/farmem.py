"""Far memory for unmodified programs (`pagewise farmem run`)."""

import json as _json

from . import _native

__all__ = ["run", "Result"]


class Result(dict):
    """The run's report (as `pagewise farmem run --stats-json` writes it:
    page_fault_count, remote_fetches, evictions, writebacks,
    injected_delay_ns, floor_ns, members, ...) and the program's `status`
    (its exit code, or 128 + the signal that ended it)."""

    @property
    def status(self):
        return self["status"]


def run(cmd, *, local_pages, latency_ns=0, bandwidth_bps=0, policy="fifo",
        fault_path="inline", trace=None):
    """Runs the program `cmd` (a list: program and arguments) with at most
    `local_pages` of its pages local, each access to another waiting as a
    far-memory fetch would (2 × `latency_ns` + page / `bandwidth_bps`);
    waits for it and returns its statistics (a Result). The GIL is
    released while it runs."""
    if isinstance(cmd, str):
        raise TypeError("cmd is a list: the program and its arguments")
    status, report = _native.farmem_run([str(c) for c in cmd], int(local_pages), int(latency_ns),
                                        int(bandwidth_bps), policy, fault_path,
                                        None if trace is None else str(trace))
    out = Result(_json.loads(report))
    out["status"] = status
    return out
