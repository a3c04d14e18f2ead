#!/usr/bin/python3
"""ckpt's HDF5 zstd plugin (libckpt_h5zstd.so) in Debian's own HDF5 programs.

A zstd checkpoint written by ckpt-convert (ckpt's ShardWriter, as Save writes) is read chunk
by chunk, every compressed chunk compared with the values saved:
- by Debian's h5dump (-b FILE: the bytes in the file's type) and by /usr/bin/python3's h5py
  (Debian's), with HDF5_PLUGIN_PATH at the build tree's plugin directory and at the one
  `cmake --install` put into the scratch prefix; with an empty plugin directory both fail
  ("unable to print data", "filter ... not registered"): the reads go through the plugin;
- with PyPI's hdf5plugin imported as well, where /usr/bin/python3 has it (it registers its
  own 32015; the two agree on cd_values, so either decodes ckpt's chunks);
- h5py compresses through ckpt's plugin (level in cd_values[0], as hdf5plugin.Zstd writes
  it) and reads back the same, as does hdf5plugin's filter where there is one.
ckpt's own readers never load a plugin: ckpt-verify, ckpt-diff and ckpt-convert read the
checkpoint with HDF5_PLUGIN_PATH at a directory whose libckpt_h5zstd.so aborts when loaded.
`cmake --install --prefix /usr` (into a DESTDIR) puts the plugin into the directory Debian's
HDF5 searches by default, as that HDF5 reports it (h5py.h5pl.get(0)).

Run by CTest: zstd_plugin_test.py --bin DIR --plugin-dir DIR --installed-plugin-dir DIR
  [--cmake CMAKE --build-dir DIR]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_edit  # noqa: E402
from cli_test import check, finish, write_safetensors, read_safetensors  # noqa: E402

PLUGIN = "libckpt_h5zstd.so"
def run(args, env=None, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, env=env, **kw)


def env_with(plugin_dir):
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    if plugin_dir is not None:
        env["HDF5_PLUGIN_PATH"] = plugin_dir
    return env


def tensors():
    rng = np.random.default_rng(27)
    return {
        "model.big": ("F32", rng.standard_normal((300, 200)).astype(np.float32)),
        "model.half": ("F16", rng.standard_normal((64, 64)).astype(np.float16)),
        "model.bf": ("BF16", rng.integers(0, 1 << 16, (40, 300), dtype=np.uint16)),
        "model.ids": ("I64", np.arange(20000, dtype=np.int64) * 7),
        "model.small": ("F32", np.linspace(-1, 1, 16).astype(np.float32)),
        "model.mask": ("U8", (np.arange(3000) % 3).astype(np.uint8)),
    }


def expected_bytes(arr, rec):
    """The bytes of chunk record `rec` of `arr`, as stored (C order, little-endian)."""
    sl = tuple(slice(o, o + s) for o, s in zip(rec["offsets"], rec["sizes"]))
    return np.ascontiguousarray(arr[sl]).tobytes()


# Run by /usr/bin/python3 in a child: reads each (file, dataset) with Debian's h5py into an
# .npz (the child has the environment under test: HDF5_PLUGIN_PATH, hdf5plugin imported).
READER = r"""
import json, sys
import numpy as np
if sys.argv[3] == "hdf5plugin":
    import hdf5plugin  # noqa: F401
import h5py
out = {}
errors = []
for i, (path, name) in enumerate(json.loads(sys.argv[1])):
    try:
        with h5py.File(path, "r") as h:
            out[str(i)] = np.frombuffer(h[name][()].tobytes(), dtype=np.uint8)
    except Exception as e:  # noqa: BLE001
        errors.append(f"{name}: {e}")
