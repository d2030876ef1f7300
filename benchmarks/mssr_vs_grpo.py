"""MSSR vs GRPO at equal rollout budgets on the shapes tiny recipe (docs/algorithms.md#mssr: the paper's sample-efficiency
claim and its shaping ablation).

Every run starts from the recipe's shipped warm start (``recipes/shapes/tiny.yaml``, ``assets/shapes-sft``) and
spends the same rollouts per step, 8 x ``--prompts``:

- ``grpo``: ``algo.preset=grpo``, G = 8 responses for each of P prompts per step.
- ``mssr``: ``algo.preset=mssr``, one response for each of 8P prompts per step, ``rho_rule: paper``.
- ``mssr_code``: the same with ``rho_rule: code`` (the forgetting rule the authors' code computes).
- ``spo``: single rollout without the entropy shaping (``algo.advantage=spo``), every other field as ``mssr``.

The recipe fixes the optimiser (lr 3e-4, cosine to 0 at ``--steps``), token-mean aggregation and the exact-match
reward for all four; the loss-side fields (clip range, dual clip, KL coefficient) are each preset's. The recipe sets
``algo.advantage``, ``algo.loss_agg`` and ``rollout.n`` itself, which a preset does not override, so they are set
here explicitly. The held-out accuracy (greedy, ``eval/accuracy`` of ``metrics.jsonl``) is logged every
``--eval-every`` steps on ``--eval-samples`` records and put against rollouts consumed = step x prompts x n. The
single-rollout methods also run the initial policy once over the training prompts before step 1 (MSSR's tracker
initialisation); those rollouts are not in the x axis (the brief's step x prompts x n) and are reported separately
as ``init_rollouts`` in the JSON.

    OMP_NUM_THREADS=1 python benchmarks/mssr_vs_grpo.py [--steps 60 --seeds 3 --prompts 8 --out runs/mssr_vs_grpo]

Writes ``<out>/curves.json`` (every curve of every run plus the seed means) and ``<out>/accuracy_vs_rollouts.png``
(seed mean and min-max band per method). The last line is ``rollouts to GRPO's final accuracy: mssr X grpo Y ratio
Z``, X and Y the first logged rollout count at which each method's seed-mean curve reaches GRPO's final seed-mean
accuracy, Z = X / Y (``mssr never`` when it does not; the paper claims Z of about 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from recipe_runs import train_recipe

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "shapes" / "tiny.yaml"
GROUP = 8  # GRPO's G; the single-rollout methods take GROUP times its prompts per step
METHODS = ("grpo", "mssr", "mssr_code", "spo")
LOGGED = ("reward/mean", "entropy", "kl", "mssr/rho", "spo/rho", "mssr/value_mean", "spo/value_mean")


def _flatten(prefix: str, value: Any) -> list[str]:
    """``{'a': {'b': 1}}`` -> ``['a.b=1']`` (values as JSON, which the config's YAML parser reads)."""
    if isinstance(value, dict) and value:
        return [o for k, v in value.items() for o in _flatten(f"{prefix}.{k}", v)]
    return [f"{prefix}={json.dumps(value)}"]


def method_overrides(method: str, prompts: int) -> list[str]:
    """Config overrides of one method on top of the tiny recipe, at ``GROUP * prompts`` rollouts per step."""
    if method == "grpo":
        return [
            "algo.preset=grpo",
            "algo.advantage=grpo",
            f"rollout.n={GROUP}",
            f"train.prompts_per_step={prompts}",
        ]
    single = ["rollout.n=1", f"train.prompts_per_step={GROUP * prompts}"]
    if method in ("mssr", "mssr_code"):
        rule = "paper" if method == "mssr" else "code"
        return ["algo.preset=mssr", "algo.advantage=mssr", f"algo.advantage_options.rho_rule={rule}", *single]
    if method == "spo":
        # The mssr preset's fields without the preset itself: its advantage_options carry the shaping's ``entropy``
        # option, which a preset merge cannot remove and ``spo`` does not take.
        from mmrl.presets import PRESETS

        algo = dict(PRESETS["mssr"]["algo"])
        algo["advantage"] = "spo"
        algo["advantage_options"] = {k: v for k, v in algo["advantage_options"].items() if k != "entropy"}
        algo["advantage_options"]["rho_rule"] = "paper"
        return [*_flatten("algo", algo), *single]
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def run_one(method: str, seed: int, args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """Train one (method, seed) in this process and return its eval curve and per-step diagnostics."""
    out = args.out / "runs" / f"{method}-s{seed}"
    data_overrides = [f"data.train={data / 'train.jsonl'}", f"data.eval={data / 'eval.jsonl'}"]
    cfg, rows, wall = train_recipe(
        RECIPE,
        out,
        [*data_overrides, *method_overrides(method, args.prompts)],
        seed=seed,
        steps=args.steps,
        eval_every=args.eval_every,
        eval_samples=args.eval_samples,
    )
    per_step = cfg.train.prompts_per_step * cfg.rollout.n
    evals = sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r)
    init = next((r["init/prompts"] for r in rows if "init/prompts" in r), 0)
    steps = [r for r in rows if r.get("step", 0) > 0 and "reward/mean" in r]
    return {
        "method": method,
        "seed": seed,
        "wall_s": wall,
        "rollouts_per_step": per_step,
        "init_rollouts": init,
        "eval_steps": [s for s, _ in evals],
        "rollouts": [s * per_step for s, _ in evals],
        "accuracy": [a for _, a in evals],
        "train": {k: [r.get(k) for r in steps] for k in LOGGED if any(k in r for r in steps)},
    }


def first_reach(x: list[int], y: np.ndarray, target: float) -> int | None:
    """The first logged rollout count at which ``y`` is at least ``target`` (1e-9 slack for float means)."""
    hit = np.nonzero(y >= target - 1e-9)[0]
    return int(x[hit[0]]) if len(hit) else None


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Seed mean, min and max of each method's accuracy curve (all seeds share the eval steps)."""
    out = {}
    for m in METHODS:
        rs = [r for r in runs if r["method"] == m]
        if not rs:
            continue
        acc = np.array([r["accuracy"] for r in rs])  # [seeds, evals]
        out[m] = {
            "rollouts": rs[0]["rollouts"],
            "mean": acc.mean(0).tolist(),
            "min": acc.min(0).tolist(),
            "max": acc.max(0).tolist(),
            "final_mean": float(acc[:, -1].mean()),
            "best_mean": float(acc.mean(0).max()),
        }
    return out


def plot(summary: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m, s in summary.items():
        (line,) = ax.plot(s["rollouts"], s["mean"], marker="o", ms=3, label=m)
        ax.fill_between(s["rollouts"], s["min"], s["max"], color=line.get_color(), alpha=0.15)
    ax.set_xlabel("rollouts consumed (step x prompts x n)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60, help="training steps per run")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per method (train.seed 0..seeds-1)")
    ap.add_argument(
        "--prompts", type=int, default=8, help="GRPO's prompts per step (single rollout: 8x this)"
    )
    ap.add_argument("--eval-every", type=int, default=10, help="steps between held-out evaluations")
    ap.add_argument("--eval-samples", type=int, default=100, help="held-out records per evaluation")
    ap.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS)
    )
    ap.add_argument("--out", type=Path, default=Path("runs/mssr_vs_grpo"), help="output folder")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from mmrl.recipes.shapes.data import build

    methods = [m for m in args.methods.split(",") if m]
    if "grpo" not in methods or "mssr" not in methods:
        raise SystemExit("--methods must include grpo and mssr: the last line compares them")
    data = args.out / "data"
    if not (data / "train.jsonl").exists():
        build(data)
    runs = []
    for m in methods:
        for seed in range(args.seeds):
            r = run_one(m, seed, args, data)
            runs.append(r)
            print(
                f"{m:9s} seed {seed}: acc {' '.join(f'{a:.2f}' for a in r['accuracy'])}  ({r['wall_s']:.0f} s)",
                flush=True,
            )
    summary = summarise(runs)
    target = summary["grpo"]["final_mean"]
    reach = {m: first_reach(s["rollouts"], np.array(s["mean"]), target) for m, s in summary.items()}
    per_step = GROUP * args.prompts
    title = f"shapes tiny, {args.seeds} seeds, {per_step} rollouts/step, {args.steps} steps (band: min-max)"
    plot(summary, args.out / "accuracy_vs_rollouts.png", title)
    result = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "grpo_final_mean": target,
        "rollouts_to_grpo_final": reach,
        "summary": summary,
        "runs": runs,
    }
    (args.out / "curves.json").write_text(json.dumps(result, indent=1))
    print(f"{'method':10s} {'final':>6s} {'best':>6s} {'reach':>7s}")
    for m, s in summary.items():
        print(f"{m:10s} {s['final_mean']:6.3f} {s['best_mean']:6.3f} {str(reach[m]):>7s}")
    print(f"wrote {args.out / 'accuracy_vs_rollouts.png'} and {args.out / 'curves.json'}")
    x, y = reach["mssr"], reach["grpo"]
    ratio = f"{x / y:.2f}" if x is not None and y else "n/a"
    print(f"rollouts to GRPO's final accuracy: mssr {x if x is not None else 'never'} grpo {y} ratio {ratio}")


if __name__ == "__main__":
    main()
