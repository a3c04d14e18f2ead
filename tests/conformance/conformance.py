#!/usr/bin/python3
"""Conformance with FORMAT.md's MUST rules (issue 27.4).

Two checks:

1. The table stays true: every MUST (and MUST NOT) of schemas/FORMAT.md has its row in
   schemas/CONFORMANCE.md. Rows are named `<section>-<n>`, n = 1.. the number of MUSTs the
   section states, in order; a section that gains or loses a MUST fails this test until its
   rows follow. Every `conf:` case the table names exists here, and every case here is in
   the table.

2. The rules hold: for each rule a reader can check, a fresh valid checkpoint (written by
   Save through conformance_driver) broken one way, and the answer of Load and
   CheckpointReader (conformance_driver load|reader), ckpt-verify and ckpt-merge: each tool
   the case names must refuse it (exit 1; ckpt-merge non-zero) with an error containing the
   case's tokens; the others must not crash. `valid` cases (what the spec allows that a
   reader could get wrong) must pass every tool. Writer rules are checked on what the writers
   write (`writer:` cases).

  conformance.py --bin DIR --driver PATH --work DIR --spec FORMAT.md --table CONFORMANCE.md
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
sys.path.insert(0, os.path.join(HERE, "..", "hostile"))
import ckpt_edit  # noqa: E402
from hostile import write_safetensors  # noqa: E402

ALL = ("load", "reader", "verify", "merge")
FAILURES = []


def fail(what):
    FAILURES.append(what)
    print("FAIL:", what, flush=True)


# --- 1. the table against the spec ----------------------------------------------------------

def spec_musts(spec):
    """{section: number of MUSTs it states}. A section is a numbered paragraph ("3.3 ...",
    "A.2 ...") or, for text under a "## N." header before its first paragraph, "N"."""
    counts, section = {}, None
    for line in open(spec, encoding="utf-8"):
        m = re.match(r"^## (\d+)\.", line)
        if m:
            section = m.group(1)
        elif line.startswith("## Appendix"):
            section = "A"
        m = re.match(r"^(\d+\.\d+|A\.\d+) ", line)
        if m:
            section = m.group(1)
        n = len(re.findall(r"\bMUST\b", line))
        if n and section:  # (the preamble defines the word: no rule)
            counts[section] = counts.get(section, 0) + n
    return counts


def table_rows(table):
    rows = []
    for line in open(table, encoding="utf-8"):
        if not line.startswith("| ") or line.startswith("| rule") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4:
            fail(f"{table}: a row without 4 cells: {line.strip()}")
            continue
        rows.append(cells)
    return rows


def check_table(spec, table, case_names):
    counts = spec_musts(spec)
    rows = table_rows(table)
    ids = {}
    for r in rows:
        if r[0] in ids:
            fail(f"{table}: rule {r[0]} has two rows")
        ids[r[0]] = r
    for section, n in sorted(counts.items()):
        for i in range(1, n + 1):
            if f"{section}-{i}" not in ids:
                fail(f"{table}: FORMAT.md §{section} states {n} MUST(s); no row {section}-{i}")
    for rid in ids:
        m = re.match(r"^(\d+\.\d+|A\.\d+|\d+)-(\d+)$", rid)
        if not m:
            fail(f"{table}: row id {rid!r} is not <section>-<n>")
        elif int(m.group(2)) > counts.get(m.group(1), 0):
            fail(f"{table}: row {rid}: FORMAT.md §{m.group(1)} states only {counts.get(m.group(1), 0)} MUST(s)")
    named = set()
    for r in rows:
        named.update(re.findall(r"(?:conf|writer):([a-z0-9-]+)", r[3]))
    for n in sorted(named - set(case_names)):
        fail(f"{table}: names conf:{n}, which conformance.py does not have")
    for n in sorted(set(case_names) - named):
        fail(f"conformance.py: case {n} has no row in {table}")
    print(f"table: {sum(counts.values())} MUSTs in {len(counts)} sections, {len(rows)} rows, "
          f"{len(named)} cases named", flush=True)


# --- 2. the cases -----------------------------------------------------------------------------

class Suite:
    def __init__(self, args):
        self.args = args
        self.work = os.path.abspath(args.work)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.base = os.path.join(self.work, "base")
        self.run([args.driver, "write", self.base], must=True)
        self.md = ckpt_edit.load_metadata(self.base)
        self.shard = os.path.join(self.base, self.md["files"][0]["name"])
        self.index = ckpt_edit.read_index(self.base, 0)
        self.cases = {}

    def run(self, cmd, must=False):
        p = subprocess.run([str(c) for c in cmd], capture_output=True, timeout=120)
        text = (p.stdout + p.stderr).decode("utf-8", "replace")
        if must and p.returncode != 0:
            raise SystemExit(f"setup: {cmd}: rc {p.returncode}: {text}")
        return p.returncode, text

    def records(self, key):
        return [r for r in self.index["chunks"] if r["key"] == key]

    def case(self, name, who=ALL, token=(), valid=False):
        """Decorator: fn(dir) breaks a fresh copy of the base."""
        def add(fn):
            assert name not in self.cases, name
            self.cases[name] = (fn, () if valid else who, (token,) if isinstance(token, str) else token)
            return fn
        return add

    def writer(self, name):
        def add(fn):
            self.cases[name] = (fn, None, ())
            return fn
        return add

    def tools(self, d):
        out = os.path.join(self.work, "out", os.path.basename(d))
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        return {"load": [self.args.driver, "load", d], "reader": [self.args.driver, "reader", d],
                "verify": [os.path.join(self.args.bin, "ckpt-verify"), d],
                "merge": [os.path.join(self.args.bin, "ckpt-merge"), d, os.path.join(out, "m")]}

    def run_all(self):
        for name, (fn, who, tokens) in self.cases.items():
            if who is None:  # a writer rule: fn checks it, failing through fail()
                try:
                    fn()
                except Exception as e:  # noqa: BLE001
                    fail(f"writer:{name}: {type(e).__name__}: {e}")
                continue
            d = os.path.join(self.work, "cases", name)
            shutil.copytree(self.base, d, symlinks=True)
            fn(d)
            for tool, cmd in self.tools(d).items():
                rc, text = self.run(cmd)
                what = f"{name}: {tool}"
                if tool == "load" and rc == 3:
                    fail(f"{what}: Load returned success without writing every byte of a tensor: {text[-300:]}")
                elif rc < 0 or rc >= 128 or rc > 2:
                    fail(f"{what}: crashed or odd exit (rc {rc}): {text[-500:]}")
                elif tool in who:
                    if rc == 0 or (tool == "verify" and rc != 1):
                        fail(f"{what}: accepted what FORMAT.md forbids (rc {rc}): {text[-300:]}")
                    else:
                        for t in tokens:
                            if t not in text:
                                fail(f"{what}: the refusal does not name {t!r}: {text[-300:]}")
                elif not who and rc != 0:
                    fail(f"{what}: refused a valid checkpoint (rc {rc}): {text[-400:]}")
        print(f"cases: {sum(1 for c in self.cases.values() if c[1] is not None)} broken or valid checkpoints, "
              f"{sum(1 for c in self.cases.values() if c[1] is None)} writer checks", flush=True)


def h5_edit(d, fn):
    md = ckpt_edit.load_metadata(d)
    with h5py.File(os.path.join(d, md["files"][0]["name"]), "r+") as f:
        fn(f)
    # the file's size is in metadata.json (files[0].bytes); the index text is unchanged
    md["files"][0]["bytes"] = os.path.getsize(os.path.join(d, md["files"][0]["name"]))
    ckpt_edit.save_metadata(d, md)


def define(s):
    big_rec = s.records("big")[0]
    p0_rec = s.records("p0")[0]
    p1_rec = s.records("p1")[0]
    pack = p0_rec["dataset"]
    entries = lambda fn: lambda d: ckpt_edit.edit_metadata(d, lambda m: fn(m["entries"]))  # noqa: E731

    def rec(key, fn, which=0):
        def edit(d):
            def f(ix):
                fn([r for r in ix["chunks"] if r["key"] == key][which])
            ckpt_edit.edit_index(d, 0, f)
        return edit

    # §1, §2
    s.case("version-newer", token="format_version 3")(
        lambda d: ckpt_edit.edit_metadata(d, lambda m: m.__setitem__("format_version", 3)))
    s.case("no-metadata", token="metadata.json")(lambda d: os.remove(ckpt_edit.metadata_path(d)))

    @s.case("stray-shard", valid=True)
    def _(d):  # a file the names suggest is part of it, not in `files`: a reader does not infer files from names
        shutil.copy(os.path.join(d, s.md["files"][0]["name"]), os.path.join(d, "shard-00001-of-00002.h5"))

    # §3.3 layouts
    s.case("step-zero", token="'w'")(entries(lambda e: e["w"]["layout"]["grid"].__setitem__(0, {"step": 0})))
    s.case("step-on-empty-extent", token="'e'")(
        entries(lambda e: e["e"]["layout"]["grid"].__setitem__(0, {"step": 1})))
    # issue 32.3: a step larger than the extent is one part (here up to 2^63 - 1)
    s.case("step-beyond-extent", valid=True)(
        entries(lambda e: e["big"]["layout"]["grid"].__setitem__(0, {"step": 2 ** 63 - 1})))
    s.case("step-beyond-extent-2d", valid=True)(
        entries(lambda e: e["w"]["layout"]["grid"].__setitem__(1, {"step": 2 ** 62})))
    s.case("zero-volume-grid-two-cells", token="'e'")(
        entries(lambda e: e["e"]["layout"].__setitem__("grid", [{"step": 0}, {"step": 2}])))
    # issue 32.4: what ckpt-convert --world 3 --dim 1 wrote for an empty tensor
    s.case("zero-volume-explicit-two-chunks", token="'e'")(entries(lambda e: e["e"].__setitem__("layout", {
        "chunks": [{"offsets": [0, 0], "sizes": [0, 2], "file": 0}, {"offsets": [0, 2], "sizes": [0, 2], "file": 0}]})))
    s.case("file-map-outside", token="'w'")(
        entries(lambda e: e["w"]["layout"].__setitem__("files", {"base": 1, "strides": [0, 0]})))
    s.case("explicit-gap", token="gap")(entries(lambda e: e["w"].__setitem__("layout", {
        "chunks": [{"offsets": [0, 0], "sizes": [4, 4], "file": 0}]})))

    # §3.4, §3.5
    s.case("file-name-not-plain", token="../x.h5")(
        lambda d: ckpt_edit.edit_metadata(d, lambda m: m["files"][0].__setitem__("name", "../x.h5")))
    s.case("file-index-outside", token="'blob'")(entries(lambda e: e["blob"].__setitem__("file", 1)))
    # issue 32.5: Load reads only the records it needs (FORMAT.md §5.5 lets it leave this)
    s.case("entry-stored-bytes", who=("reader", "verify", "merge"), token=("'w'", "stored_bytes"))(
        entries(lambda e: e["w"].__setitem__("stored_bytes", e["w"]["stored_bytes"] + 1)))
    s.case("bytes-stored-bytes", who=("reader", "verify", "merge"), token=("'blob'", "stored_bytes"))(
        entries(lambda e: e["blob"].__setitem__("stored_bytes", 9)))

    # §3.6 the digest
    s.case("digest-not-last", token="metadata.json")(lambda d: ckpt_edit.edit_metadata_text(
        d, lambda t: t[:-2] + b', "x": 1}\n', redigest=False))
    def uppercase_digest(t):  # the same digest with uppercase hex digits (or one made so)
        hexd = t[-19:-3]
        up = hexd.upper() if re.search(rb"[a-f]", hexd) else hexd[:-1] + b"A"
        return t[:-19] + up + t[-3:]
    s.case("digest-uppercase", token="metadata.json")(
        lambda d: ckpt_edit.edit_metadata_text(d, uppercase_digest, redigest=False))
    s.case("digest-mismatch", token="metadata.json")(lambda d: ckpt_edit.edit_metadata(
        d, lambda m: m.__setitem__("created", "2001-01-01T00:00:00Z"), redigest=False))
    s.case("save-timings-not-object", token="save_timings")(
        lambda d: ckpt_edit.edit_metadata(d, lambda m: m.__setitem__("save_timings", 5)))

    # §4
    s.case("unknown-dtype", token="'i'")(entries(lambda e: e["i"].__setitem__("dtype", "int33")))
    s.case("dtype-attribute-ignored", valid=True)(
        lambda d: h5_edit(d, lambda f: f[big_rec["dataset"]].attrs.__setitem__("dtype", np.bytes_(b"bfloat16"))))

    # §5.2, §5.4, §5.5 the shard index
    @s.case("dataset-renamed", valid=True)
    def _(d):  # readers go by the record's `dataset`, never a name they recompute
        h5_edit(d, lambda f: f.move(big_rec["dataset"], "renamed"))
        rec("big", lambda r: r.__setitem__("dataset", "renamed"))(d)

    @s.case("uncompressed-chunked", who=("verify",), token="'big'")
    def _(d):
        def f(h):
            data = h[big_rec["dataset"]][()]
            del h[big_rec["dataset"]]
            h.create_dataset(big_rec["dataset"], data=data, chunks=(4096,))
        h5_edit(d, f)
        rec("big", lambda r: r.pop("offset"))(d)

    s.case("offset-missing", who=("verify",), token="'big'")(rec("big", lambda r: r.pop("offset")))
    s.case("offset-on-empty", who=("verify",), token="'e'")(rec("e", lambda r: r.__setitem__("offset", 0)))
    s.case("record-missing", token=("'w'", "shard-"))(lambda d: ckpt_edit.edit_index(d, 0, lambda ix: ix.__setitem__(
        "chunks", [r for r in ix["chunks"] if not (r["key"] == "w" and r["offsets"][0] == 4)])))
    s.case("record-twice", token=("'w'", "shard-"))(lambda d: ckpt_edit.edit_index(
        d, 0, lambda ix: ix["chunks"].append(dict(s.records("w")[1]))))
    s.case("record-other-dtype", token=("'w'", "shard-"))(rec("w", lambda r: r.__setitem__("dtype", "int32")))
    s.case("bytes-record-size", token=("'blob'", "shard-"))(rec("blob", lambda r: r.__setitem__("size", 9)))
    s.case("record-unassigned", who=("verify",), token="'ghost'")(lambda d: ckpt_edit.edit_index(
        d, 0, lambda ix: ix["chunks"].append(dict(s.records("big")[0], key="ghost"))))
    s.case("index-digest", token="shard-")(lambda d: ckpt_edit.edit_index_text(
        d, 0, lambda t: t.replace(b'"format"', b'"format" ', 1), redigest=False))
    s.case("offset-outside-file", token="'big'")(rec("big", lambda r: r.__setitem__("offset", 2 ** 40)))
    # issue 32.5: a record's stored_bytes is its chunk's byte size when uncompressed
    s.case("record-stored-bytes", token="'big'")(rec("big", lambda r: r.__setitem__("stored_bytes", 80001)))
    s.case("packed-stored-bytes", token="'p0'")(rec("p0", lambda r: r.__setitem__("stored_bytes", 25)))

    # §5.6 what a shard holds
    s.case("unknown-attribute", valid=True)(lambda d: h5_edit(d, lambda f: f.attrs.__setitem__("note", b"x")))
    s.case("extra-dataset", who=("verify",), token="junk")(
        lambda d: h5_edit(d, lambda f: f.create_dataset("junk", data=np.arange(4, dtype=np.uint8))))

    # §5.7 packs
    def drop_last_member(d):
        def f(ix):
            packed = [r for r in ix["chunks"] if r.get("dataset") == pack]
            last = max(packed, key=lambda r: r["pack_offset"])
            ix["chunks"].remove(last)
            drop_last_member.key = last["key"]
        ckpt_edit.edit_index(d, 0, f)
        ckpt_edit.edit_metadata(d, lambda m: m["entries"].pop(drop_last_member.key))
    s.case("pack-bytes-past-members", who=("verify",), token=pack)(drop_last_member)
    s.case("pack-base-differs", token=("'p0'", pack))(rec("p0", lambda r: r.__setitem__("offset", r["offset"] + 1)))
    s.case("pack-outside", token=("'p1'", pack))(rec("p1", lambda r: r.update(
        offset=r["offset"] + 2 ** 20, pack_offset=r["pack_offset"] + 2 ** 20)))

    @s.case("pack-overlap", token=pack)
    def _(d):
        def f(ix):
            a = [r for r in ix["chunks"] if r["key"] == "p0"][0]
            b = [r for r in ix["chunks"] if r["key"] == "p1"][0]
            first, second = (a, b) if a["pack_offset"] < b["pack_offset"] else (b, a)
            second["offset"] -= 4
            second["pack_offset"] -= 4
        ckpt_edit.edit_index(d, 0, f)
    s.case("pack-compressed", token="'p0'")(rec("p0", lambda r: r.__setitem__(
        "compression", {"codec": "zstd", "level": 3, "shuffle": True})))
    s.case("pack-without-offset", token="'p0'")(rec("p0", lambda r: r.pop("offset")))

    @s.case("pack-name-leading-zero", token=("shard-", ".ckpt_pack.0"))
    def _(d):  # issue 32.5
        h5_edit(d, lambda f: f.move(pack, pack.replace(".ckpt_pack.", ".ckpt_pack.0")))

        def f(ix):
            for r in ix["chunks"]:
                if r.get("dataset") == pack:
                    r["dataset"] = pack.replace(".ckpt_pack.", ".ckpt_pack.0")
        ckpt_edit.edit_index(d, 0, f)

    # §7 checksums and statistics
    @s.case("data-byte-flipped", token=("'big'", "block"))
    def _(d):
        path = os.path.join(d, s.md["files"][0]["name"])
        with open(path, "r+b") as f:
            f.seek(big_rec["offset"] + 70000)
            b = f.read(1)
            f.seek(big_rec["offset"] + 70000)
            f.write(bytes([b[0] ^ 0x40]))
    s.case("blocks-short", token="'big'")(rec("big", lambda r: r.__setitem__("blocks", r["blocks"][:-16])))
    s.case("aggregate-stats-rounded", valid=True)(
        entries(lambda e: e["w"]["stats"].__setitem__("mean", e["w"]["stats"]["mean"] * (1 + 2 ** -50))))

    # §8 limits
    s.case("duplicate-member", token="metadata.json")(lambda d: ckpt_edit.edit_metadata_text(
        d, lambda t: ckpt_edit.sub_once(t, rb'"format": "ckpt"', b'"format": "ckpt", "format": "ckpt"')))
    s.case("unknown-format", token="metadata.json")(
        lambda d: ckpt_edit.edit_metadata(d, lambda m: m.__setitem__("format", "kcpt")))

    @s.case("metadata-symlink", token="metadata.json")
    def _(d):
        os.rename(ckpt_edit.metadata_path(d), os.path.join(d, "real.json"))
        os.symlink("real.json", ckpt_edit.metadata_path(d))
    s.case("shape-overflow", token="'w'")(entries(lambda e: e["w"].__setitem__("shape", [2 ** 62, 2 ** 62])))
    s.case("explicit-outside", token="'w'")(entries(lambda e: e["w"].__setitem__("layout", {"chunks": [
        {"offsets": [0, 0], "sizes": [4, 4], "file": 0}, {"offsets": [6, 0], "sizes": [4, 4], "file": 0}]})))
    s.case("grid-rank", token="'w'")(entries(lambda e: e["w"]["layout"].__setitem__("grid", [{"step": 4}])))
    s.case("sizes-not-sum", token="'w'")(
        entries(lambda e: e["w"]["layout"]["grid"].__setitem__(0, {"sizes": [4, 3]})))
    s.case("cell-files-length", token="'w'")(entries(lambda e: e["w"]["layout"].__setitem__("files", [0])))
    s.case("block-bytes", token="'big'")(rec("big", lambda r: r.__setitem__("block_bytes", 1000)))

    # --- writer rules, on what the writers write
    @s.writer("writes-version-2")
    def _():
        if s.md["format_version"] != 2:
            fail(f"writer: format_version {s.md['format_version']}")

    @s.writer("writes-defined-members")
    def _():
        top = {"format", "format_version", "state_dict_type", "world_size", "library_version", "created", "mesh",
               "user", "save_timings", "files", "entries", "digest"}
        kinds = {"tensor": {"type", "dtype", "shape", "layout", "stored_bytes", "stats", "compression"},
                 "scalar": {"type", "dtype", "value"}, "bytes": {"type", "size", "file", "stored_bytes"},
                 "json": {"type", "value"}}
        if set(s.md) - top:
            fail(f"writer: undefined members {set(s.md) - top}")
        for k, e in s.md["entries"].items():
            if set(e) - kinds[e["type"]]:
                fail(f"writer: entry {k}: undefined members {set(e) - kinds[e['type']]}")

    @s.writer("writes-digest-form")
    def _():
        text = open(ckpt_edit.metadata_path(s.base), "rb").read()
        if not re.search(rb'"digest": "xxh3-64:[0-9a-f]{16}"\}\n\Z', text) or \
                ckpt_edit.tag(text[:-38]) != text[-27:-3].decode():
            fail("writer: metadata.json does not end with its digest in the exact form")

    @s.writer("writes-offsets")
    def _():
        with h5py.File(s.shard, "r") as f:
            for r in s.index["chunks"]:
                ds = f[r["dataset"]]
                contiguous = ds.chunks is None and ds.compression is None
                has_data = r["stored_bytes"] > 0
                if ("offset" in r) != (contiguous and has_data):
                    fail(f"writer: {r['key']}: offset {'present' if 'offset' in r else 'absent'} on a "
                         f"{'contiguous' if contiguous else 'filtered'} dataset of {r['stored_bytes']} bytes")
                if "compression" not in r and not contiguous:
                    fail(f"writer: {r['key']}: an uncompressed dataset that is not contiguous")

    @s.writer("packs-no-empty-chunk")
    def _():
        packed = {r["key"] for r in s.index["chunks"] if "pack_offset" in r}
        if "e" in packed or not {"p0", "p1"} <= packed:
            fail(f"writer: packed {sorted(packed)}: the empty e is packed or p0/p1 are not")

    @s.writer("writes-aggregate-stats")
    def _():
        for k, e in s.md["entries"].items():
            if e["type"] != "tensor":
                continue
            all_stats = all("stats" in r for r in s.records(k))
            if ("stats" in e) != all_stats:
                fail(f"writer: {k}: aggregate stats {'present' if 'stats' in e else 'absent'}, chunk stats "
                     f"{'on every chunk' if all_stats else 'not on every chunk'}")

    @s.writer("tools-write-zero-volume-whole")
    def _():  # issue 32.4: ckpt-convert / ckpt-merge --world N (--dim 1) keep an empty tensor whole
        st = os.path.join(s.work, "empty.safetensors")
        write_safetensors(st, {"w": np.ones((8, 4), np.float32), "a": np.zeros((0, 4), np.float32),
                               "b": np.zeros((4, 0), np.float32)})
        for dim in ("0", "1"):
            out = os.path.join(s.work, "empty-dim" + dim)
            shutil.rmtree(out, ignore_errors=True)
            s.run([os.path.join(s.args.bin, "ckpt-convert"), st, out, "--world", "3", "--dim", dim], must=True)
            merged = out + "-merged"
            shutil.rmtree(merged, ignore_errors=True)
            s.run([os.path.join(s.args.bin, "ckpt-merge"), out, merged, "--world", "2", "--dim", dim], must=True)
            for d in (out, merged):
                per_key = {}
                for i in range(len(ckpt_edit.load_metadata(d)["files"])):
                    for r in ckpt_edit.read_index(d, i)["chunks"]:
                        per_key.setdefault(r["key"], []).append(r)
                for k, shape in (("a", [0, 4]), ("b", [4, 0])):
                    rs = per_key.get(k, [])
                    if len(rs) != 1 or rs[0]["sizes"] != shape:
                        fail(f"writer: {d}: empty {k} {shape} stored as {[r['sizes'] for r in rs]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--driver", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--table", required=True)
    args = ap.parse_args()
    s = Suite(args)
    define(s)
    check_table(args.spec, args.table, list(s.cases))
    s.run_all()
    if FAILURES:
        print(f"{len(FAILURES)} failures", flush=True)
        sys.exit(1)
    print("all rules hold", flush=True)


if __name__ == "__main__":
    main()