np.savez(sys.argv[2], **out)
print(json.dumps(errors))
"""


def h5py_read(pairs, out, plugin_dir, mode="plain"):
    p = run(["/usr/bin/python3", "-c", READER, json.dumps(pairs), out, mode], env=env_with(plugin_dir))
    if p.returncode != 0:
        return None, [p.stderr[-2000:]]
    got = np.load(out)
    return [got[str(i)].tobytes() if str(i) in got else None for i in range(len(pairs))], json.loads(p.stdout)


def h5dump_read(path, name, out, plugin_dir):
    if os.path.exists(out):
        os.remove(out)
    p = run(["h5dump", "-d", "/" + name, "-b", "FILE", "-o", out, path], env=env_with(plugin_dir))
    data = open(out, "rb").read() if os.path.exists(out) else b""
    return p, data


def make_checkpoint(bin_dir, tmp):
    st = os.path.join(tmp, "m.safetensors")
    write_safetensors(st, tensors())
    ck = os.path.join(tmp, "ck")
    # Two ranks, 32 KiB chunks: several compressed chunks per tensor and shard.
    p = run([os.path.join(bin_dir, "ckpt-convert"), st, ck, "--world", 2, "--compress", "zstd:5",
             "--chunk-size", "32KiB", "--pack-bytes", "64KiB"])
    check(p.returncode == 0, f"ckpt-convert --compress zstd: {p.stdout}{p.stderr}")
    return st, ck


def compressed_chunks(ck):
    recs = [(k, r) for k, rs in ckpt_edit.chunks(ck).items() for r in rs if r.get("compression")]
    return recs


def test_readers(ck, plugin_dirs, tmp, hdf5plugin):
    src = tensors()
    recs = compressed_chunks(ck)
    check(len(recs) >= 12 and len({k for k, _ in recs}) == len(src) and len({r["file"] for _, r in recs}) == 2,
          f"the checkpoint has compressed chunks of every tensor in both shards: {len(recs)}")
    check(all(r["compression"]["codec"] == "zstd" for _, r in recs), "every compressed chunk is zstd")
    pairs = [(os.path.join(ck, r["file"]), r["dataset"]) for _, r in recs]
    want = [expected_bytes(src[k][1], r) for k, r in recs]
    out = os.path.join(tmp, "h5py.npz")
    bin_out = os.path.join(tmp, "h5dump.bin")

    # The plugin is what makes them read: with an empty plugin directory both fail.
    empty = os.path.join(tmp, "no-plugins")
    os.makedirs(empty, exist_ok=True)
    got, errors = h5py_read(pairs, out, empty)
    check(got is not None and all(g is None for g in got) and len(errors) == len(pairs)
          and all("not registered" in e or "32015" in e or "zstd" in e for e in errors),
          f"h5py without the plugin cannot read a zstd chunk: {errors[:2]}")
    p, data = h5dump_read(pairs[0][0], pairs[0][1], bin_out, empty)
    check("unable to print data" in p.stdout + p.stderr and data != want[0],
          f"h5dump without the plugin cannot print a zstd chunk: {p.stdout[-300:]}{p.stderr[-300:]}")

    for label, d in plugin_dirs.items():
        got, errors = h5py_read(pairs, out, d)
        check(got is not None and not errors, f"h5py with the {label} plugin: {errors[:3]}")
        if got is not None:
            bad = [pairs[i][1] for i in range(len(pairs)) if got[i] != want[i]]
            check(not bad, f"h5py with the {label} plugin: every compressed chunk as saved; differ: {bad}")
        bad = []
        for (path, name), w in zip(pairs, want):
            p, data = h5dump_read(path, name, bin_out, d)
            if p.returncode != 0 or "unable" in p.stdout + p.stderr or data != w:
                bad.append(f"{os.path.basename(path)}:{name} (rc {p.returncode}, {len(data)} of {len(w)} bytes)")
        check(not bad, f"h5dump with the {label} plugin: every compressed chunk as saved; wrong: {bad[:4]}")

    # PyPI's hdf5plugin registers its own 32015 in the process; with ckpt's plugin on the
    # path too, nothing conflicts and both decode ckpt's chunks.
    if hdf5plugin:
        for d in (plugin_dirs["build tree"], empty):
            got, errors = h5py_read(pairs, out, d, mode="hdf5plugin")
            check(got is not None and not errors and got == want,
                  f"h5py with hdf5plugin imported (HDF5_PLUGIN_PATH={os.path.basename(d)}): {errors[:3]}")
    else:
        print("note: /usr/bin/python3 has no hdf5plugin; read through ckpt's plugin only")


WRITER = r"""
import sys
import numpy as np
if sys.argv[2] == "hdf5plugin":
    import hdf5plugin  # noqa: F401
