"""Seeded runs of the tiny recipes at two revisions, their `metrics.jsonl` rows compared.

A change that should not change behaviour (a move, a merge of two paths) is proven by equality: each shipped tiny
recipe runs a few seeded steps at the base revision and at the head, and every logged row must be identical but the
timing and process fields (`time/*`, `sys/*`, `*_ms`), which measure the machine rather than the run.

Each revision is exported from git (or taken from a folder as it is, `--head .` for the working tree) and installed
without `-e` into a private target folder: the run imports that copy, so the two sides never share code, and the
non-editable install is exercised on the way. Runs start in the revision's own folder (its recipes, data builders and
assets). Usage:

    python scripts/seeded_equality.py --base 2865b6c --head . [--steps 20] [--recipes shapes/tiny,zoom/tiny]
        [--python .venv-vllm/bin/python --set rollout.engine=vllm]

Prints one line per recipe (rows compared, identical rows, rows within ``--rtol``, the largest relative difference,
the first key beyond it) and exits 1 when any row differs beyond ``--rtol`` (default 0: identical). ``--new-keys
PREFIX`` lets the head log keys the base did not (a deliberate addition, such as a metric family made complete).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IGNORED_PREFIXES = ("time/", "sys/")
IGNORED_SUFFIXES = ("_ms",)  # wall-clock fields elsewhere (vade/draw_ms, vade/select_ms)


def tiny_recipes(tree: Path) -> list[str]:
    return sorted(
        str(p.relative_to(tree / "recipes").with_suffix("")) for p in (tree / "recipes").glob("*/tiny*.yaml")
    )


def checkout(rev: str, dest: Path) -> Path:
    """The tree of ``rev`` (a git revision, or a folder taken as it is) at ``dest``."""
    if Path(rev).is_dir():
        src = Path(rev).resolve()
        ignore = shutil.ignore_patterns(
            ".git", ".venv*", "runs", "__pycache__", "*.egg-info", ".gpu-site", "build"
        )
        shutil.copytree(src, dest, ignore=ignore, symlinks=True)
        return dest
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def install(tree: Path, python: str, site: Path) -> None:
    """A non-editable install of ``tree`` into ``site`` (no dependencies: the interpreter has them)."""
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(tree),
        ],
        check=True,
    )


def run(tree: Path, site: Path, python: str, recipe: str, steps: int, sets: list[str], out: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(site), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    # -P: the working directory (the tree) is not put before the install on sys.path
    cmd = [
        python,
        "-P",
        "-m",
        "mmrl",
        "train",
        f"recipes/{recipe}.yaml",
        "--output-dir",
        str(out),
        "--max-steps",
        str(steps),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, *sets], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{recipe} at {tree} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return time.perf_counter() - t0


def rows(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.append(
            {
                k: v
                for k, v in row.items()
                if not (k.startswith(IGNORED_PREFIXES) or k.endswith(IGNORED_SUFFIXES))
            }
        )
    return out


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def rel_diff(a: object, b: object) -> float:
    """|a - b| / max(|a|, |b|) of two numbers (0 when equal), inf for anything else that differs."""
    if same(a, b):
        return 0.0
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) / max(abs(a), abs(b))
    return math.inf


def compare(base: list[dict], head: list[dict], new_keys: tuple[str, ...] = (), rtol: float = 0.0):
    """``(identical rows, rows within rtol, the largest relative difference, the first difference beyond rtol or
    '')``. Keys under a ``new_keys`` prefix that only the head logs are a deliberate addition, not a difference."""
    n = close = 0
    worst, first = 0.0, ""
    for i, (a, b) in enumerate(zip(base, head)):
        keys = sorted(set(a) | {k for k in b if k in a or not k.startswith(new_keys)})
        d = {k: rel_diff(a.get(k, "<absent>"), b.get(k, "<absent>")) for k in keys}
        worst = max([worst, *d.values()])
        n += not any(d.values())
        beyond = [k for k, v in d.items() if v > rtol]
        close += not beyond
        if beyond and not first:
            k = beyond[0]
            first = (
                f"row {i} (step {a.get('step')}): {k} {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
            )
    if len(base) != len(head) and not first:
        first = f"{len(base)} rows -> {len(head)} rows"
    return n, close, worst, first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision (or folder) of the reference")
    ap.add_argument("--head", default=".", help="git revision or folder (default: the working tree)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--recipes", help="comma-separated, e.g. shapes/tiny,geometry/tiny-vade (default: every tiny)"
    )
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument(
        "--set", action="append", default=[], help="a config override for both sides (repeatable)"
    )
    ap.add_argument("--keep", help="keep the trees and runs in this folder")
    ap.add_argument(
        "--new-keys",
        action="append",
        default=[],
        help="a key prefix the head may add (repeatable), e.g. episode/end/",
    )
    ap.add_argument(
        "--rtol",
        type=float,
        default=0.0,
        help="rows whose numbers all agree within this relative tolerance pass",
    )
    args = ap.parse_args()
    if os.sep in args.python:  # runs start in each tree: a relative interpreter path (a venv's) made absolute
        args.python = os.path.abspath(args.python)
    work = Path(args.keep or tempfile.mkdtemp(prefix="mmrl-equality-"))
    sides = {}
    for name, rev in (("base", args.base), ("head", args.head)):
        tree = checkout(rev, work / name / "tree")
        install(tree, args.python, work / name / "site")
        sides[name] = tree
    recipes = args.recipes.split(",") if args.recipes else tiny_recipes(sides["head"])
    failed = 0
    print(
        f"{'recipe':24} {'rows':>4} {'identical':>9} {'within':>6} {'max rel':>8}  base s  head s  first difference"
    )
    for recipe in recipes:
        got, secs = {}, {}
        for name, tree in sides.items():
            out = work / name / "runs" / recipe.replace("/", "-")
            secs[name] = run(tree, work / name / "site", args.python, recipe, args.steps, args.set, out)
            got[name] = rows(out / "metrics.jsonl")
        n, close, worst, diff = compare(got["base"], got["head"], tuple(args.new_keys), args.rtol)
        failed += bool(diff)
        print(
            f"{recipe:24} {len(got['base']):4d} {n:9d} {close:6d} {worst:8.1e}  {secs['base']:6.0f}  "
            f"{secs['head']:6.0f}  {diff or '-'}"
        )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
