#!/usr/bin/env python3
"""bench/report.py: the tables of issue 10 from the JSON lines of bench/core (ckpt-bench-core,
and ckpt-bench-mpi's table gpt2s-4p: 4 processes under mpirun) and bench/peers.

  bench/report.py RESULTS.jsonl [--markdown]

Figures are medians over the rounds, [min-max] beside; "x raw" ratios are speed ratios
(raw seconds / method seconds, higher is better). CPU is user + sys seconds of the process
(every thread; for the MPI rows summed over the processes, and their peak RSS summed too), the
steadier figure on a shared machine. Then every target, met or by how much
it misses.
"""
import json
import statistics
import sys
from collections import defaultdict


def load(path):
    phases, meta = defaultdict(list), defaultdict(set)
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        if "table" in r:
            phases[(r["table"], r["method"], r["op"])].append(r)
        for k in ("machine", "disk", "memory", "cold", "versions", "commit"):
            if r.get(k):
                meta[k].add(r[k])
    return phases, meta


class Stats:
    def __init__(self, rs):
        self.n = len(rs)
        self.method = rs[0]["method"]
        self.wall = sorted(r["wall"] for r in rs)
        self.med = statistics.median(self.wall)
        self.cpu = statistics.median(r["cpu"] for r in rs)
        self.load = statistics.median(r["load"] for r in rs)
        self.rss = max((r["rss_mib"] for r in rs if r.get("rss_mib", -1) >= 0), default=float("nan"))
        self.bytes = rs[0]["bytes"]

    def s(self):
        return f"{self.med:.2f} [{self.wall[0]:.2f}–{self.wall[-1]:.2f}]"


