"""The Python package against the same ground truth as the Rust tests: a
shadow copy for tracking and snapshots, byte-exact restores, a program's
own output for far memory, a known layout for inspect. Run by .ci/run:
    pytest crates/faces/python/tests
A test whose kernel feature is missing is skipped with the reason."""

import ctypes
import errno
import os
import pathlib
import random
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import pagewise

PAGE = pagewise.PAGE_SIZE


def feature(name):
    for f in pagewise.probe()["features"]:
        if f["name"] == name:
            return f
    return {"available": False, "detail": f"{name} not probed"}


def need(name):
    f = feature(name)
    if not f["available"]:
        pytest.skip(f"{name}: {f['detail']}")


def as_set(ranges):
    """The page addresses of (start, pages) ranges."""
    out = set()
    for start, pages in ranges:
        out.update(int(start) + i * PAGE for i in range(int(pages)))
    return out


# A child that maps 64 pages, fills page i with byte i + 1, prints the
# address, then writes the pages named on each line of stdin.
CHILD = textwrap.dedent("""
    import ctypes, mmap, sys
    m = mmap.mmap(-1, 64 * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(64):
        m[i * 4096:(i + 1) * 4096] = bytes([i + 1]) * 4096
    view = (ctypes.c_char * len(m)).from_buffer(m)
    print(ctypes.addressof(view), flush=True)
    for line in sys.stdin:
        for p in line.split():
            m[int(p) * 4096 + 5] = 0xEE
        print("done", flush=True)
""")


