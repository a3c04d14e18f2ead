"""ckpt's Python API on s3:// against the project's own Ceph gateway (s3_gateway.py): save, load,
open and Writer round trips, ranks as threads saving and a resharded load, DCP through
ckpt.torch, two writers racing on one new path, a flipped byte refused, secrets never shown,
S3Options.ca_bundle reaching the client (a bad one named), and boto3 as an independent client
reading what ckpt wrote (the objects listed, metadata.json valid against schemas/, a shard
opened by h5py). SKIPPED without the gateway, FAILS where CI=true. PyTorch's own DCP
scenarios on s3:// (multi-rank, plan caching) are in test_dcp_scenarios.py."""
import importlib
import io
import json
import os
import socket
import threading
import traceback

import numpy as np
import pytest

import ckpt
import s3_gateway
from conftest import run_tool
from test_api import run_ranks as run_thread_ranks

GATEWAY = s3_gateway.config(module=True)
SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "schemas")


def need(module):
    """`module`, or a skip without it (scripts/test.sh's venv has it: a failure there)."""
    if os.environ.get("CKPT_REQUIRE_TORCH"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="module")
def s3():
    return s3_gateway.client()


@pytest.fixture
def bucket(s3):
    name = s3_gateway.make_bucket(s3)
    yield name
    s3_gateway.remove_bucket(s3, name)


