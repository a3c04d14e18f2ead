#!/usr/bin/env python3
"""bench/python/save_load.py: save and load from Python on one state, one process (issue 12).

    python bench/python/save_load.py --dir SCRATCH [--bin BUILD | --resave BINARY] [--workload gpt2s] [--repeat 3]
                                     [--warm] [--quick] [--json FILE] [--rows ckpt]

bench/python/run.sh builds what it needs and runs it. Rows, each the best of --repeat runs,
every save into a fresh directory and timed to fsync of its files and directory:
  ckpt.save / ckpt.load               the Python package (ckpt.load into the state's own tensors)
  C++ ckpt::Save / Load               the same bytes through the C++ API (ckpt-bench-resave of
                                      BUILD reads ckpt.save's checkpoint into memory, then times
                                      Save and Load in its own process)
  torch.save / torch.load             one file
  safetensors                         safetensors.torch.save_file / load_file, one file
  dcp.save + FileSystemWriter         DCP's own storage layer (no_dist)
  dcp.save + ckpt StorageWriter       DCP through ckpt.torch.StorageWriter / StorageReader
Each timed phase starts from a dropped page cache when the process may drop it (root;
--warm: never). Workloads come from bench/peers/peers.py: gpt2s (GPT-2 small + Adam state,
592 tensors, 1.49 GB float32) or many-small (20,000 tensors, ~190 MB); --quick is a 4 MiB
smoke run (CTest's python_bench_smoke). Prints the machine, then one line per phase with
wall and CPU seconds and the ratio to the C++ API's row.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
import peers  # noqa: E402  (the workloads and the measuring helpers of bench/peers)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import ckpt  # noqa: E402
import ckpt.torch  # noqa: E402


def machine():
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": mem, "kernel": platform.release(),
            "python": platform.python_version(), "torch": torch.__version__, "ckpt": ckpt.__version__,
            "load_average": os.getloadavg()[0]}


def state_of(workload, quick):
    if quick:
        rng = np.random.default_rng(1)
        arrays = {f"layers.{i}.weight": rng.standard_normal(2**16, dtype=np.float32) for i in range(16)}
    else:
        arrays = peers.make_arrays(workload)
    return {k: torch.from_numpy(v) for k, v in arrays.items()}


class Bench:
    def __init__(self, args):
        self.a = args
        self.rows = []
        self.warm = args.warm or args.quick

    def fresh(self, name, i):
        path = os.path.join(self.a.dir, f"{name}-{i}")
        shutil.rmtree(path, ignore_errors=True)
        if os.path.isfile(path):
            os.remove(path)
        return path

    def time(self, method, op, nbytes, body):
        """Best of --repeat runs of body(i); returns the last run's result."""
        best, result = None, None
        for i in range(self.a.repeat):
            if not self.warm:
                peers.drop_caches()
            load = os.getloadavg()[0]
            c0, t0 = peers.cpu_self(), time.perf_counter()
            result = body(i)
            wall, cpu = time.perf_counter() - t0, peers.cpu_self() - c0
            if best is None or wall < best["wall"]:
                best = {"method": method, "op": op, "wall": wall, "cpu": cpu, "load": load, "bytes": nbytes}
        self.rows.append(best)
        return result

    def external(self, rows):
        self.rows += rows


def check_same(got, want, what):
    for k, v in want.items():
        if not torch.equal(got[k], v):
            raise SystemExit(f"{what}: tensor '{k}' differs from what was saved")


