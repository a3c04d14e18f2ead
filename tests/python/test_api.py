"""ckpt's Python API in one process: save/load/open/Writer, errors, comms."""
import json
import os
import threading

import numpy as np
import pytest

import ckpt
from conftest import run_tool

try:
    import torch
except ImportError:
    if os.environ.get("CKPT_REQUIRE_TORCH"):  # scripts/test.sh's venv has it: not a skip there
        raise
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")

NUMPY_DTYPES = ["float64", "float32", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"]


def numpy_values(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def test_numpy_round_trip_every_dtype_and_kind(tmp):
    state = {f"t.{d}": numpy_values(d, (3, 5), i) for i, d in enumerate(NUMPY_DTYPES)}
    state.update({"step": 7, "lr": 0.25, "flag": True, "rng": b"\x00\x01\xffbytes",
                  "config": ckpt.Json({"layers": 2, "name": "demo"}), "note": "text", "scalar0d": np.float32(1.5),
                  "nested": {"a": np.arange(4, dtype=np.int64)}})
    ckpt.save(tmp + "/c", state)
    target = {f"t.{d}": np.zeros((3, 5), dtype=d) for d in NUMPY_DTYPES}
    target.update({"step": 0, "lr": 0.0, "flag": False, "rng": b"", "config": ckpt.Json(None), "note": "",
                   "scalar0d": np.float32(0), "nested": {"a": np.zeros(4, dtype=np.int64)}})
    report = ckpt.load(tmp + "/c", target)
    assert report.ok and report.bytes_read > 0
    for d in NUMPY_DTYPES:
        assert np.array_equal(target[f"t.{d}"], state[f"t.{d}"]), d
    assert target["step"] == 7 and isinstance(target["step"], int)
    assert target["lr"] == 0.25 and target["flag"] is True
    assert target["rng"] == state["rng"]
    assert target["config"] == ckpt.Json({"layers": 2, "name": "demo"})
    assert target["note"] == "text"
    assert target["scalar0d"] == np.float32(1.5) and isinstance(target["scalar0d"], np.float32)
    assert np.array_equal(target["nested"]["a"], np.arange(4))


def test_load_writes_in_place_and_non_contiguous_targets(tmp):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    ckpt.save(tmp + "/c", {"a": a, "b": a.copy()})
    into = np.zeros((4, 6), dtype=np.float32)
    base = np.zeros((6, 4), dtype=np.float32)
    transposed = base.T  # not C-contiguous: read into a temporary, copied back
    ckpt.load(tmp + "/c", {"a": into, "b": transposed})
    assert np.array_equal(into, a)
    assert np.array_equal(base.T, a)


def test_read_only_target_is_refused(tmp):
    ckpt.save(tmp + "/c", {"a": np.ones(3)})
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ckpt.Error) as e:
        ckpt.load(tmp + "/c", {"a": ro})
    assert e.value.key == "a" and "read-only" in str(e.value)


def test_open_reads_metadata_regions_stats(tmp):
    w = np.arange(60, dtype=np.float64).reshape(6, 10)
    ckpt.save(tmp + "/c", {"w": w, "step": 3, "blob": b"xyz", "cfg": ckpt.Json([1, 2])},
              user_metadata={"run": "r1"})
    with ckpt.open(tmp + "/c") as c:
        assert set(c.keys()) == {"w", "step", "blob", "cfg"}
        assert c.entry("w") == {"kind": "tensor", "dtype": "float64", "shape": [6, 10]}
        assert c.format_version == ckpt.FORMAT_VERSION and c.world_size == 1
        assert c.user_metadata == {"run": "r1"}
        assert np.array_equal(c.read("w"), w)
        assert np.array_equal(c.read("w", (slice(2, 4), slice(3, 9))), w[2:4, 3:9])
        assert np.array_equal(c.read("w", ([1, 0], [2, 10])), w[1:3])
        assert np.array_equal(c.read("w", 5), w[5:6])
        out = np.empty((2, 2))
        assert c.read("w", (slice(0, 2), slice(0, 2)), out=out) is out and np.array_equal(out, w[:2, :2])
        assert c.read("step") == 3 and c.read("blob") == b"xyz" and c.read("cfg") == [1, 2]
        s = c.stats("w")
        assert s["min"] == 0 and s["max"] == 59 and s["finite_count"] == 60
        assert c.chunks("w")[0][:2] == ([0, 0], [6, 10])
        c.verify_chunk("w", 0)
        assert c.bytes_read >= w.nbytes
        with pytest.raises(ckpt.Error) as e:
            c.read("w", out=np.empty((6, 10), dtype=np.float32))
        assert e.value.code == "mismatch"
        with pytest.raises(ckpt.Error) as e:
            c.entry("nope")
        assert e.value.code == "not found" and e.value.key == "nope"
    assert ckpt.read_metadata(tmp + "/c")["user"] == {"run": "r1"}


def test_writer_chunks_and_tiling_error(tmp):
    full = np.arange(40, dtype=np.int32).reshape(8, 5)
    with ckpt.Writer(tmp + "/c", num_files=2, world_size=2, state_dict_type="SHARDED") as w:
        w.write("x", full[:3], offsets=[0, 0], shape=[8, 5], file_index=0)
        w.write("x", full[3:], offsets=[3, 0], shape=[8, 5], file_index=1)
        w.write("step", 11)
        w.write("cfg", ckpt.Json({"k": 1}))
        w.write("raw", b"\x01\x02")
    with ckpt.open(tmp + "/c") as c:
        assert np.array_equal(c.read("x"), full)
        assert len(c.chunks("x")) == 2 and c.state_dict_type == "SHARDED"
        assert c.read("step") == 11 and c.read("cfg") == {"k": 1} and c.read("raw") == b"\x01\x02"
    w = ckpt.Writer(tmp + "/gap")
    w.write("x", full[:3], offsets=[0, 0], shape=[8, 5])
    with pytest.raises(ckpt.Error) as e:
        w.commit()
    assert e.value.key == "x" and e.value.code in ("corrupt", "invalid argument")
    assert not os.path.exists(tmp + "/gap")
    with pytest.raises(ckpt.Error):
        w.write("y", full)  # committed or not, a failed writer is done


def test_writer_dropped_on_exception(tmp):
    with pytest.raises(RuntimeError):
        with ckpt.Writer(tmp + "/c") as w:
            w.write("x", np.ones(3))
            raise RuntimeError("stop")
    assert not os.path.exists(tmp + "/c")


def test_errors_carry_code_file_and_key(tmp):
    with pytest.raises(ckpt.Error) as e:
        ckpt.load(tmp + "/absent", {"a": np.zeros(1)})
    assert e.value.code == "not found"
    ckpt.save(tmp + "/c", {"a": np.arange(1000, dtype=np.float32)})
    with pytest.raises(ckpt.Error) as e:
        ckpt.save(tmp + "/c", {"a": np.zeros(1)})
    assert e.value.code == "already exists"
    ckpt.save(tmp + "/c", {"a": np.arange(1000, dtype=np.float32) * 2}, overwrite=True)
    with pytest.raises(ckpt.Error) as e:
        ckpt.load(tmp + "/c", {"a": np.zeros(1000, dtype=np.float32), "b": np.zeros(1)})
    assert e.value.code == "mismatch" and "missing keys (1):\n    b" in str(e.value)
    assert e.value.file == tmp + "/c"
    report = ckpt.load(tmp + "/c", {"a": np.zeros(1000, dtype=np.float32), "b": np.zeros(1)}, strict=False)
    assert report.missing_keys == ["b"] and not report.ok
    # Flip one byte of the tensor's stored data: the load names the shard file and the key.
    with ckpt.open(tmp + "/c") as c:
        (offsets, sizes, file), = c.chunks("a")
    shard = os.path.join(tmp, "c", file)
    data = bytearray(open(shard, "rb").read())
    pos = data.find(np.float32(2 * 500).tobytes())
    assert pos > 0
    data[pos] ^= 0x40
    open(shard, "wb").write(bytes(data))
    with pytest.raises(ckpt.Error) as e:
        ckpt.load(tmp + "/c", {"a": np.zeros(1000, dtype=np.float32)})
    assert e.value.code == "corrupt" and e.value.key == "a" and e.value.file.endswith(file)
    with pytest.raises(ckpt.Error) as e:
        ckpt.save(tmp + "/d", {"c": np.zeros(2, dtype=np.complex64)})
    assert e.value.code == "unsupported" and e.value.key == "c"
    with pytest.raises(ckpt.Error) as e:
        ckpt.save(tmp + "/d", {"o": object()})
    assert e.value.key == "o"


def test_zstd_and_full_type(tmp):
    a = np.zeros((256, 256), dtype=np.float32)
    ckpt.save(tmp + "/c", {"a": a}, compression="zstd", state_dict_type="FULL")
    md = ckpt.read_metadata(tmp + "/c")
    assert md["state_dict_type"] == "FULL"
    size = sum(os.path.getsize(os.path.join(tmp, "c", f["name"])) for f in md["files"])
    assert size < a.nbytes / 4
    out = np.ones_like(a)
    ckpt.load(tmp + "/c", {"a": out})
    assert not out.any()


class ThreadGroup:
    """ckpt comms for ranks as Python threads: what a user's own process group looks like."""

    def __init__(self, size):
        self.size = size
        self.slots = [None] * size
        self.barrier = threading.Barrier(size, timeout=60)

    def comm(self, rank):
        group = self

        class Comm:
            def rank(self):
                return rank

            def size(self):
                return group.size

            def barrier(self):
                group.barrier.wait()

            def all_gather(self, data):
                group.slots[rank] = bytes(data)
                group.barrier.wait()
                out = list(group.slots)
                group.barrier.wait()
                return out

            def gather(self, data, root):
                out = self.all_gather(data)
                return out if rank == root else []

            def broadcast(self, data, root):
                return self.all_gather(data)[root]

            def split(self, color, key):
                raise NotImplementedError("split")

        return Comm()


def run_ranks(size, fn):
    group = ThreadGroup(size)
    errors = [None] * size

    def run(r):
        try:
            fn(r, group.comm(r))
        except BaseException as e:  # noqa: BLE001 (reported below)
            # No abort of the others: libckpt's agreement makes every rank fail together,
            # and a rank left waiting fails by the barrier's timeout.
            errors[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def test_python_comm_three_ranks_save_load_at_two(tmp):
    full = np.arange(12 * 4, dtype=np.float64).reshape(12, 4)

    def save(rank, comm):
        # Rows split over 3 ranks; a bias replicated on every rank; a step on rank 0 only.
        state = {"w": ckpt.Shard(full[rank * 4:(rank + 1) * 4], [rank * 4, 0], full.shape),
                 "bias": np.full(4, 0.5)}
        if rank == 0:
            state["step"] = 9
        ckpt.save(tmp + "/c", state, comm)

    assert run_ranks(3, save) == [None] * 3
    md = ckpt.read_metadata(tmp + "/c")
    assert md["world_size"] == 3
    with ckpt.open(tmp + "/c") as c:
        assert np.array_equal(c.read("w"), full)
        assert len(c.chunks("bias")) == 1  # a replica is written once
        assert len(c.chunks("w")) == 3 and c.read("step") == 9

    got = {}

    def load(rank, comm):
        w = np.zeros((6, 4))
        state = {"w": ckpt.Shard(w, [rank * 6, 0], [12, 4]), "bias": np.zeros(4), "step": 0}
        ckpt.load(tmp + "/c", state, comm)
        got[rank] = {"w": w, "bias": state["bias"], "step": state["step"]}

    assert run_ranks(2, load) == [None] * 2
    assert np.array_equal(np.concatenate([got[0]["w"], got[1]["w"]]), full)
    assert np.array_equal(got[1]["bias"], np.full(4, 0.5)) and got[1]["step"] == 9


def test_replica_desync_is_an_error_naming_the_key(tmp):
    def save(rank, comm):
        ckpt.save(tmp + "/c", {"bias": np.full(4, float(rank))}, comm)

    errors = run_ranks(2, save)
    assert all(isinstance(e, ckpt.Error) for e in errors), errors
    assert errors[0].key == "bias" and errors[0].code == "mismatch"
    assert not os.path.exists(tmp + "/c")


def test_comm_failure_is_a_comm_error(tmp):
    class Broken:
        def rank(self):
            return 0

        def size(self):
            return 1

        def barrier(self, *args):
            raise RuntimeError("network down")

        gather = broadcast = all_gather = split = barrier

    with pytest.raises(ckpt.Error) as e:
        ckpt.save(tmp + "/c", {"a": np.ones(2)}, Broken())
    assert e.value.code == "communication error" and "network down" in str(e.value)


@needs_torch
def test_torch_tensors_every_dtype_no_copy_on_load(tmp):
    dtypes = [d for d in ckpt.DTYPES if hasattr(torch, d)]
    assert {"bfloat16", "float8_e4m3fn", "float8_e5m2", "bool"} <= set(dtypes)
    g = torch.Generator().manual_seed(0)
    state = {}
    packed = {"float4_e2m1fn_x2", "float8_e8m0fnu"}  # no arithmetic in torch: made from their bytes
    for d in dtypes:
        dt = getattr(torch, d)
        if d in packed:
            state[d] = torch.randint(0, 255, (4, 3), generator=g, dtype=torch.uint8).view(dt)
        elif dt.is_floating_point:
            state[d] = torch.randn(4, 3, generator=g).to(dt)
        elif dt == torch.bool:
            state[d] = torch.randint(0, 2, (4, 3), generator=g).bool()
        else:
            state[d] = torch.randint(-100 if d != "uint8" else 0, 100, (4, 3), generator=g).to(dt)
    state["param"] = torch.nn.Parameter(torch.ones(2, 2))
    state["zero_d"] = torch.tensor(3.5)
    ckpt.save(tmp + "/c", state)
    target = {k: torch.zeros_like(v.detach()) if k not in packed else
              torch.zeros(v.shape, dtype=torch.uint8).view(v.dtype) for k, v in state.items()}
    ptrs = {k: v.data_ptr() for k, v in target.items()}
    ckpt.load(tmp + "/c", target)
    for k, v in state.items():
        assert target[k].data_ptr() == ptrs[k], k
        assert torch.equal(target[k].reshape(-1).view(torch.uint8), v.detach().reshape(-1).view(torch.uint8)), k
    with ckpt.open(tmp + "/c") as c:
        bf = c.read("bfloat16")
        assert isinstance(bf, torch.Tensor) and bf.dtype == torch.bfloat16 and torch.equal(bf, state["bfloat16"])
        assert c.entry("float8_e4m3fn")["dtype"] == "float8_e4m3fn"
        assert isinstance(c.read("float32", like="torch"), torch.Tensor)


@needs_torch
def test_torch_save_shares_memory(tmp):
    # What save hands libckpt is a view of the tensor's own storage, not a copy.
    from ckpt import _arrays
    t = torch.arange(10, dtype=torch.float32)
    _, _, view = _arrays.read_view(t, "t")
    t[3] = 42
    assert view[12:16].view(np.float32)[0] == 42
    nc = torch.arange(12.0).reshape(3, 4).t()
    _, _, copy = _arrays.read_view(nc, "nc")
    nc[0, 0] = 99
    assert copy.view(np.float32)[0] == 0


@needs_torch
def test_non_cpu_tensor_is_refused_clearly():
    with pytest.raises(ckpt.Error) as e:
        from ckpt import _arrays
        _arrays.read_view(torch.empty(1, device="meta"), "m")
    assert e.value.code == "unsupported" and e.value.key == "m"


@needs_torch
def test_process_group_comm_world_of_one(tmp):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    try:
        ckpt.save(tmp + "/c", {"a": torch.arange(5)}, comm=dist.group.WORLD)
        out = {"a": torch.zeros(5, dtype=torch.int64)}
        ckpt.load(tmp + "/c", out, comm=dist.group.WORLD)
        assert torch.equal(out["a"], torch.arange(5))
        comm = ckpt.ProcessGroupComm()
        assert comm.all_gather(b"abc") == [b"abc"] and comm.broadcast(b"", 0) == b""
    finally:
        dist.destroy_process_group()


def test_tools_read_what_python_wrote(tmp):
    ckpt.save(tmp + "/c", {"w": np.arange(6, dtype=np.float32), "step": 1})
    rc, out = run_tool("ckpt-verify", tmp + "/c")
    assert rc == 0, out
    rc, out = run_tool("ckpt-inspect", tmp + "/c")
    assert rc == 0 and "w" in out, out


def test_load_with_direct_io_returns_the_same_bytes(tmp):
    a = numpy_values("float32", (1536, 1024), 5)  # 6 MiB: runs long enough to be read direct
    ckpt.save(tmp + "/c", {"a": a})
    try:
        fd = os.open(tmp + "/c/metadata.json", os.O_RDONLY | os.O_DIRECT)
        os.close(fd)
        direct_fs = True
    except OSError:  # tmpfs: no direct I/O, every mode reads buffered
        direct_fs = False
    for mode in ("on", "auto", "off"):
        out = np.zeros_like(a)
        report = ckpt.load(tmp + "/c", {"a": out}, direct_io=mode)
        assert np.array_equal(out, a), mode
        assert 0 <= report.bytes_read_direct <= report.bytes_read
        if mode == "off" or not direct_fs:
            assert report.bytes_read_direct == 0
        if mode == "on" and direct_fs:
            assert report.bytes_read_direct >= 4 << 20
    with pytest.raises(ckpt.Error) as e:
        ckpt.load(tmp + "/c", {"a": np.zeros_like(a)}, direct_io="sometimes")
    assert e.value.code == "invalid argument" and "'off', 'auto' or 'on'" in str(e.value)


S3_URL = "s3://no-such-bucket/run/step-1"


def test_s3_path_without_the_s3_client_names_the_path_and_how_to_get_it(monkeypatch, tmp):
    # As a build without libckpt's S3 client (CKPT_WITH_S3=OFF) answers; where this build is
    # one, the real thing. Refused before anything is written, a local path unaffected.
    from ckpt import _s3
    monkeypatch.setattr(_s3, "HAVE_S3", False)
    calls = [lambda: ckpt.save(S3_URL, {"a": np.ones(2)}), lambda: ckpt.load(S3_URL, {"a": np.ones(2)}),
             lambda: ckpt.open(S3_URL), lambda: ckpt.read_metadata(S3_URL), lambda: ckpt.Writer(S3_URL)]
    for call in calls:
        with pytest.raises(ckpt.Error) as e:
            call()
        text = str(e.value)
        assert e.value.code == "unsupported" and e.value.file == S3_URL, text
        assert text.startswith(f"[unsupported] {S3_URL}: ") and "no S3 client" in text, text
        assert "CKPT_WITH_S3" in text and "pip install ./python" in text and "libcurl" in text, text
    ckpt.save(tmp + "/c", {"a": np.ones(2)}, s3={"endpoint": "http://unused"})  # ignored for a directory
    assert ckpt.read_metadata(tmp + "/c")["world_size"] == 1


def test_s3_options_are_checked_and_secrets_hidden(tmp):
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    opts = ckpt.S3Options(endpoint="http://127.0.0.1:9", access_key_id="AKIDEXAMPLE", secret_access_key=secret,
                          session_token=secret + "-token", part_bytes=8 << 20)
    assert secret not in repr(opts) and "secret_access_key=<hidden>" in repr(opts) and "AKIDEXAMPLE" in repr(opts)
    bad = [({"secret_access_key": secret.encode()}, "ckpt.S3Options.secret_access_key: a bytes, not a str"),
           ({"part_bytes": "16M"}, "ckpt.S3Options.part_bytes: a str, not an int"),
           ({"part_bytes": -1}, "out of range"), ({"single_writer": 1}, "not a bool"),
           ({"secret": secret}, "s3 option 'secret': ckpt.S3Options has no such field")]
    for fields, words in bad:
        with pytest.raises(ckpt.Error) as e:
            ckpt.save(S3_URL, {"a": np.ones(2)}, s3=fields)
        assert words in str(e.value) and secret not in str(e.value) and e.value.code == "invalid argument"
    with pytest.raises(ckpt.Error) as e:
        ckpt.save(S3_URL, {}, s3=[("endpoint", "x")])
    assert "pass a ckpt.S3Options" in str(e.value)
    # pathlib.Path collapses "s3://" to "s3:/": refused, never a local directory named "s3:".
    import pathlib
    with pytest.raises(ckpt.Error) as e:
        ckpt.save(pathlib.Path(S3_URL), {"a": np.ones(2)})
    assert "pass the URL as a str" in str(e.value)
    if not ckpt.HAVE_S3:
        return
    # The client is in this build: an endpoint where nothing listens is an I/O error naming the
    # URL, quickly (one attempt), the secret in none of it.
    opts.max_attempts = 1
    with pytest.raises(ckpt.Error) as e:
        ckpt.load(S3_URL, {"a": np.ones(2)}, s3=opts)
    assert e.value.code == "I/O error" and "s3://no-such-bucket/run/step-1" in str(e.value), str(e.value)
    assert secret not in str(e.value) and secret not in repr(e.value)