@pytest.fixture
def no_aws_env(monkeypatch, tmp):
    """No AWS setting from the environment or ~/.aws: only what a test passes counts."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", tmp)


def state_of(seed):
    rng = np.random.default_rng(seed)
    return {"model": {"w": rng.standard_normal((64, 33)).astype(np.float32),
                      "b": np.arange(33, dtype=np.int64) * seed},
            "step": 100 + seed, "lr": 0.5, "rng": bytes([seed]) * 7, "cfg": ckpt.Json({"seed": seed})}


def blank():
    return {"model": {"w": np.zeros((64, 33), np.float32), "b": np.zeros(33, np.int64)},
            "step": 0, "lr": 0.0, "rng": b"", "cfg": ckpt.Json(None)}


def assert_state(got, want):
    assert np.array_equal(got["model"]["w"], want["model"]["w"])
    assert np.array_equal(got["model"]["b"], want["model"]["b"])
    assert (got["step"], got["lr"], got["rng"], got["cfg"]) == (want["step"], want["lr"], want["rng"], want["cfg"])


def test_save_load_open_read_metadata_with_options(bucket, no_aws_env):
    url = f"s3://{bucket}/run/step-1"
    opts = s3_gateway.options()
    want = state_of(1)
    ckpt.save(url, want, s3=opts)
    got = blank()
    report = ckpt.load(url, got, s3=opts)
    assert report.ok and report.bytes_read >= want["model"]["w"].nbytes
    assert_state(got, want)
    md = ckpt.read_metadata(url, s3=opts)
    assert md["world_size"] == 1 and md["files"][0]["name"].startswith("shard-00000-of-00001.")
    with ckpt.open(url, s3=opts) as c:
        assert c.path == url and set(c.keys()) == {"model.w", "model.b", "step", "lr", "rng", "cfg"}
        assert np.array_equal(c.read("model.w", (slice(10, 20), slice(3, 9))), want["model"]["w"][10:20, 3:9])
        assert c.read("step") == 101 and c.read("rng") == want["rng"] and c.read("cfg") == {"seed": 1}
        (offsets, sizes, name), = c.chunks("model.w")
        assert name == md["files"][0]["name"] and sizes == [64, 33]
        c.verify_chunk("model.w", 0)
    # A dict of S3Options' fields does as well; a replace needs overwrite.
    fields = {k: v for k, v in vars(opts).items() if v is not None}
    with pytest.raises(ckpt.Error) as e:
        ckpt.save(url, state_of(2), s3=fields)
    assert e.value.code == "already exists" and e.value.file == url
    ckpt.save(url, state_of(2), s3=fields, overwrite=True)
    got = blank()
    ckpt.load(url, got, s3=fields)
    assert_state(got, state_of(2))
    # Without the options (and nothing in the environment) there are no credentials.
    with pytest.raises(ckpt.Error) as e:
        ckpt.load(url, blank())
    assert "credentials" in str(e.value)


def test_aws_environment_and_profile(bucket, no_aws_env, monkeypatch, tmp):
    c = GATEWAY
    for name, value in s3_gateway.aws_env().items():
        monkeypatch.setenv(name, value)
    url = f"s3://{bucket}/env/step-1"
    ckpt.save(url, state_of(3))
    got = blank()
    ckpt.load(url, got)
    assert_state(got, state_of(3))
    # AWS_ENDPOINT_URL_S3 wins over AWS_ENDPOINT_URL; an S3Options field wins over both.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", c["endpoint"])
    assert ckpt.read_metadata(url)["world_size"] == 1
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    assert ckpt.read_metadata(url, s3={"endpoint": c["endpoint"]})["world_size"] == 1
    # AWS_PROFILE: the keys from ~/.aws/credentials, the endpoint from ~/.aws/config.
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    os.makedirs(os.path.join(tmp, ".aws"))
    with open(os.path.join(tmp, ".aws", "credentials"), "w") as f:
        f.write(f"[gw]\naws_access_key_id = {c['access_key_id']}\naws_secret_access_key = {c['secret_access_key']}\n")
    with open(os.path.join(tmp, ".aws", "config"), "w") as f:
        f.write(f"[profile gw]\nregion = {c['region']}\nendpoint_url = {c['endpoint']}\n")
    monkeypatch.setenv("AWS_PROFILE", "gw")
    with ckpt.open(url) as r:
        assert r.read("step") == 103
    with pytest.raises(ckpt.Error) as e:
        ckpt.open(url, s3={"profile": "absent"})
    assert "absent" in str(e.value)


def test_writer_commits_on_exit_and_leaves_nothing_on_exception(bucket, s3):
    opts = s3_gateway.options()
    url = f"s3://{bucket}/w/full"
    full = np.arange(40, dtype=np.int32).reshape(8, 5)
    with ckpt.Writer(url, num_files=2, world_size=2, state_dict_type="SHARDED", s3=opts) as w:
        w.write("x", full[:3], offsets=[0, 0], shape=[8, 5], file_index=0)
        w.write("x", full[3:], offsets=[3, 0], shape=[8, 5], file_index=1)
        w.write("step", 11)
        w.write("raw", b"\x01\x02", file_index=1)
    with ckpt.open(url, s3=opts) as c:
        assert np.array_equal(c.read("x"), full) and len(c.chunks("x")) == 2
        assert c.read("step") == 11 and c.read("raw") == b"\x01\x02"
    assert len(s3_gateway.keys(s3, bucket, "w/full/")) == 3
    with pytest.raises(RuntimeError):
        with ckpt.Writer(f"s3://{bucket}/w/dropped", s3=opts) as w:
            w.write("x", full)
            raise RuntimeError("stop")
    w = ckpt.Writer(f"s3://{bucket}/w/gap", s3=opts)
    w.write("x", full[:3], offsets=[0, 0], shape=[8, 5])
    with pytest.raises(ckpt.Error) as e:
        w.commit()
    assert e.value.key == "x"
    assert s3_gateway.keys(s3, bucket, "w/dropped") == [] and s3_gateway.keys(s3, bucket, "w/gap") == []


def test_three_ranks_save_resharded_load_at_two_and_tools(bucket, monkeypatch):
    opts = s3_gateway.options()
    url = f"s3://{bucket}/ranks/step-7"
    full = np.arange(96 * 40, dtype=np.float64).reshape(96, 40)

    def save(rank, comm):
        state = {"w": ckpt.Shard(full[rank * 32:(rank + 1) * 32], [rank * 32, 0], full.shape),
                 "bias": np.full(4, 0.5)}
        if rank == 0:
            state["step"] = 9
        ckpt.save(url, state, comm, s3=opts)

    assert run_thread_ranks(3, save) == [None] * 3
    md = ckpt.read_metadata(url, s3=opts)
    assert md["world_size"] == 3 and len(md["files"]) == 3
    got = {}

    def load(rank, comm):
        w = np.zeros((48, 40))
        state = {"w": ckpt.Shard(w, [rank * 48, 0], [96, 40]), "bias": np.zeros(4), "step": 0}
        report = ckpt.load(url, state, comm, s3=opts)
        got[rank] = (w, state["bias"], state["step"], report.bytes_read)

    assert run_thread_ranks(2, load) == [None] * 2
    assert np.array_equal(np.concatenate([got[0][0], got[1][0]]), full)
    assert np.array_equal(got[1][1], np.full(4, 0.5)) and got[1][2] == 9
    # Each rank fetched its half, not the whole checkpoint (blocks of 64 KiB: a little more).
    assert all(g[3] < 0.8 * full.nbytes for g in got.values()), [g[3] for g in got.values()]
    # A column slab through ckpt.open: ranged reads of the three shards.
    with ckpt.open(url, s3=opts) as c:
        assert np.array_equal(c.read("w", (slice(None), slice(7, 9))), full[:, 7:9])
    # The tools take the same path with the AWS environment.
    for name, value in s3_gateway.aws_env().items():
        monkeypatch.setenv(name, value)
    rc, out = run_tool("ckpt-verify", url)
    assert rc == 0, out


def test_two_writers_racing_on_one_new_path_exactly_one_wins(bucket, s3):
    opts = s3_gateway.options()
    for round_ in range(4):
        url = f"s3://{bucket}/race/step-{round_}"
        start = threading.Barrier(2)
        outcome = [None, None]

        def writer(i):
            state = {"who": i, "w": np.full(1000, float(i), np.float32)}
            start.wait()
            try:
                ckpt.save(url, state, s3=opts)
                outcome[i] = "won"
            except ckpt.Error as e:
                outcome[i] = e

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        won = [i for i in range(2) if outcome[i] == "won"]
        assert len(won) == 1, outcome
        lost = outcome[1 - won[0]]
        assert lost.code == "already exists" and lost.file is not None and url in lost.file, lost
        state = {"who": -1, "w": np.zeros(1000, np.float32)}
        ckpt.load(url, state, s3=opts)
        assert state["who"] == won[0] and np.all(state["w"] == won[0])
        md = ckpt.read_metadata(url, s3=opts)
        named = {f"race/step-{round_}/{f['name']}" for f in md["files"]} | {f"race/step-{round_}/metadata.json"}
        # Nothing of the loser is visible: every object there is the winner's (a loser's shard
        # the store still holds is a leftover no metadata.json names, never read).
        assert named <= set(s3_gateway.keys(s3, bucket, f"race/step-{round_}/"))


def test_flipped_byte_in_an_object_is_refused_naming_key_object_and_block(bucket, s3):
    opts = s3_gateway.options()
    url = f"s3://{bucket}/flip/step-1"
    a = np.arange(100_000, dtype=np.float32)
    ckpt.save(url, {"a": a, "b": np.ones(10)}, s3=opts)
    name = ckpt.read_metadata(url, s3=opts)["files"][0]["name"]
    key = f"flip/step-1/{name}"
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    pos = data.find(np.float32(70_000).tobytes())
    assert pos > 0
    data[pos] ^= 0x40
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    for attempt in (lambda: ckpt.load(url, {"a": np.zeros_like(a), "b": np.zeros(10)}, s3=opts),
                    lambda: ckpt.open(url, s3=opts).read("a", (slice(69_000, 71_000),))):
        with pytest.raises(ckpt.Error) as e:
            attempt()
        text = str(e.value)
        assert e.value.code == "corrupt" and e.value.key == "a", text
        assert name in text and "block" in text, text
        assert e.value.file and e.value.file.startswith("s3://") and name in e.value.file, e.value.file
    # The untouched blocks still read.
    with ckpt.open(url, s3=opts) as c:
        assert np.array_equal(c.read("a", (slice(0, 1000),)), a[:1000])


SECRET = "ckpt-test-SECRET-never-shown-0123456789"
TOKEN = "ckpt-test-TOKEN-never-shown-9876543210"


def all_text(excinfo):
    e = excinfo.value
    return "\n".join([str(e), repr(e), "".join(traceback.format_exception(type(e), e, e.__traceback__)),
                      repr(getattr(e, "file", None)), repr(getattr(e, "key", None))])


def test_secrets_never_appear_in_errors_or_reprs(bucket, s3, no_aws_env):
    c = GATEWAY
    opts = ckpt.S3Options(endpoint=c["endpoint"], access_key_id=c["access_key_id"], secret_access_key=SECRET,
                          session_token=TOKEN, region=c["region"], max_attempts=1)
    assert SECRET not in repr(opts) and TOKEN not in repr(opts) and SECRET not in str(opts)
    assert "secret_access_key=<hidden>" in repr(opts)
    url = f"s3://{bucket}/secret/step-1"
    attempts = [lambda: ckpt.save(url, {"a": np.ones(3)}, s3=opts),
                lambda: ckpt.load(url, {"a": np.ones(3)}, s3=opts),
                lambda: ckpt.open(url, s3=opts),
                lambda: ckpt.read_metadata(url, s3=opts),
                lambda: ckpt.Writer(url, s3=opts).commit(),
                # unreachable endpoint, wrong types, unknown fields
                lambda: ckpt.load(url, {"a": np.ones(3)}, s3=ckpt.S3Options(
                    endpoint="http://127.0.0.1:9", access_key_id="k", secret_access_key=SECRET, max_attempts=1)),
                lambda: ckpt.save(url, {}, s3=ckpt.S3Options(secret_access_key=SECRET.encode())),
                lambda: ckpt.save(url, {}, s3={"secret_access_key": SECRET, "secret": SECRET})]
    for attempt in attempts:
        with pytest.raises(ckpt.Error) as e:
            attempt()
        text = all_text(e)
        assert SECRET not in text and TOKEN not in text, text
    with pytest.raises(ckpt.Error) as e:  # the gateway refuses the signature: a clear error
        ckpt.load(url, {"a": np.ones(3)}, s3=opts)
    assert "403" in str(e.value) and url in str(e.value)
    # Saved with the right keys (and a session token the gateway ignores): nothing secret
    # in what the store holds.
    good = s3_gateway.options()
    good.session_token = TOKEN
    ckpt.save(url, {"a": np.ones(3)}, s3=good, user_metadata={"note": "x"})
    for key in s3_gateway.keys(s3, bucket, "secret/"):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert c["secret_access_key"].encode() not in body and TOKEN.encode() not in body, key
    ckpt_torch = need("ckpt.torch")
    for obj in (ckpt_torch.StorageWriter(url, s3=opts), ckpt_torch.StorageReader(url, s3=opts)):
        assert SECRET not in repr(vars(obj)) and SECRET not in repr(obj)


def test_ca_bundle_reaches_the_client_and_a_bad_one_is_an_error_naming_it(no_aws_env, tmp):
    """S3Options(ca_bundle=...), as tests/s3's C++ CA-bundle tests: on an https endpoint a bundle
    that is no readable file is refused before any request, naming it and where it came from; a
    readable one without a certificate fails the first request, named. No TLS server is needed:
    a local socket that never answers will do, as libcurl loads the CA file before the handshake."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        endpoint = f"https://127.0.0.1:{listener.getsockname()[1]}"
        url = "s3://no-bucket/ck"
        missing = os.path.join(tmp, "no-such-ca.pem")
        for bundle in (missing, tmp):  # a missing file, a directory
            with pytest.raises(ckpt.Error) as e:
                ckpt.read_metadata(url, s3=ckpt.S3Options(endpoint=endpoint, access_key_id="k", secret_access_key="s",
                                                          ca_bundle=bundle, max_attempts=1))
            assert f"S3 options ca_bundle: CA bundle '{bundle}' for {endpoint} is not a readable file" in str(e.value)
        empty = os.path.join(tmp, "empty-ca.pem")
        with open(empty, "w") as f:
            f.write("no certificate in here\n")
        with pytest.raises(ckpt.Error) as e:
            ckpt.read_metadata(url, s3=ckpt.S3Options(endpoint=endpoint, access_key_id="k", secret_access_key="s",
                                                      ca_bundle=empty, max_attempts=1))
        assert f"CA bundle '{empty}' from S3 options ca_bundle" in str(e.value) and url in str(e.value)
    finally:
        listener.close()


