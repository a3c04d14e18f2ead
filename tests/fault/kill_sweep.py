#!/usr/bin/env python3
"""The kill sweep: real processes (a 4-rank quickstart save, ckpt-merge, ckpt-merge
--force, ckpt-convert, a training run rotating checkpoints) SIGKILLed at their N-th
system call (strace -e inject=all:signal=KILL:when=N). After each kill the target is the
old complete checkpoint or the new complete one (ckpt-verify OK), and the next run
without a kill leaves no staging leftovers behind.

  kill_sweep.py --bin-dir BUILD --tmp DIR [--points N | --full] [--seed S]

Without --full, a fixed-seed sample of --points kill points over all scenarios (fewer
under CI=true). Prints the counts; exits 1 on any violation.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import ckpt_format  # noqa: E402  (FORMAT.md's digest rule, from the independent reader)

STRACE = shutil.which("strace") or "/usr/bin/strace"


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


# Calls that make or undo a commit: every invocation of these is a kill point, also in
# the sampled sweep.
COMMIT_CALLS = {"rename", "renameat", "renameat2", "fsync", "fdatasync", "unlink", "unlinkat", "rmdir", "mkdir",
                "mkdirat", "flock", "copy_file_range", "ftruncate"}


def kill_points(cmd, cwd):
    """Every (syscall, n) of `cmd`: its n-th invocation of that system call (strace counts
    injections per call and per thread; n runs to the most any one thread makes)."""
    log = os.path.join(cwd, ".strace.log")
    r = run([STRACE, "-f", "-qq", "-o", log, *cmd], cwd=cwd)
    if r.returncode != 0:
        raise SystemExit("kill_sweep: %s fails without a kill: %s" % (cmd, r.stderr))
    counts = {}
    with open(log) as f:
        for line in f:
            pid, _, rest = line.partition(" ")
            rest = rest.lstrip()
            if rest.startswith(("<...", "+++", "---")) or "(" not in rest:
                continue
            name = rest.split("(", 1)[0]
            counts[(pid, name)] = counts.get((pid, name), 0) + 1
    os.remove(log)
    most = {}
    for (pid, name), c in counts.items():
        most[name] = max(most.get(name, 0), c)
    return [(name, n) for name in sorted(most) for n in range(1, most[name] + 1)]


def killed(cmd, point, cwd):
    name, n = point
    return run([STRACE, "-f", "-qq", "-o", "/dev/null", "-e", "inject=%s:signal=KILL:when=%d" % (name, n), *cmd],
               cwd=cwd)


def leftovers(d):
    return sorted(n for n in os.listdir(d) if ".ckpt-" in n)


class Sweep:
    def __init__(self, args):
        self.bin = os.path.abspath(args.bin_dir)
        self.tmp = args.tmp
        self.points = 0
        self.killed = 0
        self.old = self.new = self.absent = 0
        self.violations = []

    def tool(self, name):
        return os.path.join(self.bin, "tools", name)

    def verify(self, path):
        r = run([self.tool("ckpt-verify"), "-q", path])
        return r.returncode == 0, r.stdout + r.stderr

    def step_of(self, d):
        with open(os.path.join(d, "metadata.json")) as f:
            m = json.load(f)
        entries = m["entries"]
        e = entries["step"] if isinstance(entries, dict) else dict(entries)["step"]
        return int(e["value"])

    def fail(self, what):
        self.violations.append(what)
        print("VIOLATION: " + what, flush=True)

    def judge_ckpt(self, label, path, old_step, new_step, may_be_absent):
        if not os.path.exists(path):
            if may_be_absent:
                self.absent += 1
            else:
                self.fail("%s: %s is gone" % (label, path))
            return
        ok, out = self.verify(path)
        if not ok:
            self.fail("%s: %s fails ckpt-verify: %s" % (label, path, out.strip()[:300]))
            return
        s = self.step_of(path)
        if s == old_step:
            self.old += 1
        elif s == new_step:
            self.new += 1
        else:
            self.fail("%s: %s holds step %d" % (label, path, s))

    def scenario(self, label, cmd, cwd, setup, judge, after, budget, rng, full, where=None):
        setup()
        every = kill_points(cmd, cwd)
        if full:
            ns = every
        else:
            commit = [p for p in every if p[0] in COMMIT_CALLS]
            rest = [p for p in every if p[0] not in COMMIT_CALLS]
            ns = commit + rng.sample(rest, max(0, min(budget - len(commit), len(rest))))
        for n in ns:
            setup()
            r = killed(cmd, n, cwd)
            self.points += 1
            if r.returncode in (137, -9):
                self.killed += 1
            elif r.returncode != 0:
                self.fail("%s killed at %s #%d: exit %d: %s" % (label, n[0], n[1], r.returncode,
                                                                r.stderr.strip()[:300]))
            judge("%s killed at %s #%d" % (label, n[0], n[1]))
            after()
            left = leftovers(where or cwd)
            if left:
                self.fail("%s killed at %s #%d: leftovers after the next run: %s" % (label, n[0], n[1], left))
        print("%s: %d kill points (system call invocations), %d tried" % (label, len(every), len(ns)), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--points", type=int, default=0)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--seed", type=int, default=8)
    args = ap.parse_args()
    if not os.path.exists(STRACE) or run([STRACE, "-qq", "-o", "/dev/null", "true"]).returncode != 0:
        print("kill_sweep: strace is missing or cannot trace here (ptrace not permitted); skipped")
        return 77
    points = args.points or (250 if os.environ.get("CI") == "true" else 400)
    rng = random.Random(args.seed)
    sw = Sweep(args)
    work = os.path.join(args.tmp, "kill-sweep")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    q = os.path.join(sw.bin, "examples", "quickstart", "ckpt-quickstart")
    train = os.path.join(sw.bin, "examples", "train", "train")
    budget = max(points // 6, 1)

    def rm(p):
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)

    # A pristine old checkpoint: the quickstart's, marked as step 99.
    pristine = os.path.join(work, "pristine")
    os.makedirs(pristine)
    assert run([q, "old"], cwd=pristine).returncode == 0
    meta = os.path.join(pristine, "old", "metadata.json")
    with open(meta, "rb") as f:
        raw = f.read().replace(b'"value":100', b'"value":99')
    at = ckpt_format.find_digest(raw)
    with open(meta, "wb") as f:  # a version 2 metadata.json carries its own digest: recomputed
        f.write(ckpt_format.with_digest(raw[:at[0]]) if at else raw)
    old = os.path.join(pristine, "old")

    def restore(dst):
        rm(dst)
        shutil.copytree(old, dst)

    # 1. quickstart save over an existing checkpoint, 2. to a new path.
    d = os.path.join(work, "save")
    os.makedirs(d)
    dst = os.path.join(d, "dst")
    sw.scenario("quickstart save (overwrite)", [q, "dst"], d, lambda: restore(dst),
                lambda l: sw.judge_ckpt(l, dst, 99, 100, False), lambda: run([q, "dst"], cwd=d), budget, rng, args.full)
    sw.scenario("quickstart save (new path)", [q, "dst"], d, lambda: rm(dst),
                lambda l: sw.judge_ckpt(l, dst, 99, 100, True), lambda: run([q, "dst"], cwd=d), budget, rng, args.full)

    # 3. ckpt-merge to a new path, 4. --force over an existing checkpoint, 5. ckpt-convert.
    d = os.path.join(work, "merge")
    os.makedirs(d)
    src = os.path.join(pristine, "new")
    assert run([q, "new"], cwd=pristine).returncode == 0
    out = os.path.join(d, "out")
    merge = [sw.tool("ckpt-merge"), "-q", src, "out"]
    sw.scenario("ckpt-merge", merge, d, lambda: rm(out), lambda l: sw.judge_ckpt(l, out, 99, 100, True),
                lambda: run(merge + ["--force"], cwd=d), budget, rng, args.full)
    sw.scenario("ckpt-merge --force", merge + ["--force"], d, lambda: restore(out),
                lambda l: sw.judge_ckpt(l, out, 99, 100, False), lambda: run(merge + ["--force"], cwd=d), budget,
                rng, args.full)
    st = os.path.join(d, "model.safetensors")
    convert = [sw.tool("ckpt-convert"), "-q", src, "model.safetensors"]

    def judge_st(label):
        if not os.path.exists(st):
            sw.absent += 1
            return
        ok, text = sw.verify(st)
        if ok:
            sw.new += 1
        else:
            sw.fail("%s: %s is not a complete safetensors file: %s" % (label, st, text.strip()[:300]))

    sw.scenario("ckpt-convert", convert, d, lambda: rm(st), judge_st, lambda: run(convert + ["--force"], cwd=d),
                budget, rng, args.full)

    # 6. a training run rotating checkpoints (keep 2 of 3 saves).
    if os.path.exists(train):
        d = os.path.join(work, "train")
        os.makedirs(d)
        root = os.path.join(d, "run")
        base = [train, "--world", "2", "--strategy", "fsdp", "--dim", "16", "--hidden", "32", "--layers", "1",
                "--vocab", "32", "--batch", "8", "--keep", "2", "--ckpt-dir", "run", "--log-every", "1000"]
        seeded = os.path.join(pristine, "run")
        assert run(base + ["--steps", "2", "--save-every", "1"], cwd=pristine).returncode == 0
        rotate = base + ["--steps", "4", "--save-every", "1", "--resume"]

        def restore_run():
            rm(root)
            shutil.copytree(seeded, root)

        def judge_run(label):
            for n in sorted(os.listdir(root)):
                p = os.path.join(root, n)
                if n.startswith("step-"):
                    ok, text = sw.verify(p)
                    if not ok:
                        sw.fail("%s: %s looks like a checkpoint but fails ckpt-verify: %s" % (label, p, text[:300]))
            latest = os.path.join(root, "latest")
            if os.path.exists(latest):
                with open(latest) as f:
                    name = f.read().strip()
                if not os.path.exists(os.path.join(root, name, "metadata.json")):
                    sw.fail("%s: latest names %s, which is not committed" % (label, name))
            sw.new += 1

        sw.scenario("train rotation", rotate, d, restore_run, judge_run,
                    lambda: run(base + ["--steps", "6", "--save-every", "1", "--resume"], cwd=d), budget, rng,
                    args.full, where=root)

    print("kill sweep: %d points, %d killed, targets afterwards: %d old, %d new, %d absent (new path); "
          "%d violations" % (sw.points, sw.killed, sw.old, sw.new, sw.absent, len(sw.violations)), flush=True)
    return 1 if sw.violations else 0


if __name__ == "__main__":
    sys.exit(main())
