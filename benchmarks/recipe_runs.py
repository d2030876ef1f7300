"""One training run of a recipe inside a benchmark: the overrides every comparison needs, the run, its metrics.

Shared by ``mssr_vs_grpo.py`` and ``vade_recipe.py`` (scripts run as ``python benchmarks/NAME.py``, so this sibling
module is importable)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def train_recipe(
    recipe: Path,
    out: Path,
    overrides: list[str],
    *,
    seed: int,
    steps: int,
    eval_every: int,
    eval_samples: int,
) -> tuple[Any, list[dict[str, Any]], float]:
    """Train ``recipe`` into ``out`` (replacing a previous run there); return the config, the metrics rows and the
    wall-clock seconds."""
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    common = [
        f"train.seed={seed}",
        f"train.max_steps={steps}",
        "train.save_every=0",
        "train.keep_checkpoints=1",
        "train.progress=false",
        f"eval.every={eval_every}",
        f"eval.max_samples={eval_samples}",
    ]
    cfg = load_config(recipe, [*common, *overrides])
    t0 = time.perf_counter()
    Trainer(cfg, out, overwrite=True).fit()
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return cfg, rows, wall
