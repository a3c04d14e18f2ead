"""Save/load timings from Python, one process: ckpt.save / ckpt.load, and dcp.save through
ckpt.torch.StorageWriter against DCP's own FileSystemWriter, on the same state.

    python python/benchmarks/save_load.py DIR [--mib 256] [--tensors 64] [--repeat 3]

Prints the best of --repeat runs of each. Every save goes to a fresh directory under DIR
(a checkpoint's files are fsynced by ckpt; DCP's FileSystemWriter fsyncs too by default).
"""
import argparse
import os
import shutil
import time

import torch
import torch.distributed.checkpoint as dcp

import ckpt
import ckpt.torch


def best(fn, repeat):
    times = []
    for i in range(repeat):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--tensors", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    n = a.mib * 2**20 // 4 // a.tensors
    state = {f"layers.{i}.weight": torch.randn(n) for i in range(a.tensors)}
    state["step"] = 1
    os.makedirs(a.dir, exist_ok=True)

    def fresh(name, i):
        path = os.path.join(a.dir, f"{name}-{i}")
        shutil.rmtree(path, ignore_errors=True)
        return path

    rows = [
        ("ckpt.save", lambda i: ckpt.save(fresh("ckpt", i), state)),
        ("dcp.save + ckpt StorageWriter", lambda i: dcp.save(
            state, storage_writer=ckpt.torch.StorageWriter(fresh("dcp-ckpt", i)), no_dist=True)),
        ("dcp.save + FileSystemWriter", lambda i: dcp.save(
            state, storage_writer=dcp.FileSystemWriter(fresh("dcp-fs", i)), no_dist=True)),
    ]
    target = {k: torch.empty_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in state.items()}
    rows.append(("ckpt.load", lambda i: ckpt.load(os.path.join(a.dir, "ckpt-0"), target)))
    for name, fn in rows:
        t = best(fn, a.repeat)
        print(f"{name:32s} {t:7.3f} s  {a.mib / t:8.1f} MiB/s")


if __name__ == "__main__":
    main()
