"""The geometry recipe's two tiny variants over seeds: MSSR (``recipes/geometry/tiny-mssr.yaml``, docs/algorithms.md#mssr)
and GRPO + VADE (``recipes/geometry/tiny-vade.yaml``, §1 and §3), each from the shipped warm start
(``assets/geometry-sft``) at the same 128 rollouts per step (128 prompts x 1 response vs 16 prompts x 8).

Each run is the recipe unchanged but for ``train.seed`` (and, with ``--steps``, its length). Per seed it prints the
greedy held-out accuracy before step 1 and after the last step (``eval/accuracy`` on the recipe's 200 held-out
records) and the run's wall time; then each variant's mean and spread (min-max and standard deviation) of start,
final and gain. Rollouts consumed = step x prompts x n; MSSR's tracker initialisation (one pass of the initial
policy over the 512 training prompts before step 1) is reported apart as ``init_rollouts``, as in
``mssr_vs_grpo.py``.

``rollout/groups_with_signal`` is the share of groups whose rewards are not all equal; a group of one never has
signal by that definition, so MSSR's is 0 throughout. The figure's middle panel shows it for GRPO + VADE, and the
right panel each variant's training reward (the data both variants learn from).

    OMP_NUM_THREADS=1 python benchmarks/geometry_tiny.py [--seeds 3 --out runs/geometry_tiny]

Writes ``benchmarks/results/geometry_tiny.png`` (held-out accuracy, groups_with_signal and training reward against
rollouts consumed; seed mean with a min-max band) and ``benchmarks/results/geometry_tiny.json`` (every curve, the
per-seed numbers and the summary); run folders go under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from recipe_runs import train_recipe

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {
    "mssr": ROOT / "recipes/geometry/tiny-mssr.yaml",
    "vade": ROOT / "recipes/geometry/tiny-vade.yaml",
}
RESULTS = Path(__file__).resolve().parent / "results"
PER_STEP = ("rollout/groups_with_signal", "reward/mean", "reward/format_think_answer", "entropy", "kl")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_one(variant: str, seed: int, args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """Train one (variant, seed) in this process; return its eval curve, per-step diagnostics and wall time."""
    from mmrl.config import load_config

    recipe = VARIANTS[variant]
    base = load_config(recipe)
    steps = args.steps or base.train.max_steps
    load_before = load_average()
    cfg, rows, wall = train_recipe(
        recipe,
        args.out / "runs" / f"{variant}-s{seed}",
        [f"data.train={data / 'train.jsonl'}", f"data.eval={data / 'eval.jsonl'}"],
        seed=seed,
        steps=steps,
        eval_every=base.eval.every,
        eval_samples=base.eval.max_samples,
    )
    per_step = cfg.train.prompts_per_step * cfg.rollout.n
    evals = sorted((r["step"], r) for r in rows if "eval/accuracy" in r)
    train = sorted((r for r in rows if r.get("step", 0) > 0 and "reward/mean" in r), key=lambda r: r["step"])
    final_kinds = {k.split("/")[-1]: v for k, v in evals[-1][1].items() if k.startswith("eval/accuracy/")}
    start_kinds = {k.split("/")[-1]: v for k, v in evals[0][1].items() if k.startswith("eval/accuracy/")}
    return {
        "variant": variant,
        "seed": seed,
        "wall_s": wall,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "rollouts_per_step": per_step,
        "init_rollouts": next((r["init/prompts"] for r in rows if "init/prompts" in r), 0),
        "eval_rollouts": [s * per_step for s, _ in evals],
        "accuracy": [r["eval/accuracy"] for _, r in evals],
        "start_by_kind": start_kinds,
        "final_by_kind": final_kinds,
        "step_rollouts": [r["step"] * per_step for r in train],
        "train": {k: [r.get(k) for r in train] for k in PER_STEP if any(k in r for r in train)},
    }


def _band(curves: list[list[float]]) -> dict[str, list[float]]:
    a = np.array(curves, dtype=float)  # [seeds, points]
    return {"mean": a.mean(0).tolist(), "min": a.min(0).tolist(), "max": a.max(0).tolist()}


def _spread(values: list[float]) -> dict[str, float]:
    a = np.array(values, dtype=float)
    return {
        "mean": float(a.mean()),
        "min": float(a.min()),
        "max": float(a.max()),
        "std": float(a.std(ddof=0)),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: start, final and gain (mean, min, max, std over seeds), wall time, and the seed-band curves."""
    out = {}
    for v in VARIANTS:
        rs = [r for r in runs if r["variant"] == v]
        if not rs:
            continue
        kinds = sorted(rs[0]["final_by_kind"])
        out[v] = {
            "seeds": [r["seed"] for r in rs],
            "start": _spread([r["accuracy"][0] for r in rs]),
            "final": _spread([r["accuracy"][-1] for r in rs]),
            "gain": _spread([r["accuracy"][-1] - r["accuracy"][0] for r in rs]),
            "wall_s": _spread([r["wall_s"] for r in rs]),
            "start_by_kind": {k: float(np.mean([r["start_by_kind"][k] for r in rs])) for k in kinds},
            "final_by_kind": {k: float(np.mean([r["final_by_kind"][k] for r in rs])) for k in kinds},
            "eval_rollouts": rs[0]["eval_rollouts"],
            "accuracy": _band([r["accuracy"] for r in rs]),
            "step_rollouts": rs[0]["step_rollouts"],
            "train": {k: _band([r["train"][k] for r in rs]) for k in rs[0]["train"]},
        }
    return out


