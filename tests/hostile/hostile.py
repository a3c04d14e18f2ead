#!/usr/bin/python3
"""Hostile inputs for every reader of ckpt (issue 8): metadata.json, shard .h5 files and
.safetensors files.

Generates a corpus of hostile cases into --work (a valid checkpoint converted from a
safetensors file written here, then damaged one way per case), and runs each relevant
tool on each case (ckpt-inspect, ckpt-verify, ckpt-verify --quick, ckpt-merge, ckpt-diff,
ckpt-convert, and a Load through hostile_load) under a timeout and a memory cap. Checks:

  - no crash: the exit status is 0, 1 or 2, never a signal;
  - no hang: each run ends within --timeout seconds (cases that were quadratic before run
    under a tight timeout of their own, and under the memory cap);
  - linear work: on the cases that give a bound (many empty tensors), each tool reads at
    most so many bytes per tensor (the kernel's count of bytes read, not a clock);
  - a clear error: on a case marked bad, every tool but ckpt-inspect exits non-zero and
    ckpt-verify exits 1; the output names the input (the file or the key);
  - nothing opened outside the input: the cases that name a file outside (external links,
    virtual datasets, external storage) run under strace, which must show no successful
    open of it; a symlink out is opened by its own name, so those cases rely on being
    refused (ckpt-verify exits 1; the readers refuse it).

  hostile.py --bin DIR --load PATH --work DIR [--only hdf5] [--no-memory-cap] [--timeout S]

Format versions: the metadata.json field cases run on a real version 1 checkpoint
(tests/golden/v1/writer_full, written by the v1 library), so that the v1 parser stays
covered; the v2 cases (layouts, shard index records) damage the v2 base with the digests
recomputed (tests/pylib/ckpt_edit.py), so that what each one tests is the check behind the
digests; a few lies without the digests recomputed must be digest mismatches.

--only hdf5 runs the HDF5-level shard cases (external links, virtual datasets, external
storage, an unknown filter), which are CTest's hostile_hdf5; without it, everything else.
--only SECTION runs one section of the rest (metadata, v2, packs, special, shard-bytes,
safetensors), and --slice K/N every N-th of its cases from the K-th: CTest runs the corpus
as several such tests, in parallel, each well inside its timeout under the sanitizers.
"""
import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import time

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import ckpt_edit  # noqa: E402

V1_BASE = os.path.join(HERE, "..", "golden", "v1", "writer_full")
V1_W, V1_V = "model.a", "model.b"  # its float32 [11, 4] in 3 chunks, its bfloat16 [4, 9]

EMPTY_TENSORS_TIMEOUT = 240  # st-empty-tensors: a generous bound for a busy machine
READ_PER_EMPTY_TENSOR = 6000  # bytes a tool may read per empty tensor (2.4 KB measured, 15.5 KB before the fix)
FAILURES = []
RUNS = [0]


def fail(what):
    FAILURES.append(what)
    print("FAIL:", what, flush=True)


def write_safetensors(path, tensors, metadata=None, raw_header=None):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": {np.float32: "F32", np.int32: "I32"}[arr.dtype.type], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class Case:
    """One hostile input: `path` (a checkpoint directory, a shard or a safetensors file)."""

    def __init__(self, name, path, kind, bad=True, token=None, timeout=None, outside=None, group="main",
                 fatal=None, tools=None, inspect_lenient=False, ref=None, quick_lenient=False, reads=None,
                 prepare=None):
        self.name, self.path, self.kind, self.bad = name, path, kind, bad
        # (items, bytes): each tool may read (read/pread, /proc/PID/io's rchar) at most `bytes`
        # per item of the input: work that grows faster than the input (issue 32.6: HDF5
        # link-index blocks read again and again) shows as bytes read, whatever the machine's
        # speed, with no clock involved.
        self.reads = reads
        self.prepare = prepare  # makes `path` when the case is run (a case too costly to make in every slice)
        self.ref = ref  # what ckpt-diff compares it with (default: the v2 base)
        # ckpt-verify --quick reads no data: a well-formed checksum that is wrong shows only
        # when the data is read
        self.quick_lenient = quick_lenient
        self.tools = tools  # only these tools (default: all that read this kind)
        self.inspect_lenient = inspect_lenient  # ckpt-inspect lists what it cannot read
        # fatal: unreadable, so every tool must refuse it (exit non-zero); else only
        # ckpt-verify must (the readers are lenient about what does not change the data).
        self.fatal = bad if fatal is None else fatal
        # a string (or a tuple of strings) the error output must contain (default: the input's name)
        self.token = token
        self.timeout = timeout
        self.outside = outside  # a path no tool may open
        self.group = group


