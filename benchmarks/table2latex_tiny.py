"""The table2latex tiny recipe over 3 seeds: held-out reward at the start (the shipped warm start) and at the end.

    python benchmarks/table2latex_tiny.py [--seeds 0 1 2] [--steps N] [--out runs/bench-table2latex-tiny]

Each seed trains ``recipes/table2latex/tiny.yaml`` as shipped (through :func:`recipe_runs.train_recipe`, so the run
is the CLI's) and prints the step-0 and final greedy held-out reward (``eval/reward_mean``: the ``latex_table``
continuous score, compile x (TEDS-S + visual) / 2) and ``eval/accuracy`` (score >= ``eval.success_threshold``),
with the wall time. The trainer logs the held-out score but not its parts, so the parts are measured here: the
start model and each final checkpoint answer the same held-out tables greedily, and the ``latex_table`` reward (the
run's own options) scores them; its mean must equal the logged ``eval/reward_mean`` (checked, a mismatch fails).
Besides the reward's parts (compile rate, TEDS-S, visual similarity) it prints full TEDS (cell text included) and
the share of answers with the reference's number of rows and columns: what RL changed, part by part.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from recipe_runs import seed_options, train_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "table2latex" / "tiny.yaml"


def heldout_parts(cfg: Any, model_path: str | Path) -> dict[str, float]:
    """Greedy answers of ``model_path`` to the run's held-out records, scored part by part by the run's reward."""
    import torch

    from mmrl.data import load_split
    from mmrl.eval.runner import make_engine
    from mmrl.model.policy import Policy
    from mmrl.recipes.table2latex.convert import table_shape
    from mmrl.rewards.latex_table import extract_block, latex_table
    from mmrl.rewards.latex_table_html import LatexTableParseError, latex_to_html
    from mmrl.rewards.teds import teds
    from mmrl.rollout import SamplingParams
    from mmrl.train.collect import reward_inputs

    samples = load_split(cfg.data, cfg.data.eval, None)[: cfg.eval.max_samples]
    policy = Policy.from_pretrained(replace(cfg.model, path=str(model_path)))
    engine = make_engine("hf", policy, cfg.rollout.batch_size)
    prompts = [policy.encode(s) for s in samples]
    max_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    with torch.random.fork_rng():
        torch.manual_seed(cfg.train.seed + 7919)
        groups = engine.generate(prompts, SamplingParams(1, cfg.eval.temperature, 1.0, 0, max_new))
    inputs = [
        ri
        for s, p, g in zip(samples, prompts, groups)
        for ri in reward_inputs(s, p, [g[0].text], [len(g[0].token_ids)])
    ]
    (entry,) = cfg.rewards
    results = latex_table(inputs, **entry.options)
    full, shape_ok = [], []
    for s, x in zip(samples, inputs):
        ref_html = latex_to_html(s.answer)
        try:
            pred_html = latex_to_html(extract_block(x.response, ("latex", "tex")))
        except LatexTableParseError:
            full.append(0.0)
            shape_ok.append(0.0)
            continue
        full.append(float(teds(pred_html, ref_html)))
        shape_ok.append(float(table_shape(pred_html)[:2] == table_shape(ref_html)[:2]))
    n = len(results)
    out = {"reward": sum(r.score for r in results) / n}
    for part in ("compile", "teds_s", "visual"):
        out[part] = sum(r.parts.get(part, 0.0) for r in results) / n
    out["teds"] = sum(full) / n
    out["shape"] = sum(shape_ok) / n
    return out


def _fmt(d: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.3f}" for k, v in d.items())


def main() -> None:
    a, base, steps = seed_options(__doc__.split("\n\n")[0], RECIPE, ROOT / "runs" / "bench-table2latex-tiny")
    t0 = time.perf_counter()
    start = heldout_parts(base, base.model.path)
    print(f"start model {base.model.path}: {_fmt(start)}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    finals: list[dict[str, float]] = []
    for seed in a.seeds:
        out = a.out / f"seed{seed}"
        cfg, rows, wall = train_recipe(
            RECIPE,
            out,
            a.overrides,
            seed=seed,
            steps=steps,
            eval_every=base.eval.every,
            eval_samples=base.eval.max_samples,
        )
        evals = [r for r in rows if "eval/reward_mean" in r]
        first, last = evals[0], evals[-1]
        parts = heldout_parts(cfg, out / "checkpoints" / f"step-{steps}" / "model")
        if abs(parts["reward"] - last["eval/reward_mean"]) > 1e-6:
            raise SystemExit(
                f"seed {seed}: re-scored held-out reward {parts['reward']:.6f} differs from the logged "
                f"eval/reward_mean {last['eval/reward_mean']:.6f}; the part measurement is not the run's eval"
            )
        finals.append({**parts, "accuracy": last["eval/accuracy"], "start": first["eval/reward_mean"]})
        curve = " ".join(f"{r['step']}:{r['eval/reward_mean']:.3f}" for r in evals)
        print(
            f"seed {seed}: held-out reward {first['eval/reward_mean']:.3f} -> {last['eval/reward_mean']:.3f}  "
            f"accuracy {first['eval/accuracy']:.3f} -> {last['eval/accuracy']:.3f}  wall {wall:.0f} s "
            f"({steps} steps)\n  curve {curve}\n  final parts: {_fmt(parts)}",
            flush=True,
        )
    rewards = [f["reward"] for f in finals]
    gains = [f["reward"] - f["start"] for f in finals]
    print(
        f"\n{len(finals)} seeds, {steps} steps: held-out reward start {start['reward']:.3f} -> final mean "
        f"{statistics.mean(rewards):.3f} (min {min(rewards):.3f}, max {max(rewards):.3f}, "
        f"sd {statistics.pstdev(rewards):.3f}); gain {statistics.mean(gains):+.3f} "
        f"(min {min(gains):+.3f}, max {max(gains):+.3f})"
    )
    for key in ("compile", "teds_s", "visual", "teds", "shape"):
        vals = [f[key] for f in finals]
        print(f"  {key:8s} start {start[key]:.3f} -> final mean {statistics.mean(vals):.3f} "
              f"(min {min(vals):.3f}, max {max(vals):.3f})")  # fmt: skip
    print(f"total wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
