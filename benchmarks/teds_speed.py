"""TEDS: mmrl against docling-metrics-table (C++) and table_recognition_metric (apted), values and speed.

Values: the 20 PubTabNet tables in ``tests/data/pubtabnet`` (a real model's predicted HTML against the ground truth),
each implementation's full and structure-only TEDS against IBM's reference numbers (``expected_teds.json``,
computed with PubTabNet's ``src/metric.py``): the largest and the mean absolute difference per mode.

Speed: 20x10 tables. The prediction is a perturbed copy of the reference: 10% of cell texts edited, two cells merged
with colspan=2, one cell dropped and one header cell bolded, so neither mode can take an identical-tree shortcut.
Every repetition gets a table pair of a shape not seen before (the seed moves the merged, dropped and reference
colspan cells), all three implementations time the same pairs, every call parses its HTML inside the timed call,
and mmrl's per-shape caches (``functools.lru_cache`` in ``mmrl.rewards.teds``) are emptied before each of its calls:
a reward scoring many rollouts against one reference reuses them, a benchmark must not. docling is called through
its public API (``TableMetric.evaluate_sample`` with a ``TableMetricHTMLInputSample``: lxml parsing and bracket
conversion in Python, tree edit distance in C++). Times are medians over the repetitions of this process's CPU time
(``time.process_time``; every implementation runs on one thread), which other load on a shared machine does not
inflate the way it does wall-clock time.

    OMP_NUM_THREADS=1 python benchmarks/teds_speed.py [--repeats 7]

The last line is ``teds 20x10 ms/call: mmrl X docling Y trm Z; docling/mmrl R`` (CPU ms per call, mean of the two
modes' medians; R above 1: mmrl is faster than docling).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from docling_metrics_table import TableMetric, TableMetricHTMLInputSample
from docling_metrics_table.docling_metrics_table import TableMetricKind
from table_recognition_metric import TEDS

from mmrl.rewards import teds as mmrl_teds

PUBTABNET = Path(__file__).resolve().parents[1] / "tests" / "data" / "pubtabnet"
Metric = Callable[[str, str, bool], float]


def make_table(rows: int, cols: int, *, perturb: bool, seed: int = 0) -> str:
    """A ``rows`` x ``cols`` table with a header row; ``perturb`` applies the edits described in the module doc.

    The seed also moves the merged and dropped cells (and, unperturbed, one reference colspan), so every seed gives
    trees of a new shape and no call can reuse shape-keyed work cached by an earlier one.
    """
    rng = random.Random(seed)
    merge_row, drop_row, ref_row = rng.randrange(rows - 1), rng.randrange(rows - 1), rng.randrange(rows - 1)
    out = ["<html><body><table><thead><tr>"]
    out += [
        f"<td>{'<b>' if perturb and c == 3 else ''}Col {c}{'</b>' if perturb and c == 3 else ''}</td>"
        for c in range(cols)
    ]
    out.append("</tr></thead><tbody>")
    for r in range(rows - 1):
        cells = [f"{(r + 1) * (c + 3) * 1.37:.2f}" for c in range(cols)]
        if perturb:
            cells = [t[::-1] + "x" if rng.random() < 0.1 else t for t in cells]
        tds = [f"<td>{t}</td>" for t in cells]
        if perturb and r == merge_row:
            tds[2:4] = [f'<td colspan="2">{cells[2]} {cells[3]}</td>']
        if perturb and r == drop_row:
            del tds[7]
        if not perturb and r == ref_row:
            tds[5:7] = [f'<td colspan="2">{cells[5]}</td>']
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</tbody></table></body></html>")
    return "".join(out)


def clear_mmrl_caches() -> None:
    """Empty every ``lru_cache`` of ``mmrl.rewards.teds``, so the next call does all its shape-keyed work."""
    for obj in vars(mmrl_teds).values():
        if hasattr(obj, "cache_clear"):
            obj.cache_clear()


def mmrl_metric(pred: str, true: str, structure_only: bool) -> float:
    return mmrl_teds.teds(pred, true, structure_only=structure_only)


def docling_metric(metric: TableMetric, pred: str, true: str, structure_only: bool) -> float:
    sample = TableMetricHTMLInputSample(id="t", html_a=pred, html_b=true, structure_only=structure_only)
    return metric.evaluate_sample(sample).teds.teds


def trm_metric(peers: dict[bool, TEDS], pred: str, true: str, structure_only: bool) -> float:
    return peers[structure_only](pred, true)


def conformance(metrics: dict[str, Metric]) -> None:
    """Each implementation's TEDS on PubTabNet's 20 tables against IBM's reference values."""
    load = lambda name: json.loads((PUBTABNET / name).read_text(encoding="utf-8"))  # noqa: E731
    pred, true, expected = load("sample_pred.json"), load("sample_gt.json"), load("expected_teds.json")
    print(f"values vs IBM's PubTabNet reference ({len(expected)} tables): max |diff|, mean |diff|")
    for name, fn in metrics.items():
        cols = []
        for structure_only, key in ((False, "teds"), (True, "teds_structure")):
            diffs = [abs(fn(pred[n], true[n]["html"], structure_only) - expected[n][key]) for n in expected]
            cols.append(f"{key:14s} {max(diffs):.2e} {statistics.mean(diffs):.2e}")
        print(f"  {name:8s} " + "   ".join(cols))


def time_calls(fn: Metric, pairs: list[tuple[str, str]], structure_only: bool, cold: bool) -> float:
    """Median CPU seconds of one call over the (prediction, reference) pairs."""
    times = []
    for pred, true in pairs:
        if cold:
            clear_mmrl_caches()
        t0 = time.process_time()
        fn(pred, true, structure_only)
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="distinct 20x10 table pairs timed per mode")
    args = parser.parse_args()
    metrics: dict[str, Metric] = {
        "mmrl": mmrl_metric,
        "docling": partial(docling_metric, TableMetric(metrics=[TableMetricKind.TEDS])),
        "trm": partial(trm_metric, {s: TEDS(structure_only=s) for s in (False, True)}),
    }
    conformance(metrics)

    pairs = [
        (make_table(20, 10, perturb=True, seed=s), make_table(20, 10, perturb=False, seed=s))
        for s in range(1, args.repeats + 1)
    ]
    warm = (make_table(20, 10, perturb=True, seed=0), make_table(20, 10, perturb=False, seed=0))
    print(
        f"20x10 tables, {len(pairs)} distinct pairs per mode, median CPU ms per call (TEDS of the first pair)"
    )
    totals = dict.fromkeys(metrics, 0.0)
    for structure_only in (True, False):
        cells = []
        for name, fn in metrics.items():
            fn(*warm, structure_only)  # imports, first-call set-up
            seconds = time_calls(fn, pairs, structure_only, cold=name == "mmrl")
            totals[name] += seconds / 2
            cells.append(f"{name} {seconds * 1e3:7.2f} ({fn(*pairs[0], structure_only):.6f})")
        print(f"  {'structure-only' if structure_only else 'full':>14}: " + "  ".join(cells))
    ms = {name: s * 1e3 for name, s in totals.items()}
    print(
        f"teds 20x10 ms/call: mmrl {ms['mmrl']:.2f} docling {ms['docling']:.2f} trm {ms['trm']:.1f}; "
        f"docling/mmrl {ms['docling'] / ms['mmrl']:.2f}"
    )


if __name__ == "__main__":
    main()
