"""From responses to ``predictions.jsonl`` rows, and from rows to metrics.

This is also the entry point for in-training validation: :func:`score_predictions` takes a benchmark name (or
object), its items and the policy's responses and returns the same per-item rows and metrics ``mmrl eval`` writes,
so a recipe that names ``eval.benchmark`` is scored exactly as a standalone evaluation.

Rows: ``id``, ``prediction`` (the raw response), ``extracted``, ``correct`` (bool, or a score in [0, 1]),
``normalized`` where the benchmark compares a normalised answer, ``parts`` (the benchmark's named sub-metrics),
then the item's scoring fields. With K > 1 samples the per-response keys hold lists of K values.

Metrics: ``accuracy`` is the mean over items of each item's mean over its samples (mean@K); ``pass@k`` for k = 1, 2,
4, ... and K is the unbiased estimate of the expected best score among k of the K samples (Chen et al., 2021: with
c of n correct, ``1 - C(n - c, k) / C(n, k)``; for scores in [0, 1] the expected maximum of a random k-subset,
which reduces to it for 0/1 scores); each part's mean is over the items that have it; ``summary`` holds the
benchmark's whole-set metrics (:meth:`Benchmark.summary`: an env benchmark's step accuracy, turns, ends); breakdowns
give the accuracy and count per value of each breakdown field (an item with a list value counts under each entry).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from mmrl.config import ModelConfig
from mmrl.eval.base import NOT_GIVEN, Benchmark, EvalError, EvalItem, get_benchmark

RESPONSE_KEYS = ("response", "prediction")
ID_KEYS = ("id", "pid", "question_id")


def score_predictions(
    benchmark: str | Benchmark,
    items: list[EvalItem],
    responses: list[str] | list[list[str]],
    *,
    options: dict[str, Any] | None = None,
    model: ModelConfig | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Score one response (a string) or K responses (a list) per item; returns the ``predictions.jsonl`` rows and
    the metrics (``accuracy``, ``items``, ``samples``, ``pass@k``, ``parts``, ``breakdowns``)."""
    bench = benchmark if isinstance(benchmark, Benchmark) else get_benchmark(benchmark, options, model)
    rows = score_rows(bench, items, responses)
    return rows, aggregate(bench, rows)


def score_rows(
    bench: Benchmark,
    items: list[EvalItem],
    responses: list[str] | list[list[str]],
    given: list[list[Any]] | None = None,
) -> list[dict[str, Any]]:
    """``predictions.jsonl`` rows for ``items``; ``given[i]`` lists extractions from a prediction file (or
    :data:`NOT_GIVEN` entries)."""
    if len(responses) != len(items):
        raise EvalError(f"got {len(responses)} responses for {len(items)} items")
    per_item = [r if isinstance(r, list) else [r] for r in responses]
    flat_items = [it for it, rs in zip(items, per_item) for _ in rs]
    flat_resps = [str(r) for rs in per_item for r in rs]
    flat_given = [g for i, rs in enumerate(per_item) for g in (given[i] if given else [NOT_GIVEN] * len(rs))]
    scores = bench.score(flat_items, flat_resps, flat_given)
    rows, pos = [], 0
    for item, rs in zip(items, per_item):
        group = scores[pos : pos + len(rs)]
        pos += len(rs)
        rows.append(_row(item, rs, group, many=len(rs) > 1))
    return rows


def _row(item: EvalItem, responses: list[str], scores: list, many: bool) -> dict[str, Any]:
    def pick(values: list) -> Any:
        return values if many else values[0]

    row: dict[str, Any] = {
        "id": item.id,
        "prediction": pick(responses),
        "extracted": pick([s.extracted for s in scores]),
        "correct": pick([s.correct for s in scores]),
    }
    if any(s.normalized is not NOT_GIVEN for s in scores):
        row["normalized"] = pick([s.normalized for s in scores])
    names = list(dict.fromkeys(k for s in scores for k in s.parts))
    if names:
        row["parts"] = {key: pick([s.parts.get(key) for s in scores]) for key in names}
    for key, value in item.fields.items():
        if value is not None:
            row.setdefault(key, value)
    return row


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def item_score(row: dict[str, Any]) -> float:
    """The item's mean correctness over its samples."""
    values = [float(v) for v in _as_list(row["correct"])]
    return sum(values) / len(values)


def expected_max(scores: list[float], k: int) -> float:
    """E[max of a uniformly random k-subset of ``scores``]: pass@k's unbiased estimator, for 0/1 and [0, 1] scores."""
    s, n = sorted(scores), len(scores)
    total = math.comb(n, k)
    return sum(s[i - 1] * math.comb(i - 1, k - 1) for i in range(k, n + 1)) / total


