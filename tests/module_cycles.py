#!/usr/bin/env python3
"""Finds import circles between the modules of the workspace's library crates.

Usage: python3 tests/module_cycles.py [CRATE_SRC_DIR ...]   (default: every library crate)

A *module* is the crate root, a module declared at the crate root, or a `pub mod` (any visibility
with `pub`); a private `mod x;` below the root is part of its parent (an implementation file of
it, as `engine/requester.rs` is of `engine`).
Test modules (`#[cfg(test)]`) and inline `mod x { ... }` blocks are not read. An edge A -> B is
a `use` line of A that names an item of B (`crate::`, `super::` and `self::` paths; groups
expanded), resolved to the deepest module the path enters. A `pub use` of a module's own
descendant is a re-export (a facade), not a dependency, and is not counted.

Two modules in one circle cannot be read or moved alone: a type both need belongs in a leaf
module that imports neither. Exits 1 and prints each circle with one `use` line per edge.
"""

import os
import re
import sys

DEFAULT_CRATES = ["roce/src", "hca/src", "hca/abi/src", "gpu-p2p/src", "collectives/src", "tests/src"]

MOD_RE = re.compile(r"^\s*(pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;")
CFG_TEST_RE = re.compile(r"^\s*#\[cfg\((?:all\()?test\b")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] if "//" in line and '"' not in line else line
                     for line in text.split("\n"))


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module path (tuple) -> file
        self.public = {}  # module path -> bool (a node of its own)
        root = os.path.join(src, "lib.rs")
        if not os.path.exists(root):
            raise SystemExit(f"{src}: no lib.rs")
        self.walk((), root, True)

    def walk(self, path, file, public):
        self.files[path] = file
        self.public[path] = public
        here = os.path.dirname(file)
        if os.path.basename(file) not in ("lib.rs", "mod.rs"):
            here = os.path.join(here, os.path.splitext(os.path.basename(file))[0])
        lines = open(file, encoding="utf-8").read().split("\n")
        for i, line in enumerate(lines):
            m = MOD_RE.match(line)
            if not m:
                continue
            prev = lines[i - 1] if i else ""
            if CFG_TEST_RE.match(prev) or m.group(2) == "tests":
                continue
            name = m.group(2)
            cand = [os.path.join(here, name + ".rs"), os.path.join(here, name, "mod.rs")]
            # `#[path = "..."]` attributes
            pm = re.match(r'\s*#\[path\s*=\s*"([^"]+)"\]', prev)
            if pm:
                cand.insert(0, os.path.join(os.path.dirname(file), pm.group(1)))
            for c in cand:
                if os.path.exists(c):
                    self.walk(path + (name,), c, bool(m.group(1)) and m.group(1).startswith("pub"))
                    break

    def node(self, path):
        """The module a path's file belongs to: itself if public or a child of the crate root,
        else its nearest such ancestor."""
        while len(path) > 1 and not self.public.get(path, False):
            path = path[:-1]
        return path

    def resolve(self, path):
        """The deepest module a `use` path enters."""
        best = ()
        for n in range(1, len(path) + 1):
            if tuple(path[:n]) in self.files:
                best = tuple(path[:n])
            else:
                break
        return best


def use_statements(text):
    """Yields (is_pub, body, line_number) of each `use` statement outside test code."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if CFG_TEST_RE.match(line):
            # skip the test item: up to the end of the file for `mod tests {`, else one item
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if re.match(r"\s*(pub\s+)?mod\s+\w+\s*\{", nxt):
                depth = 0
                j = i + 1
                while j < len(lines):
                    depth += lines[j].count("{") - lines[j].count("}")
                    j += 1
                    if depth <= 0 and "{" in "".join(lines[i + 1:j]):
                        break
                i = j
                continue
            i += 2
            continue
        m = re.match(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+(.*)$", line)
        if m:
            body = m.group(2)
            start = i
            while ";" not in body and i + 1 < len(lines):
                i += 1
                body += " " + lines[i].strip()
            yield bool(m.group(1)), body.split(";")[0], start + 1
        i += 1


def expand(body):
    """Expands `a::{b, c::{d, e}}` into paths (lists of segments)."""
    body = re.sub(r"\s+as\s+\w+", "", body)
    body = re.sub(r"\s+", "", body)
    out = []

    def rec(prefix, s):
        # split s at top-level commas
        depth, cur, parts = 0, "", []
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        for p in parts:
            if "{" in p:
                head, rest = p.split("{", 1)
                rec(prefix + [x for x in head.split("::") if x], rest[: rest.rfind("}")])
            else:
                segs = [x for x in p.split("::") if x]
                out.append(prefix + segs)

    rec([], body)
    return out


def crate_edges(crate):
    edges = {}  # (a, b) -> example
    for path, file in crate.files.items():
        text = strip_comments(open(file, encoding="utf-8").read())
        here = crate.node(path)
        for is_pub, body, lineno in use_statements(text):
            for segs in expand(body):
                if not segs:
                    continue
                if segs[0] == "crate":
                    target = segs[1:]
                elif segs[0] in ("super", "self"):
                    base = list(path)
                    k = 0
                    while k < len(segs) and segs[k] in ("super", "self"):
                        if segs[k] == "super":
                            base = base[:-1]
                        k += 1
                    target = base + segs[k:]
                else:
                    continue
                dest = crate.node(crate.resolve(target))
                if dest == here:
                    continue
                if is_pub and dest[: len(here)] == here:
                    continue  # re-export of a descendant
                rel = os.path.relpath(file)
                edges.setdefault((here, dest), f"{rel}:{lineno}: use {body.strip()}")
    return edges


def sccs(nodes, edges):
    graph = {n: [] for n in nodes}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
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
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def name(crate_name, path):
    return "::".join((crate_name,) + path)


def main():
    crates = sys.argv[1:] or DEFAULT_CRATES
    failed = 0
    for src in crates:
        crate = Crate(src)
        crate_name = os.path.basename(os.path.dirname(os.path.abspath(src)))
        edges = crate_edges(crate)
        nodes = {crate.node(p) for p in crate.files}
        comps = sccs(nodes, edges)
        print(f"module_cycles: {src}: {len(nodes)} modules, {len(edges)} import edges, "
              f"{len(comps)} circle(s)")
        for comp in comps:
            failed += 1
            members = set(comp)
            print(f"  circle: {', '.join(sorted(name(crate_name, c) for c in comp))}")
            for (a, b), ex in sorted(edges.items()):
                if a in members and b in members:
                    print(f"    {name(crate_name, a)} -> {name(crate_name, b)}  ({ex})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
