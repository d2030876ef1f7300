"""VADE vs uniform prompt sampling on the shapes tiny recipe at equal rollouts (docs/algorithms.md#vade: the claim that VADE
keeps more groups informative than uniform sampling, at no extra rollout cost, and that this helps accuracy).

Both arms start from the recipe's shipped warm start (``recipes/shapes/tiny.yaml``, ``assets/shapes-sft``) and run the
recipe unchanged (GRPO, G = 8, 16 prompts per step, lr 3e-4 cosine to 0 at ``--steps``, token-mean, exact match)
except for ``sampler.name``: ``uniform`` (shuffled epochs without replacement) or ``vade`` (Thompson draws from
decayed Beta counts, top-k by p (1 - p)^2, the sampler's default l1 = 0.2, l2 = 0.999, whole-dataset pool). Every
step therefore consumes the same 16 x 8 rollouts in both arms; rollouts consumed = step x prompts x n.

Training records. VADE learns about a record only when it visits it, and an unvisited record draws p ~ U(0, 1),
whose gain beats that of a record seen solved (8/8) or hopeless (0/8). On the recipe's 2,000 records a 100-step run
makes 1,600 selections, so VADE spends nearly the whole run on a first sweep of unseen records, which is uniform
sampling in another order. ``--train-records`` (default 256) trains both arms on the first N records of the recipe's
train split instead (a random draw of its kinds, since the builder draws each record's kind at random), so the
first sweep takes about N / 16 steps and each record is visited about 6 times in 100 steps: that is the regime where
VADE's choice can matter. ``--train-records 0`` uses all 2,000. The held-out set is the recipe's 200 eval records,
scored greedily every ``--eval-every`` steps (and before step 1).

    OMP_NUM_THREADS=1 python benchmarks/vade_recipe.py [--steps 100 --seeds 3 --train-records 256 --out runs/vade_recipe]

Writes ``<out>/curves.json`` (every run's eval curve and per-step ``rollout/groups_with_signal``, ``reward/mean``,
``vade/p_mean``, ``vade/seen``, plus seed means) and ``<out>/vade_vs_uniform.png`` (two panels against rollouts:
held-out accuracy, and groups_with_signal as a ``--smooth``-step moving average; seed mean with a min-max band). The
last line is ``groups_with_signal: vade X uniform Y; final accuracy: vade A uniform B`` (seed means;
groups_with_signal averaged over all steps).
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
ARMS = ("uniform", "vade")
PER_STEP = ("rollout/groups_with_signal", "reward/mean", "vade/p_mean", "vade/seen", "vade/select_ms")


def prepare_data(folder: Path, train_records: int) -> Path:
    """Build the recipe's splits into ``folder`` (the builder is seeded, so they equal the recipe's own) and return
    the training file: the whole train split, or its first ``train_records`` records beside it (same image paths)."""
    from mmrl.recipes.shapes.data import build

    if not (folder / "train.jsonl").exists():
        build(folder)
    lines = [line for line in (folder / "train.jsonl").read_text().splitlines() if line.strip()]
    if train_records <= 0 or train_records >= len(lines):
        return folder / "train.jsonl"
    subset = folder / f"train_first{train_records}.jsonl"
    subset.write_text("\n".join(lines[:train_records]) + "\n")
    return subset


def run_one(arm: str, seed: int, args: argparse.Namespace, train: Path) -> dict[str, Any]:
    """Train one (arm, seed) in this process; return its eval curve and per-step diagnostics."""
    out = args.out / "runs" / f"{arm}-s{seed}"
    overrides = [
        f"data.train={train}",
        f"data.eval={train.parent / 'eval.jsonl'}",
        f"sampler.name={arm}",
        f"train.prompts_per_step={args.prompts}",
    ]
    cfg, rows, wall = train_recipe(
        RECIPE,
        out,
        overrides,
        seed=seed,
        steps=args.steps,
        eval_every=args.eval_every,
        eval_samples=args.eval_samples,
    )
    per_step = cfg.train.prompts_per_step * cfg.rollout.n
    evals = sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r)
    steps = sorted((r for r in rows if r.get("step", 0) > 0 and "reward/mean" in r), key=lambda r: r["step"])
    return {
        "arm": arm,
        "seed": seed,
        "wall_s": wall,
        "rollouts_per_step": per_step,
        "eval_steps": [s for s, _ in evals],
        "eval_rollouts": [s * per_step for s, _ in evals],
        "accuracy": [a for _, a in evals],
        "step_rollouts": [r["step"] * per_step for r in steps],
        "train": {k: [r.get(k) for r in steps] for k in PER_STEP if any(k in r for r in steps)},
    }


def moving_average(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` steps (shorter at the start), along the last axis."""
    c = np.cumsum(np.pad(y, [(0, 0)] * (y.ndim - 1) + [(1, 0)]), axis=-1)
    idx = np.arange(1, y.shape[-1] + 1)
    lo = np.maximum(idx - window, 0)
    return (c[..., idx] - c[..., lo]) / (idx - lo)


