#!/usr/bin/env python3
"""Writes every ```cpp block of a Markdown file to OUT/block_<line>.cc (line: where the block
starts in the file, kept through #line so compiler errors point into the Markdown) and prints
one "<line> <has_main>" row per block."""
import os
import re
import sys


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    with open(src, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```cpp":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            body = "\n".join(lines[start:j]) + "\n"
            path = os.path.join(out, f"block_{start + 1}.cc")
            text = f'#line {start + 1} "{os.path.abspath(src)}"\n' + body
            old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
            if old != text:  # unchanged blocks are not rebuilt
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            has_main = 1 if re.search(r"\bint\s+main\s*\(", body) else 0
            print(f"{start + 1} {has_main}")
            i = j
        i += 1


if __name__ == "__main__":
    main()
