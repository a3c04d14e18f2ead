"""torch.distributed.checkpoint through ckpt.torch: FSDP2 and tensor-parallel DTensor models
saved by gloo processes, loaded at other world sizes, by libckpt (ckpt.load is ckpt::Load)
and by the tools; and any ckpt checkpoint loaded by dcp.load."""
import json
import os
import uuid

import numpy as np
import pytest

import ckpt
from conftest import run_ranks, run_tool

if os.environ.get("CKPT_REQUIRE_TORCH"):
    import torch  # scripts/test.sh's venv has torch: a missing one is a failure there
else:
    torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
import ckpt.torch  # noqa: E402

import dcp_worker  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dcp_worker.py")


def launch(scenario, world, out, timeout=600):
    """Runs `world` ranks of a dcp_worker scenario; fails with their output if any fails."""
    store = os.path.join(out, f"store-{scenario}-{uuid.uuid4().hex}")
    run_ranks(WORKER, lambda r: (scenario, r, world, store, out), world, scenario, timeout)


def reference_flat():
    """Every key of the scenarios' state: tensors as pattern() makes them, other values as
    the unsharded reference has them."""
    model, opt = dcp_worker.reference()
    flat = dcp_worker.flat(dcp_worker.state_dicts(model, opt))
    return {k: dcp_worker.pattern(k, v.shape, v.dtype) if isinstance(v, torch.Tensor) else v
            for k, v in flat.items()}


def check_full(path, want):
    """libckpt's own Load (ckpt.load) reads every tensor whole, bit-identical to `want`."""
    with ckpt.open(path) as c:
        target = {}
        for key in c.keys():
            e = c.entry(key)
            if e["kind"] == "tensor":
                target[key] = torch.empty(e["shape"], dtype=getattr(torch, e["dtype"]))
    ckpt.load(path, target, strict=False)
    tensors = {k: v for k, v in want.items() if isinstance(v, torch.Tensor)}
    assert set(target) == set(tensors)
    for key, value in tensors.items():
        assert torch.equal(target[key], value), key
    return target


def tools_accept(path, tmp):
    rc, out = run_tool("ckpt-verify", path)
    assert rc == 0, out
    rc, out = run_tool("ckpt-inspect", path)
    assert rc == 0 and "model.0.weight" in out, out
    merged = os.path.join(tmp, "merged-" + os.path.basename(path))
    rc, out = run_tool("ckpt-merge", path, merged)
    assert rc == 0, out
    rc, out = run_tool("ckpt-diff", path, merged)
    assert rc == 0, out


def test_fsdp2_saved_by_2_loads_at_3_at_1_and_in_libckpt(tmp):
    launch("fsdp_save", 2, tmp)
    path = os.path.join(tmp, "dcp")
    md = ckpt.read_metadata(path)
    assert md["state_dict_type"] == "SHARDED" and md["world_size"] == 2
    placements = md["mesh"]["tensors"]["model.0.weight"]["placements"]
    assert placements == ["Shard(0)"]
    assert md["mesh"]["meshes"][0]["shape"] == [2]
    with ckpt.open(path) as c:
        assert len(c.chunks("model.0.weight")) == 2
        assert len(c.chunks("optim.state.0.weight.exp_avg")) == 2
        # AdamW's step is a plain tensor on both ranks: written once.
        assert len(c.chunks("optim.state.0.weight.step")) == 1
        assert c.entry("optim.param_groups.0.lr")["kind"] == "bytes"  # DCP's pickle
    want = reference_flat()
    check_full(path, want)
    check_full(os.path.join(tmp, "direct"), {k[len("model."):]: v for k, v in want.items()
                                             if k.startswith("model.")})
    tools_accept(path, tmp)
    launch("fsdp_load", 3, tmp)
    # One process, no process group: dcp.load into a plain model and optimizer.
    model = dcp_worker.build_model(seed=99)
    opt = dcp_worker.make_optimizer(model)
    dcp_worker.take_step(model, opt)
    state = dcp_worker.state_dicts(model, opt)
    dcp_worker.fill(state, salt=2)
    dcp.load(state, storage_reader=ckpt.torch.StorageReader(path), no_dist=True)
    for key, value in dcp_worker.flat(state).items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, want[key]), key
    assert state["step"] == 5


def test_tp_x_fsdp2_saved_by_4_loads_tp_at_2(tmp):
    launch("tp_fsdp_save", 4, tmp)
    path = os.path.join(tmp, "dcp")
    md = ckpt.read_metadata(path)
    assert md["world_size"] == 4 and md["mesh"]["meshes"][0]["shape"] == [2, 2]
    assert md["mesh"]["meshes"][0]["dim_names"] == ["dp", "tp"]
    check_full(path, reference_flat())
    tools_accept(path, tmp)
    launch("tp_load", 2, tmp)


