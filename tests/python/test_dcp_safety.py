"""ckpt.torch as a safe drop-in for DCP's storage layer (issues 27 and 28):
  - a verified checkpoint runs no code: a crafted pickle in a bytes entry is refused, naming
    the key, through every Python entry point (dcp.load, DCP's load-from-keys, ckpt.convert,
    ckpt.torch.unpickle), and loads (runs) only with allow_pickle=True;
  - every ckpt.Error pickles with its code, message, file and key, and a failure on one rank
    of 2 and of 4 makes every rank raise CheckpointException naming it, within seconds;
  - DCP's planner options (plan caching, flattening, dedup, partial loads) save and load
    every key, and a plan that leaves a key out is refused, never committed;
  - FileSystemWriter's defaults: a re-save overwrites (overwrite=False refuses), no_dist=True
    on one rank of an initialised group completes, FileSystemWriter's arguments are taken."""
import builtins
import io
import os
import pickle
import uuid

import pytest

import ckpt
from conftest import run_ranks, run_tool

if os.environ.get("CKPT_REQUIRE_TORCH"):
    import torch  # scripts/test.sh's venv has torch: a missing one is a failure there
else:
    torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner  # noqa: E402

import ckpt.torch  # noqa: E402
from ckpt import convert  # noqa: E402

HERE = os.path.dirname(__file__)


