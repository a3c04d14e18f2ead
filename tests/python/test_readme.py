"""The README's Python blocks (between <!-- python:begin --> and <!-- python:end -->) run as
written: each in a fresh interpreter in a scratch directory; a block that starts with
`# torchrun --nproc-per-node N` runs as N gloo processes on the loopback, as torchrun would
start it."""
import os
import re
import socket
import subprocess
import sys

import pytest

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def blocks():
    text = open(README, encoding="utf-8").read()
    out = []
    for part in re.findall(r"<!-- python:begin -->(.*?)<!-- python:end -->", text, re.S):
        out += re.findall(r"```python\n(.*?)```", part, re.S)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readme_has_python_blocks():
    assert len(blocks()) >= 1


@pytest.mark.parametrize("index", range(len(blocks())))
def test_readme_python_block_runs(index, tmp):
    code = blocks()[index]
    if not os.environ.get("CKPT_REQUIRE_TORCH"):  # scripts/test.sh's venv has both: no skip there
        for module in ("torch", "accelerate"):
            if f"import {module}" in code or f"from {module} " in code:
                pytest.importorskip(module)
    script = os.path.join(tmp, f"block_{index}.py")
    with open(script, "w") as f:
        f.write(code)
    launch = re.match(r"# torchrun --nproc-per-node (\d+)", code)
    world = int(launch.group(1)) if launch else 1
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1")
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
