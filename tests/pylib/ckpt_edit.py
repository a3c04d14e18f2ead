"""Editing a written checkpoint as a buggy writer or an attacker would, for the tests that
feed damaged checkpoints to libckpt and the tools (FORMAT.md §3.6, §5.5).

Format v2 puts a digest on metadata.json (its last member, over every byte before the
opening quote of "digest") and one on each shard index (files[i].index). An edit made with
redigest=False is a lie on its own, which a reader must refuse as a digest mismatch; with
redigest=True (the default) the digests are recomputed, so the checkpoint is consistent but
wrong, and what must catch it is the check behind the digests (tiling, shapes, checksums...).
v1 documents (no digest member) are written back without one.

The C++ twin is tests/ckpt_edit.h. Import with
    sys.path.insert(0, <tests>/pylib); import ckpt_edit
"""
import json
import os
import re

import numpy as np
import xxhash

INDEX_ATTR = "ckpt_shard_index"
DIGEST_MEMBER = b'"digest"'


def tag(data):
    """"xxh3-64:" + %016x of XXH3-64 (seed 0): the form of every digest and checksum."""
    return "xxh3-64:%016x" % xxhash.xxh3_64_intdigest(bytes(data))


def metadata_path(ckpt):
    return os.path.join(ckpt, "metadata.json")


def load_metadata(ckpt):
    with open(metadata_path(ckpt), "rb") as f:
        return json.loads(f.read())


def redigest_text(text):
    """A metadata.json text (bytes, ending with its "digest" member) with the digest
    recomputed over every byte before the member's opening quote."""
    at = text.rfind(DIGEST_MEMBER)
    if at < 0:
        raise ValueError("ckpt_edit: no \"digest\" member")
    body = text[:at]
    return body + b'"digest": "' + tag(body).encode() + b'"}\n'


def dump_metadata(md, redigest=True):
    """The bytes of metadata.json for document `md`. A document with a "digest" member (v2)
    gets it last, recomputed (or, with redigest=False, the stale one it carries)."""
    md = dict(md)
    if "digest" not in md:
        return json.dumps(md, indent=1).encode() + b"\n"
    stale = md.pop("digest")
    body = json.dumps(md, indent=1).encode().rstrip()
    assert body.endswith(b"}")
    body = body[:-1].rstrip() + (b",\n " if md else b"\n ")
    text = body + b'"digest": "' + str(stale).encode() + b'"}\n'
    return redigest_text(text) if redigest else text


def save_metadata(ckpt, md, redigest=True):
    with open(metadata_path(ckpt), "wb") as f:
        f.write(dump_metadata(md, redigest))


def edit_metadata(ckpt, fn, redigest=True):
    """fn(document) edits metadata.json in place; the digest is recomputed unless told not."""
    md = load_metadata(ckpt)
    fn(md)
    save_metadata(ckpt, md, redigest)


def edit_metadata_text(ckpt, fn, redigest=True):
    """fn(bytes) -> bytes over metadata.json's exact text, the digest recomputed after."""
    with open(metadata_path(ckpt), "rb") as f:
        text = fn(f.read())
    if redigest:
        text = redigest_text(text)
    with open(metadata_path(ckpt), "wb") as f:
        f.write(text)


def shard_path(ckpt, file_index, md=None):
    md = md or load_metadata(ckpt)
    return os.path.join(ckpt, md["files"][file_index]["name"])


def read_index_text(path):
    """The exact bytes of a shard's ckpt_shard_index attribute."""
    import h5py
    with h5py.File(path, "r") as f:
        v = f.attrs[INDEX_ATTR]
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, np.ndarray):
        v = v.item()
    return bytes(v).rstrip(b"\0")


def read_index(ckpt, file_index):
    return json.loads(read_index_text(shard_path(ckpt, file_index)))


def write_index(ckpt, file_index, index, redigest=True):
    """Replaces the ckpt_shard_index of files[file_index] through HDF5 (its own checksums
    stay valid) by `index` (a document, or the exact bytes); with redigest, metadata.json's
    files[i].index (and bytes) follow, and its own digest is recomputed."""
    import h5py
    md = load_metadata(ckpt)
    path = shard_path(ckpt, file_index, md)
    text = index if isinstance(index, (bytes, bytearray)) else json.dumps(index, separators=(",", ":")).encode()
    with h5py.File(path, "r+") as f:
        del f.attrs[INDEX_ATTR]
        f.attrs[INDEX_ATTR] = np.bytes_(bytes(text))
    if not redigest:
        return
    md["files"][file_index]["index"] = tag(text)
    md["files"][file_index]["bytes"] = os.path.getsize(path)
    save_metadata(ckpt, md)


def record_index(ckpt, file_index):
    """After something else rewrote shard file_index's index (tests/tools/hostile_shard):
    metadata.json records the digest of what the shard now holds."""
    write_index(ckpt, file_index, read_index_text(shard_path(ckpt, file_index)))


def edit_index_text(ckpt, file_index, fn, redigest=True):
    """fn(bytes) -> bytes over one shard index's exact text (for a lie alone: re-encoding
    the document could change more than the lie)."""
    write_index(ckpt, file_index, fn(read_index_text(shard_path(ckpt, file_index))), redigest)


def sub_once(text, pattern, repl):
    """`text` (bytes) with the one match of regular expression `pattern` (bytes) replaced by
    `repl`; an error unless it matches exactly once."""
    out, n = re.subn(pattern, repl, text)
    if n != 1:
        raise ValueError("ckpt_edit: %r matches %d times" % (pattern, n))
    return out


def edit_index(ckpt, file_index, fn, redigest=True):
    """fn(index document) edits one shard's index in place."""
    index = read_index(ckpt, file_index)
    fn(index)
    write_index(ckpt, file_index, index, redigest)


def edit_records(ckpt, key, fn, redigest=True):
    """fn(record, file_index) edits, in place, every index record of `key` in every shard.
    Returns how many records it was given."""
    n = 0
    for i in range(len(load_metadata(ckpt)["files"])):
        index = read_index(ckpt, i)
        mine = [r for r in index["chunks"] if r.get("key") == key]
        if not mine:
            continue
        for r in mine:
            fn(r, i)
        n += len(mine)
        write_index(ckpt, i, index, redigest)
    return n


def chunks(ckpt):
    """{key: [record + {"file": name, "file_index": i}, ...]} of every shard index (v2), or
    of metadata.json's chunk lists (v1): where each chunk of each key is stored."""
    md = load_metadata(ckpt)
    out = {}
    if md.get("format_version", 1) < 2:
        for key, e in md["entries"].items():
            for c in e.get("chunks", []):
                out.setdefault(key, []).append(dict(c, file_index=None))
        return out
    for i, f in enumerate(md["files"]):
        for r in read_index(ckpt, i)["chunks"]:
            out.setdefault(r["key"], []).append(dict(r, file=f["name"], file_index=i))
    for rs in out.values():
        rs.sort(key=lambda r: r.get("offsets", []))
    return out
