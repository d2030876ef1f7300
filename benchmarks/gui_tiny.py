"""The gui tiny recipe over several seeds: held-out reward of the warm start (step-0 eval) against the trained policy.

Each seed trains ``recipes/gui/tiny.yaml`` as shipped (warm start ``assets/gui-sft``, the recipe's steps, learning
rate and group size; only ``train.seed`` changes) on the recipe's cached data (``recipes/gui/data/tiny/``, built on
first use). The held-out numbers are the greedy evaluations that ``metrics.jsonl`` logs at step 0 and at the last
step on ``--eval-samples`` records of ``eval.jsonl``: ``eval/reward_mean`` (UI-R1's type + coordinate + format, in
[0, 3]), ``eval/accuracy`` (all three right) and ``eval/accuracy/click`` (clicks inside the target box).

    OMP_NUM_THREADS=1 python benchmarks/gui_tiny.py [--seeds 3 --steps N --out runs/gui_tiny]

Prints one line per seed (start -> final, wall seconds, load average before and after, since the 2-core machine
is shared), then the seed mean and spread (min-max) of each number and of the gain, and writes
``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from recipe_runs import train_recipe

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "gui" / "tiny.yaml"
KEYS = ("eval/reward_mean", "eval/accuracy", "eval/accuracy/click")


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train one seed of the recipe; return its step-0 and final held-out numbers and wall time."""
    from mmrl.config import load_config

    recipe = load_config(RECIPE)
    steps = args.steps or recipe.train.max_steps
    load_before = os.getloadavg()[0]
    _, rows, wall = train_recipe(
        RECIPE,
        args.out / f"seed-{seed}",
        [],
        seed=seed,
        steps=steps,
        eval_every=recipe.eval.every,
        eval_samples=args.eval_samples,
    )
    evals = [r for r in rows if "eval/accuracy" in r]
    start, final = evals[0], evals[-1]
    assert start["step"] == 0 and final["step"] == steps, "the recipe evaluates at step 0 and at the end"
    return {
        "seed": seed,
        "steps": steps,
        "wall_s": wall,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "start": {k: start.get(k) for k in KEYS},
        "final": {k: final.get(k) for k in KEYS},
        "curve": [(r["step"], r["eval/reward_mean"]) for r in evals],
    }


def spread(values: list[float]) -> str:
    a = np.array(values)
    return f"{a.mean():.3f} ({a.min():.3f}..{a.max():.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="train.seed 0..seeds-1")
    ap.add_argument("--steps", type=int, default=0, help="training steps (0 = the recipe's train.max_steps)")
    ap.add_argument("--eval-samples", type=int, default=200, help="held-out records per evaluation")
    ap.add_argument("--out", type=Path, default=Path("runs/gui_tiny"), help="output folder")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    runs = []
    for seed in range(args.seeds):
        r = run_seed(seed, args)
        runs.append(r)
        s, f = r["start"], r["final"]
        print(
            f"seed {seed}: reward {s[KEYS[0]]:.3f} -> {f[KEYS[0]]:.3f}  accuracy {s[KEYS[1]]:.3f} -> {f[KEYS[1]]:.3f}"
            f"  click {s[KEYS[2]]:.3f} -> {f[KEYS[2]]:.3f}  ({r['wall_s']:.0f} s, {r['steps']} steps, "
            f"load {r['load_before']:.1f} -> {r['load_after']:.1f})",
            flush=True,
        )
    for key in KEYS:
        start, final = [r["start"][key] for r in runs], [r["final"][key] for r in runs]
        gain = [b - a for a, b in zip(start, final)]
        print(f"{key}: start {spread(start)}  final {spread(final)}  gain {spread(gain)}")
    print(f"wall: {spread([r['wall_s'] for r in runs])} s per seed")
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    (args.out / "results.json").write_text(json.dumps({"settings": settings, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
