"""One rank of test_dcp_scenarios.py: PyTorch's own DCP scenarios (test/distributed/checkpoint/),
re-written for gloo on CPU, run with the storage layer KIND ("stock": FileSystemWriter and
FileSystemReader; "ckpt": ckpt.torch.StorageWriter and StorageReader; "s3": ckpt.torch's on
s3:// URLs under CKPT_DCP_S3_ROOT, reached through the AWS environment, the other format's
copies staying in DIR).

    python dcp_scenarios_worker.py KIND PHASE RANK WORLD STORE DIR

PHASE "w4" (world 4) runs the scenarios of SAME_WORLD one after the other in one process group
and then saves DIR/ws4; "w2" and "w3" load the checkpoints of the larger and smaller worlds
saved before (and DIR/ws4x, the other format's copy of DIR/ws4 that the test converted) and save
DIR/ws<world>; "back" (world 4) loads DIR/ws2 and DIR/ws3. Each scenario prints
"SCENARIO <name> ok" (or "skip: why") on every rank; any failure exits non-zero.
CKPT_DCP_SCENARIOS=name,name runs only those (debugging).

Every tensor holds ref(key): values fixed by its key alone, so a load at any layout is checked
against the whole tensor (DTensor.full_tensor()) bit for bit.
"""
import io
import os
import sys
import zlib

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import ckpt.torch

KIND = RANK = WORLD = OUT = None


def path_of(name):
    return f"{os.environ['CKPT_DCP_S3_ROOT']}/{name}" if KIND == "s3" else os.path.join(OUT, name)


def exists(name):
    """Whether a checkpoint (or, locally, anything) is at path_of(name)."""
    if KIND != "s3":
        return os.path.exists(path_of(name))
    try:
        ckpt.read_metadata(path_of(name))
        return True
    except ckpt.Error as e:
        if e.code != "not found":
            raise
        return False


def writer(name, **kw):
    p = path_of(name)
    return dcp.FileSystemWriter(p, **kw) if KIND == "stock" else ckpt.torch.StorageWriter(p, **kw)


def reader(name, other=False):
    if (KIND == "stock") != other:
        return dcp.FileSystemReader(os.path.join(OUT, name))  # the other format's copy: local
    return ckpt.torch.StorageReader(path_of(name))


def ref(key, shape, dtype=torch.float32):
    """The whole tensor `key` holds: a function of the key and the element index."""
    base = zlib.crc32(key.encode()) % 997
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64) * 0.25 + base).reshape(tuple(shape)).to(dtype)


def flat(d, prefix=""):
    out = {}
    items = d.items() if isinstance(d, dict) else enumerate(d)
    for k, v in items:
        if isinstance(v, (dict, list)) and v and not isinstance(v, str):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[prefix + str(k)] = v
    return out


def whole(v):
    return v.full_tensor() if isinstance(v, DTensor) else v


def fill(state, salt=""):
    """Every tensor of `state` (this rank's part of it) set to its region of ref(salt + key)."""
    for key, v in flat(state).items():
        if isinstance(v, DTensor):
            want = distribute_tensor(ref(salt + key, v.shape, v.dtype), v.device_mesh, v.placements)
            v.to_local().copy_(want.to_local())
        elif isinstance(v, torch.Tensor):
            v.copy_(ref(salt + key, v.shape, v.dtype))


def check(state, salt="", where="", keys=None):
    """Every tensor of `state` is ref(salt + key), whole; returns how many were checked."""
    n = 0
    for key, v in flat(state).items():
        if isinstance(v, torch.Tensor) and (keys is None or key in keys):
            got = whole(v)
            assert torch.equal(got, ref(salt + key, got.shape, got.dtype)), (where, key)
            n += 1
    assert n, (where, "no tensor checked")
    return n


