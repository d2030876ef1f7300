"""The evaluation's human-facing outputs: ``metrics.json``, ``metrics.md`` and PNG plots.

Plots: ``summary.png`` (accuracy, pass@k, each part's mean and the benchmark's summary, always written),
``accuracy_by_<field>.png`` for each breakdown with at least two values (at most the 30 largest groups), and
``scores.png`` (the histogram of per-item scores) for continuous metrics such as TEDS.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mmrl.eval.scoring import item_score

MAX_BARS = 30


def write_outputs(
    out: Path, metrics: dict[str, Any], rows: list[dict[str, Any]], continuous: bool
) -> list[Path]:
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1, ensure_ascii=False) + "\n")
    (out / "metrics.md").write_text(markdown(metrics))
    return plots(out, metrics, rows, continuous)


def headline(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of the overall table: accuracy, mean@K/pass@k, each part's mean and the benchmark's summary."""
    out = {"accuracy": metrics["accuracy"]}
    out |= metrics.get("pass@k", {})
    out |= metrics.get("parts", {})
    out |= metrics.get("summary", {})
    return out


def markdown(metrics: dict[str, Any]) -> str:
    data = metrics["data"]
    source = metrics["model"] or f"predictions {metrics['predictions']}"
    lines = [
        f"# {metrics['benchmark']}: {source}",
        "",
        f"- data: `{data['path']}` (sha256 `{data['sha256'][:16]}`)",
        f"- items: {metrics['items']}, samples per item: {metrics['samples']}",
        "",
        "| metric | value |",
        "|---|---:|",
        *(f"| {k} | {v:.4f} |" for k, v in headline(metrics).items()),
    ]
    for key, groups in metrics.get("breakdowns", {}).items():
        lines += ["", f"## by {key}", "", f"| {key} | n | accuracy |", "|---|---:|---:|"]
        lines += [f"| {_cell(v)} | {g['n']} | {g['accuracy']:.4f} |" for v, g in groups.items()]
    tp = metrics.get("throughput") or {}
    if tp.get("items_per_s"):
        lines += ["", f"Generated and scored {tp['items']} items in {tp['seconds']:.1f} s "
                  f"({tp['items_per_s']:.2f} items/s)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def plots(out: Path, metrics: dict[str, Any], rows: list[dict[str, Any]], continuous: bool) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    values = headline(metrics)
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(values) + 1.2))
    ax.barh(list(values)[::-1], list(values.values())[::-1], color="tab:blue")
    ax.set_xlim(0, max(1.0, *values.values()))
    ax.set_title(f"{metrics['benchmark']} ({metrics['items']} items)")
    written.append(_save(fig, out / "summary.png"))
    for key, groups in metrics.get("breakdowns", {}).items():
        if len(groups) < 2:
            continue
        shown = list(groups.items())[:MAX_BARS]
        fig, ax = plt.subplots(figsize=(7, 0.3 * len(shown) + 1.2))
        labels = [f"{str(v)[:40]} (n={g['n']})" for v, g in shown][::-1]
        ax.barh(labels, [g["accuracy"] for _, g in shown][::-1], color="tab:green")
        ax.set_xlim(0, 1)
        ax.set_xlabel("accuracy")
        ax.set_title(f"{metrics['benchmark']} by {key}")
        written.append(_save(fig, out / f"accuracy_by_{re.sub(r'[^A-Za-z0-9_]', '_', key)}.png"))
    if continuous:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.hist([item_score(r) for r in rows], bins=20, range=(0, 1), color="tab:orange")
        ax.set_xlabel("per-item score")
        ax.set_ylabel("items")
        written.append(_save(fig, out / "scores.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