class Corpus:
    def __init__(self, args):
        self.args = args
        self.work = os.path.abspath(args.work)
        self.cases = []
        if os.path.exists(self.work):
            shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.cases_dir = os.path.join(self.work, "cases")
        os.makedirs(self.cases_dir)
        self.outside = os.path.join(self.work, "outside")  # what no tool may read
        os.makedirs(self.outside)
        self.section = None  # the section whose cases are being made

    def tool(self, name, *args, check=True):
        p = subprocess.run([os.path.join(self.args.bin, name)] + [str(a) for a in args], capture_output=True,
                           text=True, timeout=300)
        if check and p.returncode != 0:
            raise SystemExit(f"setup: {name} {args}: rc {p.returncode}: {p.stderr}")
        return p

    # --- the valid inputs the cases damage -----------------------------------------------

    def make_base(self):
        rng = np.random.default_rng(5)
        self.tensors = {"w": rng.standard_normal((8, 4)).astype(np.float32),
                        "v": rng.standard_normal((6,)).astype(np.float32),
                        "i": np.arange(12, dtype=np.int32).reshape(3, 4)}
        self.st = os.path.join(self.work, "base.safetensors")
        write_safetensors(self.st, self.tensors)
        self.base = os.path.join(self.work, "base")
        self.tool("ckpt-convert", self.st, self.base, "--world", 2)
        self.full = os.path.join(self.work, "base-full")
        self.tool("ckpt-convert", self.st, self.full, "--world", 1)
        self.tool("ckpt-verify", self.base)
        self.md = ckpt_edit.load_metadata(self.base)
        if self.md.get("format_version") != 2:
            raise SystemExit("setup: ckpt-convert did not write format version 2")
        self.shard0 = self.md["files"][0]["name"]
        self.full_shard = ckpt_edit.load_metadata(self.full)["files"][0]["name"]
        # The real v1 checkpoint the metadata field cases damage.
        self.v1 = os.path.join(self.work, "base-v1")
        shutil.copytree(V1_BASE, self.v1)
        self.tool("ckpt-verify", self.v1)
        self.v1md = ckpt_edit.load_metadata(self.v1)
        if self.v1md.get("format_version") != 1:
            raise SystemExit("setup: %s is not a version 1 checkpoint" % V1_BASE)
        # A valid metadata.json outside every case: a symlink to it must not be followed.
        shutil.copy(os.path.join(self.base, "metadata.json"), os.path.join(self.outside, "metadata.json"))
        shutil.copy(os.path.join(self.base, self.shard0), os.path.join(self.outside, "outside.h5"))
        shutil.copy(self.st, os.path.join(self.outside, "outside.safetensors"))

    def new_ckpt(self, name, src=None):
        d = os.path.join(self.cases_dir, name)
        shutil.copytree(src or self.base, d, symlinks=True)
        return d

    def add(self, case):
        case.section = self.section
        self.cases.append(case)

    # --- metadata.json -------------------------------------------------------------------

    def big(self, n):
        """The size of a case that proves linear work: 10x smaller under the sanitizers."""
        return n // 10 if self.args.sanitized else n

    def md_case(self, name, fn=None, text=None, bad=True, token="metadata.json", timeout=None, fatal=False,
                inspect_lenient=False):
        """A copy of the v1 checkpoint whose metadata.json is fn(copy of the parsed one), or
        `text` (bytes)."""
        d = self.new_ckpt(name, self.v1)
        if text is None:
            md = json.loads(json.dumps(self.v1md))
            fn(md)
            text = json.dumps(md).encode()
        with open(os.path.join(d, "metadata.json"), "wb") as f:
            f.write(text)
        self.add(Case(name, d, "ckpt", bad=bad, token=token, timeout=timeout, fatal=fatal,
                      inspect_lenient=inspect_lenient, ref=self.v1))

    def metadata_cases(self):
        """metadata.json field by field, on the v1 checkpoint (its parser, its chunk lists)."""
        md = self.v1md
        W, V = V1_W, V1_V
        qw = "'%s'" % W
        wrong_values = {"null": None, "int": 7, "neg": -1, "huge": 2 ** 64, "float": 1.5, "str": "x",
                        "list": [1], "obj": {"a": 1}, "bool": True, "longstr": "y" * 100000}
        for field in ["format", "format_version", "state_dict_type", "world_size", "library_version", "created",
                      "user", "files", "entries"]:
            self.md_case(f"md-drop-{field}", lambda m, f=field: m.pop(f))
            for vname, v in wrong_values.items():
                if field in ("library_version", "created") and isinstance(v, str):
                    continue  # any string is allowed there (the schema checks created's form)
                if field == "user" and isinstance(v, dict):
                    continue
                if field == "world_size" and vname == "int":
                    continue  # world_size 7 over two ranks' files is not checked
                self.md_case(f"md-{field}-{vname}", lambda m, f=field, v=v: m.__setitem__(f, v))
        # A tensor entry and its first chunk, field by field.
        for field in ["type", "dtype", "shape", "chunks"]:
            self.md_case(f"entry-drop-{field}", lambda m, f=field: m["entries"][W].pop(f), token=qw)
            for vname, v in wrong_values.items():
                self.md_case(f"entry-{field}-{vname}", lambda m, f=field, v=v: m["entries"][W].__setitem__(f, v),
                             token=qw)
        for field in ["offsets", "sizes", "file", "dataset", "checksum", "stored_bytes"]:
            self.md_case(f"chunk-drop-{field}", lambda m, f=field: m["entries"][W]["chunks"][0].pop(f),
                         token=qw)
            for vname, v in wrong_values.items():
                # stored_bytes is not checked against the shard (only its type and range are)
                ok = field == "stored_bytes" and vname == "int"
                self.md_case(f"chunk-{field}-{vname}",
                             lambda m, f=field, v=v: m["entries"][W]["chunks"][0].__setitem__(f, v), token=W,
                             bad=not ok)
        for field in ["name", "rank", "bytes"]:
            for vname, v in wrong_values.items():
                ok = field == "rank" and vname == "int"  # a rank past world_size is not checked
                self.md_case(f"file-{field}-{vname}", lambda m, f=field, v=v: m["files"][0].__setitem__(f, v),
                             token=None, bad=not ok)
        # Long names: std::regex overflowed the stack on these.
        self.md_case("long-dataset-30k", lambda m: m["entries"][W]["chunks"][0].__setitem__("dataset", "d" * 30000),
                     token=qw)
        self.md_case("long-dataset-1m", lambda m: m["entries"][W]["chunks"][0].__setitem__("dataset", "d" * 2 ** 20),
                     token=qw)
        self.md_case("long-key-1m", lambda m: m["entries"].__setitem__("k" * 2 ** 20, m["entries"].pop(W)),
                     bad=False, token=None)
        self.md_case("long-file-name", lambda m: m["files"][0].__setitem__("name", "f" * 5000), token=None)
        self.md_case("long-checksum", lambda m: m["entries"][W]["chunks"][0].__setitem__("checksum", "x" * 2 ** 20),
                     token=qw)
        self.md_case("long-created", lambda m: m.__setitem__("created", "2" * 2 ** 20), token=None)
        # Overflowing shapes, offsets and sizes.
        big = 2 ** 63 - 1
        for vname, shape, offs, sizes in [
                ("shape-2^62x2^62", [2 ** 62, 2 ** 62], [0, 0], [8, 4]),
                ("shape-int64max", [big, 4], [0, 0], [8, 4]),
                ("shape-neg", [-8, 4], [0, 0], [8, 4]),
                ("offset-int64max", [8, 4], [big, 0], [8, 4]),
                ("size-int64max", [8, 4], [0, 0], [big, 4]),
                ("offset-plus-size-wraps", [8, 4], [big - 2, 0], [8, 4]),
                ("offset-neg", [8, 4], [-1, 0], [8, 4]),
                ("rank-33", [1] * 33, [0] * 33, [1] * 33),
                ("rank-mismatch", [8, 4], [0], [8]),
                ("zero-d-with-offsets", [], [0], [1])]:
            def fn(m, shape=shape, offs=offs, sizes=sizes):
                m["entries"][W]["shape"] = shape
                m["entries"][W]["chunks"][0]["offsets"] = offs
                m["entries"][W]["chunks"][0]["sizes"] = sizes
            self.md_case(f"geom-{vname}", fn, token=qw, fatal=True)
        # n identical chunks: n^2/2 reports before (6,000 drove verify out of memory at 8 GB).
        for n in (6000, self.big(30000)):
            def fn(m, n=n):
                m["entries"][W]["chunks"] = [m["entries"][W]["chunks"][0]] * n
            self.md_case(f"identical-chunks-{n}", fn, token=qw, timeout=30, fatal=True, inspect_lenient=True)
        # Many thin chunks that do tile (column shards): the old sweep compared all pairs.
        # (These and the next are 10x smaller under the sanitizers: at full size each took most of
        # a 5-minute test there on a busy machine.)
        def thin(m, n=self.big(20000)):
            c0 = m["entries"][W]["chunks"][0]
            m["entries"][W]["shape"] = [8, n]
            m["entries"][W]["chunks"] = [dict(c0, offsets=[0, j], sizes=[8, 1], dataset=f"a@0,{j}")
                                           for j in range(n)]
        self.md_case(f"thin-chunks-{self.big(20000)}", thin, token=W, timeout=60)
        # Many keys, each one chunk of a missing dataset: linear reports.
        def many_keys(m, n=self.big(20000)):
            c0 = m["entries"][W]["chunks"][0]
            for j in range(n):
                m["entries"][f"x{j}"] = {"type": "tensor", "dtype": "float32", "shape": [1],
                                         "chunks": [dict(c0, offsets=[0], sizes=[1], dataset=f"x{j}")]}
        self.md_case(f"many-missing-datasets-{self.big(20000)}", many_keys, token="dataset", timeout=60)
        # Deep nesting.
        for depth in (65, 1000, 100000):
            t = json.dumps(dict(md, user={"a": "@deep@"}))
            nested = "[" * depth + "]" * depth
            assert '"@deep@"' in t and '"mesh": null' in t
            self.md_case(f"deep-user-{depth}", text=t.replace('"@deep@"', nested).encode(), fatal=True)
            self.md_case(f"deep-mesh-{depth}", text=t.replace('"mesh": null', '"mesh": ' + nested).encode(),
                         fatal=True)
        # Truncated, empty, bad bytes.
        t = json.dumps(md).encode()
        for cut in (0, 1, 10, len(t) // 3, len(t) // 2, len(t) - 2, len(t) - 1):
            self.md_case(f"truncated-at-{cut}", text=t[:cut], fatal=True)
        self.md_case("nul-byte", text=t[:40] + b"\0" + t[40:], fatal=True)
        self.md_case("bom", text=b"\xef\xbb\xbf" + t, bad=False)  # RFC 8259 lets a parser ignore it
        self.md_case("bad-utf8-key", text=t.replace(b'"%s"' % W.encode(), b'"a\xff"'), token=None, fatal=True)
        self.md_case("bad-utf8-value", text=t.replace(b'"float32"', b'"float\xc0\xaf"', 1), fatal=True)
        self.md_case("overlong-utf8", text=t.replace(b'"%s"' % W.encode(), b'"\xc1\xb7"'), token=None, fatal=True)
        self.md_case("surrogate-escape", text=t.replace(b'"%s"' % W.encode(), b'"\\ud800"'), token=None, fatal=True)
        self.md_case("trailing-garbage", text=t + b" {}", fatal=True)
        self.md_case("not-an-object", text=b"[" + t + b"]", fatal=True)
        # Duplicate keys.
        self.md_case("dup-top", text=t[:-1] + b', "format": "ckpt"}', fatal=True)
        self.md_case("dup-entry", text=t.replace(b'"entries": {', b'"entries": {"%s": {}, ' % W.encode(), 1), token=W,
                     fatal=True)
        self.md_case("dup-chunk-field", text=t.replace(b'"offsets": [', b'"sizes": [1], "offsets": [', 1),
                     token=W, fatal=True)
        # Files: unsafe names, listed twice, missing.
        for vname, v in [("dotdot", "../outside/outside.h5"), ("abs", os.path.join(self.outside, "outside.h5")),
                         ("dot", "."), ("empty", ""), ("slash", "a/b.h5"), ("nul", "a\u0000b")]:
            def fn(m, v=v):
                old = m["files"][0]["name"]
                m["files"][0]["name"] = v
                for e in m["entries"].values():
                    for c in e.get("chunks", []):
                        if c["file"] == old:
                            c["file"] = v
            self.md_case(f"file-name-{vname}", fn, token=None)
        self.md_case("file-listed-twice", lambda m: m["files"].append(dict(m["files"][0])), token=None)
        self.md_case("file-missing", lambda m: m["files"].append({"name": "shard-00009-of-00010.h5", "rank": 9,
                                                                  "bytes": 10}), token="shard-00009")
        self.md_case("chunk-file-unlisted", lambda m: m["entries"][W]["chunks"][0].__setitem__("file", "nope.h5"),
                     token="nope.h5")
        self.md_case("unknown-dtype", lambda m: m["entries"][W].__setitem__("dtype", "float128"), token=W)
        self.md_case("unknown-compression",
                     lambda m: m["entries"][W]["chunks"][0].__setitem__("compression", {"codec": "lz4"}), token=W)
        self.md_case("future-version", lambda m: m.__setitem__("format_version", 99), token=None)
        self.md_case("swapped-datasets", lambda m: m["entries"][V]["chunks"][0].__setitem__(
            "dataset", m["entries"][W]["chunks"][0]["dataset"]), token=V)

    # --- format v2: layouts and shard index records, digests recomputed ---------------------

    def v2_case(self, name, md_fn=None, record_fn=None, index_fn=None, token=None, redigest=True, fatal=True,
                inspect_lenient=False, timeout=None, bad=True, quick_lenient=False):
        """A copy of the v2 base with metadata.json edited by md_fn(document), each index
        record of w by record_fn(record, file index), shard 0's whole index document by
        index_fn(document); the digests recomputed unless redigest is False."""
        d = self.new_ckpt(name)
        if md_fn:
            ckpt_edit.edit_metadata(d, md_fn, redigest)
        if record_fn:
            ckpt_edit.edit_records(d, "w", record_fn, redigest)
        if index_fn:
            ckpt_edit.edit_index(d, 0, index_fn, redigest)
        self.add(Case(name, d, "ckpt", bad=bad, token=token, fatal=fatal, inspect_lenient=inspect_lenient,
                      timeout=timeout, quick_lenient=quick_lenient))

    def v2_cases(self):
        md = self.md
        shard0, shard1 = self.shard0, md["files"][1]["name"]
        w = md["entries"]["w"]
        assert w["shape"] == [8, 4] and "grid" in w["layout"], w
        qw = "'w'"

        def layout(value):
            return lambda m: m["entries"]["w"].__setitem__("layout", value)

        def grid(*splits, files=None):
            return layout({"grid": list(splits), "files": files if files is not None else
                           {"base": 0, "strides": [1, 0]}})

        # The lie alone: the digest catches it, naming metadata.json (or the shard).
        self.v2_case("v2-md-lie-alone", token=("metadata.json", "digest mismatch"))
        ckpt_edit.edit_metadata_text(self.cases[-1].path, lambda t: ckpt_edit.sub_once(
            t, rb'"shape": ?\[8, ?4\]', b'"shape":[8,5]'), redigest=False)
        self.v2_case("v2-md-digest-missing", lambda m: m.pop("digest"), token=("metadata.json", "digest"),
                     redigest=False)
        self.v2_case("v2-index-lie-alone", token=(shard0, "digest"), inspect_lenient=True)
        off = [c for c in ckpt_edit.chunks(self.base)["w"] if c["file_index"] == 0][0]["offset"]
        ckpt_edit.edit_index_text(self.cases[-1].path, 0, lambda t: ckpt_edit.sub_once(
            t, b'"offset": ?%d\\b' % off, b'"offset":%d' % (off + 4)), redigest=False)
        self.v2_case("v2-index-digest-wrong", lambda m: m["files"][1].__setitem__(
            "index", ckpt_edit.tag(b"other")), token=(shard1, "digest"), inspect_lenient=True)
        # Hostile layouts (the grid-cell cap, tiling, cell->file maps).
        self.v2_case("v2-step-1-huge-extent", lambda m: (m["entries"]["w"].__setitem__("shape", [2 ** 40, 4]),
                                                      grid({"step": 1}, {"step": 4})(m)), token=qw, timeout=20)
        self.v2_case("v2-step-1-huge-2d", lambda m: (m["entries"]["w"].__setitem__("shape", [2 ** 31, 2 ** 31]),
                                                  grid({"step": 1}, {"step": 1})(m)), token=qw, timeout=20)
        self.v2_case("v2-step-0", grid({"step": 0}, {"step": 4}), token=qw)
        self.v2_case("v2-step-neg", grid({"step": -4}, {"step": 4}), token=qw)
        # one part of 8 (the torch.chunk rule), in file 0, which holds no such chunk: only the
        # readers of the shards can tell
        self.v2_case("v2-step-past-extent", grid({"step": 9}, {"step": 4}), token=qw, inspect_lenient=True)
        self.v2_case("v2-step-huge", grid({"step": 2 ** 64}, {"step": 4}), token=qw)
        self.v2_case("v2-sizes-wrong-sum", grid({"sizes": [3, 3]}, {"step": 4}), token=qw)
        self.v2_case("v2-sizes-neg", grid({"sizes": [10, -2]}, {"step": 4}), token=qw)
        self.v2_case("v2-sizes-zero-part", grid({"sizes": [4, 0, 4]}, {"step": 4},
                                                files={"base": 0, "strides": [0, 0]}), token=qw)
        self.v2_case("v2-sizes-wrap", grid({"sizes": [2 ** 63 - 1, 2 ** 63 - 1, 10]}, {"step": 4}), token=qw)
        n = self.big(1000000)
        self.v2_case(f"v2-sizes-{n}", grid({"sizes": [1] * n}, {"step": 4}), token=qw, timeout=20)
        self.v2_case("v2-split-both", grid({"step": 4, "sizes": [4, 4]}, {"step": 4}), token=qw)
        self.v2_case("v2-split-neither", grid({}, {"step": 4}), token=qw)
        self.v2_case("v2-grid-rank-short", grid({"step": 4}), token=qw)
        self.v2_case("v2-grid-rank-long", grid({"step": 4}, {"step": 4}, {"step": 1}), token=qw)
        self.v2_case("v2-files-list-short", grid({"step": 4}, {"step": 4}, files=[0]), token=qw)
        self.v2_case("v2-files-list-long", grid({"step": 4}, {"step": 4}, files=[0, 1, 0]), token=qw)
        self.v2_case("v2-files-list-out-of-range", grid({"step": 4}, {"step": 4}, files=[0, 2]), token=qw)
        self.v2_case("v2-files-list-neg", grid({"step": 4}, {"step": 4}, files=[0, -1]), token=qw)
        self.v2_case("v2-files-list-str", grid({"step": 4}, {"step": 4}, files=[0, "1"]), token=qw)
        self.v2_case("v2-files-base-neg", grid({"step": 4}, {"step": 4}, files={"base": -1, "strides": [1, 0]}),
                     token=qw)
        self.v2_case("v2-files-base-out-of-range", grid({"step": 4}, {"step": 4},
                                                       files={"base": 2, "strides": [1, 0]}), token=qw)
        self.v2_case("v2-strides-overflow", grid({"step": 4}, {"step": 4},
                                                files={"base": 2 ** 63 - 1, "strides": [2 ** 63 - 1, 0]}), token=qw)
        self.v2_case("v2-strides-wrap-to-valid", grid({"step": 4}, {"step": 4},
                                                     files={"base": 1, "strides": [2 ** 64 - 1, 0]}), token=qw)
        self.v2_case("v2-strides-neg-out", grid({"step": 4}, {"step": 4}, files={"base": 0, "strides": [-1, 0]}),
                     token=qw)
        self.v2_case("v2-strides-length", grid({"step": 4}, {"step": 4}, files={"base": 0, "strides": [1]}),
                     token=qw)
        self.v2_case("v2-grid-and-chunks", layout({"grid": w["layout"]["grid"], "files": w["layout"]["files"],
                                                   "chunks": []}), token=qw)
        self.v2_case("v2-layout-empty", layout({}), token=qw)
        self.v2_case("v2-layout-missing", lambda m: m["entries"]["w"].pop("layout"), token=qw)
        # A grid with more cells than any index holds: 32 cells, 2 records.
        self.v2_case("v2-grid-more-cells-than-records", grid({"step": 1}, {"step": 1},
                                                            files={"base": 0, "strides": [0, 0]}),
                     token=(qw, shard0), inspect_lenient=True)
        self.v2_case("v2-grid-fewer-cells-than-records", lambda m: (m["entries"]["w"].__setitem__("shape", [4, 4]),
                                                                    grid({"step": 4}, {"step": 4})(m)),
                     token=qw, inspect_lenient=True)
        # Explicit lists: overlapping, 300,000 identical chunks, a chunk in the wrong file.
        # (ckpt-inspect lists an explicit layout without checking its tiling, as for v1.)
        c0 = {"offsets": [0, 0], "sizes": [4, 4], "file": 0}
        self.v2_case("v2-explicit-overlap", layout({"chunks": [c0, dict(c0, offsets=[2, 0], file=1)]}), token=qw,
                     inspect_lenient=True)
        n = self.big(300000)
        self.v2_case(f"v2-explicit-identical-{n}", layout({"chunks": [c0] * n}), token=qw, timeout=30,
                     inspect_lenient=True)
        self.v2_case("v2-explicit-wrong-file", layout({"chunks": [c0, dict(c0, offsets=[4, 0], file=0)]}),
                     token=(qw, shard0), inspect_lenient=True)
        self.v2_case("v2-explicit-file-huge", layout({"chunks": [c0, dict(c0, offsets=[4, 0], file=2 ** 63)]}),
                     token=qw)
        # Hostile index records (the lie in the shard index, its digest in metadata.json
        # updated): what the reader trusts once the digest matches is still checked.
        lenient = dict(inspect_lenient=True)

        def rec(field, value):
            return lambda r, _: r.__setitem__(field, value)
        for vname, v in [("huge", 2 ** 62), ("not-pow2", 12288), ("small", 512), ("zero", 0), ("neg", -4096),
                         ("str", "4096")]:
            self.v2_case(f"v2-record-block-bytes-{vname}", record_fn=rec("block_bytes", v), token=qw, **lenient)
        self.v2_case("v2-record-blocks-long", record_fn=lambda r, _: r.__setitem__("blocks", r["blocks"] + "0" * 16),
                     token=qw, **lenient)
        self.v2_case("v2-record-blocks-short", record_fn=lambda r, _: r.__setitem__("blocks", r["blocks"][:-1]),
                     token=qw, **lenient)
        self.v2_case("v2-record-blocks-not-hex", record_fn=lambda r, _: r.__setitem__(
            "blocks", "z" * len(r["blocks"])), token=qw, **lenient)
        self.v2_case("v2-record-blocks-huge", record_fn=rec("blocks", "0" * (16 << 20)), token=qw, **lenient)
        # The readers of v2 checkpoints locate chunks through HDF5 (the offset lie cannot change
        # what they return: not fatal); ckpt-verify checks the record against the dataset.
        self.v2_case("v2-record-offset-past-file", record_fn=rec("offset", 1 << 40), token=qw, fatal=False, **lenient)
        self.v2_case("v2-record-offset-wraps", record_fn=rec("offset", 2 ** 64 - 8), token=qw, fatal=False,
                     **lenient)
        self.v2_case("v2-record-offset-neg", record_fn=rec("offset", -1), token=qw, **lenient)
        self.v2_case("v2-record-offset-shifted", record_fn=lambda r, _: r.__setitem__("offset", r["offset"] + 4),
                     token=qw, fatal=False, **lenient)
        self.v2_case("v2-record-checksum", record_fn=lambda r, _: r.__setitem__(
            "checksum", ckpt_edit.tag(b"other")), token=qw, quick_lenient=True, **lenient)
        self.v2_case("v2-record-sizes", record_fn=rec("sizes", [4, 5]), token=qw, **lenient)
        self.v2_case("v2-record-offsets", record_fn=rec("offsets", [2, 0]), token=qw, **lenient)
        self.v2_case("v2-record-shape", record_fn=rec("shape", [8, 5]), token=qw, **lenient)
        self.v2_case("v2-record-dtype", record_fn=rec("dtype", "int32"), token=qw, **lenient)
        self.v2_case("v2-record-dataset-missing", record_fn=lambda r, _: (r.pop("offset"), r.__setitem__(
            "dataset", "nothing")), token=qw, **lenient)
        self.v2_case("v2-record-dataset-other", record_fn=lambda r, _: (r.pop("offset"), r.__setitem__(
            "dataset", r["dataset"].replace("w", "v", 1))), token=qw, **lenient)
        # stored_bytes: its range is checked, and an uncompressed chunk's is its byte size (§5.5;
        # v1's value is not checked)
        self.v2_case("v2-record-stored-bytes-huge", record_fn=rec("stored_bytes", 2 ** 64), token=qw, **lenient)
        self.v2_case("v2-record-stored-bytes-lie", record_fn=rec("stored_bytes", 2 ** 40), token=qw, **lenient)
        self.v2_case("v2-record-dropped", index_fn=lambda ix: ix.__setitem__(
            "chunks", [r for r in ix["chunks"] if r["key"] != "w"]), token=(qw, shard0), **lenient)

        def duplicate(ix):
            ix["chunks"] += [r for r in ix["chunks"] if r["key"] == "w"]
        self.v2_case("v2-record-duplicate", index_fn=duplicate, token=(qw, shard0), **lenient)

        n = self.big(200000)

        def many(ix, n=n):
            ix["chunks"] += [r for r in ix["chunks"] if r["key"] == "w"] * n
        self.v2_case(f"v2-record-duplicate-{n}", index_fn=many, token=shard0, timeout=30, **lenient)
        self.v2_case("v2-index-version", index_fn=lambda ix: ix.__setitem__("format_version", 99), token=shard0,
                     **lenient)
        self.v2_case("v2-index-not-json", index_fn=None, token=shard0, **lenient)
        ckpt_edit.write_index(self.cases[-1].path, 0, b"{nope")
        self.v2_case("v2-index-deep", index_fn=None, token=shard0, **lenient)
        ckpt_edit.write_index(self.cases[-1].path, 0, b"[" * 100000 + b"]" * 100000)

    # --- packs (FORMAT.md §5.7) -----------------------------------------------------------

    def pack_cases(self):
        """Hostile packed records and pack datasets, on a base whose small tensors p0, p1, p2
        share one pack (hostile_load --write-packed), digests recomputed."""
        base = os.path.join(self.work, "base-packed")
        subprocess.run([self.args.load, "--write-packed", base], check=True)
        recs = {k: v[0] for k, v in ckpt_edit.chunks(base).items()}
        assert all("pack_offset" in recs[k] for k in ("p0", "p1", "p2")), recs
        shard = ckpt_edit.load_metadata(base)["files"][0]["name"]
        p0, p1 = recs["p0"], recs["p1"]
        lenient = dict(inspect_lenient=True)

        def case(name, key, fn, token=None, **kw):
            d = self.new_ckpt(name, base)
            ckpt_edit.edit_records(d, key, lambda r, _: fn(r))
            self.add(Case(name, d, "ckpt", token=token or ("'%s'" % key, shard), fatal=True, **kw))

        def shift(r, by):
            r["pack_offset"] += by
            r["offset"] += by
        case("pack-record-outside", "p2", lambda r: shift(r, 1 << 20), **lenient)
        case("pack-record-past-file", "p2", lambda r: shift(r, 1 << 40), **lenient)
        case("pack-record-overlap", "p1", lambda r: (r.__setitem__("pack_offset", p0["pack_offset"] + 4),
                                                     r.__setitem__("offset", p0["offset"] + 4)), **lenient)
        case("pack-record-base-differs", "p1", lambda r: r.__setitem__("offset", r["offset"] + 8), **lenient)
        case("pack-record-huge", "p1", lambda r: r.__setitem__("pack_offset", 2 ** 64 - 1), **lenient)
        case("pack-record-neg", "p1", lambda r: r.__setitem__("pack_offset", -4), **lenient)
        case("pack-record-no-offset", "p1", lambda r: r.pop("offset"), **lenient)
        case("pack-record-compressed", "p1", lambda r: r.__setitem__(
            "compression", {"codec": "zstd", "level": 3, "shuffle": True}), **lenient)
        case("pack-record-not-a-pack", "p1", lambda r: r.__setitem__("dataset", "big"), **lenient)
        case("pack-record-missing-pack", "p1", lambda r: r.__setitem__("dataset", ".ckpt_pack.9"), **lenient)
        case("pack-record-path", "p1", lambda r: r.__setitem__("dataset", ".ckpt_pack.0/x"), **lenient)

        # The pack itself replaced (by h5py) with a dataset of another dtype, or of 2 dims:
        # every member names it.
        for name, dtype, shape in [("pack-dataset-float32", "<f4", (32,)), ("pack-dataset-2d", "u1", (4, 100))]:
            d = self.new_ckpt(name, base)
            with h5py.File(os.path.join(d, shard), "r+") as h:
                del h[p0["dataset"]]
                h.create_dataset(p0["dataset"], shape=shape, dtype=dtype)
            ckpt_edit.edit_index(d, 0, lambda ix: None)  # the shard's new size recorded
            self.add(Case(name, d, "ckpt", token=(shard, p0["dataset"]), fatal=True, **lenient))

        # A gap: a member's record dropped (metadata.json no longer names the key): only
        # ckpt-verify sees that the pack holds bytes no member claims.
        def drop(m):
            m["entries"].pop("p1")
        d = self.new_ckpt("pack-gap", base)
        ckpt_edit.edit_index(d, 0, lambda ix: ix.__setitem__("chunks", [r for r in ix["chunks"]
                                                                         if r["key"] != "p1"]))
        ckpt_edit.edit_metadata(d, drop)
        self.add(Case("pack-gap", d, "ckpt", token=(shard, "pack"), fatal=False, **lenient))

    # --- metadata.json that is not a regular file ----------------------------------------

    def special_file_cases(self):
        def special(name, make, bad=True, outside=None):
            d = self.new_ckpt(name)
            m = os.path.join(d, "metadata.json")
            os.remove(m)
            make(m)
            self.add(Case(name, d, "ckpt", bad=bad, token="metadata.json", timeout=20, outside=outside, fatal=True))
        special("metadata-fifo", os.mkfifo)
        special("metadata-symlink-outside",
                lambda m: os.symlink(os.path.join(self.outside, "metadata.json"), m),
                outside=os.path.join(self.outside, "metadata.json"))
        special("metadata-symlink-dev-zero", lambda m: os.symlink("/dev/zero", m))
        special("metadata-symlink-dangling", lambda m: os.symlink(os.path.join(self.work, "nothing"), m))
        special("metadata-directory", os.mkdir)
        special("metadata-empty", lambda m: open(m, "wb").close())

        def sparse(m, size=(2 << 30) + 4096):
            with open(m, "wb") as f:
                f.truncate(size)
        special("metadata-sparse-2gib", sparse)

        def zeros_4m(m):
            with open(m, "wb") as f:
                f.write(b"\0" * (4 << 20))
        special("metadata-zeros-4mib", zeros_4m)
        # Shards that are not regular files, or lie outside.
        def shard_special(name, make, outside=None):
            d = self.new_ckpt(name)
            s = os.path.join(d, self.shard0)
            os.remove(s)
            make(s)
            self.add(Case(name, d, "ckpt", token=self.shard0, timeout=20, outside=outside, fatal=True))
        shard_special("shard-fifo", os.mkfifo)
        shard_special("shard-symlink-outside", lambda s: os.symlink(os.path.join(self.outside, "outside.h5"), s),
                      outside=os.path.join(self.outside, "outside.h5"))
        shard_special("shard-symlink-dev-zero", lambda s: os.symlink("/dev/zero", s))
        shard_special("shard-directory", os.mkdir)
        shard_special("shard-missing", lambda s: None)

        def shard_sparse(s):
            with open(s, "wb") as f:
                f.truncate((2 << 30) + 4096)
        shard_special("shard-sparse-2gib", shard_sparse)
        # Lone files named on the command line that are not regular files.
        for name, make in [("lone-fifo.safetensors", os.mkfifo), ("lone-fifo.h5", os.mkfifo),
                           ("lone-fifo", os.mkfifo),
                           ("lone-dev-zero.safetensors", lambda p: os.symlink("/dev/zero", p)),
                           ("lone-dev-zero.h5", lambda p: os.symlink("/dev/zero", p)),
                           ("lone-dir.safetensors", os.mkdir)]:
            p = os.path.join(self.cases_dir, name)
            make(p)
            self.add(Case(name, p, "file", token=name, timeout=20))

    # --- shard bytes ---------------------------------------------------------------------

    def shard_byte_cases(self):
        size = os.path.getsize(os.path.join(self.base, self.shard0))

        def shard_bytes(name, fn, fix_size=True, bad=True, lone_bad=True):
            d = self.new_ckpt(name)
            s = os.path.join(d, self.shard0)
            with open(s, "rb") as f:
                data = bytearray(f.read())
            data = fn(data)
            with open(s, "wb") as f:
                f.write(data)
            if fix_size:  # the recorded size matches, so HDF5 has to read the bytes
                ckpt_edit.edit_metadata(d, lambda m: m["files"][0].__setitem__("bytes", len(data)))
            self.add(Case(name, d, "ckpt", token=self.shard0, timeout=30, bad=bad, fatal=False))
            lone = os.path.join(self.cases_dir, name + ".h5")
            with open(lone, "wb") as f:
                f.write(data)
            self.add(Case(name + "-lone", lone, "file", token=name, timeout=30, bad=bad and lone_bad, fatal=False))
        for cut in (0, 8, 100, 512, 2048, size // 2, size - 1):
            if cut < size:
                shard_bytes(f"shard-truncated-{cut}", lambda b, c=cut: b[:c])
        shard_bytes("shard-zeros", lambda b: bytearray(len(b)))
        shard_bytes("shard-signature-then-zeros", lambda b: b[:8] + bytearray(len(b) - 8))
        rng = np.random.default_rng(7)
        for i in range(12):
            def flip(b, i=i):
                b = bytearray(b)
                for pos in rng.integers(0, len(b), size=1 + i * 3):
                    b[pos] ^= 1 << int(rng.integers(0, 8))
                return b
            shard_bytes(f"shard-bitflips-{i}", flip, bad=False)  # a flip may land in unused bytes
        shard_bytes("shard-appended-garbage", lambda b: b + b"\xff" * 4096, bad=False)
        shard_bytes("shard-size-lie", lambda b: b + b"\0" * 16, fix_size=False, lone_bad=False)

    # --- HDF5 features a shard may not use (hostile_hdf5) --------------------------------

    def hdf5_cases(self):
        outside_h5 = os.path.join(self.outside, "outside-data.h5")
        with h5py.File(outside_h5, "w") as f:
            f.create_dataset("w", data=self.tensors["w"])
        raw = os.path.join(self.outside, "raw.bin")
        self.tensors["w"].tofile(raw)
        w_ds = ckpt_edit.chunks(self.full)["w"][0]["dataset"]

        # dir_fatal: whether the readers of the checkpoint directory must refuse it too. Where
        # the old dataset is replaced in place, its bytes stay where the shard index says they
        # are: readers that locate chunks through the index read those bytes, checked against
        # the index record's block digests, from inside the file and open nothing outside (strace
        # checks that), so the values cannot change; ckpt-verify, which checks every dataset
        # header, and every reader of the lone shard (no checksums) must refuse it.
        def rewrite(name, fn, outside=None, bad=True, dir_fatal=True):
            d = self.new_ckpt(name, self.full)
            s = os.path.join(d, self.full_shard)
            with h5py.File(s, "r+") as f:
                del f[w_ds]
                fn(f)
            ckpt_edit.edit_metadata(d, lambda m: m["files"][0].__setitem__("bytes", os.path.getsize(s)))
            # (ckpt-inspect reads metadata.json or the shard index only: it may list them)
            self.add(Case(name, d, "ckpt", token=self.full_shard, timeout=30, outside=outside, group="hdf5", bad=bad,
                          fatal=bad and dir_fatal, inspect_lenient=True))
            lone = os.path.join(self.cases_dir, name + ".h5")
            shutil.copy(s, lone)
            self.add(Case(name + "-lone", lone, "file", token=name, timeout=30, outside=outside, group="hdf5",
                          bad=bad, inspect_lenient=True))
        rewrite("hdf5-external-link", lambda f: f.__setitem__(w_ds, h5py.ExternalLink(outside_h5, "w")),
                outside=outside_h5)
        rewrite("hdf5-soft-link", lambda f: (f.create_dataset("other", data=self.tensors["w"]),
                                             f.__setitem__(w_ds, h5py.SoftLink("/other"))), bad=False)

        def vds(f):
            layout = h5py.VirtualLayout(shape=(8, 4), dtype="f4")
            layout[:] = h5py.VirtualSource(outside_h5, "w", shape=(8, 4))
            f.create_virtual_dataset(w_ds, layout)
        rewrite("hdf5-virtual-dataset", vds, outside=outside_h5, dir_fatal=False)
        rewrite("hdf5-external-storage", lambda f: f.create_dataset(
            w_ds, shape=(8, 4), dtype="f4", external=[(raw, 0, h5py.h5f.UNLIMITED)]), outside=raw, dir_fatal=False)

        def lz4(f):
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_chunk((8, 4))
            dcpl.set_filter(32004, h5py.h5z.FLAG_OPTIONAL, ())
            space = h5py.h5s.create_simple((8, 4))
            h5py.h5d.create(f.id, w_ds.encode(), h5py.h5t.NATIVE_FLOAT, space, dcpl=dcpl)
        rewrite("hdf5-unknown-filter-lz4", lz4, dir_fatal=False)

    # --- safetensors ---------------------------------------------------------------------

    def safetensors_cases(self):
        def st(name, header=None, data=b"", raw=None, bad=True, timeout=None, tensors=None, tools=None, reads=None):
            p = os.path.join(self.cases_dir, name + ".safetensors")
            if raw is not None:
                with open(p, "wb") as f:
                    f.write(raw)
            elif tensors is not None:
                write_safetensors(p, tensors)
            else:
                h = header if isinstance(header, bytes) else json.dumps(header).encode()
                with open(p, "wb") as f:
                    f.write(struct.pack("<Q", len(h)) + h + data)
            self.add(Case(name, p, "st", bad=bad, token=name, timeout=timeout, tools=tools, reads=reads))
        e = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
        st("st-empty", raw=b"")
        st("st-short", raw=b"\x01\x02")
        st("st-len-huge", raw=struct.pack("<Q", 2 ** 64 - 1) + b"{}")
        st("st-len-past-end", raw=struct.pack("<Q", 1000) + b"{}")
        st("st-len-zero", raw=struct.pack("<Q", 0))
        st("st-not-json", b"{nope", b"")
        st("st-array", [1, 2])
        st("st-entry-not-object", {"a": 1})
        st("st-bad-utf8-name", b'{"a\xff": ' + json.dumps(e).encode() + b"}", b"\0" * 8)
        st("st-long-name-26k", tensors={"n" * 26000: np.zeros(2, np.float32)}, bad=False)
        st("st-long-name-1m", tensors={"n" * 2 ** 20: np.zeros(2, np.float32)}, bad=False)
        st("st-dup-name", b'{"a": ' + json.dumps(e).encode() + b', "a": ' + json.dumps(e).encode() + b"}", b"\0" * 8)
        st("st-unknown-dtype", {"a": dict(e, dtype="F128")}, b"\0" * 8)
        st("st-rank-33", {"a": dict(e, shape=[1] * 33, data_offsets=[0, 4])}, b"\0" * 4)
        st("st-shape-overflow", {"a": dict(e, shape=[2 ** 62, 2 ** 62], data_offsets=[0, 8])}, b"\0" * 8)
        st("st-shape-neg", {"a": dict(e, shape=[-2])}, b"\0" * 8)
        st("st-offsets-max", {"a": dict(e, data_offsets=[2 ** 64 - 8, 2 ** 64 - 1])}, b"\0" * 8)
        st("st-offsets-reversed", {"a": dict(e, data_offsets=[8, 0])}, b"\0" * 8)
        st("st-offsets-past-end", {"a": dict(e, data_offsets=[0, 800])}, b"\0" * 8)
        st("st-overlap", {"a": e, "b": e}, b"\0" * 8)
        st("st-gap", {"a": dict(e, data_offsets=[8, 16])}, b"\0" * 16)
        st("st-unknown-field", {"a": dict(e, extra=1)}, b"\0" * 8)
        st("st-metadata-not-string", {"__metadata__": {"k": 1}, "a": e}, b"\0" * 8)
        st("st-metadata-deep", b'{"__metadata__": ' + b"[" * 100000 + b"]" * 100000 + b"}")
        st("st-deep-header", b"[" * 100000 + b"]" * 100000)
        st("st-empty-name", {"": e}, b"\0" * 8)
        valid = json.dumps({"a": e}).encode()
        for cut in (1, len(valid) // 2, len(valid) - 1):
            st(f"st-truncated-header-{cut}", raw=struct.pack("<Q", len(valid)) + valid[:cut])
        st("st-truncated-data", raw=struct.pack("<Q", len(valid)) + valid + b"\0" * 4)
        # 100,000 tensors: verifying was quadratic (18 s; now 2.5 s). (Converting them is
        # linear but slow, 0.5 ms a dataset in HDF5: not run here.)
        # 10x fewer under the sanitizers (at 100,000 each tool ran past 30 s under ASan at load 10).
        n = self.big(100000)
        header = {f"t{j}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * j, 4 * j + 4]} for j in range(n)}
        st(f"st-{n // 1000}k-tensors", header, b"\0" * (4 * n), bad=False, timeout=30,
           tools=["ckpt-inspect", "ckpt-verify", "ckpt-diff"])

        # Empty tensors converted to a checkpoint, an HDF5 dataset each, which the convert then
        # verifies. Issue 32.6 (1,000,000 ran over 14 minutes): verify's every look at the
        # root group (two passes over its links, two lookups per dataset) read blocks of
        # HDF5's link index again and again once the index outgrew the 1 MiB metadata cache:
        # at 100,000 tensors ckpt-convert read 15.5 KB a tensor (1.55 GB for an 82 MB
        # output; 50 KB a tensor at 200,000), now 2.4 KB. Proved by the bytes each tool reads
        # (at most READ_PER_EMPTY_TENSOR a tensor), not by a clock; the timeout only catches
        # a hang. 50x fewer under the sanitizers (the bound holds at any size; there the
        # two cases, nine tool runs, took 175 s at 10,000).
        n = 2000 if self.args.sanitized else 100000
        header = {f"e{j}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for j in range(n)}
        st(f"st-empty-tensors-{n}", header, b"", bad=False, timeout=EMPTY_TENSORS_TIMEOUT,
           tools=["ckpt-convert", "ckpt-verify"], reads=(n, READ_PER_EMPTY_TENSOR))
        # The same tensors as a checkpoint, through every reader of one (made when run: a
        # convert of its own).
        src, ckpt = self.cases[-1].path, os.path.join(self.cases_dir, f"ckpt-empty-tensors-{n}")

        def convert():
            if not os.path.isdir(ckpt):
                self.tool("ckpt-convert", "-q", src, ckpt)
        self.add(Case(f"ckpt-empty-tensors-{n}", ckpt, "ckpt", bad=False, timeout=EMPTY_TENSORS_TIMEOUT,
                      ref=ckpt, reads=(n, READ_PER_EMPTY_TENSOR), prepare=convert))

        def sparse(name):
            p = os.path.join(self.cases_dir, name + ".safetensors")
            with open(p, "wb") as f:
                f.write(struct.pack("<Q", 90 << 20) + b"{")
                f.truncate((2 << 30) + 4096)
            self.add(Case(name, p, "st", token=name, timeout=30))
        sparse("st-sparse-2gib-header-90mib")

    # --- running -------------------------------------------------------------------------

    def runs_for(self, case):
        out = os.path.join(self.work, "out", case.name)
        os.makedirs(out, exist_ok=True)
        p = case.path
        if case.kind == "ckpt":
            return [("ckpt-inspect", [p]), ("ckpt-verify", [p]), ("ckpt-verify", ["--quick", p]),
                    ("ckpt-merge", [p, os.path.join(out, "merged")]), ("ckpt-diff", [p, case.ref or self.base]),
                    ("ckpt-convert", [p, os.path.join(out, "c.safetensors")]), ("load", [p])]
        if case.kind == "st":
            return [("ckpt-inspect", [p]), ("ckpt-verify", [p]), ("ckpt-diff", [p, self.st]),
                    ("ckpt-convert", [p, os.path.join(out, "c")]), ("ckpt-merge", [p, os.path.join(out, "m")])]
        return [("ckpt-inspect", [p]), ("ckpt-verify", [p]), ("ckpt-diff", [p, self.st]),
                ("ckpt-merge", [p, os.path.join(out, "m")])]

    def limits(self):
        if self.args.no_memory_cap:
            return None
        cap = self.args.memory_mb << 20

        def set_limits():
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        return set_limits

    def run_counting_reads(self, cmd, timeout, env):
        """Runs cmd as run_case does; returns (rc or None on a timeout, output, bytes it read).
        The bytes are the kernel's count (/proc/PID/io rchar), read while the exited child
        is still unreaped (waitid WNOWAIT)."""
        with open(os.path.join(self.work, "out", "counted.log"), "w+b") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=log, preexec_fn=self.limits(), env=env)
            deadline = time.monotonic() + timeout
            while os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
                if time.monotonic() > deadline:
                    p.kill()
                    p.wait()
                    return None, "", 0
                time.sleep(0.05)
            with open(f"/proc/{p.pid}/io") as f:
                rchar = int(dict(line.split(": ") for line in f.read().splitlines() if line)["rchar"])
            rc = p.wait()
            log.seek(0)
            return rc, log.read().decode("utf-8", "replace"), rchar

    def run_case(self, case):
        if case.prepare:
            case.prepare()
        timeout = case.timeout or self.args.timeout
        for tool, argv in self.runs_for(case):
            if case.tools and tool not in case.tools:
                continue
            exe = self.args.load if tool == "load" else os.path.join(self.args.bin, tool)
            cmd = [exe] + argv
            trace = None
            if case.outside and shutil.which("strace"):
                trace = os.path.join(self.work, "out", case.name, tool + ".strace")
                cmd = ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", trace] + cmd
            env = os.environ.copy()
            if trace and "ASAN_OPTIONS" in env:
                # LeakSanitizer cannot run in a traced process; memory errors are still caught.
                env["ASAN_OPTIONS"] = env["ASAN_OPTIONS"].replace("detect_leaks=1", "detect_leaks=0") + ":detect_leaks=0"
            what = f"{case.name}: {tool} {' '.join(a if len(a) < 80 else a[:77] + '...' for a in argv)}"
            RUNS[0] += 1
            t0 = time.monotonic()
            if case.reads:
                rc, text, rchar = self.run_counting_reads(cmd, timeout, env)
                if rc is None:
                    fail(f"{what}: hangs (no exit within {timeout} s)")
                    continue
                items, per_item = case.reads
                if rchar > items * per_item:
                    fail(f"{what}: read {rchar:,} bytes for {items:,} tensors ({rchar / items:,.0f} a tensor, more "
                         f"than {per_item:,}): work not linear in the input")
            else:
                try:
                    p = subprocess.run(cmd, capture_output=True, timeout=timeout, preexec_fn=self.limits(), env=env)
                except subprocess.TimeoutExpired:
                    fail(f"{what}: hangs (no exit within {timeout} s)")
                    continue
                text = (p.stdout + p.stderr).decode("utf-8", "replace")
                rc = p.returncode
            secs = time.monotonic() - t0
            if rc < 0 or rc >= 128:
                fail(f"{what}: crashed (rc {rc}): {text[-600:]}")
                continue
            if rc not in (0, 1, 2):
                fail(f"{what}: exit status {rc}, not 0/1/2")
            if "AddressSanitizer" in text or "runtime error:" in text:
                fail(f"{what}: sanitizer report: {text[-600:]}")
            quick = tool == "ckpt-verify" and "--quick" in argv
            if case.bad and tool == "ckpt-verify" and rc != 1 and not (quick and case.quick_lenient):
                fail(f"{what}: a hostile input verified with rc {rc}: {text[-400:]}")
            if case.fatal and rc == 0 and not (tool == "ckpt-inspect" and case.inspect_lenient) \
                    and not (quick and case.quick_lenient):
                fail(f"{what}: an unreadable input was accepted: {text[-300:]}")
            tokens = case.token or os.path.basename(case.path)
            tokens = (tokens,) if isinstance(tokens, str) else tokens
            diff_result = tool == "ckpt-diff" and rc == 1 and "error" not in text  # 1: the inputs differ
            named = all(t in text for t in tokens) or (len(tokens) == 1 and os.path.basename(case.path) in text)
            if rc != 0 and not diff_result and not named:
                fail(f"{what}: the error does not name {' and '.join(map(repr, tokens))}: {text[-300:]}")
            if trace:
                opened = []
                with open(trace, errors="replace") as f:
                    for line in f:
                        if case.outside in line and "= -1" not in line and "<unfinished" not in line:
                            opened.append(line.strip())
                if opened:
                    fail(f"{what}: opened the outside file {case.outside}: {opened[0][:200]}")
            if secs > timeout * 0.8:
                print(f"  slow: {what}: {secs:.1f} s", flush=True)


SECTIONS = {"metadata": Corpus.metadata_cases, "v2": Corpus.v2_cases, "packs": Corpus.pack_cases,
            "special": Corpus.special_file_cases, "shard-bytes": Corpus.shard_byte_cases,
            "safetensors": Corpus.safetensors_cases, "hdf5": Corpus.hdf5_cases}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--load", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", choices=["main", "hdf5"] + list(SECTIONS), default="main",
                    help="main: every section but hdf5")
    ap.add_argument("--slice", default="1/1", help="K/N: every N-th case of the selection, from the K-th")
    ap.add_argument("--timeout", type=float, default=20)
    ap.add_argument("--memory-mb", type=int, default=3072)
    ap.add_argument("--no-memory-cap", action="store_true")
    ap.add_argument("--sanitized", action="store_true",
                    help="tools built with ASan/UBSan (about 10x slower): the largest v2 cases are 10x smaller, "
                         "still far beyond what a quadratic path finishes in their timeouts")
    ap.add_argument("--filter", default="", help="run only cases whose name contains this")
    ap.add_argument("--list", action="store_true", help="list the selected cases by section, run nothing")
    args = ap.parse_args()
    if args.only == "hdf5":
        args.work = args.work.rstrip("/") + "-hdf5"
    k, n = (int(x) for x in args.slice.split("/"))
    if not 1 <= k <= n:
        ap.error("--slice K/N needs 1 <= K <= N")
    c = Corpus(args)
    c.make_base()
    group = "hdf5" if args.only == "hdf5" else "main"
    for name, make in SECTIONS.items():
        if args.only in (name, "main" if name != "hdf5" else None):
            c.section = name
            make(c)
    cases = [x for x in c.cases if x.group == group and args.filter in x.name][k - 1::n]
    print(f"{len(cases)} hostile cases ({args.only}, slice {k}/{n})", flush=True)
    if args.list:
        for name in SECTIONS:
            print(f"  {name}: {sum(x.section == name for x in cases)} cases")
        return 0
    t0 = time.monotonic()
    seconds = {}
    for case in cases:
        t = time.monotonic()
        c.run_case(case)
        runs, secs = seconds.get(case.section, (0, 0.0))
        seconds[case.section] = (runs + 1, secs + time.monotonic() - t)
    for name, (count, secs) in seconds.items():
        print(f"  {name}: {count} cases in {secs:.0f} s")
    print(f"{len(cases)} cases, {RUNS[0]} tool runs, {len(FAILURES)} failures, {time.monotonic() - t0:.0f} s")
    if not FAILURES:
        shutil.rmtree(c.work, ignore_errors=True)  # the sparse and 1 MB files
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
