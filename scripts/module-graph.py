#!/usr/bin/env python3
"""The module graph of Rust folders, and its cycles.

    scripts/module-graph.py [--check] [--dot] FOLDER...

Each `.rs` file under the FOLDERs is a node; an edge A -> B says A names an item of B
(`use super::b::Thing`, `crate::x::y::f(..)`, `super::{Thing}` of a `mod.rs`). Paths are
read from the text (comments, strings and `#[cfg(test)] mod tests` left out) and resolved
against the files of the crate, so it needs nothing but Python 3.

Prints, per folder: its files' edges inside the folder, the files outside it that it
reaches, and its import cycles (strongly connected groups of files, with one cycle
through each, named in order). `--check` exits 1 when a folder has a cycle. `--dot` prints
the graph of all the folders' files in Graphviz's language instead.
"""

import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
PATH = re.compile(rf"\b(crate|super|self)((?:\s*::\s*{IDENT})+)")
USE = re.compile(r"\buse\s+([^;]*);", re.S)


def strip(text):
    """The code of a file: no comments, no string or char literals, no test module."""
    test = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+tests\b", text)
    if test:
        text = text[: test.start()]
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
        elif c == "r" and re.match(r'r#*"', text[i:]) and not re.match(r"\w", text[i - 1 : i] or " "):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            i += len(re.match(r"'(\\.[^']*|[^\\'])'", text[i:]).group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand(tree):
    """The paths a `use` tree names: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+", "", tree)
    depth, start = 0, None
    for i, c in enumerate(tree):
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                prefix, inner, rest = tree[:start], tree[start + 1 : i], tree[i + 1 :]
                parts, level, last = [], 0, 0
                for j, d in enumerate(inner + ","):
                    if d in "{":
                        level += 1
                    elif d == "}":
                        level -= 1
                    elif d == "," and level == 0:
                        if inner[last:j]:
                            parts.append(inner[last:j])
                        last = j + 1
                paths = []
                for part in parts:
                    joined = prefix + part + rest if part != "self" else prefix.rstrip(":")
                    paths.extend(expand(joined))
                return paths
    return [re.sub(r"\bas\w.*$", "", tree)]


class Crate:
    def __init__(self, src):
        self.src = src

    def module_of(self, file):
        """The module path of `file`: worker/src/agent/slot.rs -> ["agent", "slot"]."""
        parts = list(file.relative_to(self.src).with_suffix("").parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts.pop()
        return parts

    def file_of(self, module):
        """The file that holds module `module`, or None."""
        if not module:
            for root in ("lib.rs", "main.rs"):
                if (self.src / root).exists():
                    return self.src / root
            return None
        base = self.src.joinpath(*module)
        for candidate in (base.with_suffix(".rs"), base / "mod.rs"):
            if candidate.exists():
                return candidate
        return None

    def resolve(self, file, path):
        """The file an item path named in `file` lies in (the deepest module it names)."""
        segments = [s for s in re.split(r"\s*::\s*", path) if s]
        here = self.module_of(file)
        head = segments.pop(0)
        if head == "crate":
            module = []
        elif head == "self":
            module = here
        elif head != "super":
            # A child module named bare (`use slot::Slot`, `seats::Seats::new`).
            module = here
            segments.insert(0, head)
        else:
            module = here[:-1]
            while segments and segments[0] == "super":
                segments.pop(0)
                module = module[:-1]
        return self.walk(module, segments)

    def walk(self, module, segments, hops=0):
        """The file of the deepest module `segments` name from `module`; an item that file
        re-exports (`pub use x::Item;`) is followed to the file it comes from."""
        for i, segment in enumerate(segments):
            if segment in ("self", "*"):
                break
            if self.file_of(module + [segment]) is None:
                if hops < 8:
                    origin = self.reexport(module, segment)
                    if origin is not None:
                        return self.walk(origin[0], origin[1], hops + 1)
                break
            module = module + [segment]
        return self.file_of(module)

    def reexport(self, module, item):
        """Where `item`, named by module `module`'s `use` (not defined there), comes from:
        the module its path starts from, and the rest of the path."""
        file = self.file_of(module)
        if file is None:
            return None
        code = strip(file.read_text())
        for use in USE.finditer(code):
            for path in expand(use.group(1)):
                path = re.sub(r"^::", "", path)
                name = path.split("::")[-1]
                alias = re.search(r"\bas(\w+)$", path)
                if (alias.group(1) if alias else name) != item:
                    continue
                path = re.sub(r"as\w+$", "", path)
                segments = [s for s in path.split("::") if s]
                head = segments[0]
                if head == "crate":
                    return [], segments[1:]
                if head == "self":
                    return module, segments[1:]
                if head == "super":
                    up = module[:-1]
                    rest = segments[1:]
                    while rest and rest[0] == "super":
                        rest, up = rest[1:], up[:-1]
                    return up, rest
                if self.file_of(module + [head]) is not None:
                    return module, segments
        return None

    def children(self, file):
        """The modules `file` declares (`mod x;`), which it may name bare (`x::Item`)."""
        here = self.module_of(file)
        code = strip(file.read_text())
        names = re.findall(rf"\bmod\s+({IDENT})\s*;", code)
        return {n for n in names if self.file_of(here + [n]) is not None}


def crate_of(file):
    for parent in file.parents:
        if parent.name == "src" and ((parent / "lib.rs").exists() or (parent / "main.rs").exists()):
            return Crate(parent)
    raise SystemExit(f"{file}: not inside a crate's src/")


def edges_of(file):
    crate = crate_of(file)
    code = strip(file.read_text())
    children = crate.children(file)
    bare = re.compile(rf"(?<![\w:])({'|'.join(sorted(children)) or '(?!)'})((?:\s*::\s*{IDENT})+)")
    paths = []
    for use in USE.finditer(code):
        tree = use.group(1).strip()
        if re.match(r"(crate|super|self)\b", tree) or tree.split("::")[0] in children:
            paths.extend(expand(tree))
    code = USE.sub(";", code)
    paths.extend(m.group(0) for m in PATH.finditer(code))
    paths.extend(m.group(0) for m in bare.finditer(code))
    targets = set()
    for path in paths:
        target = crate.resolve(file, path)
        if target is not None and target.resolve() != file.resolve():
            targets.add(target.resolve())
    return targets


def cycles(nodes, graph):
    """Strongly connected groups of more than one node (Tarjan), each as a sorted list."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def one_cycle(group, graph):
    """A cycle through the first node of `group`, inside the group (breadth first)."""
    start, members = group[0], set(group)
    previous, frontier = {start: None}, [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return list(reversed(path)) + [start]
                if w in members and w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    return group


def main(argv):
    check = "--check" in argv
    dot = "--dot" in argv
    folders = [Path(a) for a in argv if not a.startswith("--")]
    if not folders:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root = Path.cwd()

    def name(f):
        try:
            return str(f.relative_to(root))
        except ValueError:
            return str(f)

    failed = False
    dot_edges = []
    for folder in folders:
        files = sorted(p.resolve() for p in folder.rglob("*.rs"))
        if not files:
            print(f"{folder}: no .rs files", file=sys.stderr)
            return 2
        inside = set(files)
        graph = {f: {t for t in edges_of(f) if t in inside} for f in files}
        outside = {f: sorted(t for t in edges_of(f) if t not in inside) for f in files}
        if dot:
            dot_edges += [(a, b) for a in files for b in sorted(graph[a])]
            continue
        print(f"# {folder}")
        for f in files:
            local = ", ".join(name(t).removeprefix(str(folder).rstrip("/") + "/") for t in sorted(graph[f]))
            print(f"{name(f)} -> {local or '(none)'}")
        reached = sorted({t for ts in outside.values() for t in ts})
        print(f"reaches outside {folder}: {', '.join(name(t) for t in reached) or '(nothing)'}")
        groups = cycles(files, graph)
        if not groups:
            print("cycles: none")
        for group in groups:
            failed = True
            print(f"cycle among {len(group)} files: {' -> '.join(name(f) for f in one_cycle(group, graph))}")
            print(f"  all of: {', '.join(name(f) for f in group)}")
        print()
    if dot:
        print("digraph modules {")
        for a, b in dot_edges:
            print(f'  "{name(a)}" -> "{name(b)}";')
        print("}")
    return 1 if check and failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
