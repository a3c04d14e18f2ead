#!/usr/bin/env python3
"""Checks that libckpt's layers include downward only.

check_layers.py SRC INCLUDE LAYER...
  SRC      libckpt/src: one folder per layer
  INCLUDE  libckpt/include: the public headers, which include no layer's header
  LAYER... the layers, lowest first (libckpt/CMakeLists.txt's CKPT_LAYERS)

A file under SRC/<layer>/ may include "<other>/..." only where <other> is <layer> or a layer
listed before it; a folder of SRC that is not a listed layer is an error (place it in the
order), as is a quoted include that climbs out of its folder ("../"). Exit 1 with one line per
offending include (file:line: what), 0 when every include points down.
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SUFFIXES = {".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".in"}


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield number, m.group(1)


def sources(root):
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES)


def main(argv):
    if len(argv) < 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    src, public, order = pathlib.Path(argv[1]), pathlib.Path(argv[2]), argv[3:]
    rank = {layer: i for i, layer in enumerate(order)}
    problems = []
    for folder in sorted(p for p in src.iterdir() if p.is_dir()):
        if folder.name not in rank:
            problems.append(f"{folder}: a folder of libckpt/src that is not a layer: add it to "
                            f"CKPT_LAYERS (libckpt/CMakeLists.txt) at its place in {' < '.join(order)}")
    checked = 0
    for path in sources(src):
        layer = path.relative_to(src).parts[0]
        if layer not in rank:
            continue
        checked += 1
        for line, target in includes(path):
            top = target.split("/")[0]
            if target.startswith("../") or "/../" in target:
                problems.append(f"{path}:{line}: #include \"{target}\" climbs out of {layer}/: "
                                f"include it by its layer's path")
            elif top in rank and rank[top] > rank[layer]:
                problems.append(f"{path}:{line}: {layer}/ includes \"{target}\" of {top}/, a layer "
                                f"above it ({' < '.join(order)})")
    for path in sources(public):
        checked += 1
        for line, target in includes(path):
            top = target.split("/")[0]
            if top in rank or target.startswith("../"):
                problems.append(f"{path}:{line}: a public header includes \"{target}\", an internal "
                                f"header of libckpt")
    if checked == 0:
        problems.append(f"{src}, {public}: no source found: the check would check nothing")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"check_layers: {checked} files, every include points down ({' < '.join(order)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
