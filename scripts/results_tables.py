"""The results tables of docs/benchmarks/README.md, each written from the
report.json of one folder by a function here (`scripts/results tables`).

A table stands between `<!-- table KIND FOLDER -->` and `<!-- /table -->`;
KIND names a function of TABLES, which takes the report and returns the
table's Markdown. A value measured over several runs or samples is shown
as its median with its spread (min–max) where the report holds them; a
report that kept one value per point says so in the table ("one run" or
"median of N, spread not recorded"), so that no reader takes one number for
a distribution.

Kept in Python beside the script that checks the README: the reports are
JSON written by the benchmarks, the tables Markdown; a table is a few
lines of formatting over one report.
"""
import math


def median(v):
    v = sorted(v)
    n = len(v)
    return (v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2) if n else 0.0


def sig(x, n=3):
    """`x` to `n` significant digits, never in exponent form; thousands
    grouped with a thin space as the README writes them."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    digits = max(0, n - 1 - int(math.floor(math.log10(abs(x)))))
    s = f"{x:.{digits}f}"
    return group(s)


def fix(x, d):
    """`x` with `d` decimals, thousands grouped."""
    return group(f"{x:.{d}f}").replace("-", "−")


def group(s):
    neg = s.startswith("-")
    s = s.lstrip("-")
    whole, _, frac = s.partition(".")
    if len(whole) > 4:
        parts = []
        while len(whole) > 3:
            parts.insert(0, whole[-3:])
            whole = whole[:-3]
        parts.insert(0, whole)
        whole = "\u202f".join(parts)
    return ("−" if neg else "") + whole + ("." + frac if frac else "")


def spread(vals, f):
    """The median of `vals` with its spread, each shown by `f`."""
    if len(vals) == 1:
        return f"{f(vals[0])} (one run)"
    return f"{f(median(vals))} ({f(min(vals))}–{f(max(vals))})"


def md(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def mib(m):
    return f"{m // 1024} GiB" if m >= 1024 else f"{m} MiB"


# ---------------------------------------------------------------- track/


def track_write(r):
    """LDT (a): ms per write-only pass, median of `passes` (the report
    keeps the median alone)."""
    w = r["write_only"]
    n = r["config"]["passes"]
    at = {(x["size_mib"], x["bytes_per_page"], x["backend"]): x for x in w}
    rows = []
    for bpp in (1, 4096):
        for size in r["config"]["sizes_mib"]:
            if (size, bpp, "none") not in at or (bpp == 4096 and size < 1024):
                continue
            get = lambda b: at[(size, bpp, b)]["pass_ms"]
            h = at[(size, bpp, "hash")]
            rows.append([mib(size), bpp, f"{sig(get('none'))} ms", f"{sig(get('uffd-wp'))} ms",
                         f"{sig(get('mprotect'))} ms",
                         f"{sig(h['pass_ms'])} ms ({h['ratio_to_none']:.2f}×)",
                         f"{get('mprotect') / get('uffd-wp'):.1f}×"])
    return md(["working set", "B/page", "none", "uffd-wp", "mprotect", "hash",
               "mprotect / uffd-wp"], rows) + \
        f"\n\nEach time is the median of {n} passes; the report keeps the median alone (spread not recorded)."


def track_collect(r):
    """LDT (c): collection time after writing x % of the region, median
    of `collect_reps`."""
    c = r["collect"]
    n = r["config"]["collect_reps"]
    at = {(x["backend"], x["layout"], x["percent"]): x for x in c}
    rows = []
    for pct in (10, 100):
        cell = lambda b, l: f"{sig(at[(b, l, pct)]['collect_ms'])} ms"
        h = at[("hash", "random", pct)] if ("hash", "random", pct) in at else \
            next(x for k, x in at.items() if k[0] == "hash" and k[2] == pct)
        rows.append([f"{pct} %", cell("uffd-wp", "seq"), cell("uffd-wp", "random"),
                     cell("mprotect", "random"),
                     f"{sig(h['collect_ms'])} ms ({h['collect_ms'] / r['read_once_ms']:.2f}×)"])
    return md(["x", "uffd-wp seq", "uffd-wp random", "mprotect random", "hash random"], rows) + \
        f"\n\nEach time is the median of {n} collections (spread not recorded); " \
        f"reading the region once took {sig(r['read_once_ms'])} ms."


# ---------------------------------------------------------------- dedup/


def dedup_table(report):
    """SmartMD's trade-off: per level and scheme, the median of the runs
    (the spread of ops/s: the lowest and highest 1 s sample of any run)."""
    rows = report["rows"]
    names = {"none": "none", "ksm-everywhere": "KSM everywhere",
             "ksm-advisor": "KSM everywhere, advisor (200 s target)",
             "ksm-advisor-tuned": "KSM everywhere, advisor (run's pace)",
             "no-splitting": "no splitting", "ingens-like": "Ingens-like",
             "smartmd": "**pagewise (SmartMD)**"}
    secs = report["config"]["seconds"]
    out = ["| level | scheme | runs | saved (pages_sharing) | of KSM | held by the cgroup | swapped | ops/s (spread) | of no-splitting | ops per CPU-s, of no-splitting | huge pages at end | ksmd CPU | agent CPU | total CPU | every word verified |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for level in report["config"]["levels"]:
        def runs(scheme):
            return [r for r in rows if r["scheme"] == scheme and r["level"] == level]

        def med(scheme, key):
            return median([r[key] for r in runs(scheme)])
        ksm = med("ksm-everywhere", "saved_mib") if runs("ksm-everywhere") else 0
        base = med("no-splitting", "ops_per_s") if runs("no-splitting") else 0
        base_cpu = med("no-splitting", "ops_per_cpu_s") if runs("no-splitting") else 0
        first = True
        for scheme in names:
            rs = runs(scheme)
            if not rs:
                continue
            ksmd, agent = med(scheme, "ksmd_cpu_ms"), med(scheme, "agent_cpu_ms")
            pct = lambda a, b: f"{100 * a / b:.1f} %" if b else "–"
            out.append("| " + " | ".join([
                f"{level}" if first else "",
                names[scheme],
                str(len(rs)),
                f"{med(scheme, 'saved_mib'):.0f} MiB",
                pct(med(scheme, "saved_mib"), ksm),
                f"{med(scheme, 'usage_mib'):.0f} MiB",
                f"{med(scheme, 'swap_mib'):.0f} MiB",
                f"{med(scheme, 'ops_per_s') / 1e6:.1f} M ({min(r['ops_min'] for r in rs) / 1e6:.1f}–{max(r['ops_max'] for r in rs) / 1e6:.1f})",
                pct(med(scheme, "ops_per_s"), base),
                pct(med(scheme, "ops_per_cpu_s"), base_cpu),
                f"{med(scheme, 'huge_end'):.0f}",
                f"{ksmd / 1e3:.2f} s" if ksmd else "–",
                f"{agent / 1e3:.2f} s" if agent else "–",
                f"{(ksmd + agent) / (secs * 10):.1f} %",
                "yes" if all(r["verified"] for r in rs) and not any(r["oom_killed"] for r in rs) else "**no**",
            ]) + " |")
            first = False
    notes = [f"Medians over the runs of each scheme, {secs} s each; every scheme but the advisor's "
             "has ksmd paced by the agent to one pass over the mergeable pages in "
             f"{report['config'].get('full_scan_ms', 5000) / 1e3:g} s, smart scan off."]
    if any(r["scheme"].startswith("ksm-advisor") for r in rows):
        notes.append("The advisor's schemes: ksmd paced by the kernel's advisor (`advisor_mode` "
                     "`scan-time`) and smart scan on, as the kernel ships them.")
    return "\n".join(out) + "\n\n" + " ".join(notes)


# ---------------------------------------------------------------- outside/


def outside(r):
    rows = []
    for pct in r["config"]["percents"]:
        at = {x["how"]: x for x in r["rows"] if x["percent"] == pct}
        cell = lambda h: f"{at[h]['collect_ms']:.2f} ({at[h]['min_ms']:.2f}–{at[h]['max_ms']:.2f})"
        rows.append([f"{pct:g}", cell("uffd-wp outside"), cell("hash outside"),
                     cell("uffd-wp in-process"),
                     f"{at['hash outside']['collect_ms'] / at['uffd-wp outside']['collect_ms']:.0f}×"])
    return md(["x %", "uffd-wp outside, ms", "hash outside, ms", "uffd-wp in-process, ms",
               "hash / outside"], rows) + \
        f"\n\nMedian of {r['config']['reps']} collections (min–max)."


# ---------------------------------------------------------------- thp-fair/ thp/ prezero/


def thp_fair(r):
    names = ["first-come", "utilisation", "pagewise"]
    rows = []
    for p in names:
        rs = [x for x in r["rows"] if x["policy"] == p]
        if not rs:
            continue
        sp = lambda a, b: [x[a] / x[b] for x in rs]
        rows.append([p, spread(sp("random_before_ms", "random_after_ms"), lambda v: f"{v:.3f}"),
                     spread(sp("stream_before_ms", "stream_after_ms"), lambda v: f"{v:.3f}")])
    return md(["policy", "random: speedup, median (min–max)",
               "stream: speedup, median (min–max)"], rows)


def thp_fair_kernel(r):
    """Each process's time per round under the kernel's own policies
    (fresh processes, no agent) and under pagewise after its budget."""
    ms = lambda v: fix(v, 1)
    rows = []
    names = list(dict.fromkeys(x["policy"] for x in r.get("kernel", [])))
    for p in names:
        rs = [x for x in r["kernel"] if x["policy"] == p]
        rows.append([p, spread([x["random_ms"] for x in rs], ms),
                     spread([x["random_huge_kib"] / 1024 for x in rs], lambda v: fix(v, 0)),
                     spread([x["stream_ms"] for x in rs], ms),
                     spread([x["stream_huge_kib"] / 1024 for x in rs], lambda v: fix(v, 0)),
                     "yes" if all(x["verified"] for x in rs) else "no"])
    for p in ["first-come", "pagewise"]:
        rs = [x for x in r["rows"] if x["policy"] == p]
        rows.append([f"{p}, after the budget", spread([x["random_after_ms"] for x in rs], ms),
                     spread([x["random_promoted"] * 2 for x in rs], lambda v: fix(v, 0)),
                     spread([x["stream_after_ms"] for x in rs], ms),
                     spread([x["stream_promoted"] * 2 for x in rs], lambda v: fix(v, 0)),
                     "yes" if all(x["verified"] for x in rs) else "no"])
    skipped = "".join(f" Skipped: {w}." for w in r.get("kernel_skipped", []))
    return md(["policy", "random: ms per round", "random: in 2 MiB pages, MiB", "stream: ms per pass",
               "stream: in 2 MiB pages, MiB", "verified"], rows) + \
        f"\n\nMedian (min–max) over {r['config']['repeats']} runs per policy, in the same run; the THP knobs " \
        f"no policy changes: {', '.join(r.get('thp_knobs', []))}.{skipped}"


def thp_saved(r):
    names = [("coverage", "coverage (pagewise)"), ("address", "address order (khugepaged)"),
             ("utilisation", "utilisation ≥ 0.9 (Ingens-like)")]
    rows = []
    for k in r["config"]["budgets"]:
        row = [k]
        for p, _ in names:
            v = [x["saved_ms_per_huge_page"] for x in r["rows"] if x["policy"] == p and x["k"] == k]
            row.append(spread(v, lambda y: fix(y, 2)) if v else "–")
        rows.append(row)
    return md(["k"] + [n for _, n in names], rows)


def thp_kernel(r):
    rows = []
    names = list(dict.fromkeys(x["policy"] for x in r.get("kernel", [])))
    for p in names:
        rs = [x for x in r["kernel"] if x["policy"] == p]
        rows.append([p, spread([x["ms_per_round"] for x in rs], lambda v: fix(v, 1)),
                     spread([x["anon_huge_kib"] / 1024 for x in rs], lambda v: fix(v, 0)),
                     spread([x["rss_kib"] / 1024 for x in rs], lambda v: fix(v, 0)),
                     spread([x["mthp_64k_faults"] for x in rs], lambda v: fix(v, 0)),
                     "yes" if all(x["verified"] for x in rs) else "no"])
    k = max(r["config"]["budgets"])
    after = [x["after_ms"] for x in r["rows"] if x["policy"] == "coverage" and x["k"] == k]
    before = [x["before_ms"] for x in r["rows"] if x["policy"] == "coverage" and x["k"] == k]
    rows.append([f"pagewise, coverage, k = {k}: before", spread(before, lambda v: fix(v, 1)), "0", "–", "–", "–"])
    rows.append([f"pagewise, coverage, k = {k}: after", spread(after, lambda v: fix(v, 1)),
                 fix(k * 2, 0), "–", "–",
                 "yes" if all(x["verified"] for x in r["rows"] if x["policy"] == "coverage" and x["k"] == k) else "no"])
    skipped = "".join(f" Skipped: {w}." for w in r.get("kernel_skipped", []))
    return md(["policy", "ms per round", "in 2 MiB pages, MiB", "RSS, MiB", "64 KiB pages faulted", "verified"],
              rows) + f"\n\nMedian (min–max) over {r['config']['repeats']} fresh processes per policy, in the same " \
        f"run; the THP knobs no policy changes: {', '.join(r.get('thp_knobs', []))}.{skipped}"


def prezero(r):
    regimes = {"compacted": "compacted", "after-base-pages": "after base pages"}
    rows = []
    seen = []
    for x in r["rows"]:
        key = (x["regime"], x["way"])
        if key not in seen:
            seen.append(key)
    for regime, way in seen:
        rs = [x for x in r["rows"] if x["regime"] == regime and x["way"] == way]
        us = lambda v: sig(v, 2) if v < 1 else fix(v, 0)
        rows.append([regimes.get(regime, regime), way,
                     spread([x["p50_us"] for x in rs], us),
                     spread([x["p99_us"] for x in rs], us),
                     spread([x["run_ms"] for x in rs], lambda v: fix(v, 0))])
    return md(["state", "way", "first touch p50, µs", "p99, µs", "run time, ms"], rows) + \
        f"\n\nMedian of {r['config']['repeats']} runs (min–max); every run in `prezero/summary.txt`."


# ---------------------------------------------------------------- redis/


def redis(r):
    runs = r["runs"]
    base = [x for x in runs if x["backend"] == "none"]
    rows = [["none (first, last)", "–", ", ".join(fix(x["mean_rps"], 0) for x in base),
             ", ".join(f"{x['ratio_to_none']:.2f}" for x in base), "–", "–"]]
    how = {"uffd-wp": "uffd-wp (shim)", "hash": "hash (outside)"}
    for x in runs:
        if x["backend"] == "none":
            continue
        rows.append([how.get(x["backend"], x["backend"]), f"{x['interval_s']} s",
                     fix(x["mean_rps"], 0), f"{x['ratio_to_none']:.3f}", x["collections"],
                     f"{sig(x['mean_collect_ms'])} ms"])
    return md(["backend", "interval", "mean req/s", "ratio", "collections", "mean collect"],
              rows) + "\n\nOne run per backend and interval (the untracked one twice)."



# ---------------------------------------------------------------- snap/


def snap_dfs(r):
    names = {"full-copy": "full copies", "page-store": "page store"}
    rows = [[names.get(x["variant"], x["variant"]), f"{sig(x['seconds'])} s",
             f"{fix(x['peak_rss_mib'], 0)} MiB", f"{fix(x['snapshot_mib'], 0)} MiB"]
            for x in r["dfs"]]
    return md(["variant", "time", "peak RSS", "snapshots"], rows) + \
        f"\n\nOne search per variant ({r['dfs'][0]['states']} states)."


def snap_cycles(r):
    at = {(x["variant"], x["permille"]): x for x in r["cycles"]}
    floor = any(v == "floor" for v, _ in at)
    rows = []
    for pm in r["config"]["cycle_permille"]:
        ms = lambda v: f"{sig(at[(v, pm)]['cycle_ms'])} ms"
        pages = at[("page-store", pm)]["pages_dirtied"]
        row = [f"{pm / 10:g} % ({pages} pages)", ms("page-store"),
               ms("page-store restore-only"), ms("fork"), ms("memcpy"),
               f"{at[('fork', pm)]['cycle_ms'] / at[('page-store', pm)]['cycle_ms']:.1f}×"]
        if floor:
            row += [ms("floor"),
                    f"{at[('page-store', pm)]['cycle_ms'] / at[('floor', pm)]['cycle_ms']:.2f}×"]
        rows.append(row)
    n = {v: at[(v, r["config"]["cycle_permille"][0])]["cycles"]
         for v in ("page-store", "fork", "memcpy")}
    head = ["dirtied", "page store", "restore-only", "fork", "memcpy", "fork / page store"]
    if floor:
        head += ["floor", "page store / floor"]
    return md(head, rows) + \
        f"\n\nMedian cycle time over {n['page-store']} cycles (fork {n['fork']}, memcpy " \
        f"{n['memcpy']}); the report keeps the median alone (spread not recorded)." + \
        (" The floor: the same number of pages written under write-protection on a region of its "
         "own, one walk that finds them, each copied out and copied back from a copy of the base, "
         "one walk that protects them again; none of the store's work." if floor else "")


def goals_snap_cycles(r):
    at = {(x["variant"], x["permille"]): x for x in r["cycles"]}
    c, f = at[("page-store", 10)], at.get(("floor", 10))
    ms, xf = c["cycle_ms"], c["ratio_to_fork"]
    rows = [["1 % of 1 GiB: snapshot + restore cycle in the process ≤ 5 ms", f"{sig(ms)} ms",
             yes_no(ms <= 5, f"{ms / 5:.1f}× over")],
            ["≥ 10× its fork cycle", f"{xf:.1f}× ({sig(at[('fork', 10)]['cycle_ms'])} ms)",
             yes_no(xf >= 10, f"{10 / xf:.1f}× short")]]
    if f:
        fl = f["cycle_ms"]
        rows.append(["the floor on this kernel, same run (faults, two walks, a copy out and back)",
                     f"{sig(fl)} ms: the goal is {5 / fl:.2f}× the floor; the cycle {ms / fl:.2f}× it",
                     "reported"])
    return md(["goal", "measured", "met"], rows)


def snap_dump(r):
    d = r["dump"]
    names = {"pagewise first": "pagewise, first",
             "pagewise after 1 %": "pagewise, after 1 % changed",
             "pagewise after 1 % (no verify)": "pagewise, after 1 % changed, `--no-verify`"}
    rows = [[names.get(x["tool"], x["tool"]), f"{fix(x['ms'], 0)} ms",
             f"{fix(x['stopped_ms'], 0)} ms", f"{sig(x['bytes'] / 1048576)} MiB"]
            for x in d["rows"]]
    if d.get("criu_skipped"):
        rows.append(["`criu dump`", "skipped", "", ""])
    return md(["dump", "time", "process stopped", "bytes added"], rows) + \
        "\n\nOne dump of each."


# ---------------------------------------------------------------- rollback/


def mmm(x, f):
    """A `{median, min, max}` record: median (min–max)."""
    return f"{f(x['median'])} ({f(x['min'])}–{f(x['max'])})"


def rollback_resets(r):
    rs = r["resets"]
    at = {(x["variant"], x["mib"], x["thp"], x["k"]): x for x in rs}
    rows = []
    for thp in (False, True):
        for mib_ in r["config"]["sizes_mib"]:
            for k in r["config"]["ks"]:
                if ("rollback", mib_, thp, k) not in at:
                    continue
                a, b = at[("rollback", mib_, thp, k)], at[("fork server", mib_, thp, k)]
                rows.append([mib(mib_), "yes" if thp else "no", k,
                             mmm(a["reset"], lambda v: sig(v)) + " ms",
                             mmm(b["reset"], lambda v: sig(v)) + " ms",
                             f"{b['reset']['median'] / a['reset']['median']:.1f}",
                             f"{a['walk_share_pct']:.0f} %"])
    return md(["state", "THP", "k", "rollback reset", "fork server", "x", "walk share"], rows) + \
        f"\n\nMedian (min–max) of {r['config']['reps']} resets per point; x: fork server / rollback, by medians."


def rollback_phases(r):
    x = next(x for x in r["resets"] if x["variant"] == "rollback" and x["mib"] == 1024
             and not x["thp"] and x["k"] == 16)
    rows = [[k[:-3], f"{v:.0f}"] for k, v in x["phases"].items()]
    return md(["phase", "µs"], rows) + \
        f"\n\nMedian of each phase over {x['reps']} resets (1 GiB, k = 16, base pages); spread not recorded."


def rollback_cycles(r):
    rows = []
    for x in r["cycles"]:
        f = lambda v: sig(v)
        rows.append([f"{x['percent']:g} %", mmm(x["input"], f) + " ms", mmm(x["take"], f) + " ms",
                     mmm(x["restore"], f) + " ms", mmm(x["cycle"], f) + " ms",
                     mmm(x["fork_cycle"], f) + " ms", f"{x['x_fork']:.1f}",
                     mmm(x["floor_vm"], f) + " ms", mmm(x["floor_copy"], f) + " ms",
                     f"{x['x_floor_vm']:.1f}"])
    return md(["x", "input", "take", "restore", "cycle", "fork cycle", "x fork",
               "floor: readv + writev", "floor: memcpy", "cycle / floor"], rows) + \
        f"\n\nMedian (min–max) of {r['config']['cycle_reps']} cycles (and floor rounds) per point; " \
        "ratios by medians. The floors copy the same pages: `process_vm_readv` then " \
        "`process_vm_writev` of them in the target, and a plain copy out and back of as many " \
        "pages scattered over memory of the same size in the benchmark."



# ---------------------------------------------------------------- live/


def live_checkpoint(r):
    rows = [[mib(x["mib"]), f"{x['percent']:g}", fix(x["pages_per_s"], 0),
             f"{x['downtime_ms']:.2f}", x["passes"], fix(x["total_ms"], 0),
             fix(x["stop_and_copy_ms"], 0), f"{fix(x['downtime_ratio'], 0)}×"]
            for x in r["rows"]]
    return md(["size", "dirty %", "pages/s", "live downtime, ms", "passes",
               "until running again, ms", "stop-and-copy, ms", "ratio"], rows) + \
        "\n\nOne run per point."


def live_migration(r):
    rows = []
    for x in r["rows"]:
        m = x["migration"]
        down = f"{sig(m['downtime_ms'])}" + ("" if m["converged"] else " (not converged)")
        rows.append([mib(x["mib"]), f"{x['percent']:g}", down, sig(m["handover_ms"]), m["passes"],
                     fix(m["total_ms"], 0), fix(m["page_mib"], 0), f"{m['wire_mib']:.1f}"])
    return md(["size", "dirty %", "downtime, ms", "handover, ms", "passes",
               "until running again, ms", "pages sent, MiB", "on the wire, MiB"], rows) + \
        "\n\nOne run per point."


def live_compression(r):
    c = r["compression"]
    rows = [[x["compression"], fix(x["page_mib"], 0), f"{x['wire_mib']:.1f}",
             fix(x["compress_ms"], 0), sig(x["handover_ms"]), fix(x["total_ms"], 0)]
            for x in c["runs"]]
    return md(["compression", "pages sent, MiB", "on the wire, MiB", "compressing, ms",
               "handover, ms", "until running again, ms"], rows) + \
        f"\n\nOne run each ({mib(c['mib'])}, {c['percent']:g} % dirty)."



# ---------------------------------------------------------------- checkpoint/


def checkpoint(r):
    runs = r["runs"]
    hash_read = next((x["mean_bytes_read"] for x in runs if x["mode"] == "hash"), 0)
    rows, nones = [], 0
    for x in runs:
        mode = x["mode"]
        if mode == "none":
            mode = "none (first)" if nones == 0 else "none (last)"
            nones += 1
        cps = x["checkpoints"]
        stopped = [c["stopped_ms"] for c in cps]
        rows.append([mode, fix(x["set_rps"], 0), fix(x["get_rps"], 0), fix(x["mean_rps"], 0),
                     f"{x['ratio_to_none']:.3f}", len(cps),
                     spread(stopped, lambda v: sig(v)) if stopped else "",
                     f"{x['mean_bytes_read'] / 1048576:.1f}" if cps else "",
                     f"{hash_read / x['mean_bytes_read']:.1f}×" if cps and x["mean_bytes_read"] else ""])
    return md(["mode", "SET/s", "GET/s", "mean req/s", "ratio", "checkpoints",
               "stopped, median (min–max) ms", "read per checkpoint (mean), MiB",
               "fewer bytes than hash"], rows) + \
        f"\n\nOne {r['seconds']} s run per mode (the untracked one first and last), a checkpoint every {r['every_ms']} ms."



# ---------------------------------------------------------------- thp-redis/


def thp_redis(r):
    names = {"linux": "Linux (THP `always`)",
             "never": "kernel: THP `never`",
             "madvise": "kernel: THP `madvise` (Redis does not advise)",
             "always": "kernel: THP `always`",
             "always-shrinker": "kernel: THP `always` + shrinker (`max_ptes_none` 409)",
             "mthp-64k": "kernel: 64 KiB mTHP only",
             "ingens": "Ingens-like (base pages at fault, promote at 90 %)",
             "pagewise": "pagewise (`limit-above:{p:g}`, {z} zero pages)"}
    c = r["config"]
    runs = max(c.get("repeats", 1), 1)

    def sp(vals, f):
        vals = [v for v in vals if v is not None]
        return spread(vals, f) if vals else "–"

    rows = []
    for w in dict.fromkeys(x["way"] for x in r["rows"]):
        xs = [x for x in r["rows"] if x["way"] == w]
        name = names.get(w, w).format(p=c["pressure_pct"], z=c["zero_pages"])
        done = [x for x in xs if x["p3_completed"] and not x.get("died_after_p3")]
        if len(done) == len(xs):
            p3 = f"completed {len(done)}/{len(xs)}"
        else:
            killed = [fix(x["p3_inserted"], 0) for x in xs if not x["p3_completed"]]
            p3 = f"**OOM-killed** {len(xs) - len(done)}/{len(xs)} (at {', '.join(killed)} of {fix(c['p3_keys'], 0)})"
        agent = any(x["recovered_mib"] for x in xs)
        rows.append([name, p3, sp([x["peak_mib"] for x in xs], lambda v: fix(v, 0)),
                     sp([x["bloat_before_p3_mib"] for x in xs], lambda v: fix(v, 0)),
                     sp([x["recovered_of_bloat_mib"] for x in xs], lambda v: fix(v, 0)) if agent else "–",
                     sp([x["recovered_in_10s"] for x in xs], lambda v: f"{100 * v:.0f} %"),
                     sp([x["t90_s"] for x in xs], lambda v: f"{v:.1f} s"),
                     sp([x["p1_set_per_s"] for x in xs], lambda v: fix(v, 0)),
                     sp([x["p3_set_per_s"] for x in xs], lambda v: fix(v, 0)),
                     sp([x["get_per_s"] for x in xs], lambda v: fix(v, 0)),
                     sp([x["huge_share_end"] for x in xs if x["huge_share_end"]], lambda v: f"{100 * v:.0f} %")])
    return md(["policy", "P3", "peak MiB", "bloat before P3, MiB", "of it given back, MiB",
               "in 10 s", "t90", "P1 SET/s", "P3 SET/s", "GET/s after", "huge at the end"], rows) + \
        (f"\n\nMedian (min–max) over {runs} fresh servers and cgroups per policy, the policies in turn run by run"
         if runs > 1 else "\n\nOne run per policy") + \
        f"; cgroup limit {c['limit_mib']} MiB, no swap." + \
        "".join(f"\nNot run: {why}." for why in r.get("skipped", []))


def thp_redis_get(r):
    """Per way: GET/s (median of each run's second-half rounds) against
    resident memory and memory in huge pages, medians over the runs with
    their spread."""
    c = r["config"]
    names = {"pagewise": "**pagewise** (THP `madvise`, the agent promoting)"}
    rows = []
    for w in dict.fromkeys(x["way"] for x in r["rows"]):
        rs = [x for x in r["rows"] if x["way"] == w]
        rows.append([names.get(w, w), spread([x["get_per_s"] for x in rs], lambda v: fix(v, 0)),
                     spread([x["rss_mib"] for x in rs], lambda v: fix(v, 0)),
                     spread([x["huge_mib"] for x in rs], lambda v: fix(v, 0)),
                     spread([x["agent_cpu_s"] for x in rs], lambda v: fix(v, 2)) if w == "pagewise" else "–",
                     "yes" if all(x["lost"] == 0 and x["misses"] == 0 for x in rs) else "**no**"])
    return md(["way", "GET/s (second half)", "resident MiB", "in 2 MiB pages, MiB", "agent CPU, s",
               "every value back, no miss"], rows) + \
        f"\n\nMedian (min–max) over {c['repeats']} fresh servers per way, the ways in turn run by run; " \
        f"{fix(c['keys'], 0)} keys of {c['value_bytes']} B, {c['rounds']} rounds of " \
        f"{fix(c['requests_per_round'], 0)} GETs (`-P {c['pipeline']} -c {c['clients']}`)." + \
        "".join(f"\nNot run: {why}." for why in r.get("skipped", []))


def dedup_advisor(r):
    """SmartMD against KSM everywhere paced by the kernel's advisor, per
    level: medians over the runs with their spread (min–max), smartmd's
    saving and ksmd CPU as shares of each advisor scheme's."""
    rows = r["rows"]
    names = {"ksm-everywhere": "KSM everywhere, paced by the agent",
             "ksm-advisor": "KSM everywhere, advisor (200 s target)",
             "ksm-advisor-tuned": "KSM everywhere, advisor (run's pace)",
             "smartmd": "**pagewise (SmartMD)**"}
    out = []
    for level in r["config"]["levels"]:
        def runs(s):
            return [x for x in rows if x["scheme"] == s and x["level"] == level]

        def spread(s, key, f):
            v = [x[key] for x in runs(s)]
            return f"{f(median(v))} ({f(min(v))}–{f(max(v))})"
        for s in names:
            if not runs(s):
                continue
            m = runs("smartmd")
            vs = "–"
            if s.startswith("ksm-advisor") and m:
                saved = median([x["saved_mib"] for x in runs(s)])
                cpu = median([x["ksmd_cpu_ms"] for x in runs(s)])
                ms, mc = median([x["saved_mib"] for x in m]), median([x["ksmd_cpu_ms"] for x in m])
                vs = (f"{100 * ms / saved:.0f} % of its saving" if saved >= 1 else f"it saved {saved:.0f} MiB") + \
                     (f", {100 * mc / cpu:.0f} % of its ksmd CPU" if cpu else "")
            out.append([f"{level}", names[s], str(len(runs(s))),
                        spread(s, "saved_mib", lambda v: f"{v:.0f}") + " MiB",
                        spread(s, "ksmd_cpu_ms", lambda v: f"{v / 1e3:.2f}") + " s",
                        spread(s, "agent_cpu_ms", lambda v: f"{v / 1e3:.2f}") + " s",
                        spread(s, "ops_per_s", lambda v: f"{v / 1e6:.0f}") + " M",
                        f"{median([x['huge_end'] for x in runs(s)]):.0f}",
                        vs,
                        "yes" if all(x["verified"] and not x["oom_killed"] for x in runs(s)) else "**no**"])
    return md(["level", "scheme", "runs", "saved (pages_sharing)", "ksmd CPU", "agent CPU",
               "ops/s (median of run medians)", "huge pages at end", "smartmd against it",
               "every word verified"], out) + \
        f"\n\nMedian (min–max) over the runs of each scheme, {r['config']['seconds']} s each; the " \
        "advisor's schemes run smart scan on (the kernel's default), the others off."


# ---------------------------------------------------------------- dedup-redis/


def dedup_redis(r):
    names = {"none": "none", "ksm-everywhere": "KSM everywhere", "ksm-advisor": "KSM everywhere, advisor (200 s target)",
             "ksm-advisor-tuned": "KSM everywhere, advisor (run's pace)", "no-splitting": "no splitting",
             "ingens-like": "Ingens-like", "smartmd": "pagewise (SmartMD)"}
    at = {x["scheme"]: x for x in r["rows"]}
    ksm = at.get("ksm-everywhere", {}).get("saved_mib", 0)
    base = at.get("no-splitting", {}).get("get_per_s", 0)
    secs = r["config"]["seconds"]
    pct = lambda a, b: f"{100 * a / b:.1f} %" if b else "–"
    rows = []
    for key, name in names.items():
        x = at.get(key)
        if not x:
            continue
        ksmd, agent = x["ksmd_cpu_ms"], x["agent_cpu_ms"]
        t90 = next((y["t_s"] for y in x.get("samples", []) if y["saved_mib"] >= 0.9 * x["saved_mib"]), None) \
            if x["saved_mib"] >= 1 else None
        rows.append([name, f"{fix(x['saved_mib'], 0)} MiB", f"{t90:.1f} s" if t90 is not None else "–",
                     pct(x["saved_mib"], ksm),
                     f"{fix(x['usage_mib'], 0)} MiB",
                     f"{fix(x['huge_loaded_mib'], 0)} → {fix(x['huge_end_mib'], 0)} MiB",
                     f"{fix(x['get_per_s'], 0)} ({fix(x['get_min'], 0)}–{fix(x['get_max'], 0)})",
                     pct(x["get_per_s"], base), fix(x["set_per_s"], 0),
                     f"{ksmd / 1e3:.2f} s" if ksmd else "–", f"{agent / 1e3:.2f} s" if agent else "–",
                     f"{(ksmd + agent) / (secs * 10):.1f} %",
                     "yes" if x["values_ok"] == x["values_checked"] else "**no**"])
    return md(["scheme", "saved (pages_sharing)", "90 % of it by", "of KSM", "held by the cgroup (end)",
               "huge pages (after load → end)", "GET/s, 4 servers (spread)", "of no-splitting",
               "SET/s", "ksmd CPU", "agent CPU", "total CPU", "every value read back"], rows) + \
        f"\n\nOne {secs} s run per scheme; GET/s and SET/s are medians of its 1 s samples in the second half, GET/s with their spread."



# ---------------------------------------------------------------- rollback-redis/ rollback-lazy/


def rollback_redis(r):
    rows = []
    for x in r["redis"]:
        f = lambda v: sig(v)
        before = mmm(x["before_case"], f) + " ms" if x["before_case"]["median"] else "–"
        rows.append([x["method"], x["reps"], mmm(x["reset"], f) + " ms", before,
                     mmm(x["case"], f) + " ms", f"{x['x_rollback']:.1f}×"])
    return md(["method", "resets", "reset", "before each case", "case",
               "reset over rollback's"], rows) + \
        "\n\nMedian (min–max) over the resets of each method; the ratio by medians."


def lazy_cpus(r, x):
    """The CPUs a lazy-restore point ran on: the machine's count for "all"."""
    return {"all": r["machine"].get("cpus", "all"), "one": 1}.get(x["cpus"], x["cpus"])


def rollback_lazy(r):
    rows = []
    for x in r["lazy"]:
        cpus = lazy_cpus(r, x)
        f = lambda v: sig(v)
        rows.append([x["mib"], x["store"], cpus, mmm(x["eager"], f) + " ms",
                     mmm(x["first_work_eager"], f) + " ms", mmm(x["first_work_lazy"], f) + " ms",
                     mmm(x["touch_p50_us"], f) + " µs", mmm(x["touch_p99_us"], f) + " µs",
                     mmm(x["floor_p50_us"], f) + " µs", f"{x['x_floor']:.2f}",
                     mmm(x["background_complete"], f) + " ms"])
    return md(["MiB", "store", "CPUs", "eager", "first work, eager", "first work, lazy",
               "first touch p50", "p99", "floor p50", "x floor", "all in (background)"], rows) + \
        f"\n\nMedian (min–max) of {r['config']['lazy']['reps']} restores per point; x floor by medians."


def rollback_lazy_staged(r):
    rows = []
    for x in r["lazy"]:
        cpus = lazy_cpus(r, x)
        f = lambda v: sig(v)
        rows.append([x["mib"], x["store"], cpus, mmm(x["first_work_staged"], f) + " ms",
                     mmm(x["staged_all"], f) + " ms",
                     mmm(x["staged_touch_p50_us"], f) + " µs", mmm(x["staged_touch_p99_us"], f) + " µs",
                     mmm(x["floor_p50_us"], f) + " µs", f"{x['staged_x_floor']:.2f}"])
    return md(["MiB", "store", "CPUs", "first work, staging on", "every page staged",
               "staged first touch p50", "p99", "floor p50", "x floor"], rows) + \
        f"\n\nMedian (min–max) of {r['config']['lazy']['reps']} restores per point, no background fill; " \
        "the first useful work runs while the stager reads the store, the timed first touches once " \
        "every page is staged; x floor by medians."



# ---------------------------------------------------------------- farmem/ farmem-paths/


def lat(ns):
    return "0" if ns == 0 else f"{ns / 1000:g} µs"


def err(e, modelled):
    sign = "+" if e >= 0 else "−"
    t = f"{sign}{abs(e) / 1000:.2f} µs" if abs(e) >= 1000 else f"{sign}{abs(e):.0f} ns"
    if modelled and abs(e) >= 300:
        t += f" ({sign}{100 * abs(e) / modelled:.1f} %)"
    return t


def verdict(d):
    if not d["above_floor"]:
        return "below the floor"
    if d["within_goal"]:
        return "met"
    over = abs(d["error_ns"]) - max(0.05 * d["modelled_ns"], 300)
    return f"**missed** by {over:.0f} ns"


def farmem_delay(r):
    rows = [[lat(d["latency_ns"]), lat(d["modelled_ns"]), f"{d['measured_ns'] / 1000:.2f} µs",
             err(d["error_ns"], d["modelled_ns"] if d["above_floor"] else 0), verdict(d)]
            for d in r["delay"]]
    return md(["latency", "modelled", "measured", "error", "goal (±5 % or ±300 ns)"], rows) + \
        f"\n\nMedian of {r['config']['repeats']} runs of {r['config']['faults_per_point']} faults " \
        "per latency (spread not recorded in this report)."


def farmem_fault_paths(r):
    f = r["fault_paths"]
    plain = f["plain_ns"]
    rows = [["plain first touch", f"{plain / 1000:.2f} µs", "—"],
            ["handler thread", f"{f['thread_ns'] / 1000:.2f} µs", f"+{(f['thread_ns'] - plain) / 1000:.2f} µs"],
            ["`SIGBUS` in the faulting thread", f"{f['sigbus_ns'] / 1000:.2f} µs",
             f"+{(f['sigbus_ns'] - plain) / 1000:.2f} µs"]]
    if "inline_ns" in f:
        rows.append(["inline engine (`SIGBUS`, books, lock)", f"{f['inline_ns'] / 1000:.2f} µs",
                     f"+{(f['inline_ns'] - plain) / 1000:.2f} µs"])
    return md(["path", "cost per fault", "added"], rows) + "\n\nMedians of one run."


def farmem_paths_delay(r, path="inline"):
    at = {(x["path"], x["load"]): x for x in r["runs"]}
    idle, busy = at[(path, "idle")], at[(path, "busy")]
    rows = []
    for a, b in zip(idle["delay"], busy["delay"]):
        cell = lambda d: f"{d['measured_ns'] / 1000:.2f} µs ({d['spread_ns'][0] / 1000:.2f}–{d['spread_ns'][1] / 1000:.2f})"
        first = a["latency_ns"] == 0
        rows.append(["0 (the floor)" if first else lat(a["latency_ns"]), lat(a["modelled_ns"]),
                     cell(a), "—" if first else err(a["error_ns"], a["modelled_ns"] if a["above_floor"] else 0),
                     cell(b), "—" if first else err(b["error_ns"], b["modelled_ns"] if b["above_floor"] else 0),
                     "floor" if first else
                     (verdict(a) if verdict(a) == verdict(b) else
                      f"idle {verdict(a)}, busy {verdict(b)}")])
    return md(["one-way latency", "modelled", "idle: measured (spread)", "error",
               "busy: measured (spread)", "error", "goal (±5 % or ±300 ns)"], rows) + \
        f"\n\nThe {path} path. Median (min–max) of {r['config']['repeats']} runs of " \
        f"{r['config']['faults_per_point']} faults per latency."



def farmem_least(r):
    rows = []
    us = lambda ns: f"{ns / 1000:.2f}"
    for x in r["runs"]:
        if x["path"] != "inline" or not x.get("least_ns"):
            continue
        least, (lo, hi) = x["least_ns"]
        f0, f1 = x["floor_spread_ns"]
        rows.append([x["load"], f"{us(x['floor_ns'])} µs ({us(f0)}–{us(f1)})",
                     f"{us(least)} µs ({us(lo)}–{us(hi)})", f"{us(x['floor_ns'] - least)} µs"])
    return md(["other vCPU", "inline floor", "the least (min–max)", "the engine's own"], rows) + \
        f"\n\nMedian (min–max) of {r['config']['repeats']} repeats; the engine's own by medians."



# ---------------------------------------------------------------- farmem-redis/ farmem-memcached/


def _app(r):
    app = r.get("app", "redis")
    return ("GET/s", "Redis") if app == "redis" else ("ops/s", app)


def farmem_app_local(r):
    unit, _ = _app(r)
    base = r["baseline_get_rps"]
    lat_ = r["by_local"][0]["latency_ns"] if r["by_local"] else 0
    rows = []
    for x in r["by_local"]:
        faults = fix(x["page_fault_count"], 0)
        if x["evictions"] == 0 or x["local_percent"] == 100:
            faults += " (first touches)"
        rows.append([f"{x['local_percent']} %", fix(x["get_rps"], 0),
                     f"{x['get_rps'] / base:.2f}", faults])
    return md([f"local memory ({lat(lat_)})", unit, "× not emulated", "faults"], rows) + \
        f"\n\nOne run per point; not emulated: {fix(base, 0)} {unit}."


def farmem_app_latency(r):
    unit, _ = _app(r)
    base = r["baseline_get_rps"]
    pct = r["by_latency"][0]["local_percent"] if r["by_latency"] else 0
    rows = [[lat(x["latency_ns"]), fix(x["get_rps"], 0), f"{x['get_rps'] / base:.2f}"]
            for x in r["by_latency"]]
    return md([f"one-way latency ({pct} % local)", unit, "× not emulated"], rows) + \
        "\n\nOne run per point."


def farmem_app_isolation(r):
    unit, app = _app(r)
    by = {}
    for x in r["isolation"]:
        by.setdefault(x["series"], []).append(fix(x["get_rps"], 0))
    names = [("alone", "one emulated, alone"), ("separate", "two emulated, separate instances"),
             ("shared", "two emulated, one shared instance"),
             ("two-plain", "control: two not emulated"),
             ("beside", "one emulated beside one not emulated")]
    rows = []
    for key, name in names:
        v = by.get(key, [])
        if not v:
            continue
        second = v[1] if len(v) > 1 else "—"
        if key == "beside" and len(v) > 1:
            second += " (not emulated)"
        rows.append([name, v[0], second])
    return md(["setting", f"{app} 1", f"{app} 2"], rows) + \
        f"\n\n{unit}, one run per setting (50 % local, {lat(r['isolation'][0]['latency_ns'])})."


def farmem_app_system(r):
    unit, _ = _app(r)
    ours = {x["local_percent"]: x for x in r["local_0"]}
    rows = []
    for x in r["system"]:
        o = ours.get(x["local_percent"])
        if x["oom_killed"]:
            sysc = "**OOM-killed**" + (f" ({fix(x['major_faults'], 0)} page-ins before)"
                                       if x["major_faults"] else "")
        else:
            sysc = f"{fix(x['get_rps'], 0)} ({fix(x['major_faults'], 0)})"
        rows.append([f"{x['local_percent']} %",
                     f"{fix(o['get_rps'], 0)} ({fix(o['page_fault_count'], 0)})" if o else "–",
                     sysc])
    return md(["local memory", f"pagewise, latency 0: {unit} (faults)",
               f"system-wide: {unit} (major faults)"], rows) + "\n\nOne run per point."


def farmem_app_system_isolation(r):
    unit, _ = _app(r)
    by = {}
    for x in r["system_isolation"]:
        by.setdefault(x["series"], []).append(fix(x["get_rps"], 0))
    names = [("system-shared", "two sharing one cgroup (twice the limit)"),
             ("system-separate", "two in separate cgroups"),
             ("system-beside", "one limited beside one not")]
    rows = []
    for key, name in names:
        v = by.get(key, [])
        if len(v) == 2:
            rows.append([name, v[0], v[1] + (" (not limited)" if key == "system-beside" else "")])
    return md(["setting (50 %)", "system-wide: 1", "2"], rows) + f"\n\n{unit}, one run per setting."



# ---------------------------------------------------------------- inspect/


def inspect(r):
    sgn = lambda e: f"{'+' if e >= 0 else '−'}{100 * abs(e):.2f} %"
    rows = [[mib(x["bytes"] // 1048576), f"{x['inspect_s']:.3f} s", f"{x['read_once_s']:.3f} s",
             f"{x['ratio']:.2f}×", fix(x["target_rate_before"], 0), fix(x["target_rate_during"], 0),
             f"{x['target_slowdown']:.2f}×", "yes" if x["exact"] else "**no**",
             sgn(x["bloom_relative_error"]), sgn(x["bloom_sampled_relative_error"])]
            for x in r["points"]]
    return md(["size", "inspect", "read once", "ratio", "target passes/s before",
               "during the scan", "slowdown", "exact", "Bloom error", "Bloom, 25 % sampled"], rows) + \
        f"\n\nOne scan per size; read once at {r['read_bandwidth_gb_s']:.2f} GB/s (best of 3)."



def sparse(r):
    def mmx(x, d):
        return f"{fix(x['median'], d)} ({fix(x['min'], d)}–{fix(x['max'], d)})"
    rows = [[x["shape"], f"`{x['command']}`", mmx(x["ms"], 1) + " ms", f"{x['ms_over_floor']:.2f}×",
             mmx(x["peak_mib"], 1) + " MiB", f"{x['mib_over_floor']:.2f}×",
             yes_no(x["met"])] for x in r["rows"]]
    return md(["shape", "command", "time", "÷ floor", "pagewise's peak memory", "÷ floor",
               f"≤ {r['bound_ms']:.0f} ms and ≤ {r['bound_mib']:.0f} MiB"], rows) + \
        f"\n\nMedian (min–max) of {r['runs']} runs each, interleaved; every snapshot checked " \
        f"(the 2 pages, zeros elsewhere) and every restore: {'yes' if r['verified'] else '**no**'}."


# ---------------------------------------------------------------- node/


def goals_node(r):
    back = all(x["settings_put_back"] for x in r["runs"])
    n = max(c["containers"] for c in r["cases"])
    big = next(c for c in r["cases"] if c["containers"] == n)
    goals = [
        ["at most 1 % of one CPU with 50 containers", f"{big['cpu_percent'][0]:.2f} %",
         yes_no(n >= 50 and big["cpu_percent"][0] <= 1.0, f"{big['cpu_percent'][0] / 1.0:.1f}× the goal")],
        ["at most 50 series per container", str(big["series_per_container"]),
         yes_no(big["series_per_container"] <= 50)],
        ["metrics within 1 s of start-up", f"{max(c['first_answer_ms'][2] for c in r['cases']):.0f} ms at most",
         yes_no(all(c["first_answer_ms"][2] <= 1000 for c in r["cases"]))],
        ["SIGTERM puts KSM's settings back", "every run" if back else "not every run", yes_no(back)],
    ]
    return md(["goal", "measured", "met"], goals)


def k8s_node(r):
    def policy(w):
        # Reports before kube-router enforced the policy have no figure.
        s = w.get("policy_enforced_s")
        return "not enforced (no enforcer)" if s is None else f"enforced within {s} s"
    rows = [[w["how"], str(w["ready_s"]), f"{w['end_s']} (grace 30)", str(w["series"]),
             "yes", policy(w), f"back to {w['ksm_back_to']}"] for w in r["ways"]]
    v = r["versions"]
    enforcer = f", kube-router {v['kube-router']} (iptables {v['iptables']})" if "kube-router" in v else ""
    return md(["deployed with", "agent Ready, s", "agent ended, s", "series",
               "probes, labels, pods left alone, scrape, promtool", "NetworkPolicy", "KSM's run"], rows) + \
        (f"\n\nKubernetes {v['kubernetes']}, etcd {v['etcd']}, containerd {v['containerd']}, runc {v['runc']}, "
         f"Helm {v['helm']}, Prometheus {v['prometheus']}{enforcer}; cluster up in {r['cluster_up_s']} s, "
         f"the whole test {r['total_s']} s; after `down`, "
         + ("nothing left." if r["down_clean"] else "something left."))


def node(r):
    def m(t, d):
        return f"{t[0]:.{d}f} ({t[1]:.{d}f}–{t[2]:.{d}f})"
    rows = [[str(c["containers"]), m(c["cpu_percent"], 2), m(c["first_answer_ms"], 0),
             m(c["all_watched_ms"], 0), str(c["series_per_container"])] for c in r["cases"]]
    runs = len(r["runs"]) // max(1, len(r["cases"]))
    return md(["containers watched", "CPU, % of one", "first answer, ms", "all watched, ms",
               "series per container"], rows) + \
        f"\n\nMedian (min–max) of {runs} runs; CPU over {r['seconds']} s once every container is watched."



# ---------------------------------------------------------------- goals
# A goal table: each goal as the issue set it, what the report measured,
# and whether it is met, judged here from the report (never typed in).


def yes_no(ok, short=None):
    return "yes" if ok else ("no" + (f": {short}" if short else ""))


def goals_track(reports):
    t, rd = reports
    w = t["write_only"]
    c = {(x["backend"], x["layout"], x["percent"]): x["collect_ms"] for x in t["collect"]}
    seq, rnd = c[("uffd-wp", "seq", 10)], c[("uffd-wp", "random", 10)]
    ratios = [next(y["pass_ms"] for y in w if y["backend"] == "mprotect" and y["size_mib"] == x["size_mib"]
                   and y["bytes_per_page"] == 1) / x["pass_ms"]
              for x in w if x["backend"] == "uffd-wp" and x["bytes_per_page"] == 1]
    tl = {x["backend"]: x["mean_ops_per_s"] for x in t["timeline"]}
    thr = tl["uffd-wp"] / tl["mprotect"]
    hc = [x["collect_ms"] / t["read_once_ms"] for x in t["collect"] if x["backend"] == "hash"]
    hw = [x["ratio_to_none"] for x in w if x["backend"] == "hash"]
    r1 = {x["backend"]: x["ratio_to_none"] for x in rd["runs"] if x["interval_s"] == 1}
    rng = lambda v: f"{min(v):.2f}–{max(v):.2f}×"
    rows = [
        ["collect 1 GiB with 10 % dirty, `uffd-wp` ≤ 3 ms",
         f"{sig(seq)} ms (contiguous), {sig(rnd)} ms (random pages)", yes_no(max(seq, rnd) <= 3)],
        ["(a) 1 B/page: `uffd-wp` ≥ 5× faster than `mprotect`", f"{min(ratios):.1f}–{max(ratios):.1f}× over "
         f"{mib(min(t['config']['sizes_mib']))}–{mib(max(t['config']['sizes_mib']))}", yes_no(min(ratios) >= 5)],
        ["(b) throughput ≥ 2.4× `mprotect`", f"{thr:.1f}×", yes_no(thr >= 2.4)],
        ["`hash` collection ≤ 1.3× reading the region once", rng(hc), yes_no(max(hc) <= 1.3)],
        ["`hash`: tracked write pass ≤ 1.05× untracked", rng(hw),
         yes_no(max(hw) <= 1.05, f"{sum(h > 1.05 for h in hw)} of {len(hw)} passes over")],
        ["(d) Redis at 1 s within 8 % of untracked",
         f"`uffd-wp` {r1['uffd-wp']:.3f}×, `hash` {r1['hash']:.3f}× of the untracked mean",
         yes_no(all(abs(v - 1) <= 0.08 for k, v in r1.items() if k != "none"))],
    ]
    return md(["goal", "measured", "met"], rows)


def goals_rollback_resets(r):
    at = {(x["variant"], x["mib"], x["thp"], x["k"]): x["reset"]["median"] for x in r["resets"]}
    big = at[("rollback", 1024, False, 16)]
    x = at[("fork server", 1024, False, 16)] / big
    within = {k: at[("rollback", 1024, False, k)] / at[("rollback", 64, False, k)]
              for k in r["config"]["ks"] if k >= 256}
    share = {m: next(y["walk_share_pct"] for y in r["resets"] if y["variant"] == "rollback"
                     and y["mib"] == m and not y["thp"] and y["k"] == 16) for m in (1024, 64)}
    rows = [
        ["reset of 1 GiB, 16 pages written, ≤ 1 ms", f"{sig(big)} ms", yes_no(big <= 1)],
        ["≥ 10× faster than the fork server (base pages)", f"{x:.1f}×", yes_no(x >= 10)],
        ["from k = 256 up, 1 GiB within 2× of 64 MiB at the same k",
         ", ".join(f"{v:.1f}× at k = {k}" for k, v in within.items()),
         yes_no(all(v <= 2 for v in within.values()))],
        ["at k = 16 the page-table walk's share",
         f"{share[1024]:.0f} % at 1 GiB, {share[64]:.0f} % at 64 MiB", "reported"],
    ]
    return md(["goal", "measured", "met"], rows)


def goals_rollback_cycles(r):
    c = next(x for x in r["cycles"] if x["percent"] == 1.0)
    ms, xf = c["cycle"]["median"], c["x_fork"]
    fl = c["floor_vm"]["median"]
    inp = c["input"]["median"]
    rows = [["1 % of 1 GiB ≤ 8 ms per cycle for another process", f"{sig(ms)} ms",
             yes_no(ms <= 8, f"{ms / 8:.1f}× over")],
            ["≥ 2.5× its fork cycle", f"{xf:.1f}× ({sig(c['fork_cycle']['median'])} ms)",
             yes_no(xf >= 2.5, f"{2.5 / xf:.2f}× short")],
            ["≥ 10× fork (the earlier goal)", f"{xf:.1f}×", yes_no(xf >= 10)],
            ["the floor (`process_vm_readv` + `process_vm_writev` of the same pages) and the ratio to it",
             f"{sig(fl)} ms; the cycle {c['x_floor_vm']:.1f}× it; a plain copy out and back "
             f"{sig(c['floor_copy']['median'])} ms", "reported"],
            ["the floor with the input (the target's writes and their faults)",
             f"{sig(inp)} + {sig(fl)} = {sig(inp + fl)} ms: the goal is {8 / (inp + fl):.2f}× it, "
             f"the cycle {ms / (inp + fl):.2f}×", "reported"]]
    return md(["goal", "measured", "met"], rows)


def goals_rollback_redis(r):
    at = {x["method"]: x for x in r["redis"]}
    rows = []
    for method, what in (("DEBUG RELOAD", "reloading"), ("restart", "restarting")):
        x = at[method]["x_rollback"]
        rows.append([f"≥ 50× faster than {what}", f"{x:.1f}×", yes_no(x >= 50, f"{50 / x:.2f}× short")])
    a, b = at["rollback"], at["undo journal"]
    rows.append(["faster than the undo journal",
                 f"reset {sig(a['reset']['median'])} vs {sig(b['reset']['median'])} ms; a case "
                 f"{sig(a['case']['median'])} ms with the rollback's write-protect faults, against "
                 f"{sig(b['case']['median'])} ms and {sig(b['before_case']['median'])} ms of `DUMP` with the journal",
                 yes_no(a["reset"]["median"] < b["reset"]["median"])])
    return md(["goal", "measured", "met"], rows)


def goals_rollback_lazy(r):
    cache = [x for x in r["lazy"] if x["store"] == "page cache"]
    best = min(cache, key=lambda x: x["x_floor"] if x["x_floor"] >= 1 else float("inf"))
    one = next(x for x in r["lazy"] if x["cpus"] == "one")
    pts = ", ".join(f"{mib(x['mib'])} {x['store']}{' one CPU' if x['cpus'] == 'one' else ''} "
                    f"{x['staged_x_floor']:.2f}×" for x in r["lazy"])
    four = next(x for x in r["lazy"] if x["store"] == "page cache" and x["mib"] == 4096 and x["cpus"] == "all")
    cold = next(x for x in r["lazy"] if x["store"] == "cold")
    ratio = lambda x: x["first_work_eager"]["median"] / x["first_work_lazy"]["median"]
    rows = [["first-touch p50 ≤ 2× the far-memory floor, pages staged ahead, one CPU (the like-for-like row)",
             f"{one['staged_x_floor']:.2f}× at {mib(one['mib'])} ({sig(one['staged_touch_p50_us']['median'])} "
             f"against {sig(one['floor_p50_us']['median'])} µs)",
             yes_no(one["staged_x_floor"] <= 2, f"{one['staged_x_floor'] / 2:.2f}× over")],
            ["the same at every point (two CPUs unless said)", pts, "reported"],
            ["the same without staging (the store read on the fault's path), store in the page cache",
             f"{best['x_floor']:.2f}× at best ({mib(best['mib'])}, CPUs: {best['cpus']};"
             " points whose floor was above the touch are left out)", "reported"],
            ["time to first useful work, reported against eager",
             f"{sig(four['first_work_lazy']['median'])} ms against "
             f"{fix(four['first_work_eager']['median'], 0)} ms at 4 GiB ({ratio(four):.1f}×); cold "
             f"{sig(cold['first_work_lazy']['median'])} against {fix(cold['first_work_eager']['median'], 0)} ms "
             f"({ratio(cold):.0f}×)", "reported"]]
    return md(["goal", "measured", "met"], rows)


def farmem_pieces(r):
    f = r["fault_paths"]
    rows = [["the `SIGBUS`'s delivery and return (`SIGBUS` path minus a plain first touch)",
             f"{(f['sigbus_ns'] - f['plain_ns']) / 1000:.1f} µs"],
            ["the engine's books and lock on that fault (`inline` minus the `SIGBUS` path)",
             f"{(f['inline_ns'] - f['sigbus_ns']) / 1000:.1f} µs"]]
    return md(["piece", "cost"], rows) + "\n\nDifferences of the medians of one run."


def _reset_at(r):
    return {(x["variant"], x["placement"], x["mib"], x["k"]): x for x in r["rows"]}


def dist(d, f):
    """A `{median, p99, min, max}` record: median, p99 (min–max)."""
    return f"{f(d['median'])}, p99 {f(d['p99'])} ({f(d['min'])}–{f(d['max'])})"


def reset(r):
    at = _reset_at(r)
    rows = []
    for placement in ("spread", "one CPU"):
        for mib_ in r["config"]["sizes_mib"]:
            for k in r["config"]["ks"]:
                s, o, f = (at[(v, placement, mib_, k)] for v in ("session", "restore", "fork server"))
                p = s["phases"]
                rows.append([placement, mib(mib_), k,
                             dist(s["reset_us"], lambda v: fix(v, 0)) + " µs",
                             f"{s['resets_per_s']:.0f}",
                             dist(o["reset_us"], lambda v: fix(v, 0)) + " µs",
                             dist(f["reset_us"], lambda v: fix(v, 0)) + " µs",
                             f"{f['reset_us']['median'] / s['reset_us']['median']:.1f}",
                             " / ".join(f"{p[x]:.0f}" for x in
                                        ("stop_us", "check_us", "threads_us", "walk_us", "copy_us", "resume_us")),
                             f"{s['full_resets']}"])
    floor = "; ".join(f"{pl}: {dist(d, lambda v: fix(v, 1))} µs" for pl, d in r["round_trip"])
    return md(["placed", "state", "k", "session reset", "resets/s", "one-shot restore", "fork server",
               "x fork", "phases µs (stop / check / threads / walk / copy / resume)", "whole path"], rows) + \
        f"\n\nMedian, 99th percentile (min–max) of {r['config']['reps']} resets per point and variant; " \
        "x fork: the fork server's median over the session's. The machine's floor, a pipe round trip " \
        f"between two processes: {floor}."


def reset_walk(r):
    rows = []
    for w in r["walk"]:
        rows.append([mib(w["mib"]), w["k"],
                     dist(w["whole_range"], lambda v: fix(v, 1)) + " µs",
                     dist(w["written_only"], lambda v: fix(v, 1)) + " µs",
                     f"{fix(w['input_async']['median'], 1)} µs",
                     f"{fix(w['input_sync']['median'], 1)} µs",
                     f"+{fix(w['sync_extra_us'], 1)} µs"])
    return md(["mapping", "k", "scan, whole range", "scan, written pages only", "input, async",
               "input, sync", "sync adds"], rows) + \
        f"\n\nMedian, 99th percentile (min–max) of {r['walk'][0]['reps']} inputs; the inputs' times are medians."


def reset_walk_huge(r):
    rows = []
    us = lambda d: dist(d, lambda v: fix(v, 1)) + " µs"
    for w in r["walk"]:
        h = w.get("huge")
        if not h:
            rows.append([mib(w["mib"]), w["k"], us(w["whole_range"]),
                         "not measured: " + (w.get("huge_skipped") or "no report"), "–", "–", "–"])
            continue
        rows.append([mib(w["mib"]), w["k"], us(w["whole_range"]), us(h["hot"]),
                     mib(h["huge_left_mib"][0]), us(h["scattered"]), mib(h["huge_left_mib"][1])])
    return md(["mapping", "k", "scan, base pages", "scan, huge pages, the same pages every input",
               "still huge after", "scan, huge pages, other pages every input", "still huge after"],
              rows) + \
        f"\n\nMedian, 99th percentile (min–max) of {r['walk'][0]['reps']} inputs each; " \
        "still huge: the kernel's count (PAGEMAP_SCAN) after the inputs."


def goals_reset(r):
    at = _reset_at(r)
    rows = []
    for placement in ("spread", "one CPU"):
        ks = r["config"]["ks"]
        s64 = [at[("session", placement, 64, k)] for k in ks]
        p50 = max(x["reset_us"]["median"] for x in s64)
        p99 = max(x["reset_us"]["p99"] for x in s64)
        x = min(at[("fork server", placement, 64, k)]["reset_us"]["median"]
                / at[("session", placement, 64, k)]["reset_us"]["median"] for k in ks)
        big = at[("session", placement, 1024, 16)]
        b = big["reset_us"]["median"]
        rows += [
            [f"{placement}: 64 MiB, p50 ≤ 100 µs", f"{fix(p50, 0)} µs (worst k)",
             yes_no(p50 <= 100, f"{p50 / 100:.1f}× the goal")],
            [f"{placement}: 64 MiB, p99 ≤ 250 µs", f"{fix(p99, 0)} µs (worst k)",
             yes_no(p99 <= 250, f"{p99 / 250:.1f}× the goal")],
            [f"{placement}: 64 MiB, ≥ 15× the fork server", f"{x:.1f}× (worst k)",
             yes_no(x >= 15, f"{15 / x:.1f}× short")],
            [f"{placement}: 1 GiB, 16 pages, ≤ 300 µs", f"{fix(b, 0)} µs, of it the walk {big['phases']['walk_us']:.0f} µs",
             yes_no(b <= 300, f"{b / 300:.1f}× the goal")],
        ]
    return md(["goal", "measured", "met"], rows)


def reset_inside(r):
    at = _reset_at(r)

    def point(i):
        p = i.get("point_ms")
        return f" ({sig(p[1])} / {sig(p[0])} ms)" if p else ""
    rows = []
    for placement in ("spread", "one CPU"):
        for mib_ in r["config"]["sizes_mib"]:
            for k in r["config"]["ks"]:
                i = at.get(("inside", placement, mib_, k))
                if i is None:
                    continue
                s, f = at[("session", placement, mib_, k)], at[("fork server", placement, mib_, k)]
                rows.append([placement, mib(mib_), k,
                             dist(i["reset_us"], lambda v: fix(v, 1)) + " µs",
                             dist(i["asked_us"], lambda v: fix(v, 0)) + " µs",
                             f"{s['reset_us']['median'] / i['reset_us']['median']:.1f}",
                             f"{f['reset_us']['median'] / i['reset_us']['median']:.0f}",
                             f"{i['phases']['walk_us']:.0f} / {i['phases']['copy_us']:.0f}",
                             mib(round(i["collapsed_mib"] or 0)) + point(i),
                             fix(i["pages_checked"], 0)])
    return md(["placed", "state", "k", "reset inside", "asked (control word to pid)", "x session",
               "x fork", "walk / copy µs (means)", "huge at the point (collapse / point)",
               "pages checked"], rows) + \
        f"\n\nMedian, 99th percentile (min–max) of {r['config']['reps']} resets per point, from the " \
        "shim's histogram (0.5 µs buckets up to 256 µs, 4 µs up to 2.3 ms; each figure a bucket's upper edge); asked: as the fuzzer waits, " \
        "from the control word to the pid told; x session, x fork: their medians over this one's."


def goals_reset_inside(r):
    at = _reset_at(r)
    floors = {(f["mib"], f["k"]): f for f in r.get("floors", [])}
    rows = []

    def one(goal, placement, mib_, key, bound):
        i = at.get(("inside", placement, mib_, 16))
        if i is None:
            rows.append([goal, "not measured", "–", "–"])
            return
        x = i["reset_us"][key]
        fl = floors.get((mib_, 16))
        floor = (f"{fix(fl['reset_us'], 1)} µs (walk {fix(fl['walk_us'], 1)}, protect "
                 f"{fix(fl['protect_us'], 1)}, copy {fix(fl['copy_us'], 1)})") if fl and key == "median" else "–"
        rows.append([goal, f"{fix(x, 1)} µs ({fix(i['reset_us']['min'], 1)}–{fix(i['reset_us']['max'], 1)})",
                     floor, yes_no(x <= bound, f"{x / bound:.2f}× the goal")])

    one("one CPU: 64 MiB, 16 pages, p50 ≤ 30 µs", "one CPU", 64, "median", 30)
    one("one CPU: 64 MiB, 16 pages, p99 ≤ 60 µs", "one CPU", 64, "p99", 60)
    one("spread: 64 MiB, 16 pages, p50 ≤ 50 µs", "spread", 64, "median", 50)
    one("one CPU: 1 GiB, 16 pages, p50 ≤ 100 µs", "one CPU", 1024, "median", 100)
    return md(["goal", "reset inside (min–max)", "floor in base pages (afl_floor)", "met"], rows)


def _afl_at(r):
    """The modes by name; the reset inside the program (or, in reports
    from before it, the one reset) and the reset from outside, if run."""
    at = {m["mode"]: m for m in r["modes"]}
    return at, at.get("pagewise inside") or at["pagewise reset"], at.get("pagewise outside")


def fig_afl_execs(r):
    at, p, o = _afl_at(r)
    f, q = at["fork server"], at["persistent"]
    e = lambda m: fix(m["execs_per_sec"]["median"], 0)
    where = "resets inside the program" if o else "pagewise's resets"
    text = (f"{e(p)} executions a second through {where} at "
            f"{p['stability_pct']['median']:.0f} % stability (median of {r['config']['repeats']} runs): "
            f"{p['x_fork']:.1f}× AFL++'s own fork server ({e(f)}), {p['x_persistent']:.2f}× its persistent "
            f"mode ({e(q)}, at {q['stability_pct']['median']:.0f} % stability: the target does not reset "
            "its own state)")
    if o:
        text += f"; resets from outside, in the same run: {e(o)} ({o['x_persistent']:.2f}×)"
    return text


def fig_reset_session(r):
    at = _reset_at(r)
    s, f = at[("session", "one CPU", 64, 16)], at[("fork server", "one CPU", 64, 16)]
    t = at[("session", "spread", 64, 16)]
    return (f"{fix(s['reset_us']['median'], 0)} µs (p99 {fix(s['reset_us']['p99'], 0)} µs; "
            f"{f['reset_us']['median'] / s['reset_us']['median']:.1f}× an AFL-style fork server) with "
            f"the processes on one CPU, {fix(t['reset_us']['median'], 0)} µs where the scheduler spreads "
            "them over both")


def _spread(d, f):
    return f"{f(d['median'])} ({f(d['min'])}–{f(d['max'])})"


def afl(r):
    rows = []
    for m in r["modes"]:
        rows.append([m["mode"], _spread(m["execs_per_sec"], lambda v: fix(v, 0)),
                     f"{m['x_fork']:.2f}", f"{m['x_persistent']:.2f}",
                     _spread(m["stability_pct"], lambda v: f"{v:.1f}") + " %",
                     _spread(m["corpus_count"], lambda v: f"{v:.0f}")])
    c = r["config"]
    text = md(["mode", "executions a second", "x fork server", "x persistent", "stability", "paths"], rows)
    text += (f"\n\nAFL++ {r['afl_version']}, {c['repeats']} runs of `afl-fuzz -V {c['seconds']}` per mode, "
             "interleaved: median (lowest–highest) of afl-fuzz's own `fuzzer_stats`. "
             f"The target: {c['mib']} MiB of state written at start-up, {c['k']} pages of it read and written per input.")
    example = [x for x in r["runs"] if x.get("served") and x.get("target", "example") == "example"]
    for mode in sorted({x["mode"] for x in example}):
        served = [x["served"] for x in example if x["mode"] == mode]
        med = lambda key, sub=None: sorted((s[key][sub] if sub else s[key]) for s in served)[len(served) // 2]
        full = sum(s["full_resets"] for s in served)
        failed = sum(s.get("failed_resets", 0) for s in served)
        inside = sum(s.get("inside_resets", 0) for s in served)
        text += (f" {mode} (median over its runs): {fix(med('reset_us'), 0)} µs a reset "
                 f"(check {fix(med('reset_phases', 'check_us'), 0)}, walk {fix(med('reset_phases', 'walk_us'), 0)}, "
                 f"copy {fix(med('reset_phases', 'copy_us'), 0)} µs), then {fix(med('run_us'), 0)} µs until the "
                 f"program's exit; of {sum(s['runs'] for s in served)} runs, {inside} reset inside the program, "
                 f"{full} by the whole path, {failed} failed.")
    return text


def goals_afl(r):
    at, p, o = _afl_at(r)
    f, q = at["fork server"], at["persistent"]
    x, y = p["x_fork"], p["x_persistent"]
    st, sf = p["stability_pct"]["min"], f["stability_pct"]["min"]
    rows = [
        ["≥ 3× AFL++'s fork server (executions a second)", f"{x:.1f}×", yes_no(x >= 3, f"{3 / x:.1f}× short")],
        ["≥ ½ of persistent mode's", f"{y:.2f}× ({fix(p['execs_per_sec']['median'], 0)} against "
         f"{fix(q['execs_per_sec']['median'], 0)})", yes_no(y >= 0.5, f"{0.5 / y:.1f}× short")],
        ["stability no lower than the fork server's", f"{st:.1f} % (lowest run) against {sf:.1f} %",
         yes_no(st >= sf, f"{sf - st:.1f} points lower")],
    ]
    if o:
        fl = r.get("floor")
        floor = ""
        if fl:
            floor = (f"; this kernel's floor for it, measured in the same run: {fl['reset_floor_us']:.0f} µs an "
                     f"execution (walk, protection, faults, copy, two traps), at most "
                     f"{fl['inside_max_x_persistent']:.2f}× persistent mode")
        rows.append(["resets inside the program: ≥ 0.6× persistent mode's at 100 % stability",
                     f"{y:.2f}× at {st:.1f} % (lowest run); from outside {o['x_persistent']:.2f}×{floor}",
                     yes_no(y >= 0.6 and st >= 100, f"{0.6 / y:.1f}× short")])
    return md(["goal", "measured", "met"], rows)


def afl_parsers(r):
    rows = []
    for p in r.get("parsers", []):
        for m in p["modes"]:
            rows.append([p["name"], m["mode"], _spread(m["execs_per_sec"], lambda v: fix(v, 0)),
                         f"{m['x_fork']:.2f}", f"{m['x_persistent']:.2f}",
                         _spread(m["stability_pct"], lambda v: f"{v:.1f}") + " %",
                         _spread(m["edges_found"], lambda v: f"{v:.0f}")])
    c = r["config"]
    text = md(["parser", "mode", "executions a second", "x fork server", "x persistent", "stability",
               "edges found"], rows)
    text += (f"\n\nEach parser's own libFuzzer target from its Debian source, built with `afl-cc` the "
             f"three ways by `experiments/c/afl_libfuzzer_main.c`; {c['repeats']} runs of "
             f"`afl-fuzz -V {c['seconds']}` per mode, interleaved with the example target's.")
    return text


def goals_afl_parsers(r):
    rows = []
    for p in r.get("parsers", []):
        at = {m["mode"]: m for m in p["modes"]}
        i, f = at["pagewise inside"], at["fork server"]
        st, sf = i["stability_pct"]["min"], f["stability_pct"]["min"]
        rows += [
            [f"{p['name']}: ≥ 0.8× persistent mode's", f"{i['x_persistent']:.2f}×",
             yes_no(i["x_persistent"] >= 0.8, f"{0.8 / i['x_persistent']:.1f}× short")],
            [f"{p['name']}: ≥ 5× the fork server's", f"{i['x_fork']:.2f}×",
             yes_no(i["x_fork"] >= 5, f"{5 / i['x_fork']:.1f}× short")],
            [f"{p['name']}: stability no lower than the fork server's",
             f"{st:.1f} % (lowest run) against {sf:.1f} %", yes_no(st >= sf, f"{sf - st:.1f} points lower")],
        ]
    return md(["goal", "measured", "met"], rows)


TABLES = {
    "afl-parsers": afl_parsers,
    "goals-afl-parsers": goals_afl_parsers,
    "dedup": dedup_table,
    "dedup-advisor": dedup_advisor,
    "track-write": track_write,
    "track-collect": track_collect,
    "outside": outside,
    "thp-fair": thp_fair,
    "thp-fair-kernel": thp_fair_kernel,
    "thp-saved": thp_saved,
    "prezero": prezero,
    "redis": redis,
    "snap-dfs": snap_dfs,
    "snap-cycles": snap_cycles,
    "goals-snap-cycles": goals_snap_cycles,
    "snap-dump": snap_dump,
    "rollback-resets": rollback_resets,
    "rollback-phases": rollback_phases,
    "rollback-cycles": rollback_cycles,
    "live-checkpoint": live_checkpoint,
    "live-migration": live_migration,
    "live-compression": live_compression,
    "checkpoint": checkpoint,
    "thp-redis": thp_redis,
    "dedup-redis": dedup_redis,
    "rollback-redis": rollback_redis,
    "rollback-lazy": rollback_lazy,
    "thp-kernel": thp_kernel,
    "thp-redis-get": thp_redis_get,
    "rollback-lazy-staged": rollback_lazy_staged,
    "farmem-delay": farmem_delay,
    "farmem-fault-paths": farmem_fault_paths,
    "farmem-paths-delay": farmem_paths_delay,
    "farmem-least": farmem_least,
    "farmem-app-local": farmem_app_local,
    "farmem-app-latency": farmem_app_latency,
    "farmem-app-isolation": farmem_app_isolation,
    "farmem-app-system": farmem_app_system,
    "farmem-app-system-isolation": farmem_app_system_isolation,
    "inspect": inspect,
    "sparse": sparse,
    "node": node,
    "k8s-node": k8s_node,
    "goals-node": goals_node,
    "goals-track": goals_track,
    "goals-rollback-resets": goals_rollback_resets,
    "goals-rollback-cycles": goals_rollback_cycles,
    "goals-rollback-redis": goals_rollback_redis,
    "goals-rollback-lazy": goals_rollback_lazy,
    "farmem-pieces": farmem_pieces,
    "reset": reset,
    "reset-walk": reset_walk,
    "reset-walk-huge": reset_walk_huge,
    "goals-reset": goals_reset,
    "reset-inside": reset_inside,
    "goals-reset-inside": goals_reset_inside,
    "afl": afl,
    "goals-afl": goals_afl,
}


# ---------------------------------------------------------------- figures
# A figure quoted in the book's prose stands between `<!-- fig KIND FOLDER
# -->` and `<!-- /fig -->`, written by a function of FIGS from the report.


def fig_rollback_reset(r):
    a = next(x for x in r["resets"] if x["variant"] == "rollback" and x["mib"] == 1024
             and not x["thp"] and x["k"] == 16)
    b = next(x for x in r["resets"] if x["variant"] == "fork server" and x["mib"] == 1024
             and not x["thp"] and x["k"] == 16)
    return (f"{mmm(a['reset'], sig)} ms for 16 pages of 1 GiB (median, min–max of "
            f"{a['reps']}), {b['reset']['median'] / a['reset']['median']:.1f}× an AFL-style fork server")


def fig_rollback_redis(r):
    at = {x["method"]: x for x in r["redis"]}
    a = at["rollback"]
    return (f"{mmm(a['reset'], sig)} ms (median, min–max of {a['reps']}): "
            f"{at['DEBUG RELOAD']['x_rollback']:.0f}× `DEBUG RELOAD`, "
            f"{at['restart']['x_rollback']:.0f}× a restart")


def fig_rollback_lazy(r):
    four = next(x for x in r["lazy"] if x["store"] == "page cache" and x["mib"] == 4096 and x["cpus"] == "all")
    one = next(x for x in r["lazy"] if x["store"] == "page cache" and x["mib"] == 4096 and x["cpus"] == "one")
    return (f"done {mmm(four['first_work_lazy'], sig)} ms after the start, against "
            f"{mmm(four['first_work_eager'], lambda v: fix(v, 0))} ms for an eager restore (median, "
            f"min–max of {four['reps']}). With the program and the server on one CPU, a first touch of "
            f"a page staged ahead costs {mmm(one['staged_touch_p50_us'], sig)} µs, "
            f"{one['staged_x_floor']:.1f}× far memory's own floor (which copies no data); with the store "
            f"read on the fault's path, {mmm(one['touch_p50_us'], sig)} µs ({one['x_floor']:.1f}×)")


def fig_farmem_floor(r):
    at = {(x["path"], x["load"]): x["delay"][0] for x in r["runs"]}
    c = lambda d: f"{d['measured_ns'] / 1000:.2f} µs ({d['spread_ns'][0] / 1000:.2f}–{d['spread_ns'][1] / 1000:.2f})"
    return (f"inline {c(at[('inline', 'idle')])} with the other vCPU idle and "
            f"{c(at[('inline', 'busy')])} with it busy, against {c(at[('thread', 'idle')])} and "
            f"{c(at[('thread', 'busy')])} on the handler thread (median, min–max of "
            f"{r['config']['repeats']} repeats)")


def fig_thp_coverage_cost(r):
    c = r["coverage"]
    return (f"{100 * c['slowdown']:.1f} % (one run: {c['round_ms_alone']:.1f} ms a round alone, "
            f"{c['round_ms_measured']:.1f} ms measured)")


FIGS = {
    "reset-session": fig_reset_session,
    "afl-execs": fig_afl_execs,
    "rollback-reset": fig_rollback_reset,
    "rollback-redis": fig_rollback_redis,
    "rollback-lazy": fig_rollback_lazy,
    "farmem-floor": fig_farmem_floor,
    "thp-coverage-cost": fig_thp_coverage_cost,
}