class Payload:
    """Unpickled, creates the file `marker` (builtins.open): proof that a load ran it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


def torch_pickle(value):
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def crafted_checkpoint(tmp, marker):
    """A checkpoint dcp.save wrote through ckpt.torch, rewritten (as an attacker would, with
    ckpt.Writer: every checksum and digest consistent) with bytes entry "meta.payload"
    replaced by a pickle that creates `marker`. ckpt-verify passes it."""
    src = os.path.join(tmp, "honest")
    dcp.save({"w": torch.arange(6.0), "meta": {"payload": 1, "epoch": 3}},
             storage_writer=ckpt.torch.StorageWriter(src), no_dist=True)
    dst = os.path.join(tmp, "crafted")
    with ckpt.open(src) as c, ckpt.Writer(dst, user_metadata=c.user_metadata) as w:
        assert "meta.payload" in c.user_metadata[ckpt.torch.USER_KEY]["pickled"]
        for key in c.keys():
            value = c.read(key, like="torch") if c.entry(key)["kind"] == "tensor" else c.read(key)
            w.write(key, torch_pickle(Payload(marker)) if key == "meta.payload" else value)
    rc, out = run_tool("ckpt-verify", dst)
    assert rc == 0, out
    assert not os.path.exists(marker)
    return dst


def names_key(exc, key="meta.payload"):
    text = str(exc)
    assert f"'{key}'" in text and "allow_pickle" in text, text


def test_crafted_pickle_runs_nothing_through_any_entry_point(tmp):
    marker = os.path.join(tmp, "pwned")
    path = crafted_checkpoint(tmp, marker)

    # dcp.load through ckpt.torch.StorageReader: refused, naming the key.
    state = {"w": torch.zeros(6), "meta": {"payload": None, "epoch": 0}}
    with pytest.raises(CheckpointException) as e:
        dcp.load(state, storage_reader=ckpt.torch.StorageReader(path), no_dist=True)
    names_key(e.value)
    err = next(iter(e.value.failures.values()))[0]
    assert isinstance(err, ckpt.Error) and err.code == "unsupported" and err.key == "meta.payload"
    # Loading only the keys that are safe works.
    part = {"w": torch.zeros(6), "meta": {"epoch": 0}}
    dcp.load(part, storage_reader=ckpt.torch.StorageReader(path), no_dist=True)
    assert part["meta"]["epoch"] == 3 and torch.equal(part["w"], torch.arange(6.0))
    # DCP's load of everything (its own planner, which torch.load(weights_only=False)s).
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    with pytest.raises(CheckpointException) as e:
        _load_state_dict_from_keys(storage_reader=ckpt.torch.StorageReader(path))
    names_key(e.value)
    # ckpt.convert export (dcp.load through StorageReader, then FileSystemWriter).
    out = os.path.join(tmp, "exported")
    assert convert.main(["export", path, out]) == 1
    # The helper, as a user reading a bytes entry with ckpt.open would call it.
    with ckpt.open(path) as c:
        data = c.read("meta.payload")
    with pytest.raises(ckpt.Error) as e:
        ckpt.torch.unpickle(data, key="meta.payload", file=path)
    names_key(e.value)
    assert e.value.file == path
    # ckpt.load and ckpt.open hand the bytes back as bytes, unpickled.
    got = {"meta": {"payload": b""}}
    ckpt.load(path, got, strict=False)
    assert got["meta"]["payload"] == data
    assert not os.path.exists(marker), "a refused pickle ran"

    # allow_pickle=True runs it: the payload is real.
    state = {"w": torch.zeros(6), "meta": {"payload": None, "epoch": 0}}
    dcp.load(state, storage_reader=ckpt.torch.StorageReader(path, allow_pickle=True), no_dist=True)
    assert os.path.exists(marker)
    os.remove(marker)
    ckpt.torch.unpickle(data, allow_pickle=True)
    assert os.path.exists(marker)
    os.remove(marker)
    convert.main(["export", path, os.path.join(tmp, "exported2"), "--allow-pickle"])  # (the file object
    assert os.path.exists(marker)  # the payload made cannot be saved: the run is the proof)


def test_convert_import_never_unpickles_a_dcp_directory(tmp):
    marker = os.path.join(tmp, "pwned")
    src = os.path.join(tmp, "dcp-native")
    # Stock DCP pickles the payload object as it is, into its .distcp file.
    dcp.save({"w": torch.ones(3), "meta": {"payload": Payload(marker)}},
             storage_writer=dcp.FileSystemWriter(src), no_dist=True)
    dst = os.path.join(tmp, "imported")
    assert convert.main(["import", src, dst]) == 0
    assert not os.path.exists(marker), "import ran the pickle"
    with pytest.raises(CheckpointException) as e:
        dcp.load({"meta": {"payload": None}}, storage_reader=ckpt.torch.StorageReader(dst), no_dist=True)
    names_key(e.value)
    assert not os.path.exists(marker)
    # DCP's own .metadata is a pickle too: a crafted one is refused, not run.
    with open(os.path.join(src, ".metadata"), "wb") as f:
        pickle.dump(Payload(marker), f)
    assert convert.main(["import", src, os.path.join(tmp, "imported2")]) == 1
    assert not os.path.exists(marker), "import ran .metadata's pickle"
    with open(os.path.join(src, ".metadata"), "rb") as f:
        pickle.load(f).close()  # noqa: S301 (the proof that the payload is real)
    assert os.path.exists(marker)


def test_safe_non_tensor_values_load(tmp):
    path = os.path.join(tmp, "c")
    values = {"i": 3, "f": 0.5, "s": "x", "b": b"y", "n": None, "t": True, "l": [1, (2, "3")],
              "d": {"k": {1, 2}}, "size": torch.Size([2, 3]), "bio": io.BytesIO(b"abc"), "fs": frozenset({1}),
              "dt": torch.bfloat16}
    dcp.save({"w": torch.ones(2), "v": values}, storage_writer=ckpt.torch.StorageWriter(path), no_dist=True)
    back = {"w": torch.zeros(2), "v": {k: {"k": None} if k == "d" else None for k in values}}
    dcp.load(back, storage_reader=ckpt.torch.StorageReader(path), no_dist=True)
    bio = back["v"].pop("bio")
    assert bio.getvalue() == b"abc"
    assert back["v"] == {k: v for k, v in values.items() if k != "bio"}


def test_errors_pickle_with_code_message_file_and_key():
    for code in ckpt.errors.CODES:
        e = ckpt.Error(code, f"/x/c: key 'k.{code}' bad", "/x/c", f"k.{code}")
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is ckpt.Error
        assert (back.code, back.message, back.file, back.key) == (e.code, e.message, e.file, e.key)
        assert str(back) == str(e)
    # One from libckpt itself.
    with pytest.raises(ckpt.Error) as got:
        ckpt.open("/nonexistent/ckpt-dir")
    back = pickle.loads(pickle.dumps(got.value))
    assert (back.code, back.message, back.file, back.key) == (got.value.code, got.value.message, got.value.file,
                                                              got.value.key)


def launch(world, out, timeout=240):
    """`world` ranks of dcp_fail_worker.py; fails with their output if any fails or hangs."""
    store = os.path.join(out, f"store-{uuid.uuid4().hex}")
    return run_ranks(os.path.join(HERE, "dcp_fail_worker.py"), lambda r: (r, world, store, out), world,
                     "failure scenarios", timeout)


@pytest.mark.parametrize("world", [2, 4])
def test_a_failure_on_one_rank_fails_every_rank_fast(tmp, world):
    crafted = crafted_checkpoint(tmp, os.path.join(tmp, "pwned"))
    os.rename(crafted, os.path.join(tmp, "evil"))
    outputs = launch(world, tmp)
    for r, text in enumerate(outputs):
        print(text)
        assert f"rank {r}: ok" in text


def test_plan_caching_saves_every_tensor_each_time(tmp):
    planner = DefaultSavePlanner(enable_plan_caching=True)
    for step in range(3):
        path = os.path.join(tmp, f"step-{step}")
        state = {"w": torch.full((4,), float(step)), "meta": {"step": step}}
        dcp.save(state, storage_writer=ckpt.torch.StorageWriter(path), planner=planner, no_dist=True)
        back = {"w": torch.zeros(4), "meta": {"step": -1}}
        dcp.load(back, storage_reader=ckpt.torch.StorageReader(path), no_dist=True)
        assert torch.equal(back["w"], state["w"]) and back["meta"]["step"] == step, step
    rc, out = run_tool("ckpt-verify", path)
    assert rc == 0, out


def test_a_plan_that_leaves_a_key_out_is_refused(tmp):
    class Drop(DefaultSavePlanner):
        def create_local_plan(self):
            plan = super().create_local_plan()
            return type(plan)([i for i in plan.items if i.index.fqn != "b"], planner_data=plan.planner_data)

    path = os.path.join(tmp, "c")
    with pytest.raises(CheckpointException) as e:
        dcp.save({"a": torch.ones(2), "b": torch.ones(3)}, storage_writer=ckpt.torch.StorageWriter(path),
                 planner=Drop(), no_dist=True)
    assert "key 'b'" in str(e.value)
    assert not os.path.exists(path)


@pytest.mark.parametrize("flatten", [True, False])
def test_planner_options_round_trip(tmp, flatten):
    path = os.path.join(tmp, "c")
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "opt": {"lr": 0.1, "betas": [0.9, 0.99]}, "epoch": 4}
    dcp.save(state, storage_writer=ckpt.torch.StorageWriter(path), no_dist=True,
             planner=DefaultSavePlanner(flatten_state_dict=flatten, flatten_sharded_tensors=flatten,
                                        dedup_save_to_lowest_rank=True))
    back = {"model": {"w": torch.zeros(2, 3)}, "opt": {"lr": 0.0, "betas": []}, "epoch": 0}
    dcp.load(back, storage_reader=ckpt.torch.StorageReader(path), no_dist=True,
             planner=DefaultLoadPlanner(flatten_state_dict=flatten, flatten_sharded_tensors=flatten))
    assert torch.equal(back["model"]["w"], state["model"]["w"])
    assert back["opt"] == state["opt"] and back["epoch"] == 4
    # Partial loads: keys the checkpoint lacks are left as they are with allow_partial_load.
    part = {"model": {"w": torch.zeros(2, 3)}, "extra": torch.full((2,), 5.0)}
    with pytest.raises(CheckpointException):
        dcp.load(part, storage_reader=ckpt.torch.StorageReader(path), no_dist=True)
    dcp.load(part, storage_reader=ckpt.torch.StorageReader(path), no_dist=True,
             planner=DefaultLoadPlanner(flatten_state_dict=flatten, flatten_sharded_tensors=flatten,
                                        allow_partial_load=True))
    assert torch.equal(part["model"]["w"], state["model"]["w"]) and torch.equal(part["extra"], torch.full((2,), 5.0))


def test_resave_overwrites_by_default_as_filesystemwriter(tmp):
    path = os.path.join(tmp, "c")
    for value in (1.0, 2.0):
        dcp.save({"w": torch.full((3,), value)}, storage_writer=ckpt.torch.StorageWriter(path), no_dist=True)
        back = {"w": torch.zeros(3)}
        dcp.load(back, storage_reader=ckpt.torch.StorageReader(path), no_dist=True)
        assert torch.equal(back["w"], torch.full((3,), value))
    with pytest.raises(CheckpointException) as e:
        dcp.save({"w": torch.ones(3)}, storage_writer=ckpt.torch.StorageWriter(path, overwrite=False), no_dist=True)
    assert "already exists" in str(e.value)


def test_filesystemwriter_arguments_are_taken(tmp):
    from torch.distributed.checkpoint._extension import ZStandard
    path = os.path.join(tmp, "c")
    # FileSystemWriter's positional order: path, single_file_per_rank, sync_files, thread_count,
    # per_thread_copy_ahead, cache_staged_state_dict, overwrite, _extensions.
    zstd = ZStandard.__new__(ZStandard)  # (its __init__ wants the zstandard module; ckpt compresses itself)
    w = ckpt.torch.StorageWriter(path, False, False, 4, 1 << 20, True, True, [zstd])
    assert w.overwrite and w.compression == "zstd"
    dcp.save({"w": torch.zeros(1000)}, storage_writer=w, no_dist=True)
    assert ckpt.open(path).metadata  # committed
    rc, out = run_tool("ckpt-inspect", path)
    assert rc == 0 and "compression ratio" in out, out
    dcp.load({"w": torch.ones(1000)}, storage_reader=ckpt.torch.StorageReader(path, None), no_dist=True)
    with pytest.raises(ckpt.Error):
        ckpt.torch.StorageWriter(path, _extensions=[object()])
    with pytest.raises(ckpt.Error):
        ckpt.torch.StorageWriter(path, compression="lz4")


def test_no_dist_save_on_one_rank_of_an_initialised_group(tmp):
    code = f"""