def moving_average(y: list[float], window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` points (shorter at the start)."""
    c = np.cumsum(np.concatenate([[0.0], np.asarray(y, dtype=float)]))
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def plot(summary: dict[str, dict[str, Any]], path: Path, title: str, smooth: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    colours = {"mssr": "tab:blue", "vade": "tab:orange"}
    labels = {"mssr": "MSSR (128 x 1)", "vade": "GRPO + VADE (16 x 8)"}
    for v, s in summary.items():
        c, x = colours[v], s["eval_rollouts"]
        acc = s["accuracy"]
        axes[0].plot(x, acc["mean"], marker="o", ms=3, color=c, label=labels[v])
        axes[0].fill_between(x, acc["min"], acc["max"], color=c, alpha=0.15)
        for ax, key in ((axes[1], "rollout/groups_with_signal"), (axes[2], "reward/mean")):
            band = {k: moving_average(vals, smooth) for k, vals in s["train"][key].items()}
            ax.plot(s["step_rollouts"], band["mean"], color=c, label=labels[v])
            ax.fill_between(s["step_rollouts"], band["min"], band["max"], color=c, alpha=0.15)
    axes[0].set_ylabel("held-out accuracy (greedy)")
    axes[1].set_ylabel(f"rollout/groups_with_signal ({smooth}-step mean)")
    axes[1].text(0.02, 0.02, "MSSR: groups of one, 0 by definition", transform=axes[1].transAxes, fontsize=8)
    axes[2].set_ylabel(f"training reward/mean ({smooth}-step mean)")
    for ax in axes:
        ax.set_xlabel("rollouts consumed (step x prompts x n)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds per variant (train.seed 0..seeds-1)")
    ap.add_argument("--steps", type=int, default=0, help="training steps per run (0: the recipe's max_steps)")
    ap.add_argument("--variants", default="mssr,vade", help="comma-separated subset of mssr, vade")
    ap.add_argument("--smooth", type=int, default=10, help="moving-average window of the per-step panels")
    ap.add_argument(
        "--out", type=Path, default=Path("runs/geometry_tiny"), help="folder for the runs and data"
    )
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder for the PNG and the JSON")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from mmrl.recipes.geometry.data import build

    data = args.out / "data"
    if not (data / "train.jsonl").exists():
        build(data)  # seeded: the same records as the recipe's own data folder
    variants = [v for v in args.variants.split(",") if v]
    t0 = time.perf_counter()
    runs = []
    for seed in range(
        args.seeds
    ):  # variants interleaved per seed: a cut-short run still compares like with like
        for v in variants:
            r = run_one(v, seed, args, data)
            runs.append(r)
            print(
                f"{v:5s} seed {seed}: held-out accuracy start {r['accuracy'][0]:.3f} -> final "
                f"{r['accuracy'][-1]:.3f} ({r['accuracy'][-1] - r['accuracy'][0]:+.3f})  wall {r['wall_s']:.0f} s  "
                f"(load average {r['load_average_before']} -> {r['load_average_after']})",
                flush=True,
            )
    summary = summarise(runs)
    args.results.mkdir(parents=True, exist_ok=True)
    steps = len(runs[0]["step_rollouts"])
    title = (
        f"geometry tiny, {args.seeds} seeds, 128 rollouts/step, {steps} steps "
        "(line: seed mean, band: min-max; MSSR's 512-rollout tracker initialisation not on the x axis)"
    )
    plot(summary, args.results / "geometry_tiny.png", title, args.smooth)
    result = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "total_wall_s": time.perf_counter() - t0,
        "summary": summary,
        "runs": runs,
    }
    (args.results / "geometry_tiny.json").write_text(json.dumps(result, indent=1))
    print(f"{'variant':8s} {'start':>15s} {'final':>15s} {'gain':>15s} {'wall s':>8s}")
    for v, s in summary.items():
        cells = [
            f"{s[k]['mean']:.3f} ({s[k]['min']:.3f}-{s[k]['max']:.3f})" for k in ("start", "final", "gain")
        ]
        print(f"{v:8s} {cells[0]:>15s} {cells[1]:>15s} {cells[2]:>15s} {s['wall_s']['mean']:8.0f}")
        kinds = " ".join(
            f"{k} {s['start_by_kind'][k]:.2f}->{s['final_by_kind'][k]:.2f}" for k in s["final_by_kind"]
        )
        print(f"         by kind (seed mean): {kinds}")
    print(f"wrote {args.results / 'geometry_tiny.png'} and {args.results / 'geometry_tiny.json'}")


if __name__ == "__main__":
    main()
