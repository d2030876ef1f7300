"""One training run of a recipe inside a benchmark: the overrides every comparison needs, the run, its metrics.

Shared by ``mssr_vs_grpo.py``, ``vade_recipe.py`` and the ``<recipe>_tiny.py`` scripts (scripts run as
``python benchmarks/NAME.py``, so this sibling module is importable)."""

from __future__ import annotations

import argparse
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
    from mmrl.train.trainer import Trainer

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


def series_run(
    recipe: Path, seed: int, args: Any, base: Any, steps: int, series: dict[str, str], marker: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One seed of a 3-seed recipe benchmark: the run under ``args.out/runs/seed<seed>``, and each named curve of
    ``series`` (name -> metrics key) over the evaluated steps (the rows holding ``marker``), with the wall time and
    the load average before and after (the machine is shared). Also returns the run's metrics rows."""
    from pathology_tiny import load_average

    before = load_average()
    _, rows, wall = train_recipe(
        recipe,
        args.out / "runs" / f"seed{seed}",
        args.overrides,
        seed=seed,
        steps=steps,
        eval_every=base.eval.every,
        eval_samples=base.eval.max_samples,
    )
    evals = sorted((r for r in rows if marker in r), key=lambda r: r["step"])
    out: dict[str, Any] = {"seed": seed, "wall_s": wall, "load_before": before, "load_after": load_average()}
    out["steps"] = [r["step"] for r in evals]
    out |= {name: [r.get(key, float("nan")) for r in evals] for name, key in series.items()}
    return out, rows


def seed_options(description: str, recipe: Path, out: Path) -> tuple[argparse.Namespace, Any, int]:
    """The 3-seed recipe benchmarks' command line (``--seeds``, ``--steps``, ``--out``, ``key=value`` overrides):
    the parsed arguments, the recipe's config with the overrides, and the number of training steps."""
    from mmrl.config import load_config

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, help="training steps (default: the recipe's train.max_steps)")
    p.add_argument("--out", type=Path, default=out)
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every seed")
    a = p.parse_args()
    base = load_config(recipe, a.overrides)
    return a, base, a.steps or base.train.max_steps


def spread(values: list[float]) -> str:
    import statistics

    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} (min {min(values):.3f}, max {max(values):.3f}, sd {sd:.3f})"


def seed_summary(runs: list[dict[str, Any]], names: Any) -> dict[str, dict[str, list[float]]]:
    """Start, final and gain of each named curve over the seeds' runs, printed as mean (min, max, sd) lines."""
    summary = {
        name: {
            "start": [r[name][0] for r in runs],
            "final": [r[name][-1] for r in runs],
            "gain": [r[name][-1] - r[name][0] for r in runs],
        }
        for name in names
    }
    for name, s in summary.items():
        print(f"{name}: start {spread(s['start'])}; final {spread(s['final'])}; gain {spread(s['gain'])}")
    print(f"wall: {spread([r['wall_s'] for r in runs])} s")
    return summary