def main():
    phases, meta = load(sys.argv[1])
    st = {k: Stats(v) for k, v in phases.items()}
    get = lambda t, m, op: st.get((t, m, op))  # noqa: E731
    out = []
    p = out.append
    p(f"commit: {', '.join(sorted(meta['commit'])) or '?'}")
    for k in ("machine", "disk", "memory", "versions", "cold"):
        for v in sorted(meta[k]):
            p(f"{k}: {v}")
    loads = [r["load"] for v in phases.values() for r in v]
    if loads:
        p(f"load average (1 min) at the start of the phases: median {statistics.median(loads):.2f} "
          f"[{min(loads):.2f}–{max(loads):.2f}]")
    host = [r["host_mib"] for v in phases.values() for r in v if r.get("host_mib", -1) >= 0]
    if host:
        p(f"memory the host took back from the cache drop to the end of each phase: median "
          f"{statistics.median(host):.0f} MiB [{min(host):.0f}–{max(host):.0f}] (JSON: host_mib per phase)")
    p("")

    def ratio(base, x):
        return base.med / x.med if base and x else None

    def fmt(x, d=2, suffix="×"):
        return "n/a" if x is None else f"{x:.{d}f}{suffix}"

    def cpu_gb(x):
        return x.cpu / (x.bytes / 1e9) if x else None

    def table(title, t, methods, save_base, load_base, load_name):
        p(f"| {title} | n | save s | × best raw | cold load s | × {load_name} | CPU s save / load | "
          f"peak RSS MiB save / load (peers: of the process so far) | load avg |")
        p("|---|---|---|---|---|---|---|---|---|")
        for m in methods:
            s, l = get(t, m, "save"), get(t, m, "load")
            if not s and not l:
                continue
            bold = "**" if m.startswith("ckpt") else ""
            p(f"| {bold}{m}{bold} | {(s or l).n} | {s.s() if s else '—'} | {fmt(ratio(save_base, s))} | "
              f"{l.s() if l else '—'} | {fmt(ratio(load_base, l))} | {s.cpu if s else float('nan'):.2f} / "
              f"{l.cpu if l else float('nan'):.2f} | {s.rss if s else 0:.0f} / {l.rss if l else 0:.0f} | "
              f"{(s or l).load:.1f} |")
        p("")

    best = get("gpt2s", "raw-c-wb", "save")
    # The best raw load: raw-c's one read(2) at a time, raw-c-2r's two preads in flight, or
    # the O_DIRECT read, whichever was fastest.
    raw_d = get("gpt2s", "raw O_DIRECT, 4 streams", "load")
    raw_loads = [x for x in (get("gpt2s", "raw-c", "load"), get("gpt2s", "raw-c-2r", "load"), raw_d) if x]
    rawc = min(raw_loads, key=lambda x: x.med) if raw_loads else None
    rawc_name = "best raw load" if len(raw_loads) > 1 else "raw-c load"
    table("gpt2s, 1 process", "gpt2s",
          ["raw-c", "raw-c-wb", "raw-c-2r", "raw O_DIRECT, 4 streams", "h5c", "safetensors", "torch.save", "DCP",
           "ckpt", "ckpt 1 -> 3 ranks", "ckpt, direct_io auto"],
          best, rawc, rawc_name)
    best4, raw4 = get("gpt2s-4", "raw-c-wb, 4 files", "save"), get("gpt2s-4", "raw-c-wb, 4 files", "load")
    table("gpt2s, 4 ranks", "gpt2s-4",
          ["raw-c-wb, 4 files", "torch.save, 4 files", "DCP, 4 ranks (gloo)", "ckpt, 4 threads", "ckpt 4 -> 1 rank",
           "raw 4 files -> 3 readers by columns", "ckpt 4 -> 3 ranks by columns"],
          best4, raw4, "raw 4 files load")
    bestp, rawp = get("gpt2s-4p", "raw-c-wb, 4 processes", "save"), get("gpt2s-4p", "raw-c-wb, 4 processes", "load")
    ckp_s, ckp_l = get("gpt2s-4p", "ckpt, 4 processes", "save"), get("gpt2s-4p", "ckpt, 4 processes", "load")
    if bestp or ckp_s or ckp_l:
        table("gpt2s, 4 processes (MPI)", "gpt2s-4p", ["raw-c-wb, 4 processes", "ckpt, 4 processes"], bestp, rawp,
              "raw 4 processes load")
    traw = get("tmpfs", "raw-c", "save")
    if traw:
        p("| tmpfs (no disk: the CPU path) | n | save s | × raw | CPU s |")
        p("|---|---|---|---|---|")
        for m in ("raw-c", "ckpt", "ckpt, 4 threads"):
            x = get("tmpfs", m, "save")
            if x:
                p(f"| {m} | {x.n} | {x.s()} | {fmt(ratio(traw, x))} | {x.cpu:.2f} |")
        p("")
    ms_raw, ms_h5 = get("many-small", "raw-c-wb", "save"), get("many-small", "h5c", "save")
    p("| many-small: 20,000 tensors, 189 MB | n | save s | × HDF5 C floor (time) | CPU s save | peak RSS MiB | load s | CPU s load |")
    p("|---|---|---|---|---|---|---|---|")
    for m in ("raw-c-wb", "h5c", "torch.save", "safetensors", "ckpt", "ckpt, 4 threads", "DCP"):
        s, l = get("many-small", m, "save"), get("many-small", m, "load")
        if not s:
            continue
        ra = s.med / ms_h5.med if ms_h5 else None
        p(f"| {m} | {s.n} | {s.s()} | {fmt(ra)} | {s.cpu:.2f} | {max(s.rss, l.rss if l else 0):.0f} | "
          f"{l.s() if l else '—'} | {l.cpu if l else float('nan'):.2f} |")
    p("")
    cp = get("merge", "cp -r + fsync", "merge")
    if cp:
        p("| merge 4 shards → 1 file, cold, to fsync | n | s | × cp | peak RSS MiB | CPU s |")
        p("|---|---|---|---|---|---|")
        for m in ("copy_file_range of the data", "cp -r + fsync", "ckpt-merge", "DCP dcp_to_torch_save"):
            x = get("merge", m, "merge")
            if x:
                p(f"| {m} | {x.n} | {x.s()} | {fmt(ratio(cp, x))} | {x.rss:.0f} | {x.cpu:.2f} |")
        p("")

    p("Targets (medians of this run):")

    def target(name, value, goal, higher=True, unit="×"):
        if value is None:
            p(f"- {name}: not measured")
            return
        ok = value >= goal if higher else value <= goal
        miss = "" if ok else f" — misses by {abs(value / goal - 1) * 100:.0f}%"
        p(f"- {name}: {value:.2f}{unit} (goal {'≥' if higher else '≤'} {goal}{unit}): {'MET' if ok else 'missed'}{miss}")

    target("save 1 rank vs best raw (raw-c-wb)", ratio(best, get("gpt2s", "ckpt", "save")), 0.95)
    target("save 4 ranks as threads vs raw 4 files with write-back", ratio(best4, get("gpt2s-4", "ckpt, 4 threads", "save")), 0.95)
    if bestp or ckp_s:
        target("save 4 processes (MPI) vs raw 4 processes with write-back", ratio(bestp, ckp_s), 0.95)
    else:
        p("- save 4 processes (MPI): not measured (no ckpt-bench-mpi rows: built without MPI, no mpirun, "
          "or CKPT_BENCH_MPI=0)")
    raw_cols = get("gpt2s-4", "raw 4 files -> 3 readers by columns", "load")
    for m, t, base, name in (("ckpt", "gpt2s", rawc, rawc_name), ("ckpt 1 -> 3 ranks", "gpt2s", rawc, rawc_name),
                             ("ckpt, 4 threads", "gpt2s-4", raw4, "raw 4 files load"),
                             ("ckpt 4 -> 1 rank", "gpt2s-4", rawc, rawc_name),
                             ("ckpt 4 -> 3 ranks by columns", "gpt2s-4", raw_cols, "raw by columns")):
        target(f"cold load {m} vs {name}", ratio(base, get(t, m, "load")), 0.95)
    if rawp or ckp_l:
        target("cold load ckpt, 4 processes (MPI) vs raw 4 processes load", ratio(rawp, ckp_l), 0.95)
    ck_s, ck_l = get("gpt2s", "ckpt", "save"), get("gpt2s", "ckpt", "load")
    target("CPU per GB of save vs raw-c-wb", cpu_gb(ck_s) / cpu_gb(best) if ck_s and best else None, 1.3, higher=False)
    target(f"CPU per GB of load vs {rawc_name}", cpu_gb(ck_l) / cpu_gb(rawc) if ck_l and rawc else None, 1.3, higher=False)
    # Where the fastest raw load was the O_DIRECT one, the line above sets ckpt's buffered
    # load (the default) against a read that allocates and copies no page cache; the same
    # load against the faster buffered raw read says what the buffered path itself costs.
    buffered = [x for x in raw_loads if x is not raw_d]
    if raw_d and rawc is raw_d and buffered and ck_l:
        fastest = min(buffered, key=lambda x: x.med)
        target(f"CPU per GB of load vs the best buffered raw load ({fastest.method})",
               cpu_gb(ck_l) / cpu_gb(fastest), 1.3, higher=False)
    # The same with LoadOptions::direct_io (off by default): against the best raw load, and
    # against raw's own O_DIRECT read.
    ck_d = get("gpt2s", "ckpt, direct_io auto", "load")
    if ck_d:
        target(f"cold load ckpt, direct_io auto, vs {rawc_name}", ratio(rawc, ck_d), 0.95)
        target(f"CPU per GB of load, direct_io auto, vs {rawc_name}", cpu_gb(ck_d) / cpu_gb(rawc) if rawc else None,
               1.3, higher=False)
        target("CPU per GB of load, direct_io auto, vs raw O_DIRECT", cpu_gb(ck_d) / cpu_gb(raw_d) if raw_d else None,
               1.3, higher=False)
    if bestp and ckp_s:
        target("CPU per GB of save, 4 processes (MPI), vs raw 4 processes", cpu_gb(ckp_s) / cpu_gb(bestp), 1.3,
               higher=False)
    target("tmpfs save vs raw write into tmpfs", ratio(traw, get("tmpfs", "ckpt", "save")), 0.8)
    target("tmpfs save, 4 threads, vs raw write into tmpfs", ratio(traw, get("tmpfs", "ckpt, 4 threads", "save")), 0.8)
    torch_ms = get("many-small", "torch.save", "save")
    for m in ("ckpt", "ckpt, 4 threads"):
        x = get("many-small", m, "save")
        target(f"many-small save {m} vs HDF5 C floor (time ratio)", x.med / ms_h5.med if x and ms_h5 else None, 1.2,
               higher=False)
        target(f"many-small save {m} vs torch.save (speed ratio)", ratio(torch_ms, x), 1.0)
    target("merge vs cp -r + fsync", ratio(cp, get("merge", "ckpt-merge", "merge")), 0.9)
    rss = [x.rss for (t, m, op), x in st.items() if t == "merge" and m == "ckpt-merge"]
    target("ckpt-merge peak RSS", max(rss) if rss else None, 300, higher=False, unit=" MiB")
    print("\n".join(out))


if __name__ == "__main__":
    main()
