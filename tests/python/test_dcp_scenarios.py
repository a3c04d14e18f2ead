"""PyTorch's own DCP scenarios (its test/distributed/checkpoint/: resharding between placements
and meshes, world-size changes, FSDP2 and HSDP state dicts, Stateful objects, non-tensor values,
async save with thread and process executors, every planner option, overwrite, no_dist, partial
loads; edge cases: an empty state dict, checkpoint_id, 0-d and empty tensors), re-written for
gloo on CPU with at most 4 processes (dcp_scenarios_worker.py) and run twice: with DCP's
FileSystemWriter / FileSystemReader ("stock": proves the scenario) and with
ckpt.torch.StorageWriter / StorageReader ("ckpt": proves ckpt). Every checkpoint ckpt wrote then
passes ckpt-verify. DCP directories are imported into ckpt and ckpt checkpoints exported to DCP
(python -m ckpt.convert) and loaded at another world size with the other format's reader.
On s3:// (the project's gateway, s3_gateway.py) ckpt runs the scenarios whose storage calls
differ there: FSDP2, the planners with plan caching, overwrite, no_dist, edge cases and async
save at world 4, then loads at world 2 what 4 saved (resharded: HSDP and 2-D meshes of 4 into
FSDP2 and meshes of 2) and its DCP export.

One process group runs many scenarios (a launch of 4 torch processes costs seconds): world 4
runs every scenario at one world size and saves; worlds 2 and 3 load what 4 (and 2) saved and
save; world 4 loads what 2 and 3 saved."""
import os
import subprocess
import sys
import uuid

import pytest

from conftest import run_ranks, run_tool

if os.environ.get("CKPT_REQUIRE_TORCH"):
    import torch  # noqa: F401  scripts/test.sh's venv has torch: a missing one is a failure there
else:
    pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")
pytest.importorskip("torch.distributed.fsdp", reason="no FSDP2 (fully_shard)")

import dcp_scenarios_worker as worker  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dcp_scenarios_worker.py")


def launch(kind, phase, world, out, timeout=420, only=None, env=None):
    """Runs `phase` on `world` ranks (`only`: those of its scenarios); returns {scenario:
    outcome}, the same on every rank."""
    store = os.path.join(out, f"store-{phase}-{uuid.uuid4().hex}")
    env = dict(env or {}, CKPT_DCP_SCENARIOS=",".join(only)) if only else env
    outputs = run_ranks(WORKER, lambda r: (kind, phase, r, world, store, out), world, f"{kind} {phase}", timeout,
                        env)
    per_rank = [dict(line.split(" ", 2)[1:] for line in o.splitlines() if line.startswith("SCENARIO "))
                for o in outputs]
    want = [name for name, _ in worker.PHASES[phase] if not only or name in only]
    for r, got in enumerate(per_rank):
        assert list(got) == want, (r, got, outputs[r][-3000:])
    assert all(got == per_rank[0] for got in per_rank), per_rank
    return per_rank[0]


def convert(*args, env=None):
    p = subprocess.run([sys.executable, "-m", "ckpt.convert", *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})))
    assert p.returncode == 0, p.stdout + p.stderr


def ckpt_checkpoints(out):
    return sorted(d for d in (os.path.join(out, n) for n in os.listdir(out))
                  if os.path.isfile(os.path.join(d, "metadata.json")))


def dcp_directories(out):
    return sorted(d for d in (os.path.join(out, n) for n in os.listdir(out))
                  if os.path.isfile(os.path.join(d, ".metadata")))


@pytest.mark.parametrize("kind", ["stock", "ckpt"])
def test_dcp_scenarios(kind, tmp):
    outcomes = launch(kind, "w4", 4, tmp)
    # The other format's copy of the checkpoint saved at 4: a DCP directory imported into ckpt,
    # a ckpt checkpoint exported to a DCP directory; world 2 loads it with the other reader.
    src, dst = os.path.join(tmp, "ws4"), os.path.join(tmp, "ws4x")
    convert("import" if kind == "stock" else "export", src, dst)
    for phase, world in (("w2", 2), ("w3", 3), ("back", 4)):
        outcomes.update(launch(kind, phase, world, tmp))
    print(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in outcomes.items()))
    skipped = {k: v for k, v in outcomes.items() if v != "ok"}
    if kind == "ckpt":
        written = ckpt_checkpoints(tmp)
        names = {os.path.basename(d) for d in written}
        assert {"reshard", "fsdp2", "hsdp", "stateful", "ws4", "ws2", "ws3", "plan_cache2"} <= names, names
        assert [os.path.basename(d) for d in dcp_directories(tmp)] == ["ws4x"]
    else:
        written = [dst]  # the only ckpt checkpoint of the stock run: the imported one
        assert ckpt_checkpoints(tmp) == written
    for d in written:
        rc, text = run_tool("ckpt-verify", d)
        assert rc == 0, f"{d}: {text}"
    # Only the process executor may be missing (torch before AsyncCheckpointerType.PROCESS).
    assert not skipped or set(skipped) == {"async_process"}, skipped


# What runs on s3:// (each phase's scenarios, in their order): those whose storage calls
# differ there. The rest (HSDP, Stateful, non-tensor values, partial loads, and resharding's
# 9 x 9 layouts, 21 s on s3:// here against 9 s on disk) reach StorageWriter and StorageReader
# no differently from the ones kept; world 2 loading world 4's checkpoint reshards.
S3_SCENARIOS = {"w4": ["fsdp2", "planners", "overwrite", "no_dist", "edge_cases", "async_thread", "save_at_4"],
                "w2": ["load_4_at_2", "load_converted_4_at_2", "save_at_2"]}


def test_dcp_scenarios_on_s3(tmp, monkeypatch):
    import s3_gateway
    s3 = s3_gateway.client()
    bucket = s3_gateway.make_bucket(s3)
    try:
        root = f"s3://{bucket}/dcp"
        env = dict(s3_gateway.aws_env(), CKPT_DCP_S3_ROOT=root)
        outcomes = launch("s3", "w4", 4, tmp, only=S3_SCENARIOS["w4"], env=env)
        convert("export", f"{root}/ws4", os.path.join(tmp, "ws4x"), env=env)  # an s3:// source, DCP's copy local
        outcomes.update(launch("s3", "w2", 2, tmp, only=S3_SCENARIOS["w2"], env=env))
        print("s3: " + ", ".join(f"{k} {v}" for k, v in outcomes.items()))
        assert set(outcomes.values()) == {"ok"}, outcomes
        keys = s3_gateway.keys(s3, bucket, "dcp/")
        written = sorted({k.split("/")[1] for k in keys if k.endswith("/metadata.json")})
        assert {"fsdp2", "plan_cache0", "plan_cache2", "plan_cache_same", "overwrite", "no_dist",
                "edges", "async_thread0", "ws4", "ws2"} <= set(written), written
        assert not any(k.startswith("dcp/unused/") for k in keys) and ckpt_checkpoints(tmp) == []
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        for name in written:
            rc, text = run_tool("ckpt-verify", f"{root}/{name}")
            assert rc == 0, f"{root}/{name}: {text}"
    finally:
        s3_gateway.remove_bucket(s3, bucket)
