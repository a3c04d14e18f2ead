#!/usr/bin/env python3
"""The flip sweep (issue 9): single random bit flips over real checkpoints, each followed
by ckpt-verify and a strict resharded Load (another world size) whose values are compared
with what the same Load returns from the intact checkpoint.

  flip_sweep.py --driver ckpt-flip-driver --verify ckpt-verify --work DIR
                [--flips N | --full] [--seed S] [--jobs J] [--kinds fsdp2,...]

The checkpoints are written by the driver (tests/fault/flip_driver.cc): fsdp2, fsdp4
(dim-0 shards of 2 and 4 ranks), tp2x2 (a 2x2 mesh, matrices split by rows and columns,
loaded into 3 ranks by columns: strided partial reads), zstd (compressed) and misc
(scalars, JSON, bytes and 600 small tensors: a shard index over 64 KiB, which HDF5 keeps
in dense attribute storage without a checksum). Flip i hits checkpoint i mod K, at a byte
drawn uniformly over all its files (metadata.json included) and a uniform bit, from
random.Random(seed). Each flip is applied in place to a per-worker copy and undone after.

Classes:
  detected          ckpt-verify or the Load reports an error
  harmless          ckpt-verify OK and the Load returns identical values
  silent            ckpt-verify OK and the Load returns other values
  silent-load       the Load returns other values with no error, though ckpt-verify catches it
  crash             a tool or the Load died, hung, or a sanitizer spoke
Each flip is mapped to what it hit (metadata.json member, shard-index member, a dataset's
data, an HDF5 object header, superblock, padding or other HDF5 structure: h5py's low-level
API and the index), and a table of classes by region is printed. Exits 1 on any silent,
silent-load or crash flip, listing each with its seed, file, byte and bit.
"""
import argparse
import bisect
import collections
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys

# Checkpoint kind -> the resharded Load that checks it: (world size, split).
LOADS = {"fsdp2": (3, "rows"), "fsdp4": (3, "rows"), "tp2x2": (3, "cols"), "zstd": (3, "cols"),
         "misc": (3, "rows")}
TIMEOUT_S = 120
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def run(cmd):
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                           timeout=TIMEOUT_S)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        return "timeout", "", ""


# ---------------------------------------------------------------------------------------
# What a byte is: labels for every byte of metadata.json (JSON member paths) and of a shard.

def json_labels(text, prefix, generic):
    """A label per byte of JSON `text`: the member path of the value (or name) it belongs
    to, e.g. 'entries.*.chunks[].checksum', or 'whitespace' / 'structure'. Object members
    under a path in `generic` are named '*' (user keys)."""
    labels = [None] * len(text)
    pos = 0

    def ws():
        nonlocal pos
        while pos < len(text) and text[pos] in " \t\r\n":
            labels[pos] = prefix + "whitespace"
            pos += 1

    def string(label):
        nonlocal pos
        start = pos
        pos += 1
        while text[pos] != '"':
            pos += 2 if text[pos] == "\\" else 1
        pos += 1
        for i in range(start, pos):
            labels[i] = label
        return text[start + 1:pos - 1]

    def value(path):
        nonlocal pos
        ws()
        c = text[pos]
        if c == "{":
            labels[pos] = prefix + "structure"
            pos += 1
            ws()
            if text[pos] == "}":
                labels[pos] = prefix + "structure"
                pos += 1
                return
            while True:
                ws()
                # A key's name gets the label of its member with " (name)".
                save = pos
                name = string(None)
                member = "*" if path in generic else name
                sub = (path + "." if path else "") + member
                for i in range(save, pos):
                    labels[i] = prefix + sub + " (name)"
                ws()
                labels[pos] = prefix + "structure"
                pos += 1
                value(sub)
                ws()
                labels[pos] = prefix + "structure"
                pos += 1
                if text[pos - 1] == "}":
                    return
        elif c == "[":
            labels[pos] = prefix + "structure"
            pos += 1
            ws()
            if text[pos] == "]":
                labels[pos] = prefix + "structure"
                pos += 1
                return
            while True:
                value(path + "[]")
                ws()
                labels[pos] = prefix + "structure"
                pos += 1
                if text[pos - 1] == "]":
                    return
        elif c == '"':
            string(prefix + path)
        else:
            start = pos
            while pos < len(text) and text[pos] not in ",]} \t\r\n":
                pos += 1
            for i in range(start, pos):
                labels[i] = prefix + path
    value("")
    ws()
    for i in range(pos, len(text)):
        labels[i] = prefix + "trailing"
    return labels


