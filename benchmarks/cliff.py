"""Learning past the cliff (issue 36): the methods for groups that teach nothing, side by side with GRPO and DAPO on
the geometry tiny recipe (recipes/geometry/tiny-vade.yaml with the uniform sampler, so the sampler does not pick the
prompts), from its shipped warm start, the same seeds and steps.

    OMP_NUM_THREADS=1 python benchmarks/cliff.py [--methods grpo dapo ngrpo dgpo agrae ghpo scaf critique latr] [--seeds 0 1 2]
        [--steps 60] [--out runs/cliff] [--hard] [key=value ...]

``--hard`` first writes the recipe's hard split (:func:`hard_split`: the records on which all 8 of the warm start's
samples fail) and trains and evaluates on it: the cliff itself, where GRPO's groups are flat at 0.

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


def hard_split(out: Path, fail_at: float = 0.1, group: int = 8, seed: int = 0) -> list[str]:
    """The recipe's "hard" split: the train and held-out records on which the warm start's ``group`` samples (the
    recipe's temperature and rewards) all score at most ``fail_at``, written beside the recipe's data as
    ``hard_train.jsonl`` and ``hard_eval.jsonl`` (the original lines, so image paths still resolve). Returns the
    overrides that train and evaluate on them. Made once: existing files are reused."""
    import torch

    from mmrl.config import load_config
    from mmrl.data import load_split
    from mmrl.rollout import SamplingParams
    from mmrl.train.trainer import Trainer

    cfg = load_config(RECIPE, BASE)
    data = Path(cfg.data.train).parent
    files = {"train": data / "hard_train.jsonl", "eval": data / "hard_eval.jsonl"}
    if not all(f.exists() for f in files.values()):
        torch.manual_seed(seed)
        trainer = Trainer(cfg, out, overwrite=True)
        c = trainer.collector
        params = SamplingParams(group, cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k,
                                cfg.rollout.max_new_tokens)  # fmt: skip
        try:
            for split, src in (("train", cfg.data.train), ("eval", cfg.data.eval)):
                samples = load_split(cfg.data, src, None)
                hard = set()
                for i in range(0, len(samples), 64):
                    chunk = samples[i : i + 64]
                    _, rewards = c.rollout(chunk, params)
                    hard |= {s.id for s, r in zip(chunk, rewards) if bool((r <= fail_at).all())}
                lines = [ln for ln in Path(src).read_text().splitlines() if ln.strip()]
                kept = [ln for ln in lines if json.loads(ln)["id"] in hard]
                files[split].write_text("\n".join(kept) + "\n")
                print(
                    f"hard {split}: {len(kept)} of {len(lines)} records fail all {group} samples", flush=True
                )
        finally:
            trainer.collector.close()
    return [f"data.train={files['train']}", f"data.eval={files['eval']}"]


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
    p.add_argument("--hard", action="store_true", help="train and evaluate on the hard split (hard_split)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    os.chdir(ROOT)
    if a.hard:
        a.overrides = [*hard_split(a.out / "hard_split"), *a.overrides]
    table = {}
    for method in a.methods:
        done = a.out / method / "summary.json"
        if done.exists():
            table[method] = json.loads(done.read_text())
            print(f"{method}: read back from {done}", flush=True)
            continue
        runs = []
        for seed in a.seeds:
            try:
                r = one(method, seed, a.steps, a.out / method / f"seed{seed}", a.overrides)
            except (
                Exception
            ) as e:  # DAPO on the hard split may exhaust its sampling rounds: a result, said so
                print(f"{method} seed {seed}: stopped: {type(e).__name__}: {str(e)[:300]}", flush=True)
                runs.append({"seed": seed, "error": f"{type(e).__name__}: {e}"})
                continue
            runs.append(r)
            print(
                f"{method} seed {seed}: zero-signal groups {r['zero_signal']:.3f}, responses {r['responses']:.0f}, "
                f"accuracy {r['accuracy'][0]:.3f} -> {r['accuracy'][1]:.3f}, wall {r['wall_s']:.0f} s",
                flush=True,
            )
        table[method] = runs
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps(runs, indent=1))
    split = "the hard split" if a.hard else "the recipe's data"
    print(f"\ngeometry tiny (uniform sampler) on {split}, {a.steps} steps, seeds {a.seeds}: mean (min-max)")
    print(
        "| method | zero-signal groups | responses | held-out accuracy end | gain | gain per 1k responses | gain per minute |"
    )
    print("|---|---|---|---|---|---|---|")
    for method, every in table.items():
        runs = [r for r in every if "error" not in r]
        if len(runs) < len(every):
            print(
                f"| {method} | {len(every) - len(runs)} of {len(every)} runs stopped: {next(r['error'] for r in every if 'error' in r)[:80]} |"
            )
        if not runs:
            continue
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
