import os
import shutil
import subprocess
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