def summarise(runs: list[dict[str, Any]], smooth: int) -> dict[str, dict[str, Any]]:
    """Per arm: seed mean / min / max of the accuracy curve and of the smoothed groups_with_signal curve, the final
    accuracy and the all-steps mean of groups_with_signal (all seeds of an arm share their steps)."""
    out = {}
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]
        if not rs:
            continue
        acc = np.array([r["accuracy"] for r in rs])  # [seeds, evals]
        gws = np.array([r["train"]["rollout/groups_with_signal"] for r in rs], dtype=float)  # [seeds, steps]
        gws_s = moving_average(gws, smooth)
        reward = np.array([r["train"]["reward/mean"] for r in rs], dtype=float)
        q = max(1, gws.shape[1] // 4)
        out[arm] = {
            "eval_rollouts": rs[0]["eval_rollouts"],
            "acc_mean": acc.mean(0).tolist(),
            "acc_min": acc.min(0).tolist(),
            "acc_max": acc.max(0).tolist(),
            "step_rollouts": rs[0]["step_rollouts"],
            "gws_smoothed_mean": gws_s.mean(0).tolist(),
            "gws_smoothed_min": gws_s.min(0).tolist(),
            "gws_smoothed_max": gws_s.max(0).tolist(),
            "final_accuracy_mean": float(acc[:, -1].mean()),
            "final_accuracy_per_seed": acc[:, -1].tolist(),
            "best_accuracy_mean": float(acc.mean(0).max()),
            "groups_with_signal_mean": float(gws.mean()),
            "groups_with_signal_per_seed": gws.mean(1).tolist(),
            "groups_with_signal_first_quarter": float(gws[:, :q].mean()),
            "groups_with_signal_last_quarter": float(gws[:, -q:].mean()),
            "reward_mean": float(reward.mean()),
            "wall_s_mean": float(np.mean([r["wall_s"] for r in rs])),
        }
        if "vade/seen" in rs[0]["train"]:
            out[arm]["final_seen_mean"] = float(np.mean([r["train"]["vade/seen"][-1] for r in rs]))
    return out


def plot(summary: dict[str, dict[str, Any]], path: Path, title: str, smooth: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_gws) = plt.subplots(1, 2, figsize=(11, 4.3))
    for arm, s in summary.items():
        (line,) = ax_acc.plot(s["eval_rollouts"], s["acc_mean"], marker="o", ms=3, label=arm)
        ax_acc.fill_between(
            s["eval_rollouts"], s["acc_min"], s["acc_max"], color=line.get_color(), alpha=0.15
        )
        ax_gws.plot(s["step_rollouts"], s["gws_smoothed_mean"], color=line.get_color(), label=arm)
        ax_gws.fill_between(
            s["step_rollouts"],
            s["gws_smoothed_min"],
            s["gws_smoothed_max"],
            color=line.get_color(),
            alpha=0.15,
        )
    ax_acc.set_ylabel("held-out accuracy (greedy)")
    ax_gws.set_ylabel(f"rollout/groups_with_signal ({smooth}-step moving average)")
    for ax in (ax_acc, ax_gws):
        ax.set_xlabel("rollouts consumed (step x prompts x n)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100, help="training steps per run")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per arm (train.seed 0..seeds-1)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step (the recipe's 16)")
    ap.add_argument(
        "--train-records",
        type=int,
        default=256,
        help="train on the first N records of the split (0: all 2,000)",
    )
    ap.add_argument("--eval-every", type=int, default=20, help="steps between held-out evaluations")
    ap.add_argument("--eval-samples", type=int, default=200, help="held-out records per evaluation")
    ap.add_argument(
        "--smooth", type=int, default=10, help="moving-average window of the groups_with_signal panel"
    )
    ap.add_argument("--out", type=Path, default=Path("runs/vade_recipe"), help="output folder")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    train = prepare_data(args.out / "data", args.train_records)
    n_train = sum(1 for line in train.read_text().splitlines() if line.strip())
    runs = []
    for seed in range(args.seeds):  # arms interleaved per seed: a cut-short run still compares like with like
        for arm in ARMS:
            r = run_one(arm, seed, args, train)
            runs.append(r)
            gws = float(np.mean(r["train"]["rollout/groups_with_signal"]))
            print(
                f"{arm:7s} seed {seed}: acc {' '.join(f'{a:.3f}' for a in r['accuracy'])}  "
                f"groups_with_signal {gws:.3f}  ({r['wall_s']:.0f} s)",
                flush=True,
            )
    summary = summarise(runs, args.smooth)
    per_step = args.prompts * 8
    title = (
        f"shapes tiny, {n_train} train records, {args.seeds} seeds, {per_step} rollouts/step, {args.steps} steps "
        "(line: seed mean, band: min-max)"
    )
    plot(summary, args.out / "vade_vs_uniform.png", title, args.smooth)
    result = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "train_file": str(train),
        "train_records_used": n_train,
        "summary": summary,
        "runs": runs,
    }
    (args.out / "curves.json").write_text(json.dumps(result, indent=1))
    print(
        f"{'arm':8s} {'final acc':>9s} {'best acc':>9s} {'gws all':>8s} {'gws q1':>7s} {'gws q4':>7s} {'reward':>7s}"
    )
    for arm, s in summary.items():
        print(
            f"{arm:8s} {s['final_accuracy_mean']:9.3f} {s['best_accuracy_mean']:9.3f} "
            f"{s['groups_with_signal_mean']:8.3f} {s['groups_with_signal_first_quarter']:7.3f} "
            f"{s['groups_with_signal_last_quarter']:7.3f} {s['reward_mean']:7.3f}"
        )
    print(f"wrote {args.out / 'vade_vs_uniform.png'} and {args.out / 'curves.json'}")
    v, u = summary["vade"], summary["uniform"]
    print(
        f"groups_with_signal: vade {v['groups_with_signal_mean']:.3f} uniform {u['groups_with_signal_mean']:.3f}; "
        f"final accuracy: vade {v['final_accuracy_mean']:.3f} uniform {u['final_accuracy_mean']:.3f}"
    )


if __name__ == "__main__":
    main()
