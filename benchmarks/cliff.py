"""Learning past the cliff (issue 36): the methods for groups that teach nothing, side by side with GRPO and DAPO on
a tiny recipe from its shipped warm start, the same seeds and steps: geometry (recipes/geometry/tiny-vade.yaml with
the uniform sampler, so the sampler does not pick the prompts), pathology (recipes/pathology/tiny.yaml, whose region
questions the warm start never gets right) or table2latex (recipes/table2latex/tiny.yaml). Each recipe's hint builder,
failure level and steps are in :data:`RECIPES`.

    OMP_NUM_THREADS=1 python benchmarks/cliff.py [--recipe geometry|pathology|table2latex]
        [--methods grpo dapo ngrpo dgpo agrae ghpo scaf critique latr gspo dhpo] [--seeds 0 1 2]
        [--steps N] [--out runs/cliff] [--hard] [key=value ...]

``--hard`` first writes the recipe's hard split (:func:`hard_split`: the records on which all 8 of the warm start's
samples fail) and trains and evaluates on it: the cliff itself, where GRPO's groups are flat at 0.

Per method and seed: the share of zero-signal groups (all rewards equal: ``1 - rollout/groups_with_signal``, over the
groups the update sees, after any hints), the share of unsolved groups (no response reaches the recipe's success
threshold: ``1 - rollout/groups_solved``; on a continuous reward a group can be unsolved and still carry signal), the responses generated (on-policy groups x n, DAPO's extra rounds and the hints' and passes'
``*/extra_samples`` included), the held-out accuracy at the start and the end, and the wall time. Then one row per
method: mean (min-max) over the seeds, and the held-out accuracy per 1,000 responses generated (equal rollout budget)
and per minute (equal wall clock). A method whose ``<out>/<method>/summary.json`` exists is read back, not rerun, as
is each finished seed (``<out>/<method>/seed<S>.json``), so a stopped comparison goes on where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from recipe_runs import train_recipe

ROOT = Path(__file__).resolve().parent.parent
RECIPES: dict[str, dict] = {
    # recipe, overrides every run gets, the hint builder, the reward at or below which a sample counts as failed (a
    # well-formatted wrong geometry answer earns 0.1; pathology and table2latex pay continuous parts, so a sample
    # fails below the recipe's success threshold), and the training steps and held-out records
    "geometry": {
        "recipe": ROOT / "recipes" / "geometry" / "tiny-vade.yaml",
        "base": ["sampler.name=uniform", "sampler.options={}"],
        "hints": "geometry",
        "fail_at": 0.1,
        "success_at": 1.0,
        "steps": 60,
        "eval": 200,
    },
    "pathology": {
        "recipe": ROOT / "recipes" / "pathology" / "tiny.yaml",
        "base": [],
        "hints": "pathology",
        "fail_at": 0.899,  # right answer and box IoU >= 0.5 (or a right answer without a region) reach 0.9
        "success_at": 0.9,
        "steps": 100,
        "eval": 200,
    },
    "table2latex": {
        "recipe": ROOT / "recipes" / "table2latex" / "tiny.yaml",
        "base": [],
        "hints": "table2latex",
        "fail_at": 0.749,  # the recipe's success threshold is 0.75
        "success_at": 0.75,
        "steps": 40,
        "eval": 64,
    },
}


def methods(spec: dict) -> dict[str, list[str]]:
    """Each method's overrides on the recipe ``spec``."""
    h, f, ok = spec["hints"], spec["fail_at"], spec["success_at"]
    return {
        "grpo": [],
        "dapo": ["algo.dynamic_sampling=true"],
        "ngrpo": ["algo.advantage=ngrpo", "algo.clip_low=0.16", "algo.clip_high=0.24"],
        "dgpo": ["algo.advantage=dgpo"],
        "agrae": ["algo.advantage=agrae"],
        "ghpo": ["algo.augment=ghpo", f"algo.augment_options={{hints: {h}, fail_at: {f}}}"],
        "scaf": [
            "algo.augment=scaf",
            f"algo.augment_options={{hints: {h}, fail_at: {f}, success_at: {ok}, warmup_steps: 10}}",
        ],
        "critique": [
            "algo.augment=critique",
            f"algo.augment_options={{success_at: {ok}}}",
            "algo.loss=critique",
            "algo.advantage=dr_grpo",
        ],
        # the tree prefix's log-probs are at T = 1: pi_old recomputed (table2latex samples at 0.7; at T = 1 the same)
        "latr": ["rollout.engine=latr", "algo.old_logprobs=recompute"],
        # objectives at the same budget, for issue 37's DHPO (token and sequence ratios in one clipped objective)
        # beside the token-level clip of GRPO above and GSPO's sequence-level one
        "gspo": [
            "algo.loss=gspo",
            "algo.clip_low=0.0003",
            "algo.clip_high=0.0004",
            "algo.loss_agg=seq-mean-token-mean",
        ],
        "dhpo": ["algo.loss=dhpo"],
    }