def metadata_labels(path):
    with open(path, "rb") as f:
        text = f.read().decode("latin-1")
    return json_labels(text, "metadata.json: ", {"entries", "user"})


def object_header_end(raw, addr):
    """End of the first chunk of the object header at `addr` (its continuation chunks,
    OCHK blocks, lie elsewhere and are found by signature)."""
    if raw[addr:addr + 4] == b"OHDR":  # version 2: prefix, chunk 0, checksum
        flags = raw[addr + 5]
        at = addr + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        width = 1 << (flags & 3)
        size = int.from_bytes(raw[at:at + width], "little")
        return at + width + size + 4
    # version 1: 16-byte prefix (size of the header data at +8), messages 8-byte aligned
    return addr + 16 + int.from_bytes(raw[addr + 8:addr + 12], "little")


def chunk_btree_regions(raw, chunk_offsets):
    """The version-1 B-tree nodes indexing chunked (compressed) datasets ("TREE", type 1):
    the part in use (header, entries_used keys and children, one more key) and the unused
    slots HDF5 allocates for a full node (2K+1 keys, 2K children, K = 32) and never reads.
    The key size follows from the dataset rank, found as the rank whose first child is the
    address of a stored chunk."""
    out = []
    at = raw.find(b"TREE")
    while at >= 0:
        if raw[at + 4] == 1:
            used = int.from_bytes(raw[at + 6:at + 8], "little")
            for rank in range(1, 33):
                key = 8 + 8 * (rank + 1)
                child = int.from_bytes(raw[at + 24 + key:at + 32 + key], "little")
                if child in chunk_offsets:
                    end_used = at + 24 + used * (key + 8) + key
                    end_alloc = at + 24 + 65 * key + 64 * 8
                    out.append((at, at + 8, "hdf5: chunk B-tree node header"))
                    out.append((at + 8, at + 24, "hdf5: chunk B-tree node sibling addresses"))
                    out.append((at + 24, end_used - key, "hdf5: chunk B-tree node keys and children"))
                    out.append((end_used - key, end_used, "hdf5: chunk B-tree node right-most key"))
                    out.append((end_used, end_alloc, "hdf5: unused slots of a chunk B-tree node"))
                    break
        at = raw.find(b"TREE", at + 1)
    return out


def shard_regions(path):
    """Sorted (begin, end, label) of what we can name in an HDF5 shard; the rest is labelled
    later as zero padding or other HDF5 structure."""
    import h5py
    regions = []
    with open(path, "rb") as fh:
        raw = fh.read()
    with h5py.File(path, "r") as f:
        regions.append((0, 48 if f.id.get_create_plist().get_version()[0] >= 2 else 96, "hdf5: superblock"))
        info = h5py.h5o.get_info(f.id)
        regions.append((info.addr, object_header_end(raw, info.addr), "hdf5: root object header"))
        index = f.attrs.get("ckpt_shard_index")
        dataset_key = {}
        if index is not None:
            text = bytes(index)
            try:
                for rec in json.loads(text)["chunks"]:
                    dataset_key[rec["dataset"]] = rec["key"]
            except (ValueError, KeyError):
                pass

        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            oi = h5py.h5o.get_info(obj.id)
            regions.append((oi.addr, object_header_end(raw, oi.addr), "hdf5: dataset object header"))
            what = "data" if name in dataset_key else "data of an unindexed dataset"
            off = obj.id.get_offset()
            if off is not None:
                regions.append((off, off + obj.id.get_storage_size(), "shard: " + what))
            elif obj.chunks is not None:
                for i in range(obj.id.get_num_chunks()):
                    ci = obj.id.get_chunk_info(i)
                    chunk_offsets.add(ci.byte_offset)
                    regions.append((ci.byte_offset, ci.byte_offset + ci.size, "shard: compressed " + what))
        chunk_offsets = set()
        f.visititems(visit)
        regions += chunk_btree_regions(raw, chunk_offsets)
    idx_labels = None
    if index is not None:
        at = raw.find(text)
        if at >= 0:
            idx_labels = (at, json_labels(text.decode("latin-1"), "shard index: ", set()))
    return raw, regions, idx_labels


