"""The Python blocks of README.md and docs/*.md (every ```python block) run as written: each in
a fresh interpreter in a scratch directory; a block that starts with
`# torchrun --nproc-per-node N` runs as N gloo processes on the loopback, as torchrun would
start it. A block that names s3://BUCKET/... runs against the project's S3 gateway
(s3_gateway.py: SKIPPED without it, FAILS where CI=true), with its endpoint and keys in the
AWS environment and each bucket named made empty first and removed after. Each test is named
by the file and the line where its block starts."""
import glob
import os
import re
import socket
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def blocks():
    """{"<file>:<line>": code} for every ```python block; line: the block's first line."""
    out = {}
    for path in DOCS:
        lines = open(path, encoding="utf-8").read().split("\n")
        name = os.path.relpath(path, ROOT)
        i = 0
        while i < len(lines):
            if lines[i].strip() == "```python":
                j = i + 1
                while j < len(lines) and lines[j].strip() != "```":
                    j += 1
                out[f"{name}:{i + 2}"] = "\n".join(lines[i + 1:j]) + "\n"
                i = j
            i += 1
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_docs_have_python_blocks():
    assert len(blocks()) >= 1


@pytest.mark.parametrize("where", list(blocks()), ids=lambda where: where.replace("/", "_"))  # ids name folders
def test_docs_python_block_runs(where, tmp):
    code = blocks()[where]
    if not os.environ.get("CKPT_REQUIRE_TORCH"):  # scripts/test.sh's venv has both: no skip there
        for module in ("torch", "accelerate"):
            if f"import {module}" in code or f"from {module} " in code:
                pytest.importorskip(module)
    script = os.path.join(tmp, re.sub(r"[^A-Za-z0-9_]", "_", where) + ".py")
    with open(script, "w") as f:
        f.write(code)
    launch = re.match(r"# torchrun --nproc-per-node (\d+)", code)
    world = int(launch.group(1)) if launch else 1
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1")
    buckets = sorted(set(re.findall(r"s3://([a-z0-9][a-z0-9.-]{2,62})/", code)))
    if buckets:
        import s3_gateway
        s3 = s3_gateway.client()
        env.update(s3_gateway.aws_env())
        for b in buckets:
            s3_gateway.remove_bucket(s3, b)  # what a run before may have left
            s3_gateway.make_bucket(s3, b)
    try:
        run_block(script, world, tmp, env)
    finally:
        for b in buckets:
            s3_gateway.remove_bucket(s3, b)


def run_block(script, world, tmp, env):
    # -X faulthandler: a rank that dies of a signal prints every thread's Python stack.
    procs = [subprocess.Popen([sys.executable, "-X", "faulthandler", script], cwd=tmp, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(world)]
    outs = []
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(
        f"--- rank {r}: exit status {p.returncode}\n{out}" for r, (p, out) in enumerate(zip(procs, outs)))
