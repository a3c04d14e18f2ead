"""s3:// checkpoints from Python: ckpt.S3Options, and the check every entry point makes of a
path before libckpt sees it (python/src/module.cc turns the options into ckpt::ObjectStoreOptions).

A path "s3://bucket/prefix/step-100" is a checkpoint on S3-compatible object storage
(docs/object-storage.md). What is not set in S3Options comes from the AWS environment
(AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_PROFILE with ~/.aws/credentials and ~/.aws/config), as libckpt reads it.
"""
import dataclasses
import numbers
import os
from collections.abc import Mapping

from . import _ckpt
from .errors import Error

SCHEME = "s3://"
HAVE_S3 = bool(getattr(_ckpt, "have_s3", False))

# Fields whose value is never shown (repr, errors).
_SECRET = ("secret_access_key", "session_token")
_TEXT = ("endpoint", "region", "profile", "access_key_id", "secret_access_key", "session_token", "addressing",
         "staging_dir", "ca_bundle")
_COUNT = ("part_bytes", "upload_concurrency", "leftover_grace_seconds", "max_attempts", "cache_max_bytes")

NO_S3 = ("this build of the ckpt package has no S3 client (it was built with CKPT_WITH_S3=OFF, or without "
         "libcurl and OpenSSL found). The wheel of scripts/build-wheel.sh has it; to build one yourself, install "
         "libcurl4-openssl-dev and libssl-dev (scripts/install-deps.sh does) and run `pip install ./python` "
         "(or -DCKPT_WITH_S3=ON with -DCKPT_WITH_PYTHON=ON), then check ckpt.HAVE_S3")


@dataclasses.dataclass(repr=False)
class S3Options:
    """How to reach an S3-compatible store and how to write to it: libckpt's
    ckpt::ObjectStoreOptions (ckpt/checkpoint.h), field for field. Each field left None comes
    from the AWS environment and profile files (endpoint, region, profile, keys) or is the
    library's default; one set here overrides them.

      endpoint          "http://127.0.0.1:7480", "https://s3.eu-west-1.amazonaws.com"
      region, profile   the signing region; the profile of ~/.aws/credentials and ~/.aws/config
      access_key_id, secret_access_key, session_token   credentials (never shown by repr or
                        in an error)
      addressing        "auto" (a custom endpoint path-style), "path" or "virtual"
      ca_bundle         PEM file of the CA certificates an https endpoint is checked against
                        (else AWS_CA_BUNDLE, the profile's ca_bundle, libcurl's default)
      staging_dir       each rank's local staging of its shard (default $TMPDIR/ckpt-s3-staging)
      part_bytes, upload_concurrency   multipart parts (5 MiB..5 GiB, default 16 MiB) and how many
                        are in flight per rank (default 8)
      single_writer     accept a store whose conditional PUT does not work, promising one writer
      leftover_grace_seconds   leftovers younger than this are never removed (default 3600)
      max_attempts      tries of an idempotent request (default 8)
      cache_max_bytes   the most a load that must download a checkpoint fetches (default 64 GiB)
    """
    endpoint: str = None
    region: str = None
    profile: str = None
    access_key_id: str = None
    secret_access_key: str = None
    session_token: str = None
    addressing: str = None
    ca_bundle: str = None
    staging_dir: str = None
    part_bytes: int = None
    upload_concurrency: int = None
    single_writer: bool = None
    leftover_grace_seconds: int = None
    max_attempts: int = None
    cache_max_bytes: int = None

    def __repr__(self):
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                shown.append(f"{f.name}=<hidden>" if f.name in _SECRET else f"{f.name}={value!r}")
        return f"ckpt.S3Options({', '.join(shown)})"

    def _native(self):
        """{field: value} of the fields set, checked, for the extension."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            what = f"ckpt.S3Options.{f.name}"
            if f.name in _TEXT:
                if f.name in ("staging_dir", "ca_bundle") and isinstance(value, os.PathLike):
                    value = os.fspath(value)
                if not isinstance(value, str):  # the value is not shown: it may be a secret
                    raise Error("invalid argument", f"{what}: a {type(value).__name__}, not a str")
            elif f.name in _COUNT:
                if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                    raise Error("invalid argument", f"{what}: a {type(value).__name__}, not an int")
                value = int(value)
                if value < 0 or value >= 1 << 63:
                    raise Error("invalid argument", f"{what}: {value} is out of range (0..2^63)")
            elif not isinstance(value, bool):
                raise Error("invalid argument", f"{what}: a {type(value).__name__}, not a bool")
            out[f.name] = value
        return out


def options(s3):
    """S3Options of `s3`: None, an S3Options, or a mapping of its field names."""
    if s3 is None or isinstance(s3, S3Options):
        return s3
    if isinstance(s3, Mapping):
        names = {f.name for f in dataclasses.fields(S3Options)}
        unknown = sorted(str(k) for k in s3 if k not in names)
        if unknown:
            raise Error("invalid argument", f"s3 option '{unknown[0]}': ckpt.S3Options has no such field (it has "
                        f"{', '.join(sorted(names))})")
        return S3Options(**s3)
    raise Error("invalid argument", f"s3: a {type(s3).__name__}; pass a ckpt.S3Options, a dict of its fields, "
                "or None")


def is_url(path):
    return str(path).startswith(SCHEME)


def target(path, s3):
    """(path text, options for the extension) of a checkpoint path and the `s3` argument:
    an s3:// path needs the S3 client; a local path ignores `s3` (as libckpt does)."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    opts = options(s3)
    if text.startswith("s3:/") and not text.startswith(SCHEME):
        raise Error("invalid argument", f"{text}: an s3:// URL with one slash (pathlib.Path turns 's3://' into "
                    "'s3:/'): pass the URL as a str", text)
    if not text.startswith(SCHEME):
        return text, None
    if not HAVE_S3:
        raise Error("unsupported", f"{text}: {NO_S3}", text)
    return text, (opts._native() if opts is not None else None)