def shard_labels(path):
    raw, regions, idx = shard_regions(path)
    labels = [None] * len(raw)
    # Wider regions first, so that the index text inside the root object header (or a
    # heap) and data keep their own label.
    for begin, end, label in sorted(regions, key=lambda r: -(r[1] - r[0])):
        for i in range(max(0, begin), min(len(raw), end)):
            labels[i] = label
    if idx is not None:
        at, text_labels = idx
        for i, lab in enumerate(text_labels):
            labels[at + i] = lab
    # What is left: zero runs of 8+ bytes are padding (alignment, unused), the rest is
    # other HDF5 structure (B-trees, heaps, free-space records), named by the signature of
    # the nearest structure that starts before it.
    sigs = [b"OHDR", b"OCHK", b"FRHP", b"FHDB", b"FHIB", b"BTHD", b"BTLF", b"BTIN", b"TREE", b"HEAP", b"GCOL",
            b"SNOD", b"FSHD", b"FSSE"]
    found = []
    for s in sigs:
        at = raw.find(s)
        while at >= 0:
            found.append((at, s.decode()))
            at = raw.find(s, at + 1)
    found.sort()
    found_at = [at for at, _ in found]
    i = 0
    n = len(raw)
    while i < n:
        if labels[i] is not None:
            i += 1
            continue
        j = i
        while j < n and labels[j] is None:
            j += 1
        # [i, j) unlabelled
        k = i
        while k < j:
            if raw[k] == 0:
                z = k
                while z < j and raw[z] == 0:
                    z += 1
                if z - k >= 8:
                    for m in range(k, z):
                        labels[m] = "hdf5: zero padding (alignment gap, unreferenced)"
                k = z
            else:
                k += 1
        for m in range(i, j):
            if labels[m] is None:
                k = bisect.bisect_right(found_at, m)
                sig = found[k - 1][1] if k else "?"
                labels[m] = ("hdf5: object header continuation (OCHK)" if sig == "OCHK" else
                             "hdf5: other structure (after %s)" % sig)
        i = j
    return labels


def generalise(label):
    """Coarser labels for the table: array positions and entry keys are already generic;
    stats members fold into one."""
    if ".stats." in label and "(name)" not in label:
        return label.split(".stats.")[0] + ".stats.*"
    return label


# ---------------------------------------------------------------------------------------

def write_checkpoints(driver, kinds, root):
    for kind in kinds:
        d = os.path.join(root, kind)
        if os.path.exists(d):
            shutil.rmtree(d)
        rc, out, err = run([driver, "write", kind, d])
        if rc != 0:
            raise SystemExit("flip_sweep: writing %s failed (%s): %s" % (kind, rc, err))


def files_of(ckpt):
    return sorted(os.listdir(ckpt))


def load_cmd(driver, kind, d):
    world, split = LOADS[kind]
    return [driver, "load", kind, d, str(world), split]


def flip_bit(path, byte, bit):
    with open(path, "r+b") as f:
        f.seek(byte)
        b = f.read(1)[0]
        f.seek(byte)
        f.write(bytes([b ^ (1 << bit)]))


