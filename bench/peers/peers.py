#!/usr/bin/env python3
"""bench/peers/peers.py: one round of ckpt's peers on bench/core's workloads (issue 10).

  peers.py --dir SCRATCH --json FILE [--round I] [--bin BUILD] [--only torch,safetensors,dcp,merge]

Runs in the venv bench/run.sh makes (numpy, safetensors, h5py, torch from PyPI). Each timed
phase starts from an empty page cache (sync; echo 3 > /proc/sys/vm/drop_caches; 1 s pause)
and records wall seconds, CPU seconds of the process (every thread; for DCP's 4 ranks the
sum over the rank processes), the 1-minute load average at its start and peak RSS. Saves are
timed to fsync of every file and the directory; loads are cold and build new tensors (these
libraries have no load into existing buffers, except DCP, which loads in place).

Workloads (same shapes and sizes as bench/core; values are random float32, not the same bits):
  gpt2s        GPT-2 small + Adam state, 592 tensors, 1.49 GB
  gpt2s-4      the same, dim-0 shards of 4 ranks (torch.save: 4 threads, 4 files; DCP: 4
               processes over gloo)
  many-small   20,000 1-D float32 tensors, 16..16384 elements, log-uniform (~190 MB); DCP
               runs it in round 0 only (minutes per round on a loaded 2-core machine)
  merge        4 shards -> 1 file: copy_file_range of the data, cp -r + fsync, ckpt-merge
               (on a 4-rank ckpt checkpoint made by ckpt-bench-tools-gen), DCP's
               dcp_to_torch_save (on the DCP 4-rank checkpoint)
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")  # DCP's "assuming the intent is to save in a single process"


# ---------------------------------------------------------------------------- workloads

def gpt2s_params(d=768, vocab=50257, ctx=1024, layers=12):
    p = [("transformer.wte.weight", (vocab, d)), ("transformer.wpe.weight", (ctx, d))]
    for i in range(layers):
        h = f"transformer.h.{i}."
        p += [(h + "ln_1.weight", (d,)), (h + "ln_1.bias", (d,)),
              (h + "attn.c_attn.weight", (d, 3 * d)), (h + "attn.c_attn.bias", (3 * d,)),
              (h + "attn.c_proj.weight", (d, d)), (h + "attn.c_proj.bias", (d,)),
              (h + "ln_2.weight", (d,)), (h + "ln_2.bias", (d,)),
              (h + "mlp.c_fc.weight", (d, 4 * d)), (h + "mlp.c_fc.bias", (4 * d,)),
              (h + "mlp.c_proj.weight", (4 * d, d)), (h + "mlp.c_proj.bias", (d,))]
    return p + [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]


def spec(workload):
    """[(name, shape, dtype)] in save order."""
    if workload == "gpt2s":
        params = gpt2s_params()
        out = [(n, s, np.float32) for n, s in params]
        for n, s in params:
            st = f"optimizer.state.{n}."
            out += [(st + "step", (), np.int64), (st + "exp_avg", s, np.float32), (st + "exp_avg_sq", s, np.float32)]
        return out
    if workload == "many-small":
        rng = np.random.default_rng(0x5eed)
        sizes = np.rint(np.exp(rng.uniform(np.log(16), np.log(16384), 20000))).astype(np.int64)
        return [(f"small.{i:05d}", (int(n),), np.float32) for i, n in enumerate(sizes)]
    raise ValueError(workload)


def rows(n, world, rank):
    base, extra = divmod(n, world)
    begin = rank * base + min(rank, extra)
    return begin, base + (1 if rank < extra else 0)


def make_arrays(workload, world=1, rank=0):
    """{name: numpy array}: rank's dim-0 shard of each tensor (0-D tensors whole)."""
    rng = np.random.default_rng(1234)
    out = {}
    for name, shape, dt in spec(workload):
        if dt == np.int64:
            out[name] = np.array(1000, dtype=np.int64)
            continue
        if world > 1 and shape:
            b, c = rows(shape[0], world, rank)
            shape = (c,) + tuple(shape[1:])
        out[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))
    return out


# ---------------------------------------------------------------------------- measuring

