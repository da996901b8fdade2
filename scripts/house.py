#!/usr/bin/env python3
"""How the house of host/src stands: which top-level modules import which.

Reads every `.rs` file of each module `host/src/lib.rs` declares (the
binary's own `cli/` is not part of the library and is skipped),
drops comments and string literals, and counts a reference from module A
to module B for every `crate::B` (including `use crate::{B, ...}` groups)
and every `super::` chain that climbs out of A into B. From that graph it
prints:

- mutual pairs: modules that import each other (A -> B and B -> A);
- cycles: groups of modules that reach each other (strongly connected
  components of more than one module);
- floors: the length, in modules, of the longest import chain once every
  cycle is collapsed into one node (a module importing nothing of ours is
  on floor 1), with the modules of each floor;
- longest chain: the longest import chain that visits no module twice,
  each module of a cycle counted on its own (equal to floors when there is
  no cycle; a cycle collapsed into one floor hides how tall it is).

Usage:
    python3 scripts/house.py            # the working tree
    python3 scripts/house.py --rev main # a commit, read through git
    python3 scripts/house.py --edges    # also list every edge

Standard library only; nothing in CI runs it.
"""

import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = "host/src"


def read_tree(rev):
    """{path relative to host/src: text} of every .rs file, at `rev` or on disk."""
    files = {}
    if rev:
        names = subprocess.run(
            ["git", "-C", ROOT, "ls-tree", "-r", "--name-only", rev, SRC],
            check=True, capture_output=True, text=True,
        ).stdout.split()
        for name in names:
            if name.endswith(".rs"):
                files[name[len(SRC) + 1:]] = subprocess.run(
                    ["git", "-C", ROOT, "show", f"{rev}:{name}"],
                    check=True, capture_output=True, text=True,
                ).stdout
    else:
        base = os.path.join(ROOT, SRC)
        for dirpath, _, names in os.walk(base):
            for name in names:
                if name.endswith(".rs"):
                    path = os.path.join(dirpath, name)
                    with open(path, encoding="utf-8") as f:
                        files[os.path.relpath(path, base)] = f.read()
    return files


def code_only(text):
    """`text` with comments and string/char literals blanked out."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 40]) and not re.match(r"\w", text[i - 1:i] or " "):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and (text[i + 1:i + 2] == "\\" or text[i + 2:i + 3] == "'"):
            # A char literal ('x', '\n', '\u{..}'); a lifetime has no closing quote.
            j = text.find("'", i + 2)
            i = j + 1
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_path(rel):
    """host/src-relative file -> its module path (`a/b.rs` -> [a, b])."""
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


def group_heads(text, start):
    """Top-level names of the `{...}` group that opens at text[start]."""
    names, depth, segment = [], 0, ""
    for c in text[start:]:
        if c == "{":
            depth += 1
            if depth == 1:
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and c == ",":
            names.append(segment)
            segment = ""
        elif depth >= 1:
            segment += c
    names.append(segment)
    heads = []
    for s in names:
        m = re.match(r"\s*(\w+)", s)
        if m:
            heads.append(m.group(1))
    return heads


def references(text, path):
    """Top-level modules `text` (the file at module `path`) refers to."""
    found = []
    for m in re.finditer(r"\bcrate\s*::\s*(\{|\w+)", text):
        if m.group(1) == "{":
            found.extend(group_heads(text, m.start(1)))
        else:
            found.append(m.group(1))
    for m in re.finditer(r"(?<![\w:])((?:super\s*::\s*)+)(\{|\w+)", text):
        ups = m.group(1).count("super")
        if ups < len(path):
            continue  # stays inside its own top-level module
        if ups == len(path) and m.group(2) != "{":
            found.append(m.group(2))
        elif ups == len(path):
            found.extend(group_heads(text, m.start(2)))
    return found


def graph(files):
    lib = code_only(files["lib.rs"])
    modules = sorted(set(re.findall(r"\bmod\s+(\w+)\s*;", lib)))
    edges = defaultdict(lambda: defaultdict(int))
    for rel, text in files.items():
        path = module_path(rel)
        if path[0] not in modules:
            continue  # lib.rs, main.rs and the binary's own modules
        for target in references(code_only(text), path):
            if target in modules and target != path[0]:
                edges[path[0]][target] += 1
    return modules, edges


def components(modules, edges):
    """Strongly connected components (Tarjan), each a sorted list."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in modules:
        if v not in index:
            visit(v)
    return out


def floors(modules, edges, comps):
    """{component index: floor}, floor 1 importing nothing of ours."""
    of = {m: i for i, c in enumerate(comps) for m in c}
    below = defaultdict(set)
    for a, targets in edges.items():
        for b in targets:
            if of[a] != of[b]:
                below[of[a]].add(of[b])
    floor = {}

    def height(c):
        if c not in floor:
            floor[c] = 1 + max((height(d) for d in below[c]), default=0)
        return floor[c]

    for c in range(len(comps)):
        height(c)
    return floor


def longest_chain(modules, edges):
    """The longest import path visiting no module twice (depth-first; the
    graph is small)."""
    best = []

    def walk(path, seen):
        nonlocal best
        if len(path) > len(best):
            best = list(path)
        for w in sorted(edges.get(path[-1], {})):
            if w not in seen:
                path.append(w)
                seen.add(w)
                walk(path, seen)
                seen.discard(w)
                path.pop()

    for v in modules:
        walk([v], {v})
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", help="read host/src at this git revision")
    parser.add_argument("--edges", action="store_true", help="list every edge")
    args = parser.parse_args()
    modules, edges = graph(read_tree(args.rev))
    comps = components(modules, edges)
    floor = floors(modules, edges, comps)
    mutual = sorted(
        (a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, {})
    )
    cycles = [c for c in comps if len(c) > 1]
    where = args.rev or "working tree"
    print(f"host/src at {where}: {len(modules)} modules, "
          f"{sum(len(t) for t in edges.values())} module-to-module imports")
    print(f"mutual pairs: {len(mutual)}")
    for a, b in mutual:
        print(f"  {a} <-> {b}  ({edges[a][b]} / {edges[b][a]} references)")
    print(f"cycles: {len(cycles)}")
    for c in cycles:
        print("  " + ", ".join(c))
    top = max(floor.values(), default=0)
    print(f"floors: {top}")
    for f in range(top, 0, -1):
        names = [" + ".join(comps[c]) if len(comps[c]) > 1 else comps[c][0]
                 for c in sorted(floor, key=lambda c: comps[c]) if floor[c] == f]
        print(f"  {f:2}: {', '.join(names)}")
    chain = longest_chain(modules, edges)
    print(f"longest chain: {len(chain)} ({' -> '.join(chain)})")
    if args.edges:
        for a in sorted(edges):
            print(f"  {a} -> " + ", ".join(
                f"{b}({n})" for b, n in sorted(edges[a].items())))


if __name__ == "__main__":
    main()