def classify(verify_rc, verify_err, load_rc, load_out, load_err, reference):
    for rc, err in ((verify_rc, verify_err), (load_rc, load_err)):
        if rc == "timeout" or (isinstance(rc, int) and (rc < 0 or rc > 2)) or any(m in err for m in SANITIZER_MARKS):
            return "crash"
    if load_rc == 2:
        return "crash"  # the driver's usage error cannot come from a flip
    verify_ok = verify_rc == 0
    if load_rc == 0 and load_out != reference:
        return "silent" if verify_ok else "silent-load"
    if verify_ok and load_rc == 0:
        return "harmless"
    return "detected"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--driver", required=True)
    ap.add_argument("--verify", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--flips", type=int, default=1000)
    ap.add_argument("--full", action="store_true", help="10,000 flips")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--kinds", default="fsdp2,fsdp4,tp2x2,zstd,misc")
    ap.add_argument("--verify-args", default="", help="extra arguments for ckpt-verify (split at spaces)")
    ap.add_argument("--show", type=int, default=20, help="problem flips printed in full, at most")
    ap.add_argument("--list", action="append", default=[], metavar="CLASS",
                    help="also list every flip of CLASS with what it hit (repeatable), e.g. harmless")
    args = ap.parse_args()
    flips = 10000 if args.full else args.flips
    kinds = args.kinds.split(",")
    for k in kinds:
        if k not in LOADS:
            ap.error("unknown kind %s" % k)

    os.makedirs(args.work, exist_ok=True)
    ref_root = os.path.join(args.work, "ref")
    os.makedirs(ref_root, exist_ok=True)
    write_checkpoints(args.driver, kinds, ref_root)

    reference, layout, labels = {}, {}, {}
    for kind in kinds:
        d = os.path.join(ref_root, kind)
        rc, out, err = run(load_cmd(args.driver, kind, d))
        if rc != 0:
            raise SystemExit("flip_sweep: the intact %s does not load: %s" % (kind, err))
        reference[kind] = out
        rc, vout, err = run([args.verify, *args.verify_args.split(), d])
        if rc != 0:
            raise SystemExit("flip_sweep: the intact %s does not verify: %s" % (kind, vout + err))
        names = files_of(d)
        sizes = [os.path.getsize(os.path.join(d, n)) for n in names]
        layout[kind] = (names, sizes)
        for n in names:
            p = os.path.join(d, n)
            labels[(kind, n)] = metadata_labels(p) if n == "metadata.json" else shard_labels(p)

    rng = random.Random(args.seed)
    plan = []
    for i in range(flips):
        kind = kinds[i % len(kinds)]
        names, sizes = layout[kind]
        at = rng.randrange(sum(sizes))
        bit = rng.randrange(8)
        for n, s in zip(names, sizes):
            if at < s:
                plan.append((i, kind, n, at, bit))
                break
            at -= s

    jobs = max(1, args.jobs)
    workers = []
    for j in range(jobs):
        wd = os.path.join(args.work, "w%d" % j)
        if os.path.exists(wd):
            shutil.rmtree(wd)
        shutil.copytree(ref_root, wd)
        workers.append(wd)

    def do(j):
        results = []
        for (i, kind, name, byte, bit) in plan[j::jobs]:
            d = os.path.join(workers[j], kind)
            p = os.path.join(d, name)
            flip_bit(p, byte, bit)
            try:
                vrc, vout, verr = run([args.verify, *args.verify_args.split(), d])
                verr = vout + verr
                lrc, lout, lerr = run(load_cmd(args.driver, kind, d))
            finally:
                flip_bit(p, byte, bit)
            cls = classify(vrc, verr, lrc, lout, lerr, reference[kind])
            detail = ""
            if cls != "harmless" and cls != "detected":
                detail = "verify rc %s: %s | load rc %s: %s" % (vrc, verr.strip()[:300], lrc, lerr.strip()[:300])
            results.append((i, kind, name, byte, bit, cls, detail))
        return results

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = sorted(r for part in pool.map(do, range(jobs)) for r in part)

    classes = ["detected", "harmless", "silent", "silent-load", "crash"]
    total = collections.Counter(r[5] for r in results)
    by_region = collections.defaultdict(collections.Counter)
    by_kind = collections.defaultdict(collections.Counter)
    for (i, kind, name, byte, bit, cls, _) in results:
        lab = labels[(kind, name)][byte] or "?"
        by_region[generalise(lab)][cls] += 1
        by_kind[kind][cls] += 1

    print("flip_sweep: %d flips, seed %d, checkpoints %s" % (flips, args.seed, ", ".join(
        "%s (%d files, %d bytes; load into %d ranks by %s)" % (k, len(layout[k][0]), sum(layout[k][1]), *LOADS[k])
        for k in kinds)))
    print("  " + ", ".join("%s %d" % (c, total[c]) for c in classes))
    width = max(len(r) for r in by_region) if by_region else 10
    print("\n%-*s %9s %9s %7s %11s %6s" % (width, "region", *classes))
    for region in sorted(by_region, key=lambda r: (-sum(by_region[r].values()), r)):
        c = by_region[region]
        print("%-*s %9d %9d %7d %11d %6d" % (width, region, *(c[x] for x in classes)))
    print("\n%-8s %9s %9s %7s %11s %6s" % ("kind", *classes))
    for kind in kinds:
        c = by_kind[kind]
        print("%-8s %9d %9d %7d %11d %6d" % (kind, *(c[x] for x in classes)))

    for cls in args.list:
        print("\n%s flips:" % cls)
        for (i, kind, name, byte, bit, c, _) in results:
            if c == cls:
                print("  #%d %s/%s byte %d bit %d [%s]" % (i, kind, name, byte, bit, labels[(kind, name)][byte]))

    order = {"silent": 0, "crash": 1, "silent-load": 2}
    bad = sorted((r for r in results if r[5] in order), key=lambda r: (order[r[5]], r[0]))
    if bad:
        print("\n%d problem flips (seed %d; flip #, checkpoint, file, byte, bit, class, what it hit):" % (len(bad), args.seed))
        for (i, kind, name, byte, bit, cls, detail) in bad[:args.show]:
            print("  #%d %s/%s byte %d bit %d: %s [%s]\n      %s" % (i, kind, name, byte, bit, cls,
                                                                labels[(kind, name)][byte], detail))
        if len(bad) > args.show:
            print("  ... and %d more" % (len(bad) - args.show))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
