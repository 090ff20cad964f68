"""A walk through pagewise from Python, cell by cell (each `# %%` is a
notebook cell: run it in Jupyter or VS Code, or the whole file with
`python examples/python/walkthrough.py`)."""

# %% What this kernel offers
import os
import subprocess
import sys
import textwrap
import time

import pagewise

probe = pagewise.probe()
have = {f["name"] for f in probe["features"] if f["available"]}
print(f"Linux {probe['kernel']}: {len(have)} features, e.g.", ", ".join(sorted(have)[:6]))

# %% Which pages of my own buffer did I write?
buf = pagewise.alloc(1024 * pagewise.PAGE_SIZE)    # 4 MiB, page-aligned
tracker = pagewise.Tracker(buf)
for page in (1, 2, 3, 500):
    buf[page * pagewise.PAGE_SIZE] = 1
c = tracker.collect_all()
print(f"{tracker.backend}: {c.pages} pages written, in {len(c.ranges)} ranges")
assert c.pages >= 4

# %% Snapshots of the buffer: take, change, diff, restore byte-exact
del tracker                      # one tracker of a buffer at a time: Snapshots tracks it too
snaps = pagewise.Snapshots(buf)
before = snaps.take()
buf[0:5] = b"hello"
after = snaps.take()
print("changed ranges:", [(hex(int(s)), int(n)) for s, n in snaps.diff(before, after)])
snaps.restore(before)
assert bytes(buf[0:5]) == b"\0" * 5 and snaps.read(after, 0, 5) == b"hello"
print("restored; the later snapshot still reads", snaps.read(after, 0, 5))

# %% Another process: watch its writes, then roll it back
CHILD = textwrap.dedent("""
    import mmap, time
    m = mmap.mmap(-1, 256 * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    print("ready", flush=True)
    while True:                       # writes a page every 2 ms, round and round
        for i in range(256):
            m[i * 4096] = (m[i * 4096] + 1) % 256
            time.sleep(0.002)
""")
child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
try:
    watcher = pagewise.Tracker(pid=child.pid)
    for c in watcher.every(0.2, count=3):
        print(f"pid {child.pid}: {c.pages} pages written in the last 0.2 s ({watcher.backend})")
    p = pagewise.ProcessSnapshots(child.pid)
    first = p.take()
    time.sleep(0.2)
    report = p.restore(first, memory_only=True)
    print(f"rolled back: {report.get('pages_written', report)} pages written back")
except OSError as e:
    print("another process:", e)
finally:
    child.kill()
    child.wait()

# %% Far memory: how does a program behave with 100 local pages, 5 µs away?
if "uffd.MOVE" in have:
    r = pagewise.farmem.run(["sh", "-c", "seq 1 200000 | sort -n | tail -1"],
                            local_pages=100, latency_ns=5000)
    print(f"exit {r.status}: {r['page_fault_count']} faults, {r['evictions']} evictions, "
          f"{r['injected_delay_ns'] / 1e6:.1f} ms injected")
else:
    print("far memory needs userfaultfd with UFFDIO_MOVE here")

# %% What a process's memory holds
rep = pagewise.inspect(os.getpid())   # this very process
print(f"rss {rep['rss_bytes'] / 2**20:.1f} MiB, anonymous {rep['anon_bytes'] / 2**20:.1f} MiB,"
      f" {len(rep['regions'])} regions")
