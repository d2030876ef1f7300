"""Rewards without labels on a recipe (docs/labelfree.md): the same tiny recipe trained with its labeled reward and
with ``ttrl``, ``empo`` (and ``scope``) in its place, the held-out records always scored against their references
(``eval.rewards: [{name: exact_match}]``), which the label-free runs never read. Per reward and seed: held-out
accuracy at the start and the end, and for the pseudo-label rewards the pseudo-label accuracy over training (the
share of groups whose voted label equals the hidden reference, ``reward/<name>/pseudo_label_correct``), first and
last tenth of the steps.

    OMP_NUM_THREADS=1 python benchmarks/labelfree.py [--recipe shapes/tiny] [--steps 200] [--seeds 0 1 2]
        [--rewards exact_match ttrl empo]

Prints one row per (reward, seed), then per reward the mean (min, max) over seeds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from recipe_runs import train_recipe

ROOT = Path(__file__).resolve().parents[1]


def run(recipe: str, reward: str, seed: int, steps: int, every: int, samples: int, out: Path) -> dict:
    _, rows, wall = train_recipe(
        ROOT / "recipes" / f"{recipe}.yaml",
        out,
        [f"rewards=[{{name: {reward}}}]", "eval.rewards=[{name: exact_match}]"],
        seed=seed,
        steps=steps,
        eval_every=every,
        eval_samples=samples,
    )
    evals = sorted((r for r in rows if "eval/accuracy" in r), key=lambda r: r["step"])
    train = [r for r in rows if "reward/mean" in r]
    key = f"reward/{reward}/pseudo_label_correct"
    tenth = max(1, len(train) // 10)
    labels = [r[key] for r in train if key in r]
    return {
        "start": evals[0]["eval/accuracy"],
        "final": evals[-1]["eval/accuracy"],
        "label_first": statistics.mean(labels[:tenth]) if labels else float("nan"),
        "label_last": statistics.mean(labels[-tenth:]) if labels else float("nan"),
        "wall": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="shapes/tiny")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-samples", type=int, default=200)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rewards", nargs="+", default=["exact_match", "ttrl", "empo"])
    a = p.parse_args()
    print(
        f"{a.recipe}, {a.steps} steps, held-out scored by exact_match ({a.eval_samples} records), seeds {a.seeds}"
    )
    print("reward        seed  start  final  pseudo-label acc first/last tenth   wall s")
    table: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="mmrl-labelfree-") as tmp:
        for reward in a.rewards:
            for seed in a.seeds:
                r = run(
                    a.recipe,
                    reward,
                    seed,
                    a.steps,
                    a.eval_every,
                    a.eval_samples,
                    Path(tmp) / f"{reward}-{seed}",
                )
                table.setdefault(reward, []).append(r)
                print(
                    f"{reward:12} {seed:>5} {r['start']:6.3f} {r['final']:6.3f} "
                    f"{r['label_first']:17.3f} / {r['label_last']:.3f} {r['wall']:12.0f}",
                    flush=True,
                )
    print("reward        final held-out accuracy mean (min-max)   gain mean   pseudo-label acc last tenth")
    for reward, rs in table.items():
        finals = [r["final"] for r in rs]
        gain = statistics.mean(r["final"] - r["start"] for r in rs)
        last = [r["label_last"] for r in rs if r["label_last"] == r["label_last"]]
        lab = f"{statistics.mean(last):.3f}" if last else "-"
        print(
            f"{reward:12} {statistics.mean(finals):10.3f} ({min(finals):.3f}-{max(finals):.3f}) "
            f"{gain:+18.3f} {lab:>24}"
        )


if __name__ == "__main__":
    main()
