#!/usr/bin/python3
"""The tools against shards that reach outside themselves, filters the format does not name,
a plugin directory that must never be loaded from, and failed writes and closes.

Each hostile shard is made from a good checkpoint by hostile_shard (C API, see
hostile_shard.h): dataset 'w' becomes LZ4-filtered (id 32004), an external link, a soft
link, a virtual dataset or a dataset with external storage, values unchanged. Every reader
(verify, merge, diff, inspect --stats of the lone shard) must refuse it, naming the file,
the dataset and what is wrong, and must not open the outside file.

HDF5_PLUGIN_PATH points at a directory holding a library that aborts when loaded; HDF5's
own h5dump proves that it would be loaded for the LZ4 chunk, the tools must not load it.

Every shard of the fuzz corpus kept as a regression input (tests/fuzz/corpus/shard/regress-*.h5,
each an input that once crashed a tool or HDF5 itself), as a lone shard: ckpt-verify and
ckpt-merge exit 1 or 2 (never a signal), naming the file; the one whose mutated virtual-dataset
layout crashed HDF5 1.10 inside H5Dopen2 is refused as a virtual dataset, and the one whose
chunk index claims 1.9 GB (HDF5 allocated and zeroed it per read: 20 s an input under ASan) for
what it is, each naming its dataset.

Faults come from strace: ENOSPC at each pwrite64 of a merge, EIO at each close(2) of a
source shard of a merge and a verify. Exit codes must stay 0/1/2 (HDF5 1.10 used to crash
at exit after a failed close: rc 139), and a merge whose only fault is a source shard's
close succeeds.

Run by CTest:  hardening_test.py --bin <tools> --hostile <hostile_shard>
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import ckpt_edit  # noqa: E402
from cli_test import write_safetensors  # noqa: E402

FAILURES = []
STRACE = "/usr/bin/strace"
SHARD = "shard-00000-of-00001.h5"


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


def run(args, env=None, **kw):
    if args[0] == STRACE:
        # LeakSanitizer stops the world with ptrace, which a traced process cannot: leak
        # checking is off under strace (the runs without strace keep it).
        env = dict(env or os.environ)
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, **kw)


# What each kind's refusal says.
KINDS = {
    "lz4": "HDF5 filter 32004 (LZ4)",
    "extlink": "external link",
    "softlink": "soft link",
    "vds": "virtual dataset",
    "external": "stored in external files",
}


def make_checkpoints(bin_dir, tmp):
    rng = np.random.default_rng(8)
    st = os.path.join(tmp, "m.safetensors")
    write_safetensors(st, {"w": ("F32", rng.standard_normal((64, 32)).astype(np.float32)),
                           "b": ("F32", rng.standard_normal((64,)).astype(np.float32))})
    ck1, ck2 = os.path.join(tmp, "ck1"), os.path.join(tmp, "ck2")
    for ck, world in ((ck1, "1"), (ck2, "2")):
        p = run([os.path.join(bin_dir, "ckpt-convert"), st, ck, "--world", world])
        check(p.returncode == 0, f"convert --world {world}: {p.stderr}")
    return ck1, ck2


def opened_paths(trace_file):
    with open(trace_file) as f:
        return re.findall(r'open(?:at)?\(.*?"([^"]*)"', f.read())


def test_hostile(bin_dir, hostile, tmp, ck1, plugin_env):
    tool = lambda name: os.path.join(bin_dir, name)  # noqa: E731
    for kind, phrase in KINDS.items():
        ck = os.path.join(tmp, f"ck-{kind}")
        shutil.copytree(ck1, ck)
        outside = os.path.join(tmp, f"outside-{kind}.bin")
        p = run([hostile, os.path.join(ck, SHARD), "w", kind, outside])
        check(p.returncode == 0, f"{kind}: hostile_shard: {p.stderr}")
        ckpt_edit.record_index(ck, 0)  # the index changed (the dataset's offset dropped): its digest follows
        # verify: a problem naming file, dataset and what; the outside file never opened
        trace = os.path.join(tmp, f"verify-{kind}.trace")
        p = run([STRACE, "-f", "-qq", "-o", trace, "-e", "trace=open,openat", tool("ckpt-verify"), ck],
                env=plugin_env)
        check(p.returncode == 1, f"{kind}: ckpt-verify exits 1, got {p.returncode}: {p.stdout}{p.stderr}")
        check(phrase in p.stdout and SHARD in p.stdout and "'w'" in p.stdout,
              f"{kind}: ckpt-verify names file, dataset and '{phrase}': {p.stdout}")
        if kind != "lz4":
            check(not any(os.path.basename(outside) in x for x in opened_paths(trace)),
                  f"{kind}: ckpt-verify opened the outside file")
        # merge, diff, inspect of the lone shard: refused with the same words
        out = os.path.join(tmp, f"merged-{kind}")
        for name, args, codes in (
                ("ckpt-merge", [ck, out], (1, 2)),
                ("ckpt-merge", [ck, out + ".safetensors"], (1, 2)),
                ("ckpt-diff", [ck1, ck], (1, 2)),
                ("ckpt-inspect", ["--stats", os.path.join(ck, SHARD)], (1, 2))):
            p = run([tool(name)] + args, env=plugin_env)
            check(p.returncode in codes and all(x in p.stdout + p.stderr for x in (phrase, "'w'", SHARD)),
                  f"{kind}: {name} {' '.join(args[:-1])} refuses naming '{phrase}' (rc {p.returncode}): "
                  f"{p.stdout}{p.stderr}")
        check(not os.path.exists(out), f"{kind}: nothing merged")


FUZZ_SHARDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus", "shard")
# regress-*.h5 whose refusal names a dataset: what it is refused for, and the dataset.
FUZZ_REFUSALS = {"regress-virtual-layout-global-heap.h5": ("virtual dataset", "'model.w'"),
                 "regress-chunk-size-past-eof.h5": ("HDF5 chunks claim", "'model.w'")}


def test_fuzz_regressions(bin_dir, tmp):
    tool = lambda name: os.path.join(bin_dir, name)  # noqa: E731
    names = sorted(n for n in os.listdir(FUZZ_SHARDS) if n.startswith("regress-"))
    check(set(FUZZ_REFUSALS) <= set(names), f"fuzz regression shards present: {names}")
    for name in names:
        shard = os.path.join(tmp, name)
        shutil.copyfile(os.path.join(FUZZ_SHARDS, name), shard)
        for args in (["ckpt-verify", shard], ["ckpt-merge", shard, os.path.join(tmp, name + ".safetensors")]):
            p = run([tool(args[0])] + args[1:])
            said = p.stdout + p.stderr
            check(p.returncode in (1, 2) and name in said,
                  f"{name}: {args[0]} exits 1 or 2 naming the file (rc {p.returncode}): {said}")
            for phrase in FUZZ_REFUSALS.get(name, ()):
                check(phrase in said, f"{name}: {args[0]} says {phrase}: {said}")


def make_plugin_dir(tmp):
    """A plugin directory whose only library aborts the process as soon as it is loaded."""
    d = os.path.join(tmp, "plugins")
    os.makedirs(d)
    src = os.path.join(tmp, "boom.c")
    with open(src, "w") as f:
        f.write("#include <stdlib.h>\n"
                "__attribute__((constructor)) static void boom(void) { abort(); }\n"
                "int H5PLget_plugin_type(void) { abort(); }\n"
                "const void* H5PLget_plugin_info(void) { abort(); }\n")
    p = run(["cc", "-shared", "-fPIC", "-o", os.path.join(d, "libboom.so"), src])
    check(p.returncode == 0, f"building the aborting plugin: {p.stderr}")
    env = dict(os.environ, HDF5_PLUGIN_PATH=d)
    return env


def test_plugin_would_load(tmp, plugin_env):
    """The aborting plugin is real: HDF5 itself loads it for the LZ4 chunk."""
    h5dump = shutil.which("h5dump")
    if not h5dump:
        print("note: no h5dump, the plugin directory's effect is not cross-checked")
        return
    p = run([h5dump, "-d", "/w", os.path.join(tmp, "ck-lz4", SHARD)], env=plugin_env)
    check(p.returncode in (-6, 134), f"h5dump with the aborting plugin aborts (rc {p.returncode})")


def count_calls(args, syscall, tmp):
    trace = os.path.join(tmp, "count.trace")
    run([STRACE, "-f", "-qq", "-o", trace, "-e", f"trace={syscall}"] + args)
    with open(trace) as f:
        return sum(1 for line in f if re.search(rf"\b{syscall}\(", line))


def test_enospc(bin_dir, tmp, ck2):
    merge = os.path.join(bin_dir, "ckpt-merge")
    out = os.path.join(tmp, "enospc-out")
    n = count_calls([merge, ck2, out], "pwrite64", tmp)
    shutil.rmtree(out, ignore_errors=True)
    check(n > 3, f"a merge writes with pwrite64 ({n} calls)")
    failed = 0
    for when in range(1, n + 1):
        p = run([STRACE, "-f", "-qq", "-o", "/dev/null", "-e", "trace=pwrite64",
                 "-e", f"inject=pwrite64:error=ENOSPC:when={when}", merge, ck2, out])
        check(p.returncode in (0, 1, 2), f"ENOSPC at pwrite64 #{when}: exit {p.returncode} ({p.stderr.strip()})")
        if p.returncode != 0:
            failed += 1
            check("error:" in p.stderr, f"ENOSPC at pwrite64 #{when}: a clear error: {p.stderr}")
        shutil.rmtree(out, ignore_errors=True)
    check(failed > 0, "some injected ENOSPC failed the merge")


def source_closes(args, tmp, source_dir):
    """Ordinals of the close(2) calls that close a file of `source_dir`."""
    trace = os.path.join(tmp, "close.trace")
    run([STRACE, "-qq", "-o", trace, "-e", "trace=openat,close"] + args)
    fds, n, hits = {}, 0, []
    with open(trace) as f:
        for line in f:
            m = re.search(r'openat\((\w+), "([^"]*)".*= (\d+)', line)
            if m:
                base, path = m.group(1), m.group(2)
                # Readers open shards relative to one directory handle (openat(dirfd, name)),
                # and HDF5 through /proc/self/fd/<dirfd>/<name>: resolve both to real paths.
                proc = re.match(r"/proc/self/fd/(\d+)/(.*)", path)
                if proc:
                    path = os.path.join(fds.get(int(proc.group(1)), "?"), proc.group(2))
                elif not path.startswith("/") and base.isdigit():
                    path = os.path.join(fds.get(int(base), "?"), path)
                fds[int(m.group(3))] = path
                continue
            m = re.search(r"close\((\d+)\)", line)
            if m:
                n += 1
                if fds.pop(int(m.group(1)), "").startswith(source_dir + "/"):
                    hits.append(n)
    return hits


def test_close_eio(bin_dir, tmp, ck2):
    merge, verify = os.path.join(bin_dir, "ckpt-merge"), os.path.join(bin_dir, "ckpt-verify")
    out = os.path.join(tmp, "eio-out")
    for name, args in (("merge", [merge, ck2, out]), ("verify", [verify, ck2])):
        hits = source_closes(args, tmp, ck2)
        shutil.rmtree(out, ignore_errors=True)
        check(len(hits) >= 2, f"{name} closes its source shards ({hits})")
        for when in hits:
            p = run([STRACE, "-qq", "-o", "/dev/null", "-e", "trace=close",
                     "-e", f"inject=close:error=EIO:when={when}"] + args)
            check(p.returncode == 0, f"{name}: EIO at close #{when} of a source shard: exit {p.returncode} "
                                     f"({p.stderr.strip()})")
            if name == "merge":
                check(run([verify, out]).returncode == 0, f"merge with EIO at close #{when}: the output verifies")
            shutil.rmtree(out, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--hostile", required=True)
    args = ap.parse_args()
    scratch = os.environ.get("CKPT_TEST_TMP") or tempfile.gettempdir()
    os.makedirs(scratch, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="hardening-", dir=scratch)
    ck1, ck2 = make_checkpoints(args.bin, tmp)
    plugin_env = make_plugin_dir(tmp)
    test_hostile(args.bin, args.hostile, tmp, ck1, plugin_env)
    test_fuzz_regressions(args.bin, tmp)
    test_plugin_would_load(tmp, plugin_env)
    check(os.access(STRACE, os.X_OK), f"{STRACE} is needed (scripts/install-deps.sh installs it)")
    if os.access(STRACE, os.X_OK):
        test_enospc(args.bin, tmp, ck2)
        test_close_eio(args.bin, tmp, ck2)
    if FAILURES:
        print(f"{len(FAILURES)} failures (scratch kept in {tmp})")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("all hardening tests passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
