#!/usr/bin/env python3
"""bench/s3/s3bench.py: the object-storage benchmark (issue 30 §5). Run it through bench/s3.sh,
which builds ckpt-bench-s3, starts the project's Ceph gateway with admin sockets and sets AWS_*.

  s3bench.py --bin BUILD/bench/core/ckpt-bench-s3 --gw-dir DIR [--rounds N] [--max-gb G]
             [--part-mib 16] [--concurrency 8] [--json FILE] [--only raw,ckpt1,ckpt4,dcp]

The same gpt2s sizes (bench/common/gpt2s.h; 592 tensors, 1.49 GB; --max-gb keeps the first
tensors up to G GB) go through the gateway by each contender, one process per phase:
  raw     boto3: one object, multipart upload and ranged download (s3transfer) with the part
          size and concurrency ckpt uses (the raw baseline)
  ckpt1   ckpt::Save / Load, 1 rank (ckpt-bench-s3)
  ckpt4   the same by 4 ranks (threads), and a 4 -> 3 rank row reshard of that checkpoint
  dcp     torch.distributed.checkpoint with FsspecWriter / FsspecReader over s3fs, 1 process
          (thread_count = the concurrency)
Per phase: wall seconds; client CPU seconds (the phase's process, every thread, the timed part
only); the gateway's requests and bytes in and out (radosgw's perf counters over its admin
socket); server CPU seconds (radosgw, OSD and mon, from /proc/<pid>/stat); the load average at
its start. Each load is checked against what was saved (untimed). The objects are deleted
between contenders (the OSD keeps them in RAM).
"""
import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- the workload

def gpt2s_spec(max_gb=0.0):
    """[(name, shape, numpy dtype)] of gpt2s in save order (as bench/common/gpt2s.h), cut
    like ckpt-bench-s3's --max-gb (the first tensors up to max_gb GB)."""
    import numpy as np
    sys.path.insert(0, os.path.join(HERE, "..", "peers"))
    from peers import spec  # noqa: E402  (bench/peers: the same tensors the other benchmarks use)
    out, total = [], 0
    for name, shape, dt in spec("gpt2s"):
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        if max_gb > 0 and total + n > max_gb * 1e9:
            break
        out.append((name, shape, dt))
        total += n
    return out


def spec_bytes(sp):
    import numpy as np
    return sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for _, s, d in sp)


def cpu_now():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def s3_env():
    return dict(endpoint=os.environ["AWS_ENDPOINT_URL"], key=os.environ["AWS_ACCESS_KEY_ID"],
                secret=os.environ["AWS_SECRET_ACCESS_KEY"], region=os.environ.get("AWS_REGION", "us-east-1"))


def boto_client(concurrency):
    import boto3
    from botocore.config import Config
    e = s3_env()
    return boto3.client("s3", endpoint_url=e["endpoint"], aws_access_key_id=e["key"],
                        aws_secret_access_key=e["secret"], region_name=e["region"],
                        config=Config(max_pool_connections=max(10, concurrency), s3={"addressing_style": "path"}))


# ---------------------------------------------------------------------------- one phase (a child process)

def phase_raw(args, op):
    """boto3's managed transfer of one object (upload_fileobj / download_fileobj)."""
    import numpy as np
    from boto3.s3.transfer import TransferConfig
    n = spec_bytes(gpt2s_spec(args.max_gb))
    rng = np.random.default_rng(1234)
    data = rng.random(n // 4, dtype=np.float32).tobytes() + b"\0" * (n % 4)
    client = boto_client(args.concurrency)
    part = args.part_mib << 20
    cfg = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=args.concurrency,
                         use_threads=True)
    key = args.key + "/gpt2s.bin"
    if op == "save":
        src = io.BytesIO(data)
        t0, c0 = time.perf_counter(), cpu_now()
        client.upload_fileobj(src, args.bucket, key, Config=cfg)
        wall, cpu = time.perf_counter() - t0, cpu_now() - c0
    else:
        dst = io.BytesIO(bytes(n))  # sized ahead: the ranged parts land by seek + write
        t0, c0 = time.perf_counter(), cpu_now()
        client.download_fileobj(args.bucket, key, dst, Config=cfg)
        wall, cpu = time.perf_counter() - t0, cpu_now() - c0
        if dst.getbuffer() != memoryview(data):
            sys.exit("raw load: the bytes differ from those uploaded")
    return dict(wall=wall, cpu=cpu, bytes=n)