def run(a):
    os.makedirs(a.dir, exist_ok=True)
    state = state_of(a.workload, a.quick)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    b = Bench(a)
    print("machine:", json.dumps(machine()))
    print(f"workload: {'quick (4 MiB)' if a.quick else a.workload}, {len(state)} tensors, {nbytes / 1e9:.3f} GB; "
          f"best of {a.repeat}; page cache {'warm' if b.warm else 'dropped before each phase (when root)'}",
          flush=True)

    def ckpt_save(i):
        path = b.fresh("ckpt", i)
        ckpt.save(path, state)
        return path
    b.time("ckpt.save / ckpt.load", "save", nbytes, ckpt_save)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    b.time("ckpt.save / ckpt.load", "load", nbytes, lambda i: ckpt.load(os.path.join(a.dir, "ckpt-0"), target))
    check_same(target, state, "ckpt.load")

    resave = a.resave or os.path.join(a.bin, "bench", "python", "ckpt-bench-resave")
    if not os.path.exists(resave):
        raise SystemExit(f"no {resave}: build the ckpt-bench-resave target (bench/python/run.sh does)")
    cmd = [resave, os.path.join(a.dir, "ckpt-0"), a.dir, "--repeat", str(a.repeat)] + (["--warm"] if b.warm else [])
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    b.external([dict(json.loads(line), load=load) for line in out.splitlines() if line.strip()])

    if "peers" not in a.rows:
        return report(a, b)

    def torch_save(i):
        path = b.fresh("model.pt", i)
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        peers.fsync_tree(a.dir)
    b.time("torch.save / torch.load", "save", nbytes, torch_save)
    out = b.time("torch.save / torch.load", "load", nbytes,
                 lambda i: torch.load(os.path.join(a.dir, "model.pt-0"), weights_only=True))
    check_same(out, state, "torch.load")

    from safetensors.torch import load_file, save_file

    def st_save(i):
        path = b.fresh("model.safetensors", i)
        save_file(state, path)
        peers.fsync_tree(path)
    b.time("safetensors", "save", nbytes, st_save)
    out = b.time("safetensors", "load", nbytes, lambda i: load_file(os.path.join(a.dir, "model.safetensors-0")))
    check_same(out, state, "safetensors load")

    def dcp_fs(i):
        path = b.fresh("dcp-fs", i)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
        peers.fsync_tree(path)
    b.time("dcp.save + FileSystemWriter", "save", nbytes, dcp_fs)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    b.time("dcp.save + FileSystemWriter", "load", nbytes,
           lambda i: dcp.load(target, storage_reader=dcp.FileSystemReader(os.path.join(a.dir, "dcp-fs-0")), no_dist=True))
    check_same(target, state, "dcp.load (FileSystemReader)")

    def dcp_ckpt(i):
        dcp.save(state, storage_writer=ckpt.torch.StorageWriter(b.fresh("dcp-ckpt", i), single_process=True),
                 no_dist=True)
    b.time("dcp.save + ckpt StorageWriter", "save", nbytes, dcp_ckpt)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    b.time("dcp.save + ckpt StorageWriter", "load", nbytes,
           lambda i: dcp.load(target, storage_reader=ckpt.torch.StorageReader(os.path.join(a.dir, "dcp-ckpt-0")),
                              no_dist=True))
    check_same(target, state, "dcp.load (ckpt StorageReader)")

    report(a, b)


def report(a, b):
    ref = {r["op"]: r["wall"] for r in b.rows if r["method"].startswith("C++")}
    print(f"{'method':<32} {'op':<5} {'wall s':>8} {'cpu s':>8} {'GB/s':>7} {'vs C++':>7} {'load':>5}")
    for r in b.rows:
        vs = f"{r['wall'] / ref[r['op']]:.3f}" if r["op"] in ref else "-"
        print(f"{r['method']:<32} {r['op']:<5} {r['wall']:8.3f} {r['cpu']:8.3f} {r['bytes'] / r['wall'] / 1e9:7.2f} "
              f"{vs:>7} {r['load']:5.2f}")
    if a.json:
        with open(a.json, "a") as f:
            for r in b.rows:
                f.write(json.dumps(dict(r, source="python", workload="quick" if a.quick else a.workload)) + "\n")
    for name in os.listdir(a.dir):
        if name.split("-")[0] in ("ckpt", "model.pt", "model.safetensors", "dcp"):
            p = os.path.join(a.dir, name)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="scratch directory")
    p.add_argument("--bin", default=".", help="build directory (for bench/python/ckpt-bench-resave)")
    p.add_argument("--resave", help="the ckpt-bench-resave binary (default: under --bin)")
    p.add_argument("--workload", default="gpt2s", choices=["gpt2s", "many-small"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warm", action="store_true", help="never drop the page cache")
    p.add_argument("--quick", action="store_true", help="a 4 MiB smoke run, warm, for CTest")
    p.add_argument("--json", help="append one JSON line per row")
    p.add_argument("--rows", default="ckpt,peers", choices=["ckpt,peers", "ckpt"],
                   help="ckpt: only ckpt.save/load and the C++ API (e.g. many-small, where DCP takes minutes)")
    run(p.parse_args())


if __name__ == "__main__":
    main()
