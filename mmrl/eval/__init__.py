"""Benchmark evaluation: ``mmrl eval`` / ``mmrl compare`` and the scorers in-training validation reuses.

- :func:`load_benchmark` reads a benchmark's published layout into :class:`EvalItem` records (``item.sample`` is
  what the policy encodes);
- :func:`score_predictions` scores responses for those items exactly as ``mmrl eval`` does and returns the
  ``predictions.jsonl`` rows and the metrics;
- :func:`mmrl.eval.runner.run_eval` is the whole command (generation, resume, outputs);
  :mod:`mmrl.eval.compare` the paired bootstrap behind ``mmrl compare``.

Each benchmark family lives in its own module (``mathvista``, ``mathv``, ``screenspot``, ``table``, ``pathvqa``,
``videoqa``, ``zoom``, ``gui_agent``) whose docstring gives its layout on disk and its scoring; ``zoom`` and
``gui_agent`` are env benchmarks, whose items are answered by episodes in a multi-turn env (:mod:`.episodic`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmrl.config import ModelConfig
from mmrl.eval.base import BENCHMARKS, Benchmark, EvalError, EvalItem, Score, get_benchmark
from mmrl.eval.scoring import score_predictions


def load_benchmark(
    name: str, data: str | Path, options: dict[str, Any] | None = None, model: ModelConfig | None = None
) -> list[EvalItem]:
    """The items of benchmark ``name`` stored at ``data`` (see each family's module for its layout)."""
    return get_benchmark(name, options, model).load(Path(data)).items


__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "EvalError",
    "EvalItem",
    "Score",
    "get_benchmark",
    "load_benchmark",
    "score_predictions",
]
