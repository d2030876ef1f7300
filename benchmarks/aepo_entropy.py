"""Does AEPO hold the policy's entropy at its target (issue 37)? A tiny recipe from its shipped warm start (shapes:
answers of one or two tokens; geometry: answers of about 15 tokens, `recipes/geometry/tiny-vade.yaml` with the
uniform sampler; table2latex: LaTeX tables of hundreds of tokens), GRPO against AEPO's temperature pass
(``algo.augment: aepo``) at a low and a high target, equal on-policy rollouts per step, for the same seeds and steps.

    OMP_NUM_THREADS=1 python benchmarks/aepo_entropy.py [--recipe shapes|geometry|table2latex] [--seeds 0 1]
        [--steps N] [--targets LOW HIGH] [--out runs/aepo_entropy[_RECIPE]]

Per run it prints the mean token entropy (the update's ``entropy``) at the start (first 10 steps) and over the last
third of the steps with its distance to the target, the pass's temperature share (T_high vs T_low) and the held-out
accuracy (table2latex: reward) at the start and the end. Writes ``<out>/summary.json`` and the entropy curves to
``benchmarks/results/aepo_entropy[_RECIPE].png`` (shapes: no suffix).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from recipe_runs import train_recipe

ROOT = Path(__file__).resolve().parent.parent
# recipe, overrides every run gets, default steps, held-out records, default targets (one below and one above where
# GRPO's entropy settles on the recipe)
RECIPES: dict[str, dict] = {
    "shapes": {
        "recipe": ROOT / "recipes" / "shapes" / "tiny.yaml",
        "base": [],
        "steps": 300,
        "eval": 200,
        "targets": [0.6, 1.3],
    },
    "geometry": {
        "recipe": ROOT / "recipes" / "geometry" / "tiny-vade.yaml",
        "base": ["sampler.name=uniform", "sampler.options={}"],
        "steps": 120,
        "eval": 200,
        "targets": [0.3, 1.0],
    },
    "table2latex": {
        "recipe": ROOT / "recipes" / "table2latex" / "tiny.yaml",
        "base": [],
        "steps": 60,
        "eval": 64,
        "targets": [0.3, 1.0],
    },
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", choices=list(RECIPES), default="shapes")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument(
        "--steps", type=int, help="training steps (default: shapes 300, geometry 120, table2latex 60)"
    )
    p.add_argument("--targets", type=float, nargs="+", help="target entropies (default: the recipe's)")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    spec = RECIPES[a.recipe]
    a.steps = a.steps or spec["steps"]
    a.targets = a.targets or spec["targets"]
    suffix = "" if a.recipe == "shapes" else f"_{a.recipe}"
    a.out = a.out or ROOT / "runs" / f"aepo_entropy{suffix}"
    os.chdir(ROOT)
    runs = {"grpo": [*spec["base"], "algo.old_logprobs=recompute"]}
    for t in a.targets:
        runs[f"aepo H*={t:g}"] = [
            *spec["base"],
            "algo.old_logprobs=recompute",
            "algo.augment=aepo",
            f"algo.augment_options={{target_entropy: {t}}}",
        ]
    results: dict[str, list[dict]] = {}
    for name, overrides in runs.items():
        for seed in a.seeds:
            out = a.out / name.replace(" ", "_").replace("*", "").replace("=", "") / f"seed{seed}"
            _, rows, wall = train_recipe(
                spec["recipe"],
                out,
                overrides,
                seed=seed,
                steps=a.steps,
                eval_every=a.steps,
                eval_samples=spec["eval"],
            )
            train = [r for r in rows if "entropy" in r]
            ent = [r["entropy"] for r in train]
            key = "eval/reward_mean" if a.recipe == "table2latex" else "eval/accuracy"
            evals = [r[key] for r in sorted(rows, key=lambda r: r["step"]) if key in r]
            tail = ent[-max(1, len(ent) // 3) :]
            hot = [r["aepo/temperature"] > 1.0 for r in train if "aepo/temperature" in r]
            res = {
                "seed": seed,
                "entropy": ent,
                "start": statistics.mean(ent[:10]),
                "last_third": statistics.mean(tail),
                "hot_share": sum(hot) / len(hot) if hot else None,
                "replaced_mean": statistics.mean([r.get("aepo/replaced", 0.0) for r in train]),
                "accuracy": [evals[0], evals[-1]],
                "wall_s": wall,
            }
            results.setdefault(name, []).append(res)
            target = train[0].get("aepo/target_entropy")
            gap = (
                f", |last third - target| {abs(res['last_third'] - target):.3f}" if target is not None else ""
            )
            hs = f", T_high share {res['hot_share']:.2f}" if hot else ""
            print(
                f"{name} seed {seed}: entropy {res['start']:.3f} -> last third {res['last_third']:.3f}{gap}{hs}, "
                f"rows replaced/step {res['replaced_mean']:.1f}; accuracy {evals[0]:.3f} -> {evals[-1]:.3f}; "
                f"wall {wall:.0f} s",
                flush=True,
            )
    print(f"\n{a.recipe} tiny, {a.steps} steps, seeds {a.seeds}")
    print(
        f"| run | entropy start | entropy, last third (per seed) | held-out {key.split('/')[1]} end (per seed) |"
    )
    print("|---|---|---|---|")
    for name, rs in results.items():
        last = ", ".join(f"{r['last_third']:.3f}" for r in rs)
        acc = ", ".join(f"{r['accuracy'][1]:.3f}" for r in rs)
        print(f"| {name} | {statistics.mean(r['start'] for r in rs):.3f} | {last} | {acc} |")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.json").write_text(json.dumps(results, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, rs) in enumerate(results.items()):
        for j, r in enumerate(rs):
            ax.plot(r["entropy"], color=f"C{i}", alpha=0.8, label=name if j == 0 else None)
    for i, t in enumerate(a.targets, start=1):
        ax.axhline(t, color=f"C{i}", linestyle="--", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("mean token entropy")
    ax.set_title(f"{a.recipe} tiny: entropy under GRPO and AEPO (dashed: targets)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(ROOT / "benchmarks" / "results" / f"aepo_entropy{suffix}.png", dpi=100)


if __name__ == "__main__":
    main()
