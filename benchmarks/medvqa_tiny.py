"""The medvqa tiny recipe over seeds: does GRPO with MediX-R1's composite reward (a judge model and an encoder,
docs/rewards.md#domain-rewards) raise the held-out reward and the true accuracy from the shipped warm start
(``assets/medvqa-sft``)? (``recipes/medvqa/tiny.yaml``.)

Each run is the recipe unchanged but for ``train.seed`` (and, with ``--steps``, its length). Per seed it prints,
before step 1 and after the last step, on the recipe's 200 held-out tiles (greedy answers):
- ``reward``: the medix composite (``eval/reward_mean``);
- ``accuracy``: the share the tiny judge says YES to (``eval/part/.../judge``);
- ``oracle``: the share naming the tile's tissue and lesion exactly (the recipe's synthetic truth);
- ``judge agreement``: the share where the judge's verdict equals the oracle's (the judge's accuracy on the
  policy's own answers);
then the mean and spread over seeds, and the wall time with the load average (the machine is shared).

    OMP_NUM_THREADS=1 python benchmarks/medvqa_tiny.py [--seeds 0 1 2 --out runs/medvqa_tiny]

Writes ``<out>/summary.json``; run folders go under ``<out>/runs``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from recipe_runs import seed_options, seed_summary, series_run

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "medvqa" / "tiny.yaml"
PART = "eval/part/medix_with_oracle"
SERIES = {
    "reward": "eval/reward_mean",
    "judge_yes": f"{PART}/judge",
    "oracle": f"{PART}/oracle",
    "judge_agreement": f"{PART}/judge_agrees",
}


def run_one(seed: int, args: Any, base: Any, steps: int) -> dict[str, Any]:
    return series_run(RECIPE, seed, args, base, steps, SERIES, "eval/reward_mean")[0]


def main() -> None:
    args, base, steps = seed_options(__doc__.split("\n\n")[0], RECIPE, ROOT / "runs" / "medvqa_tiny")
    os.chdir(ROOT)
    runs = []
    for seed in args.seeds:
        r = run_one(seed, args, base, steps)
        runs.append(r)
        parts = ", ".join(f"{name} {r[name][0]:.3f} -> {r[name][-1]:.3f}" for name in SERIES)
        print(
            f"seed {seed}: {parts}; wall {r['wall_s']:.0f} s, load {r['load_before']} -> {r['load_after']}",
            flush=True,
        )
    summary = seed_summary(runs, SERIES)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
