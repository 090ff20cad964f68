"""pagewise: page-level memory management from user space on a stock Linux
kernel, for Python.

    import pagewise
    pagewise.probe()                      # what this kernel offers
    buf = pagewise.alloc(64 << 20)        # page-aligned memory of this process
    t = pagewise.Tracker(buf)             # which pages were written since ...
    buf[4096] = 1
    t.collect()                           # -> array([[address, pages]])
    for ranges in pagewise.Tracker(pid=1234).every(0.5, count=10): ...
    s = pagewise.Snapshots(buf); a = s.take(); ...; s.restore(a)
    p = pagewise.ProcessSnapshots(1234)   # take / restore / read / diff another process
    pagewise.Store("store.d").snapshots() # a store on disk
    pagewise.farmem.run(["./prog"], local_pages=1000, latency_ns=5000)
    pagewise.inspect(1234)                # per-region records

Page ranges come back as numpy arrays of shape (n, 2) (start address,
pages) when numpy is installed, lists of (start, pages) tuples otherwise.
Errors are OSError (its subclasses by errno: ProcessLookupError,
PermissionError, FileNotFoundError, ...). Every call that waits on the
kernel or another process releases the GIL.
"""

import ctypes as _ctypes
import json as _json
import mmap as _mmap
import os as _os
import struct as _struct
import time as _time

from . import _native

try:  # numpy is optional
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the environment
    _np = None

__all__ = [
    "PAGE_SIZE",
    "HUGE_PAGE_SIZE",
    "probe",
    "alloc",
    "Tracker",
    "Collection",
    "Snapshots",
    "ProcessSnapshots",
    "ResetSession",
    "Store",
    "inspect",
    "node_agent",
    "farmem",
]

PAGE_SIZE, HUGE_PAGE_SIZE = _native.page_sizes()

# The preload shim that far-memory runs load into a program: the one
# shipped in this package, unless the environment names another.
_SHIM = _os.path.join(_os.path.dirname(__file__), "libpagewise_preload.so")
if _os.path.exists(_SHIM):
    _os.environ.setdefault("PAGEWISE_PRELOAD", _SHIM)


def _use_numpy():
    return _np is not None and not _os.environ.get("PAGEWISE_NO_NUMPY")


def _ranges(raw):
    """(start, pages) pairs from the native layer's little-endian u64s."""
    if _use_numpy():
        return _np.frombuffer(raw, dtype="<u8").reshape(-1, 2).copy()
    return [tuple(p) for p in _struct.iter_unpack("<QQ", raw)]


def _pin(buffer):
    """(pin, address, length) of a writable, contiguous buffer: the pin, a
    ctypes view, holds the buffer's export, so that while it lives the
    buffer can neither be resized, moved nor closed."""
    with memoryview(buffer) as mv:
        if mv.readonly or not mv.c_contiguous:
            raise ValueError("the buffer must be writable and contiguous "
                             "(an mmap.mmap, or pagewise.alloc(n))")
        length = mv.nbytes
    pin = (_ctypes.c_char * length).from_buffer(buffer)
    return pin, _ctypes.addressof(pin), length


def probe():
    """What this kernel offers: {"kernel": ..., "features": [{"name",
    "available", "detail"}, ...], ...} (as `pagewise probe --json`)."""
    return _json.loads(_native.probe_json())