def model_on(mesh, seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))
    if mesh is not None:
        fully_shard(m[0], mesh=mesh)
        fully_shard(m[2], mesh=mesh)
        fully_shard(m, mesh=mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    for p in m.parameters():
        p.grad = torch.ones_like(p) * 0.1
    opt.step()  # AdamW's state exists
    opt.zero_grad()
    return m, opt


def train_state(model, opt, salt=""):
    """{"model", "optim"} of get_state_dict, every tensor set to ref(salt + key)."""
    msd, osd = get_state_dict(model, opt)
    sd = {"model": msd, "optim": osd}
    fill(sd, salt)
    return sd


def expect_failure(fn, *needles):
    try:
        fn()
    except CheckpointException as e:
        text = str(e).lower()
        assert any(n.lower() in text for n in needles), text
        return
    raise AssertionError(f"expected a CheckpointException naming one of {needles}")


# ---------------------------------------------------------------- scenarios at one world size

def layouts():
    """(mesh, placements) on a 1-D mesh of 4 and a 2-D mesh of 2 x 2 (test_dtensor_resharding)."""
    m1 = init_device_mesh("cpu", (WORLD,))
    m2 = init_device_mesh("cpu", (2, WORLD // 2))
    return [(m1, [Shard(0)]), (m1, [Shard(1)]), (m1, [Replicate()]),
            (m2, [Replicate(), Replicate()]), (m2, [Replicate(), Shard(0)]), (m2, [Shard(0), Replicate()]),
            (m2, [Shard(0), Shard(0)]), (m2, [Shard(0), Shard(1)]), (m2, [Shard(1), Shard(0)])]


DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.float16]


def resharding():
    """Each of 9 layouts (Shard/Replicate on 1-D and 2-D meshes; 6 x 5, so that shards are
    uneven) saved once, loaded into every other layout."""
    ls = layouts()
    shape = (6, 5)
    saved = {}
    for i, (mesh, pl) in enumerate(ls):
        key = f"t{i}"
        saved[key] = distribute_tensor(ref(key, shape, DTYPES[i % len(DTYPES)]), mesh, pl)
    dcp.save(saved, storage_writer=writer("reshard"))
    for shift in range(1, len(ls)):
        target = {}
        for i in range(len(ls)):
            mesh, pl = ls[(i + shift) % len(ls)]
            target[f"t{i}"] = distribute_tensor(torch.zeros(shape, dtype=DTYPES[i % len(DTYPES)]), mesh, pl)
        dcp.load(target, storage_reader=reader("reshard"))
        assert check(target, where=f"shift {shift}") == len(ls)
        for i in range(len(ls)):
            assert target[f"t{i}"].placements == tuple(ls[(i + shift) % len(ls)][1])


def fsdp2():
    """FSDP2 model + AdamW through get_state_dict / dcp.save / dcp.load / set_state_dict."""
    mesh = init_device_mesh("cpu", (WORLD,))
    m, opt = model_on(mesh)
    sd = train_state(m, opt)
    assert isinstance(sd["model"]["0.weight"], DTensor)
    dcp.save(sd, storage_writer=writer("fsdp2"))
    m2, opt2 = model_on(mesh, seed=1)
    sd2 = train_state(m2, opt2, salt="other")
    dcp.load(sd2, storage_reader=reader("fsdp2"))
    set_state_dict(m2, opt2, model_state_dict=sd2["model"], optim_state_dict=sd2["optim"])
    msd, osd = get_state_dict(m2, opt2)
    check({"model": msd, "optim": osd}, where="fsdp2 after set_state_dict")
    assert osd["param_groups"][0]["lr"] == 0.01


def partial_loads():
    """Part of the fsdp2 checkpoint: the model alone, one key, keys by prefix through
    _load_state_dict_from_keys, and a key the checkpoint lacks (allow_partial_load)."""
    mesh = init_device_mesh("cpu", (WORLD,))
    m, opt = model_on(mesh, seed=2)
    sd = train_state(m, opt, salt="other")
    only_model = {"model": sd["model"]}
    dcp.load(only_model, storage_reader=reader("fsdp2"))
    check(only_model, where="model alone")
    check({"optim": sd["optim"]}, salt="other", where="optimizer untouched")
    one = {"model": {"2.bias": torch.zeros(3)}}
    dcp.load(one, storage_reader=reader("fsdp2"))
    check(one, where="one key")
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    got = _load_state_dict_from_keys("optim.state", storage_reader=reader("fsdp2"))
    assert set(got) == {"optim"} and set(got["optim"]) == {"state"}, got.keys()
    assert check(got, where="optim.state from keys") == 12  # exp_avg, exp_avg_sq, step of 4 parameters
    extra = {"model": {"2.bias": torch.zeros(3), "absent": torch.full((2,), 7.0)}}
    expect_failure(lambda: dcp.load(extra, storage_reader=reader("fsdp2")), "absent", "missing")
    dcp.load(extra, storage_reader=reader("fsdp2"), planner=DefaultLoadPlanner(allow_partial_load=True))
    check(extra, where="allow_partial_load", keys={"model.2.bias"})
    assert torch.equal(extra["model"]["absent"], torch.full((2,), 7.0))


def hsdp():
    """HSDP (fully_shard on a 2 x 2 mesh: replicate x shard) saved; loaded into HSDP and into
    FSDP2 on a 1-D mesh of 4; the FSDP2 checkpoint loaded into HSDP."""
    mesh2 = init_device_mesh("cpu", (2, WORLD // 2), mesh_dim_names=("replicate", "shard"))
    m, opt = model_on(mesh2)
    sd = train_state(m, opt, salt="hsdp")
    assert sd["model"]["0.weight"].placements == (Replicate(), Shard(0))
    dcp.save(sd, storage_writer=writer("hsdp"))
    for mesh, name, salt in ((mesh2, "hsdp", "hsdp"), (init_device_mesh("cpu", (WORLD,)), "hsdp", "hsdp"),
                             (mesh2, "fsdp2", "")):
        m2, opt2 = model_on(mesh, seed=3)
        sd2 = train_state(m2, opt2, salt="other")
        dcp.load(sd2, storage_reader=reader(name))
        set_state_dict(m2, opt2, model_state_dict=sd2["model"], optim_state_dict=sd2["optim"])
        msd, osd = get_state_dict(m2, opt2)
        check({"model": msd, "optim": osd}, salt=salt, where=f"{name} into mesh {tuple(mesh.shape)}")


class TrainState(Stateful):
    """As e2e/test_e2e_save_and_load's: tensors and a BytesIO of torch.save'd losses."""

    def __init__(self, step=0, losses=()):
        self.step, self.losses, self.loaded = step, list(losses), False

    def state_dict(self):
        buf = io.BytesIO()
        torch.save(self.losses, buf)
        return {"step": torch.tensor(self.step, dtype=torch.int32), "losses": buf}

    def load_state_dict(self, sd):
        self.step = int(sd["step"])
        sd["losses"].seek(0)
        self.losses = torch.load(sd["losses"], weights_only=True)
        self.loaded = True


class AppState(Stateful):
    """DCP's documented pattern: model and optimizer behind get_state_dict / set_state_dict."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def state_dict(self):
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, sd):
        set_state_dict(self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def stateful():
    """Stateful objects loaded in place (never replaced in the dict), with the state dict's keys
    in another order on every other rank (test_different_ordered_state_dict_keys)."""
    mesh = init_device_mesh("cpu", (WORLD,))
    m, opt = model_on(mesh)
    fill(AppState(m, opt).state_dict(), salt="app")  # the model's own tensors, through the views
    items = [("app", AppState(m, opt)), ("train", TrainState(7, [0.5, 0.25, 1.0]))]
    sd = dict(items if RANK % 2 else reversed(items))
    dcp.save(sd, storage_writer=writer("stateful"))
    m2, opt2 = model_on(mesh, seed=4)
    app, ts = AppState(m2, opt2), TrainState()
    sd2 = {"app": app, "train": ts}
    dcp.load(sd2, storage_reader=reader("stateful"))
    assert sd2["app"] is app and sd2["train"] is ts and ts.loaded
    assert ts.step == 7 and ts.losses == [0.5, 0.25, 1.0], (ts.step, ts.losses)
    check(app.state_dict(), salt="app", where="stateful model and optimizer")


NON_TENSOR = {"epoch": 3, "lr": 0.125, "name": "run-\u00e9", "flags": [True, None, "x"],
              "sched": {"milestones": [1, 2], "gamma": 0.5}, "size": torch.Size([2, 3]), "dtype": torch.bfloat16,
              "pair": (1, "a"), "nothing": None, "big": 2 ** 40}


def non_tensor():
    """Numbers, strings, lists, tuples, None, nested dicts, torch.Size and dtypes beside tensors."""
    state = {"t": torch.arange(4.0), "meta": dict(NON_TENSOR)}
    dcp.save(state, storage_writer=writer("non_tensor"))
    blank = {"t": torch.zeros(4), "meta": {k: None for k in NON_TENSOR}}
    blank["meta"]["sched"] = {"milestones": None, "gamma": None}
    dcp.load(blank, storage_reader=reader("non_tensor"))
    assert torch.equal(blank["t"], torch.arange(4.0))
    got = blank["meta"]
    for k, v in NON_TENSOR.items():
        assert got[k] == v and type(got[k]) is type(v), (k, got[k], v)


def async_save(kind):
    """dcp.async_save with the THREAD or PROCESS executor: the state is staged before it
    returns (changing the tensors then changes nothing saved), the future completes, the
    checkpoint loads; then a second async save to another path."""
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    executor = getattr(AsyncCheckpointerType, kind, None)
    if executor is None:
        return f"skip: torch {torch.__version__} has no AsyncCheckpointerType.{kind}"
    mesh = init_device_mesh("cpu", (WORLD,))
    m, opt = model_on(mesh)
    sd = train_state(m, opt, salt=kind)
    sd["meta"] = {"step": 11}
    name = f"async_{kind.lower()}"
    for i in range(2):
        # (e2e's cache_staged_state_dict=True is left out: FileSystemWriter then stages into
        # pinned memory, which needs CUDA.)
        res = dcp.async_save(sd, storage_writer=writer(f"{name}{i}"), async_checkpointer_type=executor)
        fut = getattr(res, "upload_completion", res)
        for v in flat(sd).values():
            if isinstance(v, torch.Tensor):
                (v.to_local() if isinstance(v, DTensor) else v).add_(1000)  # after staging: not saved
        fut.result(timeout=300)
        fill(sd, salt=kind)
    for i in range(2):
        m2, opt2 = model_on(mesh, seed=5)
        sd2 = train_state(m2, opt2, salt="other")
        sd2["meta"] = {"step": 0}
        dcp.load(sd2, storage_reader=reader(f"{name}{i}"))
        check(sd2, salt=kind, where=name)
        assert sd2["meta"]["step"] == 11


def planners():
    """Every option of DefaultSavePlanner and DefaultLoadPlanner, on DTensors, a replicated
    plain tensor and non-tensor values."""
    mesh = init_device_mesh("cpu", (WORLD,))

    def state(salt):
        s = {"d": distribute_tensor(ref(salt + "d", (8, 3)), mesh, [Shard(0)]),
             "r": {"plain": ref(salt + "r.plain", (5,)), "rep": distribute_tensor(ref(salt + "r.rep", (3,)), mesh,
                                                                                   [Replicate()])},
             "n": {"epoch": len(salt)}}
        return s

    def blank():
        return {"d": distribute_tensor(torch.zeros(8, 3), mesh, [Shard(0)]),
                "r": {"plain": torch.zeros(5), "rep": distribute_tensor(torch.zeros(3), mesh, [Replicate()])},
                "n": {"epoch": -1}}

    def round_trip(name, salt, save_planner, load_planner=None):
        dcp.save(state(salt), storage_writer=writer(name), planner=save_planner)
        got = blank()
        dcp.load(got, storage_reader=reader(name), planner=load_planner)
        d = {k: v for k, v in flat(got).items() if isinstance(v, torch.Tensor)}
        for key, v in d.items():
            assert torch.equal(whole(v), ref(salt + key, v.shape)), (name, key)
        assert got["n"]["epoch"] == len(salt), (name, got["n"])

    round_trip("plan_nodedup", "a", DefaultSavePlanner(dedup_replicated_tensors=False))
    round_trip("plan_dedup", "bb", DefaultSavePlanner(dedup_replicated_tensors=True))
    round_trip("plan_lowest", "ccc", DefaultSavePlanner(dedup_save_to_lowest_rank=True))
    round_trip("plan_noflat", "dddd", DefaultSavePlanner(flatten_state_dict=False, flatten_sharded_tensors=False),
               DefaultLoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False))
    round_trip("plan_flat", "eeeee", DefaultSavePlanner(flatten_state_dict=True),
               DefaultLoadPlanner(flatten_state_dict=True))
    # Plan caching: the same planner settings three times, the values changed in between.
    for i, salt in enumerate(("f", "gg", "hhh")):
        round_trip(f"plan_cache{i}", salt, DefaultSavePlanner(enable_plan_caching=True))
    for salt in ("i", "jj"):  # and again into one path, overwritten
        round_trip("plan_cache_same", salt, DefaultSavePlanner(enable_plan_caching=True))


def overwrite():
    """A re-save to the same path replaces the checkpoint (the default, as FileSystemWriter);
    overwrite=False refuses it; a load sees the latest, and no key of the one replaced."""
    t1, t2 = ref("o1", (10,)), ref("o2", (10,))
    dcp.save({"random": t1}, storage_writer=writer("overwrite"))
    dcp.save({"random": t2}, storage_writer=writer("overwrite"))
    dcp.save({"random": t2}, storage_writer=writer("overwrite", overwrite=True))
    got = {"random": torch.zeros(10)}
    dcp.load(got, storage_reader=reader("overwrite"))
    assert torch.equal(got["random"], t2)
    expect_failure(lambda: dcp.save({"random": t1}, storage_writer=writer("overwrite", overwrite=False)),
                   "already exists")
    got = {"random": torch.zeros(10)}
    dcp.load(got, storage_reader=reader("overwrite"))
    assert torch.equal(got["random"], t2)
    # A re-save of other keys: the old ones are gone, not left behind.
    dcp.save({"other": t1}, storage_writer=writer("overwrite"))
    expect_failure(lambda: dcp.load({"random": torch.zeros(10)}, storage_reader=reader("overwrite")),
                   "random", "missing")
    got = {"other": torch.zeros(10)}
    dcp.load(got, storage_reader=reader("overwrite"))
    assert torch.equal(got["other"], t1)


def no_dist():
    """dcp.save / dcp.load with no_dist=True by one rank of an initialised group, the others
    elsewhere; then every rank loads it alone."""
    state = {"w": ref("nd.w", (4, 3)), "meta": {"by": RANK}}
    if RANK == 0:
        dcp.save(state, storage_writer=writer("no_dist"), no_dist=True)
    dist.barrier()
    got = {"w": torch.zeros(4, 3), "meta": {"by": -1}}
    dcp.load(got, storage_reader=reader("no_dist"), no_dist=True)
    assert torch.equal(got["w"], state["w"]) and got["meta"]["by"] == 0
    dist.barrier()


def edge_cases():
    """An empty state dict (test_no_dist); checkpoint_id naming the path (given to a writer
    and reader made for another); a 0-d, an empty, a non-contiguous and a bool tensor; the
    whole checkpoint loaded without a state dict (_load_state_dict_from_keys())."""
    dcp.save({}, storage_writer=writer("empty"))
    dcp.load({}, storage_reader=reader("empty"))
    odd = {"s": torch.tensor(3.5), "z": torch.zeros(0, 4), "nc": ref("nc", (3, 4)).t(),
           "b": torch.tensor([True, False, True]), "meta": {"k": "v"}}
    dcp.save(odd, storage_writer=writer("unused"), checkpoint_id=path_of("edges"))
    assert not exists("unused") and exists("edges")
    got = {"s": torch.tensor(0.0), "z": torch.ones(0, 4), "nc": torch.zeros(4, 3),
           "b": torch.zeros(3, dtype=torch.bool), "meta": {"k": None}}
    dcp.load(got, storage_reader=reader("unused"), checkpoint_id=path_of("edges"))
    for k in ("s", "z", "nc", "b"):
        assert got[k].dtype == odd[k].dtype and torch.equal(got[k], odd[k]), k
    assert got["meta"] == {"k": "v"}
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    everything = _load_state_dict_from_keys(storage_reader=reader("edges"))
    assert set(everything) == {"s", "z", "nc", "b", "meta"} and everything["meta"] == {"k": "v"}, everything
    assert torch.equal(everything["nc"], odd["nc"])


SAME_WORLD = [("resharding", resharding), ("fsdp2", fsdp2), ("partial_loads", partial_loads), ("hsdp", hsdp),
              ("stateful", stateful), ("non_tensor", non_tensor), ("planners", planners),
              ("overwrite", overwrite), ("no_dist", no_dist), ("edge_cases", edge_cases),
              ("async_thread", lambda: async_save("THREAD")), ("async_process", lambda: async_save("PROCESS"))]


# ------------------------------------------------------------------------- world-size changes

def ws_state(salt):
    """At this world size: an HSDP (world 4) or FSDP2 model + AdamW, a DTensor on a 1-D mesh,
    one on a 2-D mesh (2 x world/2, or world x 1), a plain tensor and non-tensor values."""
    mesh = init_device_mesh("cpu", (WORLD,))
    # At 4 the model is HSDP (2 x 2: replicate x shard), elsewhere FSDP2 on all ranks.
    hsdp_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")) if WORLD == 4 else None
    m, opt = model_on(mesh if hsdp_mesh is None else hsdp_mesh, seed=6)
    sd = train_state(m, opt, salt=salt)
    grid = init_device_mesh("cpu", (2, WORLD // 2) if WORLD % 2 == 0 else (WORLD, 1))
    sd["vec"] = distribute_tensor(torch.zeros(7, 3), mesh, [Shard(0)])
    sd["grid"] = distribute_tensor(torch.zeros(5, 6, dtype=torch.bfloat16), grid, [Shard(0), Shard(1)])
    sd["plain"] = torch.zeros(3, dtype=torch.int64)
    fill(sd, salt)
    sd["meta"] = {"world": WORLD, "tag": salt}
    return m, opt, sd


def ws_load(name, other=False):
    m, opt, sd = ws_state("other")
    sd["meta"] = {"world": 0, "tag": ""}
    dcp.load(sd, storage_reader=reader(name, other))
    set_state_dict(m, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    msd, osd = get_state_dict(m, opt)
    sd["model"], sd["optim"] = msd, osd
    saved_world = int(name[2:3])
    check(sd, salt="ws", where=f"{name} at world {WORLD}")
    assert sd["meta"] == {"world": saved_world, "tag": "ws"}, sd["meta"]


def ws_save():
    _, _, sd = ws_state("ws")
    dcp.save(sd, storage_writer=writer(f"ws{WORLD}"))


PHASES = {
    "w4": SAME_WORLD + [("save_at_4", ws_save)],
    "w2": [("load_4_at_2", lambda: ws_load("ws4")), ("load_converted_4_at_2", lambda: ws_load("ws4x", other=True)),
           ("save_at_2", ws_save)],
    "w3": [("load_4_at_3", lambda: ws_load("ws4")), ("load_2_at_3", lambda: ws_load("ws2")),
           ("save_at_3", ws_save)],
    "back": [("load_2_at_4", lambda: ws_load("ws2")), ("load_3_at_4", lambda: ws_load("ws3"))],
}


def main():
    global KIND, RANK, WORLD, OUT
    KIND, phase, RANK, WORLD, store, OUT = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
        sys.argv[5], sys.argv[6]
    torch.set_num_threads(1)
    # The PROCESS executor's background processes meet at MASTER_ADDR (else this host's fully
    # qualified name, which a machine without DNS may not resolve).
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=RANK, world_size=WORLD)
    only = os.environ.get("CKPT_DCP_SCENARIOS")  # debugging: a comma-separated subset
    try:
        for name, fn in PHASES[phase]:
            if only and name not in only.split(","):
                continue
            try:
                outcome = fn() or "ok"
            except BaseException:
                print(f"SCENARIO {name} FAILED (rank {RANK})", flush=True)
                raise
            print(f"SCENARIO {name} {outcome}", flush=True)
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
