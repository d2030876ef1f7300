"""``mmrl compare DIR_A DIR_B``: per-benchmark and per-category deltas with paired bootstrap 95% intervals.

Each DIR is one evaluation's output folder or a folder of them (one subfolder per benchmark). Evaluations are
paired by benchmark name (by subfolder name when a DIR holds one benchmark twice), and within a pair the items by
id: only items scored in both count. The delta is ``mean(B) - mean(A)`` of the per-item scores (each item's mean
over its samples); its interval is the 2.5th and 97.5th percentiles of the delta over ``resamples`` paired
bootstrap resamples of the items (Efron & Tibshirani's percentile interval; pairing keeps the per-item difficulty
out of the variance, so the interval is much tighter than that of two independent means). A category's interval
resamples only that category's items. ``*`` marks an interval that excludes 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from mmrl.eval.base import EvalError
from mmrl.eval.scoring import item_score


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean(b - a), lower, upper) with the percentile 95% interval of the paired bootstrap."""
    d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)  # [n]
    n = len(d)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    step = max(1, 4_000_000 // max(n, 1))  # resamples per chunk, bounding the index matrix to ~32 MB
    for start in range(0, resamples, step):
        m = min(step, resamples - start)
        means[start : start + m] = d[rng.integers(0, n, size=(m, n))].mean(axis=1)  # [m]
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)


def find_evals(root: Path) -> dict[str, Path]:
    """Evaluation folders under ``root`` (itself, or its subfolders), keyed by benchmark (or subfolder) name."""
    if not root.is_dir():
        raise EvalError(f"not a folder: {root}")
    folders = [root] if (root / "metrics.json").is_file() else sorted(
        p for p in root.iterdir() if (p / "metrics.json").is_file()
    )  # fmt: skip
    if not folders:
        raise EvalError(f"{root}: no metrics.json here or in its subfolders (run mmrl eval first)")
    names = [json.loads((p / "metrics.json").read_text())["benchmark"] for p in folders]
    return {(n if names.count(n) == 1 else f"{n}:{p.name}"): p for n, p in zip(names, folders)}


def _rows(folder: Path) -> dict[str, dict[str, Any]]:
    path = folder / "predictions.jsonl"
    if not path.is_file():
        raise EvalError(f"{folder}: predictions.jsonl is missing")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["id"]: r for r in rows}


def compare(dir_a: Path, dir_b: Path, resamples: int = 10_000, seed: int = 0) -> list[dict[str, Any]]:
    """One record per (benchmark, category): n, mean A, mean B, delta and its interval."""
    evals_a, evals_b = find_evals(dir_a), find_evals(dir_b)
    common = [k for k in evals_a if k in evals_b]
    if not common:
        raise EvalError(
            f"no benchmark evaluated in both {dir_a} ({sorted(evals_a)}) and {dir_b} ({sorted(evals_b)})"
        )
    out = []
    for name in common:
        rows_a, rows_b = _rows(evals_a[name]), _rows(evals_b[name])
        ids = [i for i in rows_a if i in rows_b]
        if not ids:
            raise EvalError(f"{name}: no item id is in both predictions.jsonl files")
        keys = json.loads((evals_a[name] / "metrics.json").read_text()).get("breakdowns", {})
        groups: dict[tuple[str, str], list[str]] = {("", "all"): ids}
        for key in keys:
            for i in ids:
                value = rows_a[i].get(key)
                for v in value if isinstance(value, list) else [value] if value is not None else []:
                    groups.setdefault((key, str(v)), []).append(i)
        for (key, value), members in groups.items():
            a = np.array([item_score(rows_a[i]) for i in members])
            b = np.array([item_score(rows_b[i]) for i in members])
            delta, lo, hi = paired_bootstrap(a, b, resamples, seed)
            category = "all" if not key else f"{key}={value}"
            out.append(
                {"benchmark": name, "category": category, "n": len(members), "a": float(a.mean()),
                 "b": float(b.mean()), "delta": delta, "lo": lo, "hi": hi}
            )  # fmt: skip
    return out


def markdown_table(results: list[dict[str, Any]], dir_a: Path, dir_b: Path) -> str:
    lines = [
        f"A = `{dir_a}`, B = `{dir_b}`; delta = B - A, paired bootstrap 95% interval (* excludes 0)",
        "",
        "| benchmark | category | n | A | B | delta | 95% CI |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        star = "*" if r["lo"] > 0 or r["hi"] < 0 else ""
        lines.append(
            f"| {r['benchmark']} | {r['category'].replace('|', '/')} | {r['n']} | {r['a']:.4f} | {r['b']:.4f} | "
            f"{r['delta']:+.4f}{star} | [{r['lo']:+.4f}, {r['hi']:+.4f}] |"
        )
    return "\n".join(lines) + "\n"
