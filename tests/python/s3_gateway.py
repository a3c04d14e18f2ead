"""The project's S3 gateway for the Python tests, as tests/s3/s3_gateway.h is for the C++ ones:
scripts/s3-gateway.sh runs it, scripts/test.sh passes its endpoint and keys as
CKPT_TEST_S3_ENDPOINT_URL, _ACCESS_KEY_ID, _SECRET_ACCESS_KEY and _REGION. Where they are unset
or the gateway does not answer, a test that needs it is SKIPPED, or FAILS where CI=true (CI
must test against it). boto3 is the independent client: it makes and empties the buckets."""
import os
import uuid

import pytest

# The words of a skip for want of a gateway (CTest's SKIP_REGULAR_EXPRESSION of python_s3).
UNAVAILABLE = "SKIPPED without the S3 gateway"


def unavailable(why, module=False):
    if os.environ.get("CI") == "true":
        pytest.fail(f"the S3 gateway is needed here (CI=true) but {why}: scripts/test.sh starts it "
                    "(scripts/s3-gateway.sh)", pytrace=False)
    pytest.skip(f"{UNAVAILABLE}: it {why} (run scripts/s3-gateway.sh start and pass its endpoint as "
                "CKPT_TEST_S3_*; scripts/test.sh does)", allow_module_level=module)


def boto3_module(module=False):
    if os.environ.get("CKPT_REQUIRE_TORCH"):  # scripts/test.sh's venv has boto3: missing is a failure
        import boto3
        return boto3
    try:
        import boto3
    except ImportError:
        pytest.skip("no boto3 (pip install boto3; scripts/test.sh's venv has it)", allow_module_level=module)
    return boto3


_checked = {}


def config(module=False):
    """{"endpoint", "access_key_id", "secret_access_key", "region"} of a gateway that answers,
    or a skip (a failure where CI=true)."""
    c = {"endpoint": os.environ.get("CKPT_TEST_S3_ENDPOINT_URL", ""),
         "access_key_id": os.environ.get("CKPT_TEST_S3_ACCESS_KEY_ID", ""),
         "secret_access_key": os.environ.get("CKPT_TEST_S3_SECRET_ACCESS_KEY", ""),
         "region": os.environ.get("CKPT_TEST_S3_REGION", "") or "us-east-1"}
    if not (c["endpoint"] and c["access_key_id"] and c["secret_access_key"]):
        unavailable("is not configured (CKPT_TEST_S3_ENDPOINT_URL, _ACCESS_KEY_ID, _SECRET_ACCESS_KEY unset)", module)
    if c["endpoint"] not in _checked:
        try:
            _client(c, boto3_module(module)).list_buckets()
            _checked[c["endpoint"]] = None
        except Exception as e:  # noqa: BLE001 (any failure to reach it)
            _checked[c["endpoint"]] = f"does not answer at {c['endpoint']} ({type(e).__name__}: {e})"
    if _checked[c["endpoint"]]:
        unavailable(_checked[c["endpoint"]], module)
    return c


def _client(c, boto3):
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=c["endpoint"], aws_access_key_id=c["access_key_id"],
                        aws_secret_access_key=c["secret_access_key"], region_name=c["region"],
                        config=Config(connect_timeout=3, read_timeout=30, retries={"max_attempts": 2},
                                      s3={"addressing_style": "path"}))


def client():
    return _client(config(), boto3_module())


def options(**overrides):
    """ckpt.S3Options reaching the gateway, as a caller gives them (path-style)."""
    import ckpt
    c = config()
    return ckpt.S3Options(endpoint=c["endpoint"], region=c["region"], access_key_id=c["access_key_id"],
                          secret_access_key=c["secret_access_key"], addressing="path", **overrides)


def aws_env():
    """The AWS environment that reaches the gateway (for processes that take it from there)."""
    c = config()
    return {"AWS_ENDPOINT_URL": c["endpoint"], "AWS_ACCESS_KEY_ID": c["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": c["secret_access_key"], "AWS_REGION": c["region"]}


def make_bucket(s3, name=None):
    name = name or f"ckpt-py-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name)
    return name


def remove_bucket(s3, name):
    """Empties (objects, unfinished uploads) and removes bucket `name`; quietly."""
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                s3.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        for u in s3.list_multipart_uploads(Bucket=name).get("Uploads", []):
            s3.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
        s3.delete_bucket(Bucket=name)
    except Exception:  # noqa: BLE001 (cleanup: the gateway's RAM store goes with it anyway)
        pass


def keys(s3, bucket, prefix=""):
    """Every object key under `prefix`, sorted."""
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(o["Key"] for o in page.get("Contents", []))
    return sorted(out)
