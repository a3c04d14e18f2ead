"""Runs a pytest file of GPU tests, or exits 77 (CTest's SKIP_RETURN_CODE: SKIPPED) where
there is no CUDA device or ckpt was built without its CUDA backend.

    python gpu_pytest.py TEST_FILE [pytest arguments]
"""
import sys

import pytest


def main():
    try:
        import torch
        import ckpt
    except ImportError as e:
        print(f"SKIPPED: {e}")
        return 77
    if not ckpt.HAVE_CUDA:
        print("SKIPPED: ckpt was built without ckpt::cuda (no CUDA toolkit)")
        return 77
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device (torch.cuda.is_available() is False)")
        return 77
    return pytest.main(["-q", "-p", "no:cacheprovider", "-rs", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