COLD = {"method": None}


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        COLD["method"] = "sync; echo 3 > /proc/sys/vm/drop_caches before every phase"
    except OSError:
        COLD["method"] = "not root: page cache NOT dropped (warm figures)"
    time.sleep(1)


def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_with_children():
    return cpu_self() + sum(getattr(resource.getrusage(resource.RUSAGE_CHILDREN), f) for f in ("ru_utime", "ru_stime"))


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def fsync_tree(path):
    paths = [path] if os.path.isfile(path) else []
    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            paths += [os.path.join(root, f) for f in files]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    d = path if os.path.isdir(path) else os.path.dirname(path)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)


class Recorder:
    def __init__(self, json_path, round_index, commit):
        self.f = open(json_path, "a")
        self.round = round_index
        self.commit = commit

    def phase(self, table, method, op, nbytes, body, prepare=None, external=None):
        """Times body() from a cold cache. external: body returns (wall, cpu, rss) itself."""
        if prepare:
            prepare()
        drop_caches()
        load = os.getloadavg()[0]
        c0, t0 = cpu_self(), time.perf_counter()
        res = body()
        wall, cpu = time.perf_counter() - t0, cpu_self() - c0
        rss = peak_rss_mib()
        if external:
            wall, cpu, rss = res
        print(f"  {table:<12} {method:<26} {op:<5} {wall:7.3f} s  {nbytes / wall / 1e9:6.2f} GB/s  "
              f"cpu {cpu:6.3f} s  load {load:.2f}", flush=True)
        self.f.write(json.dumps({"source": "peers", "table": table, "method": method, "op": op,
                                 "round": self.round, "wall": wall, "cpu": cpu, "load": load,
                                 "rss_mib": rss, "bytes": nbytes, "commit": self.commit}) + "\n")
        self.f.flush()
        return res


def nbytes_of(arrays):
    return sum(a.nbytes for a in arrays.values())


# ---------------------------------------------------------------------------- peers

