"""One rank of a torch.distributed.checkpoint scenario (test_dcp.py starts WORLD of them).

    python dcp_worker.py SCENARIO RANK WORLD STORE DIR

Scenarios (gloo, CPU):
  fsdp_save     FSDP2 (fully_shard) model + AdamW state -> dcp.save through ckpt.torch into
                DIR/dcp; the model's DTensors also through ckpt.save (DIR/direct)
  fsdp_load     a fresh FSDP2 model at this world size <- dcp.load of DIR/dcp; checked
  tp_fsdp_save  tensor parallel (2 ranks) x FSDP2 (WORLD/2) on a 2-D mesh -> DIR/dcp
  tp_load       a fresh tensor-parallel model at this world size <- dcp.load; checked
Every tensor (parameters, AdamW's exp_avg, exp_avg_sq and step) is set to pattern(key):
values fixed by the key and the global element index, so that each rank's shard has a
known value whatever the layout, and every check compares shards bit for bit with the same
region of it. The non-tensor values (param_groups) come from reference(), unsharded.
"""
import math
import os
import sys
import zlib

import torch
import torch.nn as nn

SEED = 1234


def build_model(seed=SEED):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def take_step(model, opt):
    """One optimizer step with gradients made from the parameters (no forward, no
    collectives), which creates AdamW's state."""
    for p in model.parameters():
        p.grad = p.detach() * 0.5 + 0.01
    opt.step()


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=0.1)


def reference():
    """(model, optimizer) unsharded, with optimizer state: the keys and non-tensor values of
    every scenario's state."""
    model = build_model()
    opt = make_optimizer(model)
    take_step(model, opt)
    return model, opt


def pattern(key, shape, dtype, salt=0):
    """The full tensor `key` holds: a function of the key and the element index only."""
    base = zlib.crc32(key.encode()) % 1000 + salt * 7919
    n = math.prod(shape)
    return (torch.arange(n, dtype=torch.float64) * 0.001 + base).reshape(tuple(shape)).to(dtype)


def fill(state, salt=0):
    """Sets every tensor of `state` (this rank's shard of it) to its region of pattern()."""
    for key, value in flat(state).items():
        if isinstance(value, torch.Tensor):
            local, region = local_region(value)
            local.copy_(pattern(key, value.shape, value.dtype, salt)[region])


def state_dicts(model, opt):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "step": 5}


def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out.update(flat({str(i): x for i, x in enumerate(v)}, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def local_region(value):
    """(local tensor, slices into the global tensor) of a DTensor or plain tensor."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    if not isinstance(value, DTensor):
        return value, tuple(slice(None) for _ in value.shape)
    shape, offsets = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
    return value.to_local(), tuple(slice(o, o + n) for o, n in zip(offsets, shape))


def check(state, ref_state, where):
    """`state` has the keys and non-tensor values of `ref_state`, and every tensor (this
    rank's shard of it) is its region of pattern(), bit for bit."""
    got, want = flat(state), flat(ref_state)
    assert set(got) == set(want), (where, sorted(set(got) ^ set(want)))
    checked = 0
    for key, value in got.items():
        if isinstance(value, torch.Tensor):
            local, region = local_region(value)
            expect = pattern(key, value.shape, want[key].dtype)[region]
            assert list(value.shape) == list(want[key].shape), (where, key)
            assert local.dtype == expect.dtype and torch.equal(local, expect), (where, key)
            checked += 1
        elif key != "step":
            assert value == want[key], (where, key, value, want[key])
    assert checked >= 8, (where, checked)


def main():
    scenario, rank, world, store, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    torch.set_num_threads(1)
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import ckpt
    import ckpt.torch

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        ref_model, ref_opt = reference()
        ref = state_dicts(ref_model, ref_opt)
        if scenario in ("fsdp_save", "fsdp_load"):
            mesh = init_device_mesh("cpu", (world,))
            model = build_model()
            fully_shard(model[0], mesh=mesh)
            fully_shard(model[2], mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            if scenario == "tp_fsdp_save":
                mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
                tp_mesh = mesh["tp"]
            else:
                tp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
            model = build_model()
            parallelize_module(model, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
            if scenario == "tp_fsdp_save":
                fully_shard(model, mesh=mesh["dp"])
        opt = make_optimizer(model)
        take_step(model, opt)  # creates the optimizer state
        state = state_dicts(model, opt)
        if scenario.endswith("_save"):
            fill(state)
            check(state, ref, f"rank {rank} before save")
            dcp.save(state, storage_writer=ckpt.torch.StorageWriter(os.path.join(out, "dcp")))
            if scenario == "fsdp_save":  # the DTensors through ckpt.save itself, over gloo
                ckpt.save(os.path.join(out, "direct"), state["model"], comm=dist.group.WORLD)
        else:
            # Other values everywhere first, so that a load that did nothing is caught.
            fill(state, salt=1)
            state["step"] = 0
            dcp.load(state, storage_reader=ckpt.torch.StorageReader(os.path.join(out, "dcp")))
            assert state["step"] == 5, state["step"]
            check(state, ref, f"rank {rank} after dcp.load")
            from torch.distributed.checkpoint.state_dict import set_state_dict
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            check(state_dicts(model, opt), ref, f"rank {rank} in the model and optimizer")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    print(f"rank {rank}: {scenario} ok")


if __name__ == "__main__":
    main()
