"""One rank of test_dcp_safety.py's failure scenarios (it starts WORLD of them):

    python dcp_fail_worker.py RANK WORLD STORE DIR

In one gloo process group, after saves with DCP's plan caching and dedup that must keep every
key, each scenario makes dcp.save or dcp.load through ckpt.torch fail
on one rank (the last, BAD: not DCP's coordinator; the coordinator for "already exists"),
and every rank must raise DCP's CheckpointException naming the cause, within FAST seconds.
A rank whose exception cannot reach the others (ckpt.Error once could not be unpickled), or
that skips a collective the others are in, hangs them: the process group's timeout (90 s)
and test_dcp_safety's deadline turn that into a failure. The scenarios run one after another
in the same group, so a collective left unmatched by one breaks the next. Prints one line per
scenario: "rank R: NAME S.s s".
"""
import datetime
import os
import sys
import time

import torch

FAST = 60.0  # seconds; a hang waits for the process group's timeout (90 s)


def main():
    rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    import ckpt
    import ckpt.torch

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=90))
    bad = world - 1
    good = os.path.join(out, "good")
    evil = os.path.join(out, "evil")  # made by the test: bytes entry "meta.payload" a crafted pickle

    class DropPlanner(DefaultSavePlanner):  # a buggy planner: leaves "only" out of the local plan
        def create_local_plan(self):
            plan = super().create_local_plan()
            return type(plan)([i for i in plan.items if i.index.fqn != "only"], planner_data=plan.planner_data)

    class BoomPlanner(DefaultSavePlanner):
        def resolve_data(self, write_item):
            raise ValueError("boom from a planner")

    def base():
        return {"w": torch.arange(8, dtype=torch.float32), "step": 7}

    def save(state, path, **kw):
        planner = kw.pop("planner", None)
        dcp.save(state, storage_writer=ckpt.torch.StorageWriter(path, **kw), planner=planner)

    def load(state, path, **kw):
        dcp.load(state, storage_reader=ckpt.torch.StorageReader(path), **kw)

    def odd_dtype():
        s = base()
        if rank == bad:
            s["odd"] = torch.zeros(2, dtype=torch.complex64)
        save(s, os.path.join(out, "s-dtype"))

    def replicas():
        s = base()
        s["shared"] = torch.full((4,), 1.0 if rank == bad else 0.0)
        save(s, os.path.join(out, "s-replicas"))

    def exists():
        save(base(), good, overwrite=False)

    def dropped():
        s = base()
        if rank == bad:
            s["only"] = torch.ones(3)  # a key no other rank has
        save(s, os.path.join(out, "s-dropped"), planner=DropPlanner() if rank == bad else None)

    def boom():
        save(base(), os.path.join(out, "s-boom"), planner=BoomPlanner() if rank == bad else None)

    def pickle_refused():
        s = {"w": torch.zeros(6)}  # the crafted checkpoint's "w"
        if rank == bad:
            s["meta"] = {"payload": None}
        load(s, evil)

    def no_checkpoint():
        load({"w": torch.zeros(8)}, os.path.join(out, "absent") if rank == bad else good)

    def missing_key():
        s = {"w": torch.zeros(8)}
        if rank == bad:
            s["absent_key"] = torch.zeros(2)
        load(s, good)

    def wrong_shape():
        load({"w": torch.zeros(9 if rank == bad else 8)}, good)

    try:
        # First, success over the ranks with DCP's planner options: plan caching (the second
        # save is a cache hit, whose local plan DCP hands over empty) and dedup to the lowest rank.
        planner = DefaultSavePlanner(enable_plan_caching=True, dedup_save_to_lowest_rank=True)
        for step in (1, 2, 1):
            save({"w": torch.arange(8.0) * step, "step": step}, good, planner=planner)
            back = {"w": torch.zeros(8), "step": 0}
            load(back, good)
            assert torch.equal(back["w"], torch.arange(8.0) * step) and back["step"] == step, (step, back)
        print(f"rank {rank}: plan caching and dedup ok", flush=True)
        scenarios = [("unsupported dtype", odd_dtype, "complex64"),
                     ("replicas differ", replicas, "shared"),
                     ("already exists", exists, "already exists"),
                     ("plan leaves out a key", dropped, "key 'only'"),
                     ("planner raises", boom, "boom from a planner"),
                     ("pickle refused", pickle_refused, "meta.payload"),
                     ("no checkpoint", no_checkpoint, "absent"),
                     ("missing key", missing_key, "absent_key"),
                     ("wrong shape", wrong_shape, "torch.Size([9])")]
        for name, fn, cause in scenarios:
            t0 = time.monotonic()
            try:
                fn()
            except CheckpointException as e:
                text = str(e)
            else:
                raise AssertionError(f"rank {rank}: {name}: no error")
            took = time.monotonic() - t0
            assert cause in text, f"rank {rank}: {name}: {cause!r} not in {text}"
            assert took < FAST, f"rank {rank}: {name}: {took:.1f} s"
            print(f"rank {rank}: {name} {took:.1f} s", flush=True)
            dist.barrier()
        assert not os.path.exists(os.path.join(out, "pwned")), "the crafted pickle ran"
    finally:
        dist.destroy_process_group()
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    main()
