"""Print mmrl's import graph: modules per layer, import cycles, upward imports and function-local imports.

Every `import` of an mmrl module counts, the ones inside functions too (a cycle hidden in a function is still a
cycle). A module's layer is 0 when it imports no other mmrl module and otherwise one more than the highest layer it
imports; in a cycle no layer exists, so the cycle's modules are reported instead. An import "points up" when it goes
from a package to a package of the same or a higher rank in `RANKS`, the layout's stated order (docs/development.md).
Usage: python scripts/import_graph.py [--json] [--strict] (--strict: exit 1 on a cycle or an upward import)
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the import name it installs as (pyproject's package-dir mapping)
PACKAGE_DIRS = {"mmrl": "mmrl", "processors": "mmrl.processors", "rewards": "mmrl.rewards"}


# the layout's order, lowest first: a package imports only packages of a lower rank (the foundation modules of
# mmrl/ itself, "core", import each other freely but nothing above them)
RANKS = {
    "core": 0, "processors": 0,
    "model": 1,
    "rewards": 2, "algos": 2,
    "envs": 3, "samplers": 3,
    "rollout": 4,
    "eval": 5,
    "run": 6,
    "train": 7,
    "plan": 8, "tiny": 8, "recipes": 8,
    "cli": 9,
}  # fmt: skip


def package(mod: str) -> str:
    """The layout package of an mmrl module: a sub-package's name, ``cli`` for the command line, else ``core``."""
    parts = mod.split(".")
    if len(parts) > 1 and parts[1] in RANKS:
        return parts[1]
    return "cli" if parts[1:2] in (["cli"], ["__main__"]) else "core"


def upward(edges: list[tuple[str, str, bool]]) -> list[tuple[str, str]]:
    """Imports from a package to one of the same or a higher rank (``core`` and ``processors`` import each other)."""
    out = []
    for a, b, _ in edges:
        pa, pb = package(a), package(b)
        if pa != pb and RANKS[pb] >= RANKS[pa] and not (RANKS[pa] == RANKS[pb] == 0):
            out.append((a, b))
    return sorted(set(out))


def module_files() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for folder, name in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([name, *parts])] = path
    return mods


def resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mods: dict[str, Path]) -> list[tuple[str, str, bool]]:
    """(importer, imported, function_local) for every import of an mmrl module."""
    edges = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"
        local_ids = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local_ids.update(id(n) for n in ast.walk(fn))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = resolve(mod, is_pkg, node)
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.append(full if full in mods else base)
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod and not mod.startswith(t + "."):
                    edges.append((mod, t, id(node) in local_ids))
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layers(graph: dict[str, set[str]], in_cycle: set[str]) -> dict[str, int]:
    layer: dict[str, int] = {}

    def depth(v: str, seen: tuple = ()) -> int:
        if v in layer:
            return layer[v]
        if v in seen:
            return 0
        deps = [depth(w, seen + (v,)) for w in graph[v]]
        layer[v] = 1 + max(deps) if deps else 0
        return layer[v]

    for v in graph:
        if v not in in_cycle:
            depth(v)
    return {v: n for v, n in layer.items() if v not in in_cycle}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--strict", action="store_true", help="exit 1 on a cycle or an upward import")
    args = ap.parse_args()
    mods = module_files()
    edges = imports(mods)
    graph: dict[str, set[str]] = defaultdict(set)
    for m in mods:
        graph[m]
    for a, b, _ in edges:
        graph[a].add(b)
    cyc = cycles(graph)
    in_cycle = {m for c in cyc for m in c}
    lay = layers(graph, in_cycle)
    per_layer: dict[int, list[str]] = defaultdict(list)
    for m, n in lay.items():
        per_layer[n].append(m)
    local = sorted({(a, b) for a, b, is_local in edges if is_local})
    up = upward(edges)
    result = {
        "modules": len(mods),
        "layers": {n: len(per_layer[n]) for n in sorted(per_layer)},
        "cycles": cyc,
        "upward_imports": [f"{a} -> {b}" for a, b in up],
        "function_local_imports": len([e for e in edges if e[2]]),
        "top_level_packages": sorted(
            {m for m in mods if m.count(".") == 1 and (mods[m].name == "__init__.py")}
        ),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 1 if args.strict and (cyc or up) else 0
    print(f"modules: {result['modules']}")
    print(f"layers: {len(per_layer)} ({', '.join(f'{n}: {len(per_layer[n])}' for n in sorted(per_layer))})")
    print(f"cycles: {len(cyc)}")
    for c in cyc:
        print(f"  {len(c)} modules: {' '.join(c)}")
    print(f"upward imports: {len(up)}")
    for a, b in up:
        print(f"  {a} -> {b} ({package(a)} -> {package(b)})")
    print(
        f"function-local imports of mmrl modules: {result['function_local_imports']} ({len(local)} distinct pairs)"
    )
    packages: dict[str, int] = defaultdict(int)
    for m in mods:
        packages[package(m)] += 1
    print("modules per package: " + ", ".join(f"{p} {packages[p]}" for p in sorted(packages, key=RANKS.get)))
    return 1 if args.strict and (cyc or up) else 0


if __name__ == "__main__":
    raise SystemExit(main())