def test_boto3_reads_what_ckpt_wrote(bucket, s3, tmp):
    jsonschema, h5py = need("jsonschema"), need("h5py")
    opts = s3_gateway.options()
    url = f"s3://{bucket}/indep/step-5"
    want = state_of(5)

    def save(rank, comm):
        part = {"model": {"w": ckpt.Shard(want["model"]["w"][rank * 32:(rank + 1) * 32], [rank * 32, 0], [64, 33]),
                          "b": want["model"]["b"]}, "step": want["step"]}
        ckpt.save(url, part, comm, s3=opts)

    assert run_thread_ranks(2, save) == [None] * 2
    listed = s3_gateway.keys(s3, bucket, "indep/step-5/")
    text = s3.get_object(Bucket=bucket, Key="indep/step-5/metadata.json")["Body"].read()
    md = json.loads(text)
    assert sorted(["indep/step-5/metadata.json"] + [f"indep/step-5/{f['name']}" for f in md["files"]]) == listed
    with open(os.path.join(SCHEMAS, "metadata.schema.json")) as f:
        schema = json.load(f)
    jsonschema.validate(md, schema, cls=jsonschema.validators.validator_for(schema))
    assert md == ckpt.read_metadata(url, s3=opts)
    for f in md["files"]:
        head = s3.head_object(Bucket=bucket, Key=f"indep/step-5/{f['name']}")
        assert head["ContentLength"] == f["bytes"], f
    body = s3.get_object(Bucket=bucket, Key=f"indep/step-5/{md['files'][0]['name']}")["Body"].read()
    with h5py.File(io.BytesIO(body), "r") as h:
        names = []
        h.visit(names.append)
        assert names, "an empty shard"
    # What boto3 downloads is a local checkpoint that ckpt loads.
    local = os.path.join(tmp, "copy")
    os.makedirs(local)
    for key in listed:
        s3.download_file(bucket, key, os.path.join(local, os.path.basename(key)))
    got = {"model": {"w": np.zeros((64, 33), np.float32), "b": np.zeros(33, np.int64)}, "step": 0}
    ckpt.load(local, got)
    assert np.array_equal(got["model"]["w"], want["model"]["w"]) and got["step"] == want["step"]


