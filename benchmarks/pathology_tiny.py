"""The pathology tiny recipe over seeds: does GRPO from the shipped warm start (``assets/pathology-sft``) raise the
held-out reward? (``recipes/pathology/tiny.yaml``; docs/algorithms.md#grpo-family GRPO, docs/rewards.md#domain-rewards the pathology reward.)

Each run is the recipe unchanged but for ``train.seed`` (and, with ``--steps``, its length), on the recipe's own
data (``recipes/pathology/data/tiny``, built on first use). Per seed it prints the greedy held-out reward before
step 1 and after the last step (``eval/reward_mean``: the composite reward, answer + box IoU + format, on the
recipe's 200 held-out records), the held-out accuracy (``eval/accuracy``: reward >= 0.9, i.e. the answer right
and, when a box is asked, IoU >= 0.5), and the run's wall time with the load average around it (the machine is
shared); then the mean and spread (min-max, standard deviation) over seeds of start, final and gain.

    OMP_NUM_THREADS=1 python benchmarks/pathology_tiny.py [--seeds 3 --out runs/pathology_tiny]

Writes ``<out>/summary.json`` (every eval curve, per-kind accuracies, per-seed numbers and the summary); run folders
go under ``<out>/runs``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from recipe_runs import seed_summary, train_recipe

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "pathology" / "tiny.yaml"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_one(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from mmrl.config import load_config

    base = load_config(RECIPE)
    before = load_average()
    _, rows, wall = train_recipe(
        RECIPE,
        args.out / "runs" / f"seed{seed}",
        [],
        seed=seed,
        steps=args.steps or base.train.max_steps,
        eval_every=base.eval.every,
        eval_samples=base.eval.max_samples,
    )
    evals = sorted((r for r in rows if "eval/reward_mean" in r), key=lambda r: r["step"])
    kinds = {
        k.split("/")[-1]: (evals[0][k], evals[-1][k]) for k in evals[-1] if k.startswith("eval/accuracy/")
    }
    return {
        "seed": seed,
        "wall_s": wall,
        "load_average_before": before,
        "load_average_after": load_average(),
        "steps": [r["step"] for r in evals],
        "reward": [r["eval/reward_mean"] for r in evals],
        "accuracy": [r["eval/accuracy"] for r in evals],
        "accuracy_by_kind": kinds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="default: the recipe's train.max_steps")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "pathology_tiny")
    args = ap.parse_args()
    os.chdir(ROOT)
    runs = []
    for seed in range(args.seeds):
        r = run_one(seed, args)
        runs.append(r)
        kinds = ", ".join(f"{k} {a:.2f}->{b:.2f}" for k, (a, b) in sorted(r["accuracy_by_kind"].items()))
        print(
            f"seed {seed}: held-out reward {r['reward'][0]:.3f} -> {r['reward'][-1]:.3f}, "
            f"accuracy {r['accuracy'][0]:.3f} -> {r['accuracy'][-1]:.3f} ({kinds}); "
            f"wall {r['wall_s']:.0f} s, load {r['load_average_before']} -> {r['load_average_after']}",
            flush=True,
        )
    summary = seed_summary(runs, ("reward", "accuracy"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
