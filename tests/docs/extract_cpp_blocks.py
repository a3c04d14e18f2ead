#!/usr/bin/env python3
"""Writes every ```cpp block of the given Markdown files to OUT/<doc>/block_<line>.cc (line:
where the block starts in its file, kept through #line so compiler errors point into the
Markdown) and prints one "<doc> <line> <has_main>" row per block. <doc> names the file:
"readme" for README.md, the file's stem for docs/<stem>.md (lower case, [a-z0-9_] only), so
test names stay unique across the docs and do not change when another doc changes.

usage: extract_cpp_blocks.py OUT FILE.md...
"""
import os
import re
import sys


def doc_name(path):
    stem = os.path.splitext(os.path.basename(path))[0].lower()
    name = re.sub(r"[^a-z0-9_]", "_", stem)
    if not name:
        sys.exit(f"{path}: no usable name for its tests")
    return name


def blocks(path):
    """(line of the block's first line, body) for every ```cpp block of a Markdown file."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```cpp":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                sys.exit(f"{path}:{i + 1}: ```cpp block never closed")
            yield start + 1, "\n".join(lines[start:j]) + "\n"
            i = j
        i += 1


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = sys.argv[1]
    seen = {}
    for src in sys.argv[2:]:
        name = doc_name(src)
        if name in seen:
            sys.exit(f"{src} and {seen[name]} would give their tests the same name '{name}'")
        seen[name] = src
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        for line, body in blocks(src):
            path = os.path.join(folder, f"block_{line}.cc")
            text = f'#line {line} "{os.path.abspath(src)}"\n' + body
            old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
            if old != text:  # unchanged blocks are not rebuilt
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            has_main = 1 if re.search(r"\bint\s+main\s*\(", body) else 0
            print(f"{name} {line} {has_main}")


if __name__ == "__main__":
    main()