def test_dcp_save_load_one_process_overwrite_and_convert(bucket, s3, tmp, monkeypatch):
    torch, dcp, ckpt_torch = need("torch"), need("torch.distributed.checkpoint"), need("ckpt.torch")
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    opts = s3_gateway.options()
    url = f"s3://{bucket}/dcp/step-1"
    state = {"w": torch.arange(120, dtype=torch.bfloat16).reshape(10, 12), "meta": {"epoch": 3, "name": "x"}}
    dcp.save(state, storage_writer=ckpt_torch.StorageWriter(url, s3=opts), no_dist=True)
    md = ckpt.read_metadata(url, s3=opts)
    assert md["user"][ckpt_torch.USER_KEY]["pickled"] == ["meta.epoch", "meta.name"]
    with pytest.raises(BaseException) as e:
        dcp.save(state, storage_writer=ckpt_torch.StorageWriter(url, overwrite=False, s3=opts), no_dist=True)
    assert "already exists" in str(e.value) or "already exists" in repr(e.value)
    # Overwrite, with a caching planner twice (the second save hands DCP a cached plan).
    for factor in (2, 3):
        state["w"] = torch.arange(120, dtype=torch.bfloat16).reshape(10, 12) * factor
        dcp.save(state, storage_writer=ckpt_torch.StorageWriter(url, s3=opts),
                 planner=DefaultSavePlanner(enable_plan_caching=True), no_dist=True)
    out = {"w": torch.zeros(10, 12, dtype=torch.bfloat16), "meta": {"epoch": 0, "name": ""}}
    dcp.load(out, storage_reader=ckpt_torch.StorageReader(url, s3=opts), no_dist=True)
    assert torch.equal(out["w"], state["w"]) and out["meta"] == {"epoch": 3, "name": "x"}
    # checkpoint_id as the URL (the reader made for no path); a float32 target converts.
    out32 = {"w": torch.zeros(10, 12), "meta": {"epoch": 0, "name": ""}}
    dcp.load(out32, storage_reader=ckpt_torch.StorageReader(s3=opts), checkpoint_id=url, no_dist=True)
    assert torch.equal(out32["w"], state["w"].float())
    assert ckpt_torch.StorageReader.validate_checkpoint_id(url)
    # Only the replacing save's objects are named; what a replaced save left is a leftover.
    names = {f["name"] for f in ckpt.read_metadata(url, s3=opts)["files"]}
    assert len(names) == 1 and f"dcp/step-1/{names.pop()}" in s3_gateway.keys(s3, bucket, "dcp/step-1/")
    # python -m ckpt.convert to and from s3:// (the AWS environment: it takes no options).
    from ckpt import convert
    for name, value in s3_gateway.aws_env().items():
        monkeypatch.setenv(name, value)
    native = os.path.join(tmp, "dcp-native")
    dcp.save(state, storage_writer=dcp.FileSystemWriter(native), no_dist=True)
    assert convert.main(["import", native, f"s3://{bucket}/dcp/imported"]) == 0
    assert convert.main(["export", f"s3://{bucket}/dcp/imported", os.path.join(tmp, "exported")]) == 0
    again = {"w": torch.zeros(10, 12, dtype=torch.bfloat16), "meta": {"epoch": 0, "name": ""}}
    dcp.load(again, storage_reader=dcp.FileSystemReader(os.path.join(tmp, "exported")), no_dist=True)
    assert torch.equal(again["w"], state["w"]) and again["meta"] == {"epoch": 3, "name": "x"}
