import os
import shutil
import subprocess
import sys
import tempfile

import pytest


@pytest.fixture
def tmp(request):
    """A fresh scratch directory under CKPT_TEST_TMP (CTest's), removed after a passing test."""
    root = os.environ.get("CKPT_TEST_TMP") or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)
    d = tempfile.mkdtemp(prefix=request.node.name[:40] + "-", dir=root)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def tool(name):
    """Path of a ckpt command-line tool of this build (CKPT_BIN), or skip."""
    bin_dir = os.environ.get("CKPT_BIN")
    if not bin_dir:
        pytest.skip("CKPT_BIN not set (run through CTest)")
    return os.path.join(bin_dir, name)


def run_tool(name, *args):
    """(exit code, stdout + stderr) of a ckpt tool."""
    p = subprocess.run([tool(name), *map(str, args)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def run_ranks(script, args_of_rank, world, what, timeout, env=None):
    """Runs `world` processes of `script` at once (`args_of_rank(r)`: rank r's arguments, `env`:
    variables set for them) and returns their outputs; fails with them if any exits non-zero
    or outlives `timeout` s."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    procs = [subprocess.Popen([sys.executable, script, *map(str, args_of_rank(r))], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for r in range(world)]
    outputs = []
    try:
        for p in procs:
            try:
                outputs.append(p.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                outputs.append("(hung: killed)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    assert not failed, f"{what} x{world}: ranks {failed} failed\n" + "\n".join(
        f"--- rank {r}\n{o[-6000:]}" for r, o in enumerate(outputs))
    return outputs
