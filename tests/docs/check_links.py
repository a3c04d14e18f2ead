#!/usr/bin/env python3
"""Checks the relative links of Markdown files: every [text](target) that is not a URL must
name a file or folder of the repository, and a #fragment into a Markdown file must name one of
its headings (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens). Prints
each broken link as FILE:LINE: message and exits 1 if there is one.

usage: check_links.py FILE.md...
"""
import os
import re
import sys

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path):
    out, fenced = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                title = line.lstrip("#").strip().lower()
                title = re.sub(r"[^\w\- ]", "", title)
                out.add(title.replace(" ", "-"))
    return out


def check(path):
    problems, fenced = [], False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, fragment = target.partition("#")
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                if not os.path.exists(resolved):
                    problems.append(f"{path}:{number}: '{target}': no such file")
                elif fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
                    problems.append(f"{path}:{number}: '{target}': no heading '#{fragment}' in {file or path}")
    return problems


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    problems = [p for path in sys.argv[1:] for p in check(path)]
    print("\n".join(problems) if problems else f"links OK in {len(sys.argv) - 1} files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