def run_torch(rec, table, arrays, d):
    import torch
    sd = {k: torch.from_numpy(v) for k, v in arrays.items()}
    path = os.path.join(d, "model.pt")

    def save():
        with open(path, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_tree(d)

    rec.phase(table, "torch.save", "save", nbytes_of(arrays), save, prepare=lambda: fresh(d))
    out = rec.phase(table, "torch.save", "load", nbytes_of(arrays), lambda: torch.load(path, weights_only=True))
    check(out, sd, "torch.load")


def run_torch4(rec, d):
    import torch
    shards = [{k: torch.from_numpy(v) for k, v in make_arrays("gpt2s", 4, r).items()} for r in range(4)]
    total = sum(sum(t.numel() * t.element_size() for t in s.values()) for s in shards)

    def save():
        def one(r):
            with open(os.path.join(d, f"rank{r}.pt"), "wb") as f:
                torch.save(shards[r], f)
                f.flush()
                os.fsync(f.fileno())
        ts = [threading.Thread(target=one, args=(r,)) for r in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        fsync_tree(d)

    def load():
        out = [None] * 4
        def one(r):
            out[r] = torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=True)
        ts = [threading.Thread(target=one, args=(r,)) for r in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        return out

    rec.phase("gpt2s-4", "torch.save, 4 files", "save", total, save, prepare=lambda: fresh(d))
    out = rec.phase("gpt2s-4", "torch.save, 4 files", "load", total, load)
    check(out[3], shards[3], "torch.load rank 3")


def run_safetensors(rec, table, arrays, d):
    from safetensors.numpy import save_file, load_file
    path = os.path.join(d, "model.safetensors")

    def save():
        save_file(arrays, path)
        fsync_tree(d)

    rec.phase(table, "safetensors", "save", nbytes_of(arrays), save, prepare=lambda: fresh(d))
    out = rec.phase(table, "safetensors", "load", nbytes_of(arrays), lambda: load_file(path))
    check(out, arrays, "safetensors load")


def run_dcp(rec, table, arrays, d):
    import torch
    import torch.distributed.checkpoint as dcp
    sd = {k: torch.from_numpy(v) for k, v in arrays.items()}

    def save():
        dcp.save(sd, checkpoint_id=d)
        fsync_tree(d)

    rec.phase(table, "DCP", "save", nbytes_of(arrays), save, prepare=lambda: fresh(d))
    target = {k: torch.zeros_like(v) for k, v in sd.items()}
    rec.phase(table, "DCP", "load", nbytes_of(arrays), lambda: dcp.load(target, checkpoint_id=d))
    check(target, sd, "DCP load")


def dcp_rank_main(args):
    """A rank of the DCP 4-process save/load (gloo): times its part between barriers."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    sd = {k: torch.from_numpy(v) for k, v in make_arrays("gpt2s", world, rank).items()}
    # DCP's resharding needs DTensor; as plain per-rank tensors, each rank saves its own keys.
    sd = {f"{k}.rank{rank}" if v.dim() else k: v for k, v in sd.items()}
    res = {}
    for op in ("save", "load"):
        dist.barrier()
        if rank == 0:
            drop_caches()
        dist.barrier()
        c0, t0 = cpu_self(), time.perf_counter()
        if op == "save":
            dcp.save(sd, checkpoint_id=args.dcp_dir)
            fsync_tree(args.dcp_dir)
        else:
            target = {k: torch.zeros_like(v) for k, v in sd.items()}
            dcp.load(target, checkpoint_id=args.dcp_dir)
        dist.barrier()
        res[op] = {"wall": time.perf_counter() - t0, "cpu": cpu_self() - c0, "rss": peak_rss_mib()}
    with open(os.path.join(args.dcp_out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def run_dcp4(rec, d, total):
    fresh(d)
    outdir = d + ".out"
    fresh(outdir)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), WORLD_SIZE="4")
    procs = [subprocess.Popen([sys.executable, __file__, "--dcp-rank", "--dcp-dir", d, "--dcp-out", outdir],
                              env=dict(env, RANK=str(r))) for r in range(4)]
    if any(p.wait() != 0 for p in procs):
        print("  DCP 4 ranks failed", file=sys.stderr)
        return
    res = [json.load(open(os.path.join(outdir, f"rank{r}.json"))) for r in range(4)]
    for op in ("save", "load"):
        wall = max(x[op]["wall"] for x in res)
        cpu = sum(x[op]["cpu"] for x in res)
        rss = sum(x[op]["rss"] for x in res)
        rec.phase("gpt2s-4", "DCP, 4 ranks (gloo)", op, total, lambda w=wall, c=cpu, r=rss: (w, c, r), external=True)


def child_time(cmd):
    """Runs cmd; returns (wall, cpu, peak RSS MiB) of the child. The peak is VmHWM polled from
    /proc every 5 ms: wait4's ru_maxrss of a child forked from this (large) process starts at
    this process's RSS, which exec does not reset."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    hwm = 0.0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]) / 1024.0)
        except OSError:
            pass
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, ru.ru_utime + ru.ru_stime - r0.ru_utime - r0.ru_stime, hwm


def copy_range_all(srcs, dst):
    with open(dst, "wb") as out:
        for s in srcs:
            with open(s, "rb") as f:
                n = os.fstat(f.fileno()).st_size
                while n > 0:
                    k = os.copy_file_range(f.fileno(), out.fileno(), n)
                    if k <= 0:
                        raise OSError("copy_file_range")
                    n -= k
        out.flush()
        os.fsync(out.fileno())
    fsync_tree(os.path.dirname(dst))


def run_merge(rec, a, d, dcp4_dir):
    src = os.path.join(d, "src4")
    if not os.path.isdir(src):
        subprocess.check_call([os.path.join(a.bin, "bench/tools/ckpt-bench-tools-gen"), "gpt2s", src, "--world", "4"],
                              stdout=subprocess.DEVNULL)
    shards = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".h5"))
    total = sum(os.path.getsize(s) for s in shards)
    out = os.path.join(d, "merged")
    def timed(method, cmd_or_fn):
        def body():
            if callable(cmd_or_fn):
                c0, t0 = cpu_with_children(), time.perf_counter()  # cp's CPU too
                cmd_or_fn()
                return time.perf_counter() - t0, cpu_with_children() - c0, 1.0
            return child_time(cmd_or_fn)
        rec.phase("merge", method, "merge", total, body, prepare=lambda: fresh(out, make=False), external=True)
    timed("copy_file_range of the data", lambda: (os.makedirs(out), copy_range_all(shards, os.path.join(out, "all.bin"))))
    timed("cp -r + fsync", lambda: (subprocess.check_call(["cp", "-r", src, out]), fsync_tree(out)))
    timed("ckpt-merge", [os.path.join(a.bin, "tools/ckpt-merge"), src, out, "-q"])
    if dcp4_dir and os.path.isdir(dcp4_dir):
        code = ("import sys, os; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; "
                "f(sys.argv[1], sys.argv[2]); fd = os.open(sys.argv[2], os.O_RDONLY); os.fsync(fd)")
        def dcp_merge():
            os.makedirs(out)
            return child_time([sys.executable, "-c", code, dcp4_dir, os.path.join(out, "model.pt")])
        rec.phase("merge", "DCP dcp_to_torch_save", "merge", total, dcp_merge,
                  prepare=lambda: fresh(out, make=False), external=True)