def pass_ks(n: int) -> list[int]:
    ks = [k for k in (2**j for j in range(n.bit_length())) if k < n]
    return [*ks, n]


def aggregate(bench: Benchmark, rows: list[dict[str, Any]]) -> dict[str, Any]:
    if not rows:
        raise EvalError("no items to score")
    scores = [item_score(r) for r in rows]
    k = min(len(_as_list(r["correct"])) for r in rows)
    out: dict[str, Any] = {"items": len(rows), "samples": k, "accuracy": sum(scores) / len(scores)}
    if k > 1:
        out[f"mean@{k}"] = out["accuracy"]
        samples = [[float(v) for v in _as_list(r["correct"])][:k] for r in rows]
        out["pass@k"] = {
            f"pass@{j}": sum(expected_max(s, j) for s in samples) / len(samples) for j in pass_ks(k)
        }
    parts = _part_means(rows)
    if parts:
        out["parts"] = parts
    summary = bench.summary(rows)
    if summary:
        out["summary"] = summary
    out["breakdowns"] = breakdowns(rows, bench.breakdowns, scores)
    return out


def _part_means(rows: list[dict[str, Any]]) -> dict[str, float]:
    sums: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in (row.get("parts") or {}).items():
            values = [float(v) for v in _as_list(value) if v is not None]
            if values:
                sums[key].append(sum(values) / len(values))
    return {k: sum(v) / len(v) for k, v in sums.items()}


def breakdowns(rows: list[dict[str, Any]], keys: tuple[str, ...], scores: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys:
        groups: dict[str, list[float]] = defaultdict(list)
        for row, score in zip(rows, scores):
            value = row.get(key)
            for v in _as_list(value) if value is not None else []:
                groups[str(v)].append(score)
        if groups:
            out[key] = {
                v: {"accuracy": sum(s) / len(s), "n": len(s)}
                for v, s in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
            }
    return out


def read_predictions(
    path: Path, bench: Benchmark, items: list[EvalItem]
) -> tuple[list[list[str]], list[list[Any]]]:
    """Responses (and given extractions) for ``items`` from a prediction file: a JSON object ``id -> record`` (or
    ``id -> response string``, as PubTabNet's ``{file name: HTML}``), a JSON list or JSONL of records with ``id``
    (or ``pid``/``question_id``). A record's response is ``response`` or ``prediction`` (a string, or a list of K);
    the benchmark's own extraction key (MathVista ``extraction``, MATH-Vision ``model_answer``) is judged as given."""
    entries = _entries(path)
    missing = [it.id for it in items if it.id not in entries]
    if missing:
        raise EvalError(
            f"{path}: no prediction for {len(missing)} of {len(items)} items (first: {missing[0]!r}); predictions "
            f"are matched to items by id ({'/'.join(ID_KEYS)} or the JSON key) — use --limit to score a prefix"
        )
    responses, given = [], []
    for it in items:
        value = entries[it.id]
        if isinstance(value, str):
            responses.append([value])
            given.append([NOT_GIVEN])
            continue
        resp = next((value[k] for k in RESPONSE_KEYS if value.get(k) is not None), None)
        if resp is None:
            raise EvalError(f"{path}: the prediction for {it.id!r} has no {' or '.join(RESPONSE_KEYS)} field")
        resps = [str(r) for r in _as_list(resp)]
        key = bench.extraction_key
        ext = _as_list(value[key]) if key and key in value else [NOT_GIVEN] * len(resps)
        if len(ext) != len(resps):
            raise EvalError(f"{path}: {it.id!r} has {len(resps)} responses but {len(ext)} {key} values")
        responses.append(resps)
        given.append(ext)
    return responses, given


def _entries(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise EvalError(f"prediction file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            data: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
    except json.JSONDecodeError as e:
        raise EvalError(
            f"{path}: invalid JSON ({e.msg} at line {e.lineno}); give a JSON or JSONL file"
        ) from None
    if isinstance(data, dict):
        return {str(k): v for k, v in data.items()}
    if not isinstance(data, list):
        raise EvalError(f"{path}: expected a JSON object or list of predictions")
    out = {}
    for i, rec in enumerate(data):
        rid = next((rec[k] for k in ID_KEYS if isinstance(rec, dict) and rec.get(k) is not None), None)
        if rid is None:
            raise EvalError(f"{path}: prediction {i} has no id ({'/'.join(ID_KEYS)})")
        out[str(rid)] = rec
    return out