def test_dcp_loads_checkpoints_libckpt_wrote(tmp):
    golden = os.environ.get("CKPT_GOLDEN")
    if not golden:
        pytest.skip("CKPT_GOLDEN not set (run through CTest)")
    for case in ("v2/v2_grid_w3", "v1/sharded_w3", "v1/dtypes_w1", "v2/v2_zstd_w2"):
        path = os.path.join(golden, case)
        with ckpt.open(path) as c:
            state, want = {}, {}
            for key in c.keys():
                e = c.entry(key)
                if e["kind"] == "tensor":
                    state[key] = torch.zeros(e["shape"], dtype=getattr(torch, e["dtype"]))
                    want[key] = c.read(key, like="torch")
                else:
                    state[key] = b"" if e["kind"] == "bytes" else 0
                    want[key] = c.read(key)
        assert any(isinstance(v, torch.Tensor) for v in state.values()), case
        dcp.load(state, storage_reader=ckpt.torch.StorageReader(path), no_dist=True)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(state[key].reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8)), (case, key)
            else:
                assert state[key] == value, (case, key)


def test_storage_writer_single_process_round_trip_and_overwrite(tmp):
    path = os.path.join(tmp, "c")
    state = {"w": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4), "meta": {"epoch": 3, "name": "x"}}
    dcp.save(state, storage_writer=ckpt.torch.StorageWriter(path), no_dist=True)
    md = ckpt.read_metadata(path)
    assert md["state_dict_type"] == "FULL" and md["mesh"] is None
    assert md["user"][ckpt.torch.USER_KEY]["pickled"] == ["meta.epoch", "meta.name"]
    with pytest.raises(BaseException) as e:  # DCP wraps it (CheckpointException); the message is kept
        dcp.save(state, storage_writer=ckpt.torch.StorageWriter(path, overwrite=False), no_dist=True)
    assert "already exists" in str(e.value) or "already exists" in repr(e.value)
    state["w"] = state["w"] * 2
    dcp.save(state, storage_writer=ckpt.torch.StorageWriter(path), no_dist=True)  # overwrites, as FileSystemWriter
    out = {"w": torch.zeros(3, 4, dtype=torch.bfloat16), "meta": {"epoch": 0, "name": ""}}
    dcp.load(out, storage_reader=ckpt.torch.StorageReader(path), no_dist=True)
    assert torch.equal(out["w"], state["w"]) and out["meta"] == {"epoch": 3, "name": "x"}
    # A dtype other than the stored one converts, as DCP's own reader does.
    out32 = {"w": torch.zeros(3, 4, dtype=torch.float32), "meta": {"epoch": 0, "name": ""}}
    dcp.load(out32, storage_reader=ckpt.torch.StorageReader(path), no_dist=True)
    assert torch.equal(out32["w"], state["w"].float())
    json.dumps(md["user"])  # the recorded planner data is plain JSON
    assert np.asarray(ckpt.open(path).read("w", like="torch").float()).sum() == float(state["w"].float().sum())


def test_convert_imports_and_exports_dcp_directories(tmp):
    from ckpt import convert
    state = {"model": {"w": torch.randn(5, 3), "b": torch.arange(4, dtype=torch.int32)},
             "epoch": 7, "sched": {"milestones": [1, 2]}}
    src = os.path.join(tmp, "dcp-native")
    dcp.save(state, storage_writer=dcp.FileSystemWriter(src), no_dist=True)
    assert convert.main(["import", os.path.join(tmp, "absent"), os.path.join(tmp, "x")]) == 1
    dst = os.path.join(tmp, "imported")
    assert convert.main(["import", src, dst]) == 0
    rc, out = run_tool("ckpt-verify", dst)
    assert rc == 0, out
    with ckpt.open(dst) as c:
        assert torch.equal(c.read("model.w", like="torch"), state["model"]["w"])
    back = {"model": {"w": torch.zeros(5, 3), "b": torch.zeros(4, dtype=torch.int32)},
            "epoch": 0, "sched": {"milestones": []}}
    dcp.load(back, storage_reader=ckpt.torch.StorageReader(dst), no_dist=True)
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and back["epoch"] == 7
    assert back["sched"]["milestones"] == [1, 2]
    exported = os.path.join(tmp, "exported")
    assert convert.main(["export", dst, exported]) == 0
    again = {"model": {"w": torch.zeros(5, 3), "b": torch.zeros(4, dtype=torch.int32)},
             "epoch": 0, "sched": {"milestones": []}}
    dcp.load(again, storage_reader=dcp.FileSystemReader(exported), no_dist=True)
    assert torch.equal(again["model"]["b"], state["model"]["b"]) and again["epoch"] == 7