def dcp_state(args, zero):
    import numpy as np
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "peers"))
    out = {}
    rng = np.random.default_rng(1234)
    for name, shape, dt in gpt2s_spec(args.max_gb):
        if zero:
            a = np.zeros(shape, dtype=dt)
        elif dt == np.int64:
            a = np.full(shape, 1000, dtype=dt)
        else:
            a = rng.random(shape, dtype=np.float32)
        out[name] = torch.from_numpy(a)
    return out


def phase_dcp(args, op):
    """DCP's FsspecWriter / FsspecReader over s3fs, one process (no process group)."""
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FsspecReader, FsspecWriter
    e = s3_env()
    opts = dict(key=e["key"], secret=e["secret"], client_kwargs={"endpoint_url": e["endpoint"], "region_name": e["region"]})
    url = f"s3://{args.bucket}/{args.key}"
    n = spec_bytes(gpt2s_spec(args.max_gb))
    if op == "save":
        sd = dcp_state(args, zero=False)
        t0, c0 = time.perf_counter(), cpu_now()
        dcp.save(sd, storage_writer=FsspecWriter(url, thread_count=args.concurrency, **opts))
        wall, cpu = time.perf_counter() - t0, cpu_now() - c0
    else:
        want = dcp_state(args, zero=False)
        sd = dcp_state(args, zero=True)
        t0, c0 = time.perf_counter(), cpu_now()
        dcp.load(sd, storage_reader=FsspecReader(url, **opts))
        wall, cpu = time.perf_counter() - t0, cpu_now() - c0
        bad = [k for k in want if not torch.equal(want[k], sd[k])]
        if bad:
            sys.exit(f"dcp load: {len(bad)} tensors differ, the first {bad[0]}")
    return dict(wall=wall, cpu=cpu, bytes=n)


# ---------------------------------------------------------------------------- the gateway's side

class Gateway:
    def __init__(self, gw_dir):
        self.dir = gw_dir
        self.pids = {}
        for name in ("rgw", "osd", "mon"):
            with open(os.path.join(gw_dir, "pids", name)) as f:
                self.pids[name] = int(f.read().strip())

    def cpu(self):
        out = {}
        for name, pid in self.pids.items():
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
        return out

    def counters(self):
        asok = os.path.join(self.dir, "run", "client.rgw.gateway.asok")
        r = subprocess.run(["ceph", "--admin-daemon", asok, "perf", "dump", "rgw"], capture_output=True, text=True,
                           timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"perf dump of {asok}: {r.stderr.strip()}")
        d = json.loads(r.stdout)["rgw"]
        return {k: d[k] for k in ("req", "failed_req", "get", "get_b", "put", "put_b")}

    def snapshot(self):
        return dict(cpu=self.cpu(), counters=self.counters())

    @staticmethod
    def delta(a, b):
        out = {k: b["counters"][k] - a["counters"][k] for k in a["counters"]}
        out["cpu"] = {k: b["cpu"][k] - a["cpu"][k] for k in a["cpu"]}
        return out


def empty_prefix(client, bucket, prefix):
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        keys += [{"Key": o["Key"]} for o in page.get("Contents", [])]
    for i in range(0, len(keys), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": keys[i:i + 1000]})
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for u in page.get("Uploads", []):
            client.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])