import h5py
a = np.arange(50000, dtype=np.float32).reshape(500, 100) * 0.5
if sys.argv[3] == "write":
    with h5py.File(sys.argv[1], "w") as h:
        h.create_dataset("w", data=a, chunks=(100, 100), shuffle=True, compression=32015, compression_opts=(9,))
with h5py.File(sys.argv[1], "r") as h:
    d = h["w"]
    print(dict(d._filters), d.id.get_storage_size() < a.nbytes // 2, np.array_equal(d[()], a))
"""


def test_plugin_writes(plugin_dir, tmp, hdf5plugin):
    """h5py compresses through ckpt's plugin, cd_values (level,) as the registered filter's,
    and reads it back; where hdf5plugin is installed, each filter reads what the other wrote."""
    h5 = os.path.join(tmp, "written-by-h5py.h5")
    p = run(["/usr/bin/python3", "-c", WRITER, h5, "plain", "write"], env=env_with(plugin_dir))
    check(p.returncode == 0 and p.stdout.strip() == "{'shuffle': (4,), '32015': (9,)} True True",
          f"h5py writes (compressed, level 9 in cd_values[0]) and reads through the plugin: {p.stdout}{p.stderr}")
    if hdf5plugin:
        empty = os.path.join(tmp, "no-plugins")
        p = run(["/usr/bin/python3", "-c", WRITER, h5, "hdf5plugin", "read"], env=env_with(empty))
        check(p.returncode == 0 and p.stdout.strip().endswith("True True"),
              f"hdf5plugin's zstd reads what ckpt's plugin wrote: {p.stdout}{p.stderr}")
        other = os.path.join(tmp, "written-by-hdf5plugin.h5")
        p = run(["/usr/bin/python3", "-c", WRITER, other, "hdf5plugin", "write"], env=env_with(empty))
        check(p.returncode == 0 and p.stdout.strip() == "{'shuffle': (4,), '32015': (9,)} True True",
              f"hdf5plugin writes 32015 with cd_values (9,): {p.stdout}{p.stderr}")
        p = run(["/usr/bin/python3", "-c", WRITER, other, "plain", "read"], env=env_with(plugin_dir))
        check(p.returncode == 0 and p.stdout.strip().endswith("True True"),
              f"ckpt's plugin reads what hdf5plugin's zstd wrote: {p.stdout}{p.stderr}")


def test_ckpt_loads_no_plugin(bin_dir, ck, st, tmp, plugin_dir):
    """ckpt's readers use their own filter: a plugin directory whose zstd plugin aborts when
    loaded changes nothing, nor does ckpt's real plugin on the path."""
    boom = os.path.join(tmp, "boom-plugins")
    os.makedirs(boom)
    src = os.path.join(tmp, "boom.c")
    with open(src, "w") as f:
        f.write("#include <stdlib.h>\n"
                "int H5PLget_plugin_type(void) { abort(); }\n"
                "const void* H5PLget_plugin_info(void) { abort(); }\n")
    p = run(["cc", "-shared", "-fPIC", "-o", os.path.join(boom, PLUGIN), src])
    check(p.returncode == 0, f"building the aborting plugin: {p.stderr}")
    # It is real: h5dump loads it for a zstd chunk and aborts.
    path, name = [(os.path.join(ck, r["file"]), r["dataset"]) for _, r in compressed_chunks(ck)][0]
    p = run(["h5dump", "-d", "/" + name, path], env=env_with(boom))
    check(p.returncode in (-6, 134), f"h5dump loads the aborting plugin (rc {p.returncode})")
    tool = lambda n: os.path.join(bin_dir, n)  # noqa: E731
    for label, d in (("aborting", boom), ("ckpt's", plugin_dir)):
        env = env_with(d)
        p = run([tool("ckpt-verify"), ck], env=env)
        check(p.returncode == 0, f"ckpt-verify with the {label} plugin on HDF5_PLUGIN_PATH: rc {p.returncode} "
                                 f"{p.stdout[-500:]}{p.stderr[-500:]}")
        p = run([tool("ckpt-diff"), ck, st], env=env)
        check(p.returncode == 0, f"ckpt-diff with the {label} plugin: rc {p.returncode} {p.stdout[-500:]}{p.stderr[-500:]}")
        out = os.path.join(tmp, f"back-{label[:4]}.safetensors")
        p = run([tool("ckpt-convert"), ck, out], env=env)
        check(p.returncode == 0, f"ckpt-convert with the {label} plugin: {p.stdout[-500:]}{p.stderr[-500:]}")
        if p.returncode == 0:
            back, _ = read_safetensors(out)
            check(all(back[k][2] == a.tobytes() for k, (_, a) in tensors().items()),
                  f"ckpt-convert with the {label} plugin: every value as saved")


def test_install_where_debian_looks(cmake, build_dir, tmp):
    """`cmake --install --prefix /usr` puts the plugin where Debian's HDF5 looks by default."""
    p = run(["/usr/bin/python3", "-c", "import h5py; print(h5py.h5pl.get(0).decode())"], env=env_with(None))
    check(p.returncode == 0 and p.stdout.strip(), f"h5py names HDF5's default plugin directory: {p.stderr}")
    default_dir = p.stdout.strip()
    dest = os.path.join(tmp, "destdir")
    p = run([cmake, "--install", build_dir, "--prefix", "/usr"], env=dict(os.environ, DESTDIR=dest))
    check(p.returncode == 0, f"cmake --install --prefix /usr (DESTDIR): {p.stdout[-500:]}{p.stderr[-500:]}")
    installed = dest + os.path.join(default_dir, PLUGIN)
    check(os.path.isfile(installed), f"the plugin is installed into {default_dir} (looked for {installed})")
    shutil.rmtree(dest, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--plugin-dir", required=True)
    ap.add_argument("--installed-plugin-dir", required=True)
    ap.add_argument("--cmake")
    ap.add_argument("--build-dir")
    args = ap.parse_args()
    if not shutil.which("h5dump"):
        check(False, "h5dump is needed (scripts/install-deps.sh installs hdf5-tools)")
        return 1
    base = os.environ.get("CKPT_TEST_TMP")
    if base:
        os.makedirs(base, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="zstd-plugin-", dir=base)
    try:
        for label, d in (("build tree", args.plugin_dir), ("installed", args.installed_plugin_dir)):
            check(os.path.isfile(os.path.join(d, PLUGIN)), f"{label}: {PLUGIN} in {d}")
        has_hdf5plugin = run(["/usr/bin/python3", "-c", "import hdf5plugin"]).returncode == 0
        st, ck = make_checkpoint(args.bin, tmp)
        test_readers(ck, {"build tree": args.plugin_dir, "installed": args.installed_plugin_dir}, tmp,
                     has_hdf5plugin)
        test_plugin_writes(args.plugin_dir, tmp, has_hdf5plugin)
        test_ckpt_loads_no_plugin(args.bin, ck, st, tmp, args.plugin_dir)
        if args.cmake and args.build_dir:
            test_install_where_debian_looks(args.cmake, args.build_dir, tmp)
    finally:
        status = finish(tmp, "zstd plugin: all checks passed")
    return status


if __name__ == "__main__":
    sys.exit(main())
