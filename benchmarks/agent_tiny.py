"""The multi-turn tiny recipes over seeds (issue 20): does GiGPO raise held-out success and per-step correctness from
the shipped warm start? ``zoom`` (recipes/zoom/tiny.yaml: zoom on the red box, then name the dot's colour) or
``gui_agent`` (recipes/gui_agent/tiny.yaml: press the tile the page marks, again on the re-arranged screen, then
Done, in Chromium).

Each run is the recipe unchanged but for ``train.seed`` (and, with ``--steps``, its length). Per seed it prints,
before step 1 and after the last step, on the recipe's held-out tasks (greedy episodes, the validator's):
- ``success``: the share of episodes the env scores 1 (``eval/accuracy``);
- ``step_accuracy``: the share of steps the env says were the right action (``eval/step_accuracy``: the zoom
  contained the target / the answer was right; the click was the oracle's next one);
- ``turns``: actions per episode (``eval/turns_mean``);
then the mean and spread over seeds, and the wall time with the load average (the machine is shared).

    OMP_NUM_THREADS=1 python benchmarks/agent_tiny.py zoom [--seeds 0 1 2 --out runs/agent_tiny_zoom]

Writes ``<out>/summary.json``; run folders go under ``<out>/runs``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from recipe_runs import seed_options, seed_summary, series_run

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {
    "zoom": ROOT / "recipes" / "zoom" / "tiny.yaml",
    "gui_agent": ROOT / "recipes" / "gui_agent" / "tiny.yaml",
}
SERIES = {"success": "eval/accuracy", "step_accuracy": "eval/step_accuracy", "turns": "eval/turns_mean"}


def run_one(recipe: Path, seed: int, args: Any, base: Any, steps: int) -> dict[str, Any]:
    out, rows = series_run(recipe, seed, args, base, steps, SERIES, "eval/accuracy")
    train = [r for r in rows if "episode/success" in r]
    out["train_success"] = [r["episode/success"] for r in train]
    out["train_step_accuracy"] = [r.get("episode/step_accuracy", float("nan")) for r in train]
    return out


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in RECIPES:
        sys.exit(
            f"usage: agent_tiny.py {{{'|'.join(RECIPES)}}} [--seeds ...] [--steps N] [--out DIR] [key=value ...]"
        )
    name = sys.argv.pop(1)
    recipe = RECIPES[name]
    args, base, steps = seed_options(__doc__.split("\n\n")[0], recipe, ROOT / "runs" / f"agent_tiny_{name}")
    os.chdir(ROOT)
    runs = []
    for seed in args.seeds:
        r = run_one(recipe, seed, args, base, steps)
        runs.append(r)
        parts = ", ".join(f"{n} {r[n][0]:.3f} -> {r[n][-1]:.3f}" for n in SERIES)
        k = max(1, len(r["train_success"]) // 5)
        tr = sum(r["train_success"][:k]) / k, sum(r["train_success"][-k:]) / k
        print(
            f"seed {seed}: {parts}; train success (first/last {k} steps) {tr[0]:.3f} -> {tr[1]:.3f}; "
            f"wall {r['wall_s']:.0f} s, load {r['load_before']} -> {r['load_after']}",
            flush=True,
        )
    summary = seed_summary(runs, SERIES)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
