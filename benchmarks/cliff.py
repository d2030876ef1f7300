"""Learning past the cliff (issue 36): the methods for groups that teach nothing, side by side with GRPO and DAPO on
the geometry tiny recipe (recipes/geometry/tiny-vade.yaml with the uniform sampler, so the sampler does not pick the
prompts), from its shipped warm start, the same seeds and steps.

    OMP_NUM_THREADS=1 python benchmarks/cliff.py [--methods grpo dapo ngrpo dgpo agrae ghpo scaf critique latr] [--seeds 0 1 2]
        [--steps 60] [--out runs/cliff] [key=value ...]

Per method and seed: the share of zero-signal groups (all rewards equal: ``1 - rollout/groups_with_signal``, over the
groups the update sees, after any hints), the responses generated (on-policy groups x n, DAPO's extra rounds and the hints' and passes'
``*/extra_samples`` included), the held-out accuracy at the start and the end, and the wall time. Then one row per
method: mean (min-max) over the seeds, and the held-out accuracy per 1,000 responses generated (equal rollout budget)
and per minute (equal wall clock). A method whose ``<out>/<method>/summary.json`` exists is read back, not rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from recipe_runs import train_recipe

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "geometry" / "tiny-vade.yaml"
HINTS = ["algo.augment_options={hints: geometry, fail_at: 0.1}"]  # a well-formatted wrong answer earns 0.1
METHODS: dict[str, list[str]] = {
    "grpo": [],
    "dapo": ["algo.dynamic_sampling=true"],
    "ngrpo": ["algo.advantage=ngrpo", "algo.clip_low=0.16", "algo.clip_high=0.24"],
    "dgpo": ["algo.advantage=dgpo"],
    "agrae": ["algo.advantage=agrae"],
    "ghpo": ["algo.augment=ghpo", *HINTS],
    "scaf": ["algo.augment=scaf", "algo.augment_options={hints: geometry, fail_at: 0.1, warmup_steps: 10}"],
    "critique": ["algo.augment=critique", "algo.loss=critique", "algo.advantage=dr_grpo"],
    "latr": ["rollout.engine=latr"],
}
BASE = ["sampler.name=uniform", "sampler.options={}"]


def one(method: str, seed: int, steps: int, out: Path, extra: list[str]) -> dict:
    cfg, rows, wall = train_recipe(
        RECIPE,
        out,
        [*BASE, *METHODS[method], *extra],
        seed=seed,
        steps=steps,
        eval_every=steps,
        eval_samples=200,
    )
    train = [r for r in rows if "rollout/groups_with_signal" in r]
    n = cfg.rollout.n
    generated = sum(r.get("rollout/groups_generated", cfg.train.prompts_per_step) * n for r in train)
    generated += sum(v for r in train for k, v in r.items() if k.endswith("/extra_samples"))
    evals = [r["eval/accuracy"] for r in sorted(rows, key=lambda r: r["step"]) if "eval/accuracy" in r]
    return {
        "seed": seed,
        "zero_signal": 1 - statistics.mean(r["rollout/groups_with_signal"] for r in train),
        "responses": generated,
        "accuracy": [evals[0], evals[-1]],
        "wall_s": wall,
    }


def span(values: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.mean(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "cliff")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    os.chdir(ROOT)
    table = {}
    for method in a.methods:
        done = a.out / method / "summary.json"
        if done.exists():
            table[method] = json.loads(done.read_text())
            print(f"{method}: read back from {done}", flush=True)
            continue
        runs = []
        for seed in a.seeds:
            r = one(method, seed, a.steps, a.out / method / f"seed{seed}", a.overrides)
            runs.append(r)
            print(
                f"{method} seed {seed}: zero-signal groups {r['zero_signal']:.3f}, responses {r['responses']:.0f}, "
                f"accuracy {r['accuracy'][0]:.3f} -> {r['accuracy'][1]:.3f}, wall {r['wall_s']:.0f} s",
                flush=True,
            )
        table[method] = runs
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps(runs, indent=1))
    print(f"\ngeometry tiny (uniform sampler), {a.steps} steps, seeds {a.seeds}: mean (min-max)")
    print(
        "| method | zero-signal groups | responses | held-out accuracy end | gain | gain per 1k responses | gain per minute |"
    )
    print("|---|---|---|---|---|---|---|")
    for method, runs in table.items():
        gain = [r["accuracy"][1] - r["accuracy"][0] for r in runs]
        per_k = [g / r["responses"] * 1000 for g, r in zip(gain, runs)]
        per_min = [g / r["wall_s"] * 60 for g, r in zip(gain, runs)]
        print(
            f"| {method} | {span([r['zero_signal'] for r in runs])} | {span([r['responses'] for r in runs], '.0f')} | "
            f"{span([r['accuracy'][1] for r in runs])} | {statistics.mean(gain):+.3f} | "
            f"{statistics.mean(per_k):+.4f} | {statistics.mean(per_min):+.4f} |"
        )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.json").write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