# ---------------------------------------------------------------------------- helpers

def fresh(d, make=True):
    shutil.rmtree(d, ignore_errors=True)
    if make:
        os.makedirs(d)


def check(out, ref, what):
    """Spot-checks a load: three tensors compared with the source."""
    keys = list(ref)
    for k in (keys[0], keys[len(keys) // 2], keys[-1]):
        a = out[k].numpy() if hasattr(out[k], "numpy") else out[k]
        b = ref[k].numpy() if hasattr(ref[k], "numpy") else ref[k]
        if not np.array_equal(a, b):
            raise SystemExit(f"{what}: {k} differs from what was saved")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir")
    ap.add_argument("--json")
    ap.add_argument("--round", type=int, default=0)
    ap.add_argument("--bin", help="the Release build dir (ckpt-merge, ckpt-bench-tools-gen)")
    ap.add_argument("--only", default="torch,safetensors,dcp,merge")
    ap.add_argument("--dcp-rank", action="store_true")
    ap.add_argument("--dcp-dir")
    ap.add_argument("--dcp-out")
    a = ap.parse_args()
    if a.dcp_rank:
        return dcp_rank_main(a)
    only = set(a.only.split(","))
    rec = Recorder(a.json, a.round, os.environ.get("CKPT_BENCH_COMMIT", ""))
    try:
        import torch
        torch.set_num_threads(2)
        versions = f"torch {torch.__version__}"
    except ImportError:
        only -= {"torch", "dcp"}
        versions = "torch not installed (torch.save and DCP rows skipped)"
    import safetensors
    versions += f", safetensors {safetensors.__version__}, numpy {np.__version__}"
    print(f"peers round {a.round}: {versions}", flush=True)
    rec.f.write(json.dumps({"source": "peers", "versions": versions, "round": a.round}) + "\n")
    d = os.path.join(a.dir, "peers")
    os.makedirs(d, exist_ok=True)
    work = os.path.join(d, "w")
    for workload in ("gpt2s", "many-small"):
        arrays = make_arrays(workload)
        if "safetensors" in only:
            run_safetensors(rec, workload, arrays, work)
        if "torch" in only:
            run_torch(rec, workload, arrays, work)
        # DCP on many-small takes minutes on a loaded 2-core machine: round 0 only.
        if "dcp" in only and (workload == "gpt2s" or a.round == 0):
            run_dcp(rec, workload, arrays, work)
        del arrays
        fresh(work, make=False)
    dcp4 = os.path.join(d, "dcp4")
    if "torch" in only:
        run_torch4(rec, work)
        fresh(work, make=False)
    if "dcp" in only:
        total = sum(int(np.prod(s)) * np.dtype(t).itemsize for _, s, t in spec("gpt2s"))
        run_dcp4(rec, dcp4, total)
    if "merge" in only and a.bin:
        run_merge(rec, a, d, dcp4 if "dcp" in only else None)
    shutil.rmtree(os.path.join(d, "merged"), ignore_errors=True)
    shutil.rmtree(dcp4, ignore_errors=True)
    rec.f.write(json.dumps({"source": "peers", "cold": COLD["method"], "round": a.round}) + "\n")


if __name__ == "__main__":
    main()