def machine(gw_dir):
    facts = {"cores": os.cpu_count(), "load": os.getloadavg()}
    with open("/proc/meminfo") as f:
        mem = {ln.split(":")[0]: int(ln.split()[1]) for ln in f}
    facts["mem_gib"] = round(mem["MemTotal"] / 2**20, 1)
    facts["mem_available_gib"] = round(mem["MemAvailable"] / 2**20, 1)
    with open("/proc/cpuinfo") as f:
        facts["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    st = os.statvfs(os.environ.get("TMPDIR", "/tmp"))
    facts["staging_disk_free_gb"] = round(st.f_bavail * st.f_frsize / 1e9, 1)
    r = subprocess.run(["df", "-P", os.environ.get("TMPDIR", "/tmp")], capture_output=True, text=True)
    facts["staging_disk"] = r.stdout.splitlines()[-1].split()[0] if r.returncode == 0 else "?"
    r = subprocess.run(["radosgw", "--version"], capture_output=True, text=True)
    facts["gateway"] = (r.stdout.strip().split(" (")[0] + ", OSD memstore (RAM), 127.0.0.1") if r.returncode == 0 else "?"
    facts["kernel"] = os.uname().release
    return facts


# ---------------------------------------------------------------------------- the driver

def run_phase(args, gw, contender, op, cmd):
    before = gw.snapshot()
    load1 = os.getloadavg()[0]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(f"{contender} {op} failed (exit {r.returncode}): {' '.join(cmd)}")
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    time.sleep(0.5)  # the gateway's counters settle (a request's bytes are counted as it ends)
    d = Gateway.delta(before, gw.snapshot())
    out = dict(contender=contender, op=op, wall=rec["wall"], client_cpu=rec["cpu"], bytes=rec["bytes"],
               load1=load1, requests=d["req"], failed=d["failed_req"], put_b=d["put_b"], get_b=d["get_b"],
               server_cpu=sum(d["cpu"].values()), server_cpu_by=d["cpu"])
    print(f"  {contender:10s} {op:12s} {out['wall']:7.2f} s  {out['bytes'] / out['wall'] / 1e6:7.1f} MB/s  "
          f"req {out['requests']:5d}  in {out['put_b'] / 1e9:5.2f} GB  out {out['get_b'] / 1e9:5.2f} GB  "
          f"client {out['client_cpu']:5.1f} s  server {out['server_cpu']:5.1f} s CPU  load {load1:.2f}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", help=argparse.SUPPRESS)  # raw-save, raw-load, dcp-save, dcp-load: one child
    ap.add_argument("--bin", help="ckpt-bench-s3")
    ap.add_argument("--gw-dir")
    ap.add_argument("--bucket", default="ckpt-bench")
    ap.add_argument("--key", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-gb", type=float, default=0.0)
    ap.add_argument("--part-mib", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json")
    ap.add_argument("--only", default="raw,ckpt1,ckpt4,dcp")
    args = ap.parse_args()

    if args.phase:
        kind, op = args.phase.split("-")
        rec = (phase_raw if kind == "raw" else phase_dcp)(args, op)
        print(json.dumps(rec))
        return

    gw = Gateway(args.gw_dir)
    client = boto_client(args.concurrency)
    try:
        client.create_bucket(Bucket=args.bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    facts = machine(args.gw_dir)
    n = spec_bytes(gpt2s_spec(args.max_gb))
    print(f"== machine: {facts['cores']} cores ({facts['cpu']}), {facts['mem_gib']} GiB "
          f"({facts['mem_available_gib']} available), load {' '.join(f'{x:.2f}' for x in facts['load'])}; "
          f"staging on {facts['staging_disk']} ({facts['staging_disk_free_gb']} GB free); {facts['gateway']}")
    print(f"== gpt2s{'' if args.max_gb <= 0 else f' (first tensors up to {args.max_gb} GB)'}: {n / 1e9:.3f} GB; "
          f"parts {args.part_mib} MiB, {args.concurrency} at a time; {args.rounds} rounds", flush=True)
    only = set(args.only.split(","))
    me = [sys.executable, os.path.abspath(__file__), "--bucket", args.bucket, "--max-gb", str(args.max_gb),
          "--part-mib", str(args.part_mib), "--concurrency", str(args.concurrency)]
    ck = ["--part-mib", str(args.part_mib), "--concurrency", str(args.concurrency), "--max-gb", str(args.max_gb)]
    recs = []
    jf = open(args.json, "a") if args.json else None
    for rnd in range(args.rounds):
        print(f"-- round {rnd + 1}/{args.rounds}", flush=True)
        steps = []
        if "raw" in only:
            k = f"r{rnd}/raw"
            steps.append(("boto3", k, [("save", me + ["--phase", "raw-save", "--key", k]),
                                       ("load", me + ["--phase", "raw-load", "--key", k])]))
        if "ckpt1" in only:
            k = f"r{rnd}/ckpt1"
            url = f"s3://{args.bucket}/{k}"
            steps.append(("ckpt 1", k, [("save", [args.bin, "save", url, "--ranks", "1"] + ck),
                                        ("load", [args.bin, "load", url, "--ranks", "1"] + ck)]))
        if "ckpt4" in only:
            k = f"r{rnd}/ckpt4"
            url = f"s3://{args.bucket}/{k}"
            steps.append(("ckpt 4", k, [("save", [args.bin, "save", url, "--ranks", "4"] + ck),
                                        ("load", [args.bin, "load", url, "--ranks", "4"] + ck),
                                        ("load 4->3", [args.bin, "load", url, "--ranks", "3"] + ck)]))
        if "dcp" in only:
            k = f"r{rnd}/dcp"
            steps.append(("dcp+s3fs", k, [("save", me + ["--phase", "dcp-save", "--key", k]),
                                          ("load", me + ["--phase", "dcp-load", "--key", k])]))
        for contender, key, phases in steps:
            for op, cmd in phases:
                rec = run_phase(args, gw, contender, op, cmd)
                rec["round"] = rnd
                recs.append(rec)
                if jf:
                    jf.write(json.dumps(rec) + "\n")
                    jf.flush()
            empty_prefix(client, args.bucket, key)
            time.sleep(6)  # radosgw's garbage collection frees the RAM store (period 5 s)
    report(recs, facts, n)


def report(recs, facts, n):
    groups = {}
    for r in recs:
        groups.setdefault((r["contender"], r["op"]), []).append(r)

    def med(rs, f):
        return statistics.median(f(r) for r in rs)

    base = {op: med(groups[("boto3", op)], lambda r: r["wall"]) for op in ("save", "load") if ("boto3", op) in groups}
    print()
    print(f"== median of {max(len(v) for v in groups.values())} rounds; {n / 1e9:.3f} GB; {facts['cores']} cores; "
          f"load average at the phases' starts {min(r['load1'] for r in recs):.2f}..{max(r['load1'] for r in recs):.2f}")
    hdr = (f"| {'contender':10s} | {'op':9s} | {'s':>6s} | {'MB/s':>6s} | {'vs boto3':>8s} | {'requests':>8s} | "
           f"{'GB in':>6s} | {'GB out':>6s} | {'client CPU s/GB':>15s} | {'server CPU s/GB':>15s} |")
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for (contender, op), rs in groups.items():
        wall = med(rs, lambda r: r["wall"])
        gb = rs[0]["bytes"] / 1e9
        b = base.get(op.split(" ")[0]) if op in ("save", "load") else None
        ratio = f"{b / wall:.2f}x" if b else ""
        print(f"| {contender:10s} | {op:9s} | {wall:6.2f} | {rs[0]['bytes'] / wall / 1e6:6.1f} | {ratio:>8s} | "
              f"{med(rs, lambda r: r['requests']):8.0f} | {med(rs, lambda r: r['put_b']) / 1e9:6.2f} | "
              f"{med(rs, lambda r: r['get_b']) / 1e9:6.2f} | {med(rs, lambda r: r['client_cpu']) / gb:15.2f} | "
              f"{med(rs, lambda r: r['server_cpu']) / gb:15.2f} |")
    print()
    print("targets:")
    for c in ("ckpt 1", "ckpt 4"):
        for op in ("save", "load"):
            if (c, op) in groups and op in base:
                v = base[op] / med(groups[(c, op)], lambda r: r["wall"])
                print(f"  {c} {op}: {v:.2f}x the boto3 baseline's speed (target >= 0.90): {'met' if v >= 0.9 else 'NOT met'}")
            if (c, op) in groups and ("dcp+s3fs", op) in groups:
                v = med(groups[("dcp+s3fs", op)], lambda r: r["wall"]) / med(groups[(c, op)], lambda r: r["wall"])
                print(f"  {c} {op}: {v:.2f}x DCP+s3fs's speed (target > 1): {'met' if v > 1 else 'NOT met'}")
    if ("ckpt 4", "load 4->3") in groups:
        rs = groups[("ckpt 4", "load 4->3")]
        v = med(rs, lambda r: r["get_b"] / r["bytes"])
        print(f"  4 -> 3 row reshard: fetched {v:.3f}x the bytes it returns (target <= 1.25): "
              f"{'met' if v <= 1.25 else 'NOT met'}")


if __name__ == "__main__":
    main()
