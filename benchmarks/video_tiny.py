"""The video tiny recipe over 3 seeds: held-out reward of the shipped warm start (step 0) and after training.

    python benchmarks/video_tiny.py [--seeds 0 1 2] [--steps N] [--out runs/bench-video-tiny] [key=value ...]

Each seed trains ``recipes/video/tiny.yaml`` as shipped (through :func:`recipe_runs.train_recipe`, the trainer the
CLI runs) from ``assets/video-sft`` and prints the greedy held-out reward at step 0 and at the end
(``eval/reward_mean``: ``mc_letter`` correctness, so it equals ``eval/accuracy``), the per-kind accuracy (count,
direction, order; ``eval.group_by: kind``), the eval curve and the wall time, then the seed mean, spread and gain.
Extra ``key=value`` arguments are overrides for every seed, e.g. DeepVideo-R1's loss:

    python benchmarks/video_tiny.py algo.loss=reg_grpo algo.loss_agg=seq-mean-token-mean

The machine's 1-minute load average is printed beside each wall time: the 2-core CI machine is shared, and wall
times are only comparable at similar load.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from recipe_runs import seed_options, train_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "video" / "tiny.yaml"
KINDS = ("count", "direction", "order")


def _kinds(row: dict) -> str:
    return " ".join(f"{k} {row[f'eval/accuracy/{k}']:.2f}" for k in KINDS if f"eval/accuracy/{k}" in row)


def main() -> None:
    a, base, steps = seed_options(__doc__.split("\n\n")[0], RECIPE, ROOT / "runs" / "bench-video-tiny")
    t0 = time.perf_counter()
    starts, finals, walls = [], [], []
    for seed in a.seeds:
        load = os.getloadavg()[0]
        _, rows, wall = train_recipe(
            RECIPE,
            a.out / f"seed{seed}",
            a.overrides,
            seed=seed,
            steps=steps,
            eval_every=base.eval.every,
            eval_samples=base.eval.max_samples,
        )
        evals = [r for r in rows if "eval/reward_mean" in r]
        first, last = evals[0], evals[-1]
        train_s = sum(v for r in rows for k, v in r.items() if k.startswith("time/") and k != "time/eval")
        starts.append(first["eval/reward_mean"])
        finals.append(last["eval/reward_mean"])
        walls.append(wall)
        curve = " ".join(f"{r['step']}:{r['eval/reward_mean']:.3f}" for r in evals)
        print(
            f"seed {seed}: held-out reward {first['eval/reward_mean']:.3f} -> {last['eval/reward_mean']:.3f} "
            f"({steps} steps; wall {wall:.0f} s, of it {train_s:.0f} s in training steps; load {load:.1f} -> "
            f"{os.getloadavg()[0]:.1f})\n  by kind: {_kinds(first)}  ->  {_kinds(last)}\n  curve {curve}",
            flush=True,
        )
    gains = [f - s for s, f in zip(starts, finals)]
    print(
        f"\n{len(finals)} seeds, {steps} steps: held-out reward start {statistics.mean(starts):.3f} -> final mean "
        f"{statistics.mean(finals):.3f} (min {min(finals):.3f}, max {max(finals):.3f}, sd "
        f"{statistics.pstdev(finals):.3f}); gain {statistics.mean(gains):+.3f} (min {min(gains):+.3f}, max "
        f"{max(gains):+.3f}); wall per seed {statistics.mean(walls):.0f} s (min {min(walls):.0f}, max "
        f"{max(walls):.0f}); total {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
