#!/usr/bin/python3
"""The tools benchmark: on the gpt2s workload (~1.5 GB, 4 shard files) measures
merge against `cp` of the same bytes, verify against a raw read, diff throughput,
inspect on a 100,000-key checkpoint, and every tool's peak RSS (default --max-memory).

  bench/tools/bench.py --bin BUILD/tools --gen BUILD/bench/tools/ckpt-bench-tools-gen --dir SCRATCH

With --chunks it measures instead ckpt-verify's cost per chunk: --quick (every shard index
and dataset header checked, no data read) and full, on checkpoints of 16k, 65k and 262k
tiny chunks (16 bytes) and of 16k chunks over 64 KiB (too big to be packed), printing CPU
seconds (user + system, of the child) per chunk and peak RSS. Figures from a loaded
machine: compare CPU seconds within one run.

Page cache: the data set fits in memory, so every figure is a warm-cache figure (both
sides of each comparison read from the page cache) except the two cold-cache rows: raw
read and verify again, the page cache dropped (sync; echo 3 > /proc/sys/vm/drop_caches)
before each run of either side; they are skipped, with a note, where that file is not
writable (not root). Writes end with fsync (ckpt's commit) against `cp` followed by `sync`.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time


def measure(cmd, **kw):
    """Runs cmd; returns (seconds, peak RSS in MiB of the child, returncode, CPU seconds of the child)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0 and not kw.get("allow_fail"):
        print(f"command failed ({rc}): {' '.join(cmd)}\n{err}", file=sys.stderr)
    return dt, ru.ru_maxrss / 1024.0, rc, ru.ru_utime + ru.ru_stime


def drop_caches():
    """Empties the page cache; returns None, or why it cannot."""
    path = "/proc/sys/vm/drop_caches"
    if not os.access(path, os.W_OK):
        return f"{path} is not writable"
    os.sync()
    try:
        with open(path, "w") as f:
            f.write("3\n")
    except OSError as e:
        return f"{path}: {e.strerror}"
    return None


def cold(fn):
    """Runs fn from a cold page cache."""
    why = drop_caches()
    if why:
        raise OSError(why)
    return fn()


def best(n, fn):
    runs = [fn() for _ in range(n)]
    return min(runs, key=lambda r: r[0])