METHODS = list(methods(RECIPES["geometry"]))


def hard_split(spec: dict, out: Path, group: int = 8, seed: int = 0) -> list[str]:
    """The recipe's "hard" split: the train and held-out records on which the warm start's ``group`` samples (the
    recipe's temperature and rewards) all score at most ``spec["fail_at"]``, written beside the recipe's data as
    ``hard_train.jsonl`` and ``hard_eval.jsonl`` (the original lines, so image paths still resolve). Returns the
    overrides that train and evaluate on them. Made once: existing files are reused."""
    import torch

    from mmrl.config import load_config
    from mmrl.data import load_split
    from mmrl.rollout import SamplingParams
    from mmrl.train.trainer import Trainer

    fail_at = spec["fail_at"]
    cfg = load_config(spec["recipe"], spec["base"])
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
                    _, rewards, _ = c.rollout(chunk, params)
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


def one(spec: dict, method: str, seed: int, steps: int, out: Path, extra: list[str]) -> dict:
    cfg, rows, wall = train_recipe(
        spec["recipe"],
        out,
        [*spec["base"], *methods(spec)[method], *extra],
        seed=seed,
        steps=steps,
        eval_every=steps,
        eval_samples=spec["eval"],
    )
    train = [r for r in rows if "rollout/groups_with_signal" in r]
    n = cfg.rollout.n
    generated = sum(r.get("rollout/groups_generated", cfg.train.prompts_per_step) * n for r in train)
    generated += sum(v for r in train for k, v in r.items() if k.endswith("/extra_samples"))
    ordered = sorted((r for r in rows if "eval/accuracy" in r), key=lambda r: r["step"])
    evals = [r["eval/accuracy"] for r in ordered]
    return {
        "seed": seed,
        "zero_signal": 1 - statistics.mean(r["rollout/groups_with_signal"] for r in train),
        "unsolved": 1 - statistics.mean(r["rollout/groups_solved"] for r in train),
        "responses": generated,
        "accuracy": [evals[0], evals[-1]],
        "reward": [ordered[0]["eval/reward_mean"], ordered[-1]["eval/reward_mean"]],
        "wall_s": wall,
    }


def span(values: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.mean(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="geometry", choices=list(RECIPES))
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, help="training steps (default: the recipe's, geometry 60)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "cliff")
    p.add_argument("--hard", action="store_true", help="train and evaluate on the hard split (hard_split)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    os.chdir(ROOT)
    spec = RECIPES[a.recipe]
    a.steps = a.steps or spec["steps"]
    if a.hard:
        a.overrides = [*hard_split(spec, a.out / "hard_split"), *a.overrides]
    table = {}
    for method in a.methods:
        done = a.out / method / "summary.json"
        if done.exists():
            table[method] = json.loads(done.read_text())
            print(f"{method}: read back from {done}", flush=True)
            continue
        runs = []
        for seed in a.seeds:
            kept = (
                a.out / method / f"seed{seed}.json"
            )  # a seed finished by an earlier, interrupted invocation
            if kept.exists():
                runs.append(json.loads(kept.read_text()))
                print(f"{method} seed {seed}: read back from {kept}", flush=True)
                continue
            try:
                r = one(spec, method, seed, a.steps, a.out / method / f"seed{seed}", a.overrides)
            except (
                Exception
            ) as e:  # DAPO on the hard split may exhaust its sampling rounds: a result, said so
                print(f"{method} seed {seed}: stopped: {type(e).__name__}: {str(e)[:300]}", flush=True)
                runs.append({"seed": seed, "error": f"{type(e).__name__}: {e}"})
                continue
            runs.append(r)
            kept.write_text(json.dumps(r))
            print(
                f"{method} seed {seed}: zero-signal groups {r['zero_signal']:.3f}, responses {r['responses']:.0f}, "
                f"accuracy {r['accuracy'][0]:.3f} -> {r['accuracy'][1]:.3f}, wall {r['wall_s']:.0f} s",
                flush=True,
            )
        table[method] = runs
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps(runs, indent=1))
    split = "the hard split" if a.hard else "the recipe's data"
    print(f"\n{a.recipe} tiny on {split}, {a.steps} steps, seeds {a.seeds}: mean (min-max)")
    print(
        "| method | zero-signal groups | unsolved groups | responses | held-out accuracy end | gain "
        "| gain per 1k responses | gain per minute | held-out reward end |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
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
        unsolved = span([r["unsolved"] for r in runs]) if all("unsolved" in r for r in runs) else "-"
        reward = span([r["reward"][1] for r in runs]) if all("reward" in r for r in runs) else "-"
        print(
            f"| {method} | {span([r['zero_signal'] for r in runs])} | {unsolved} | "
            f"{span([r['responses'] for r in runs], '.0f')} | {span([r['accuracy'][1] for r in runs])} | "
            f"{statistics.mean(gain):+.3f} | {statistics.mean(per_k):+.4f} | {statistics.mean(per_min):+.4f} | "
            f"{reward} |"
        )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.json").write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