@pytest.fixture
def child():
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    address = int(p.stdout.readline())

    def write(pages):
        p.stdin.write(" ".join(map(str, pages)) + "\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "done"

    yield p, address, write
    p.kill()
    p.wait()


def test_probe_names_what_this_kernel_has():
    p = pagewise.probe()
    names = {f["name"] for f in p["features"]}
    assert {"userfaultfd", "pagemap_scan", "thp"} <= names
    assert all(isinstance(f["available"], bool) for f in p["features"])


@pytest.mark.parametrize("numpy", [True, False])
def test_tracking_own_memory_sees_every_write(monkeypatch, numpy):
    if not numpy:
        monkeypatch.setenv("PAGEWISE_NO_NUMPY", "1")
    buf = pagewise.alloc(256 * PAGE)
    base = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    t = pagewise.Tracker(buf)
    rng = random.Random(7)
    for _ in range(3):
        written = {rng.randrange(256) for _ in range(40)}
        for p in written:
            buf[p * PAGE + rng.randrange(PAGE)] = rng.randrange(1, 256)
        c = t.collect_all()
        got = as_set(c.ranges)
        want = {base + p * PAGE for p in written}
        assert want <= got, f"{t.backend}: writes lost: {sorted(want - got)}"
        extra = got - want
        if extra:
            print(f"{t.backend}: {len(extra)} pages reported not written (allowed)")
        assert c.pages == len(got)
        if numpy and pagewise._np is not None:
            assert c.ranges.shape[1] == 2
        else:
            assert isinstance(c.ranges, list)
    assert t.collect_all().pages == 0, "nothing written since"


def test_tracking_another_process_sees_its_writes(child):
    need("pagemap_scan")
    p, address, write = child
    t = pagewise.Tracker(pid=p.pid)
    t.collect()
    write([3, 10, 41])
    got = {a for a in as_set(t.collect()) if address <= a < address + 64 * PAGE}
    want = {address + n * PAGE for n in (3, 10, 41)}
    assert want <= got, f"{t.backend}: lost {sorted(want - got)}"
    assert len(got - want) <= 1, f"{t.backend}: {sorted(got - want)}"


def test_snapshots_restore_byte_exact_and_read_as_taken(tmp_path):
    buf = pagewise.alloc(64 * PAGE)
    rng = random.Random(3)
    buf[:] = bytes(rng.randrange(256) for _ in range(len(buf)))
    shadow = bytes(buf)
    s = pagewise.Snapshots(buf)
    a = s.take()
    changed = sorted({rng.randrange(64) for _ in range(10)})
    for p in changed:
        buf[p * PAGE: p * PAGE + 16] = b"\xff" * 16
    after = bytes(buf)
    b = s.take()
    assert as_set(s.diff(a, b)) == {s.address + p * PAGE for p in changed}
    s.restore(a)
    assert bytes(buf) == shadow
    assert s.read(b, 0, len(buf)) == after
    saved = s.save(b, tmp_path / "store.d", "after")
    store = pagewise.Store(tmp_path / "store.d")
    [rec] = store.snapshots()
    assert rec["label"] == "after"
    assert store.stats()["snapshots"] == 1, store.stats()
    assert saved["pages"] == 64, saved


def test_another_process_is_rolled_back(child):
    p, address, write = child
    try:
        ps = pagewise.ProcessSnapshots(p.pid)
    except PermissionError as e:
        pytest.skip(f"cannot act on another process here: {e}")
    a = ps.take()
    # Written from outside, as the child's own writes would be: the child
    # runs no code meanwhile, so what its threads keep (their stacks and
    # thread-local data, which a memory-only restore leaves them) still
    # matches the memory put back; an interpreter that ran since may hold
    # pointers into it, and the restore would be refused (ESTALE).
    with open(f"/proc/{p.pid}/mem", "r+b", buffering=0) as mem:
        for page in [0, 7, 63]:
            mem.seek(address + page * PAGE + 5)
            mem.write(b"\xee")
    r = ps.restore(a, memory_only=True)
    b = ps.take()
    got = ps.read(b, address, 64 * PAGE)
    want = b"".join(bytes([i + 1]) * PAGE for i in range(64))
    assert got == want, "memory is as it was when snapshot a was taken"
    # Memory-only leaves the memory the running threads are on (their
    # stacks, thread-control blocks) as it is: any difference is there.
    left = r["thread_areas"]
    assert 1 <= len(left) <= 2, r
    for start, pages in ps.diff(a, b):
        end = start + pages * PAGE
        assert any(s <= start and end <= e for s, e in left), (start, end, left)
    ps.drop(b)
    assert ps.ids() == [a]


def test_a_reset_session_puts_another_process_back_at_its_point(child):
    p, address, write = child
    try:
        rs = pagewise.ResetSession(p.pid)
    except PermissionError as e:
        pytest.skip(f"cannot act on another process here: {e}")
    want = b"".join(bytes([i + 1]) * PAGE for i in range(64))
    assert rs.read(address, 64 * PAGE) == want, "the point as taken"
    mem = open(f"/proc/{p.pid}/mem", "rb", buffering=0)
    for round in range(5):
        write([round, 20 + round, 63])
        r = rs.reset()
        assert r["full"] is None, r
        assert r["pages_written"] >= 3, r
        mem.seek(address)
        assert mem.read(64 * PAGE) == want, f"round {round}: memory is the point's"
    assert rs.pump() >= 0


def test_the_books_example_runs_top_to_bottom(child, tmp_path):
    """The book's example (docs/book/src/python.md) as written, but for
    what it leaves to the reader: the process 4242 and its `address` (a
    child's), the program (/bin/true) and the store (a temporary one)."""
    p, address, write = child
    root = pathlib.Path(__file__).resolve().parents[4]
    text = (root / "docs/book/src/python.md").read_text()
    blocks = text.split("```python\n")
    assert len(blocks) == 2, "one Python example in the book"
    code = blocks[1].split("```")[0]
    store = str(tmp_path / "store.d")
    for what, by in [("4242", str(p.pid)), ('"./prog"', '"/bin/true"'),
                     ('"store.d"', repr(store))]:
        assert what in code, what
        code = code.replace(what, by)
    exec(compile(code, "python.md", "exec"), {"address": address})
    assert pagewise.Store(store).snapshots(), "the example saved a snapshot"


def test_errors_are_os_errors_with_their_errno():
    with pytest.raises(ProcessLookupError) as e:
        pagewise.Tracker(pid=2**22 + 12345)
    assert e.value.errno == errno.ESRCH
    with pytest.raises(ValueError):
        pagewise.Snapshots(b"read-only bytes")


def test_inspect_finds_the_childs_region(child):
    p, address, _ = child
    rep = pagewise.inspect(p.pid)
    regions = rep["regions"]
    assert any(r["start"] <= address < r["start"] + r["len"] for r in regions), regions[:3]


PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    size_t n = 1000, sum = 0;
    char *m = malloc(n * 4096);
    for (size_t i = 0; i < n; i++) m[i * 4096] = (char)(i * 7 + 1);
    for (size_t i = 0; i < n; i++) sum += (unsigned char)m[i * 4096];
    printf("sum %zu\n", sum);
    return 0;
}
"""


def test_far_memory_changes_no_output_and_evicts(tmp_path):
    need("uffd.MOVE")
    src = tmp_path / "p.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "p"
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src)], check=True)
    plain = subprocess.run([str(exe)], capture_output=True, text=True).stdout
    out = tmp_path / "out"
    r = pagewise.farmem.run(["sh", "-c", f"{exe} > {out}"], local_pages=100, latency_ns=1000)
    assert r.status == 0, r
    assert out.read_text() == plain
    assert r["evictions"] >= 800, f"1000 pages through a budget of 100: {r['evictions']} evictions"


def test_long_calls_release_the_gil():
    need("uffd.MOVE")
    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.01)

    th = threading.Thread(target=count)
    th.start()
    r = pagewise.farmem.run(["sleep", "0.5"], local_pages=1000)
    stop.set()
    th.join()
    assert r.status == 0
    assert len(ticks) >= 10, f"the other thread ran {len(ticks)} times in 0.5 s"


def test_the_node_agent_steps_and_puts_back_what_it_changed(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the node agent claims KSM and THP settings: needs root")
    ksm_run = pathlib.Path("/sys/kernel/mm/ksm/run")
    if not ksm_run.exists():
        pytest.skip("the kernel has no KSM")
    before = ksm_run.read_text()
    prom = tmp_path / "agent.prom"
    cfg = tmp_path / "agent.toml"
    cfg.write_text(textwrap.dedent(f"""\
        interval_ms = 200
        window_ms = 50
        listen = "127.0.0.1:0"
        metrics_file = "{prom}"
        [thp]
        enabled = false
        [[select]]
        all_containers = true
        """))
    steps = pagewise.node_agent(cfg, 2)
    assert len(steps) == 2, steps
    assert steps[0]["t_ms"] <= steps[1]["t_ms"], steps
    assert all(s["thp"] is None for s in steps), "thp is disabled"
    text = prom.read_text()
    assert "pagewise_node_steps_total 2.0" in text, text
    # The classic text format, as node_exporter's textfile collector reads it.
    assert "# TYPE pagewise_node_steps_total counter\n" in text, text
    assert "# EOF" not in text, text
    assert ksm_run.read_text() == before, "KSM's run is not as it was"
    with pytest.raises(OSError) as bad:
        cfg.write_text("[[select]]\n")
        pagewise.node_agent(cfg, 1)
    assert "exactly one of" in str(bad.value), bad.value