def alloc(nbytes):
    """Anonymous memory of this process, page-aligned, rounded up to whole
    pages: an mmap.mmap that Tracker and Snapshots accept."""
    n = max(PAGE_SIZE, -(-int(nbytes) // PAGE_SIZE) * PAGE_SIZE)
    return _mmap.mmap(-1, n, flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)


class Collection:
    """One collection: `ranges` (the pages written since the one before),
    `pages` (their count) and `stats` (the collection's figures)."""

    __slots__ = ("ranges", "stats")

    def __init__(self, ranges, stats):
        self.ranges = ranges
        self.stats = stats

    @property
    def pages(self):
        return int(self.stats.get("pages_dirty", 0))

    def __repr__(self):
        return f"Collection(pages={self.pages}, ranges={len(self.ranges)})"


class Tracker:
    """Which pages were written: `Tracker(buffer)` for a buffer of this
    process (an mmap, or `alloc(n)`), `Tracker(pid=N)` for another process,
    watched from outside. `backend`: "auto", "uffd-wp", "soft-dirty",
    "mprotect" or "hash"."""

    def __init__(self, buffer=None, *, pid=None, backend="auto"):
        self._pin = None
        where = None
        if buffer is not None:
            self._pin, address, length = _pin(buffer)
            where = (address, length)
        self._t = _native.Tracker(where, pid, backend)
        self.pid = pid

    @property
    def backend(self):
        return self._t.backend

    @property
    def note(self):
        """Why another backend than the one asked for is used, if so."""
        return self._t.note

    def collect(self):
        """The pages written since the last collection, as ranges."""
        return self.collect_all().ranges

    def collect_all(self):
        """The last collection's ranges with its figures (a Collection)."""
        raw, stats = self._t.collect()
        return Collection(_ranges(raw), _json.loads(stats))

    def regions(self):
        """The regions tracked, as ranges."""
        return _ranges(self._t.regions())

    def every(self, seconds, count=None):
        """Yields a Collection every `seconds` (`count` times, or until
        the process exits: ProcessLookupError ends the iteration)."""
        n = 0
        due = _time.monotonic()
        while count is None or n < count:
            due += seconds
            _time.sleep(max(0.0, due - _time.monotonic()))
            try:
                yield self.collect_all()
            except ProcessLookupError:
                return
            n += 1

    def __iter__(self):
        return self.every(1.0)


class Snapshots:
    """Snapshots of a buffer of this process: `take()` an id,
    `restore(id)` in place (byte-exact), `read(id, offset, n)`,
    `diff(a, b)` ranges, `save(id, path)` into a store on disk."""

    def __init__(self, buffer):
        self._pin, address, length = _pin(buffer)
        self._s = _native.Snapshots(address, length)
        self.address = self._s.address

    def take(self):
        return self._s.take()

    def restore(self, snapshot):
        return _json.loads(self._s.restore(snapshot))

    def read(self, snapshot, offset, length):
        """`length` bytes at `offset` into the buffer, as in `snapshot`."""
        return self._s.read(snapshot, self.address + offset, length)

    def diff(self, a, b):
        return _ranges(self._s.diff(a, b))

    def save(self, snapshot, path, label=""):
        return _json.loads(self._s.save(snapshot, _os.fspath(path), label))


class ProcessSnapshots:
    """Snapshots of another process (`pagewise snapshot serve` as an
    object): `take()`, `restore(id, memory_only=False)` puts memory, layout
    and threads' registers back, `read(id, address, n)`, `diff(a, b)`,
    `drop(id)`, `ids()`."""

    def __init__(self, pid):
        self._p = _native.ProcessSnapshots(pid)
        self.pid = pid

    @property
    def note(self):
        return self._p.note

    def take(self):
        return self._p.take()

    def restore(self, snapshot, memory_only=False, keep_new_fds=False, ignore_missing_fds=False):
        return _json.loads(
            self._p.restore(snapshot, memory_only, keep_new_fds, ignore_missing_fds)
        )

    def read(self, snapshot, address, length):
        return self._p.read(snapshot, address, length)

    def diff(self, a, b):
        return _ranges(self._p.diff(a, b))

    def regions(self, snapshot):
        return _ranges(self._p.regions(snapshot))

    def drop(self, snapshot):
        self._p.drop(snapshot)

    def ids(self):
        return self._p.ids()


class ResetSession:
    """Another process held at one point and put back there at each
    `reset()` (`pagewise snapshot serve --session` as an object): only the
    pages written since, every thread's registers, its files' offsets; the
    whole restore where its layout, descriptors or threads changed
    (`reset()["full"]` says why). Call `pump()` now and then while waiting
    on the process: signals sent to it between resets wait for it. Use it
    from the thread that made it."""

    def __init__(self, pid):
        self._r = _native.ResetSession(pid)
        self.pid = pid

    @property
    def point(self):
        return self._r.point

    def reset(self, full=False):
        return _json.loads(self._r.reset(full))

    def pump(self):
        return self._r.pump()

    def read(self, address, length):
        """`length` bytes at `address` as the point holds them."""
        return self._r.read(address, length)


class Store:
    """A snapshot store on disk (`pagewise snapshot inspect` as an object)."""

    def __init__(self, path):
        self._s = _native.Store(_os.fspath(path))

    def snapshots(self):
        """Every snapshot's record: id, pid, label, regions, pages, ..."""
        return _json.loads(self._s.list_json())

    def stats(self):
        """The store's figures: unique and zero pages, bytes on disk, ..."""
        return _json.loads(self._s.stats_json())

    def diff(self, a, b):
        return _ranges(self._s.diff(a, b))


def inspect(*pids, bloom_sample=False):
    """What the processes' memory holds (`pagewise inspect --json`): a dict
    with per-region records under "regions"."""
    return _json.loads(_native.inspect_json(list(pids), bool(bloom_sample)))


def node_agent(config, steps, walk_ns=None):
    """Runs the node agent (`pagewise agent --config CONFIG`, its TOML
    configuration at `config`) for `steps` steps: a dict per step (as
    `pagewise agent --json` prints). Its endpoint answers at the
    configuration's `listen` while it runs; what it changed is put back
    before it returns."""
    lines = _native.node_agent_run(str(config), int(steps), walk_ns)
    return [_json.loads(line) for line in lines]


from . import farmem  # noqa: E402  (uses the names above)