import datetime, os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import ckpt, ckpt.torch
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://{tmp}/store-nodist", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
if rank == 1:
    dcp.save({{"w": torch.full((3,), 7.0)}}, storage_writer=ckpt.torch.StorageWriter("{tmp}/solo"), no_dist=True)
    back = {{"w": torch.zeros(3)}}
    dcp.load(back, storage_reader=ckpt.torch.StorageReader("{tmp}/solo"), no_dist=True)
    assert torch.equal(back["w"], torch.full((3,), 7.0))
dist.barrier()
dist.destroy_process_group()
print("ok", rank)
"""
    script = os.path.join(tmp, "no_dist.py")
    with open(script, "w") as f:
        f.write(code)
    run_ranks(script, lambda r: (r,), 2, "no_dist", 150)
    assert ckpt.read_metadata(os.path.join(tmp, "solo"))["world_size"] == 1


def test_inspect_shows_which_entries_hold_pickles(tmp):
    import json
    path = crafted_checkpoint(tmp, os.path.join(tmp, "pwned"))
    plain = os.path.join(tmp, "plain")
    ckpt.save(plain, {"raw": b"not a pickle", "p": pickle.dumps([1, 2])})
    rc, out = run_tool("ckpt-inspect", path)
    assert rc == 0, out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("meta.", "w "))}
    assert "bytes (pickle)" in rows["meta.payload"] and "bytes (pickle)" in rows["meta.epoch"], out
    assert "pickle" not in rows["w"], out
    rc, out = run_tool("ckpt-inspect", "--json", plain)
    assert rc == 0, out
    keys = {k["key"]: k for k in json.loads(out)["keys"]}
    assert keys["p"]["pickle"] is True and keys["raw"]["pickle"] is False
