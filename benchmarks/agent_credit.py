"""Step credit and entropy methods on the multi-turn tiny recipes (issue 37), at equal episodes: each method is the
recipe unchanged but for its ``algo`` keys, trained from the shipped warm start for the same seeds and steps.

    OMP_NUM_THREADS=1 python benchmarks/agent_credit.py zoom [--methods gigpo episode_grpo salt salt_prefix epo igpo]
        [--seeds 0 1 2] [--steps N] [--out runs/agent_credit_zoom] [key=value ...]

Per method and seed it prints the held-out ``success`` and ``step_accuracy`` (greedy episodes, the validator's:
:mod:`agent_tiny`) before step 1 and after the last step; then one table row per method: final mean (min-max) and
gain over the seeds. A method whose ``<out>/<method>/summary.json`` exists is read back, not rerun (so a long
comparison can be run in parts), and so is a seed whose ``<out>/<method>/seed<S>-<steps>.json`` exists (run
``--seeds 0`` for every method first, then the other seeds); delete the folder to rerun it. Writes ``<out>/summary.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from agent_tiny import RECIPES, SERIES, run_one
from recipe_runs import seed_options, seed_summary

ROOT = Path(__file__).resolve().parent.parent
# each method's overrides over the recipe (which runs gigpo); epo is gigpo's advantages with EPO's loss
METHODS: dict[str, list[str]] = {
    "gigpo": ["algo.advantage=gigpo"],
    "episode_grpo": ["algo.advantage=episode_grpo"],
    "salt": ["algo.advantage=salt"],  # merging steps by state, its default
    # the prefix-tree key: a merged step has the same context and tokens in every trajectory of its node, so
    # on-policy the update is episode_grpo's (docs/credit.md#salt); kept to show that
    "salt_prefix": ["algo.advantage=salt", "algo.advantage_options.key=prefix"],
    "epo": ["algo.advantage=gigpo", "algo.loss=epo"],
    "igpo": ["algo.advantage=igpo"],
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in RECIPES:
        sys.exit(
            f"usage: agent_credit.py {{{'|'.join(RECIPES)}}} [--methods ...] [--seeds ...] [--steps N] [--out DIR]"
        )
    name = sys.argv.pop(1)
    methods = list(METHODS)
    if "--methods" in sys.argv:
        i = sys.argv.index("--methods")
        j = i + 1
        while j < len(sys.argv) and not sys.argv[j].startswith("-") and "=" not in sys.argv[j]:
            j += 1
        methods = sys.argv[i + 1 : j]
        del sys.argv[i:j]
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            sys.exit(f"unknown methods {unknown}; known: {list(METHODS)}")
    recipe = RECIPES[name]
    args, base, steps = seed_options(__doc__.split("\n\n")[0], recipe, ROOT / "runs" / f"agent_credit_{name}")
    os.chdir(ROOT)
    extra, root = list(args.overrides), args.out
    table: dict[str, Any] = {}
    for method in methods:
        folder = root / method
        done = folder / "summary.json"
        if done.exists() and [r["seed"] for r in json.loads(done.read_text())["runs"]] == args.seeds:
            table[method] = json.loads(done.read_text())
            print(f"{method}: read back from {done}", flush=True)
            continue
        args.overrides, args.out = [*METHODS[method], *extra], folder
        runs = []
        for seed in args.seeds:
            kept = folder / f"seed{seed}-{steps}.json"  # one seed's result, so a comparison can span sessions
            if kept.exists():
                runs.append(json.loads(kept.read_text()))
                print(f"{method} seed {seed}: read back from {kept}", flush=True)
                continue
            r = run_one(recipe, seed, args, base, steps)
            runs.append(r)
            folder.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps(r, indent=1))
            parts = ", ".join(f"{n} {r[n][0]:.3f} -> {r[n][-1]:.3f}" for n in SERIES)
            print(
                f"{method} seed {seed}: {parts}; wall {r['wall_s']:.0f} s, load {r['load_after']}", flush=True
            )
        print(f"{method}:")
        summary = seed_summary(runs, SERIES)
        folder.mkdir(parents=True, exist_ok=True)
        table[method] = {"runs": runs, "summary": summary, "steps": steps, "overrides": args.overrides}
        done.write_text(json.dumps(table[method], indent=1))
    print(
        f"\n{name}, {steps} steps, seeds {args.seeds}: mean (min-max) over seeds; 'mean success' averages every"
    )
    print(
        "evaluation after step 0 (how fast it learns: the tiny zoom recipe's final numbers sit near its ceiling)"
    )
    print("| method | mean success | final success | gain | final step accuracy | gain | wall per seed (s) |")
    print("|---|---|---|---|---|---|---|")
    for method, t in table.items():
        s, walls = t["summary"], [r["wall_s"] for r in t["runs"]]
        auc = [sum(r["success"][1:]) / max(1, len(r["success"]) - 1) for r in t["runs"]]
        cells = [f"{sum(auc) / len(auc):.3f} ({min(auc):.3f}-{max(auc):.3f})"]
        for n in ("success", "step_accuracy"):
            f, g = s[n]["final"], s[n]["gain"]
            cells += [f"{sum(f) / len(f):.3f} ({min(f):.3f}-{max(f):.3f})", f"{sum(g) / len(g):+.3f}"]
        print(f"| {method} | {' | '.join(cells)} | {min(walls):.0f}-{max(walls):.0f} |")
    root.mkdir(parents=True, exist_ok=True)
    (root / "summary.json").write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
