"""CUDA torch tensors in ckpt.save and ckpt.load (DLPack, ckpt::cuda): chunks in device
memory are copied by libckpt's CUDA backend, bit for bit, into checkpoints that CPU code
reads; loads land in place in CUDA tensors, contiguous or not. Run by gpu_pytest.py, which
reports SKIPPED (exit 77) where there is no GPU or ckpt has no CUDA backend."""
import numpy as np
import pytest

import ckpt

torch = pytest.importorskip("torch")
if not (ckpt.HAVE_CUDA and torch.cuda.is_available()):
    pytest.skip("no CUDA device, or ckpt built without ckpt::cuda", allow_module_level=True)

DEV = "cuda:0"


def values(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100, 100, shape, generator=g).to(dtype)


def test_save_from_cuda_load_on_cpu_and_cuda(tmp):
    host = {"w": values(torch.float32, (64, 33), 1), "b": values(torch.bfloat16, (33,), 2),
            "i": values(torch.int64, (5, 7), 3), "big": values(torch.float32, (3, 1 << 20), 4)}
    state = {"model": {k: v.to(DEV) for k, v in host.items()}, "step": 7}
    ckpt.save(tmp + "/c", state)
    with ckpt.open(tmp + "/c") as c:  # read back on the host, without torch's CUDA
        for k, v in host.items():
            assert torch.equal(c.read("model." + k, like="torch"), v), k
        assert c.stats("model.w")["max"] == pytest.approx(float(host["w"].max()))
    # In place into CUDA tensors (and one non-contiguous CUDA target), and into CPU ones.
    on_gpu = {"model": {k: torch.zeros_like(v, device=DEV) for k, v in host.items()}, "step": 0}
    on_gpu["model"]["w"] = torch.zeros(33, 64, device=DEV).t()
    ptr = on_gpu["model"]["big"].data_ptr()
    report = ckpt.load(tmp + "/c", on_gpu)
    assert report.ok and on_gpu["step"] == 7
    assert on_gpu["model"]["big"].data_ptr() == ptr  # in place
    for k, v in host.items():
        assert torch.equal(on_gpu["model"][k].cpu(), v), k
    on_cpu = {"model": {k: torch.zeros_like(v) for k, v in host.items()}, "step": 0}
    ckpt.load(tmp + "/c", on_cpu)
    for k, v in host.items():
        assert torch.equal(on_cpu["model"][k], v), k


def test_cuda_and_host_chunks_in_one_save_and_resharded_load(tmp):
    full = values(torch.float32, (40, 8), 5)
    # Two ranks as threads: rank 0's rows on the GPU, rank 1's on the host.
    from test_api import run_ranks
    parts = [full[:25].to(DEV), full[25:].clone()]

    def rank(r, comm):
        ckpt.save(tmp + "/s", {"x": ckpt.Shard(parts[r], [0 if r == 0 else 25, 0], [40, 8])}, comm=comm)

    assert run_ranks(2, rank) == [None, None]
    out = {"x": ckpt.Shard(torch.zeros(10, 8, device=DEV), [20, 0], [40, 8])}  # straddles both chunks
    ckpt.load(tmp + "/s", out)
    assert torch.equal(out["x"].array.cpu(), full[20:30])


def test_pending_kernels_finish_before_the_copy(tmp):
    x = torch.zeros(1 << 22, device=DEV)
    for _ in range(20):  # queued on torch's stream, likely still running when save starts
        x.add_(1.0)
    ckpt.save(tmp + "/k", {"x": x})
    with ckpt.open(tmp + "/k") as c:
        got = c.read("x")
    assert np.all(got == 20.0)


def test_dcp_save_of_cuda_state_through_storage_writer(tmp):
    import torch.distributed.checkpoint as dcp
    import ckpt.torch
    host = {"a": values(torch.float32, (16, 4), 6), "b": values(torch.bfloat16, (9,), 7)}
    dcp.save({k: v.to(DEV) for k, v in host.items()},
             storage_writer=ckpt.torch.StorageWriter(tmp + "/d", single_process=True), no_dist=True)
    target = {k: torch.zeros_like(v, device=DEV) for k, v in host.items()}
    dcp.load(target, storage_reader=ckpt.torch.StorageReader(tmp + "/d"), no_dist=True)
    for k, v in host.items():
        assert torch.equal(target[k].cpu(), v), k