def chunks_bench(a, tool):
    """ckpt-verify's CPU time per chunk and peak RSS as the number of chunks grows."""
    cases = [(16384, 16), (65536, 16), (262144, 16), (16384, 68 << 10)]
    rows = []
    for n, chunk_bytes in cases:
        d = os.path.join(a.dir, "chunks", f"c{n}-b{chunk_bytes}")
        if not os.path.exists(os.path.join(d, "metadata.json")):
            print(f"generating {n:,} chunks of {chunk_bytes:,} bytes ...", flush=True)
            subprocess.run([a.gen, "chunks", d, "--chunks", str(n), "--chunk-bytes", str(chunk_bytes)], check=True)
        files = glob.glob(os.path.join(d, "*.h5"))
        subprocess.run(["cat"] + files, stdout=subprocess.DEVNULL, check=True)  # warm page cache
        chunks = max(1, n // 1000) * 1000  # the generator's 1,000 keys of n // 1000 rows
        for mode, extra in (("--quick", ["--quick"]), ("full", [])):
            runs = [measure([tool("ckpt-verify"), d, "-q"] + extra) for _ in range(a.repeat)]
            if any(r[2] != 0 for r in runs):
                raise SystemExit(f"ckpt-verify failed on {d}")
            cpu = min(r[3] for r in runs)
            rss = max(r[1] for r in runs)
            rows.append((chunks, chunk_bytes, mode, cpu, cpu / chunks * 1e6, rss))
    print(f"\nckpt-verify per chunk (16 files, 1,000 keys; warm page cache; load average {os.getloadavg()[0]:.1f})\n")
    print(f"{'chunks':>9}{'bytes/chunk':>13}{'mode':>9}{'CPU s':>9}{'CPU us/chunk':>14}{'peak RSS MiB':>14}")
    for chunks, b, mode, cpu, per, rss in rows:
        print(f"{chunks:>9,}{b:>13,}{mode:>9}{cpu:>9.2f}{per:>14.1f}{rss:>14.0f}")
    with open(os.path.join(a.dir, "chunks", "results.json"), "w") as f:
        json.dump([dict(zip(("chunks", "chunk_bytes", "mode", "cpu_s", "cpu_us_per_chunk", "peak_rss_mib"), r))
                   for r in rows], f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keys", type=int, default=10000,
                    help="keys of the many-key checkpoint (100000 once the core metadata parser is linear)")
    ap.add_argument("--chunks", action="store_true", help="only ckpt-verify's CPU time per chunk (see above)")
    a = ap.parse_args()
    tool = lambda name: os.path.join(a.bin, name)
    if a.chunks:
        return chunks_bench(a, tool)
    d = os.path.join(a.dir, "tools")
    os.makedirs(d, exist_ok=True)
    src = os.path.join(d, "gpt2s-4")
    many = os.path.join(d, f"many-{a.keys}")
    if not os.path.exists(os.path.join(src, "metadata.json")):
        print("generating gpt2s over 4 shards ...", flush=True)
        subprocess.run([a.gen, "gpt2s", src, "--world", "4"], check=True)
    if not os.path.exists(os.path.join(many, "metadata.json")):
        print(f"generating a {a.keys:,}-key checkpoint ...", flush=True)
        subprocess.run([a.gen, "many", many, "--keys", str(a.keys)], check=True)
    shards = sorted(glob.glob(os.path.join(src, "*.h5")))
    nbytes = sum(os.path.getsize(f) for f in shards)
    gib = nbytes / 2 ** 30
    # Warm the page cache so both sides of every comparison read from memory.
    subprocess.run(["cat"] + shards, stdout=subprocess.DEVNULL, check=True)

    res = {"bytes": nbytes, "files": len(shards)}
    out_cp = os.path.join(d, "cp-copy")
    out_merge = os.path.join(d, "merged")

    def run_cp():
        shutil.rmtree(out_cp, ignore_errors=True)
        return measure(["sh", "-c", f"cp -r '{src}' '{out_cp}' && sync"])

    def run_merge():
        shutil.rmtree(out_merge, ignore_errors=True)
        return measure([tool("ckpt-merge"), src, out_merge, "-q"])

    res["raw_read"] = best(a.repeat, lambda: measure(["cat"] + shards))
    res["verify"] = best(a.repeat, lambda: measure([tool("ckpt-verify"), src, "-q"]))
    res["verify_quick"] = best(a.repeat, lambda: measure([tool("ckpt-verify"), src, "--quick", "-q"]))
    res["cp"] = best(a.repeat, run_cp)
    res["merge"] = best(a.repeat, run_merge)
    res["diff"] = best(a.repeat, lambda: measure([tool("ckpt-diff"), src, out_merge, "-q"]))
    res["inspect_100k"] = best(a.repeat, lambda: measure([tool("ckpt-inspect"), many, "-q"]))
    res["inspect_stats"] = best(a.repeat, lambda: measure([tool("ckpt-inspect"), src, "--stats", "-q"]))
    st = os.path.join(d, "merged.safetensors")

    def run_convert():
        if os.path.exists(st):
            os.remove(st)
        return measure([tool("ckpt-convert"), src, st, "-q"])

    res["convert"] = best(a.repeat, run_convert)
    shutil.rmtree(out_cp, ignore_errors=True)

    # Cold page cache: each run of either side starts from an empty cache.
    cold_note = None
    try:
        runs = {"raw_read_cold": [], "verify_cold": []}
        for _ in range(a.repeat):  # alternating, so both sides see the same disk
            runs["raw_read_cold"].append(cold(lambda: measure(["cat"] + shards)))
            runs["verify_cold"].append(cold(lambda: measure([tool("ckpt-verify"), src, "-q"])))
        for k, v in runs.items():
            res[k] = min(v, key=lambda r: r[0])
    except OSError as e:
        cold_note = str(e)
    subprocess.run(["cat"] + shards, stdout=subprocess.DEVNULL, check=True)  # warm again

    def rate(k):
        return gib / res[k][0]

    print(f"\nckpt tools on gpt2s: {nbytes:,} bytes in {len(shards)} shard files (warm page cache unless said)\n")
    print(f"{'operation':<34}{'time s':>8}{'GiB/s':>8}{'peak RSS MiB':>14}")
    rows = [("raw read (cat shards)", "raw_read", True), ("ckpt-verify (all checksums)", "verify", True),
            ("ckpt-verify --quick", "verify_quick", False), ("cp -r + sync", "cp", True),
            ("ckpt-merge -> FULL, 1 file", "merge", True), ("ckpt-diff sharded vs merged", "diff", True),
            ("ckpt-convert -> .safetensors", "convert", True), ("ckpt-inspect --stats", "inspect_stats", False),
            (f"ckpt-inspect ({a.keys:,} keys)", "inspect_100k", False)]
    if cold_note is None:
        rows[2:2] = [("raw read, cold page cache", "raw_read_cold", True),
                     ("ckpt-verify, cold page cache", "verify_cold", True)]
    for label, k, thr in rows:
        t, rss = res[k][0], res[k][1]
        print(f"{label:<34}{t:>8.2f}{(f'{rate(k):.2f}' if thr else '-'):>8}{rss:>14.0f}")
    print(f"\nmerge / cp throughput:        {res['cp'][0] / res['merge'][0]:.2f}x  (target >= 0.8)")
    print(f"verify / raw read throughput: {res['raw_read'][0] / res['verify'][0]:.2f}x  (target >= 0.8)")
    if cold_note is None:
        print(f"  the same, cold page cache:  {res['raw_read_cold'][0] / res['verify_cold'][0]:.2f}x  (target >= 0.8)")
    else:
        print(f"  cold page cache: skipped ({cold_note})")
    peak = max(res[k][1] for k in ("verify", "merge", "diff", "convert", "inspect_stats", "inspect_100k")
               + (("verify_cold",) if cold_note is None else ()))
    print(f"largest tool peak RSS:        {peak:.0f} MiB  (target < 300 MiB)")
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump({k: (list(v) if isinstance(v, tuple) else v) for k, v in res.items()}, f, indent=2)


if __name__ == "__main__":
    main()
