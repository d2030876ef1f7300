"""ArenaRL against pointwise scoring on the medvqa tiny recipe (issue 37): does a tournament spread a group's rewards
where the pointwise judge compresses them, and does the policy then learn the true answer better?

Two arms from the same warm start (``assets/medvqa-sft``), the same data, GRPO settings and seeds:
- ``pointwise``: ``recipes/medvqa/tiny.yaml``, MediX-R1's composite (the tiny YES/NO judge, the encoder's cosine,
  the modality tag, the format term);
- ``arena``: ``recipes/medvqa/tiny-arena.yaml``, each group's answers placed by a seeded single-elimination
  tournament of the tiny pairwise judge (``assets/tiny-arena-judge``), the place as the reward, plus the format term.

Per arm and seed it prints the held-out true accuracy (``oracle``: the greedy answer names the tile's tissue and
lesion exactly; the medix arm's ``eval/part/medix_with_oracle/oracle``, the arena arm's
``eval/part/arena/true_correct``, the same function) before step 1 and after the last step, and over the training
steps: the within-group reward spread (``rollout/group_reward_std``, the population std of a group's rewards, mean
over groups), the share of groups with any spread (``rollout/groups_with_signal``), the training answers' true
accuracy, and for the arena arm how often the tournament placed a correct answer above a wrong one
(``order_accuracy``). Then a table: mean (min-max) over seeds.

    OMP_NUM_THREADS=1 python benchmarks/arena_medvqa.py [--arms pointwise arena] [--seeds 0 1 2]
        [--steps N] [--out runs/arena_medvqa]

An arm's seed whose ``<out>/<arm>/seed<S>-<steps>.json`` exists is read back, not rerun. Writes
``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from recipe_runs import series_run

ROOT = Path(__file__).resolve().parent.parent
ARMS = {
    "pointwise": (ROOT / "recipes" / "medvqa" / "tiny.yaml", "medix_with_oracle", "oracle"),
    "arena": (ROOT / "recipes" / "medvqa" / "tiny-arena.yaml", "arena", "true_correct"),
}


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else float("nan")


def run_one(arm: str, seed: int, args: Any, steps: int) -> dict[str, Any]:
    from mmrl.config import load_config

    recipe, reward, part = ARMS[arm]
    base = load_config(recipe, [])
    run_args = argparse.Namespace(out=args.out / arm, overrides=[])
    series = {"oracle": f"eval/part/{reward}/{part}"}
    out, rows = series_run(recipe, seed, run_args, base, steps, series, series["oracle"])
    train = [r for r in rows if "rollout/group_reward_std" in r]
    out["group_reward_std"] = _mean([r["rollout/group_reward_std"] for r in train])
    out["groups_with_signal"] = _mean([r["rollout/groups_with_signal"] for r in train])
    out["train_true"] = [r.get(f"reward/{reward}/{part}", float("nan")) for r in train]
    out["order_accuracy"] = _mean([r.get("reward/arena/order_accuracy", float("nan")) for r in train])
    out["parse_failures"] = _mean([r.get("reward/arena/parse_failures", float("nan")) for r in train])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "arena_medvqa")
    args = p.parse_args()
    os.chdir(ROOT)
    table: dict[str, list[dict[str, Any]]] = {}
    for arm in args.arms:
        table[arm] = []
        for seed in args.seeds:
            kept = args.out / arm / f"seed{seed}-{args.steps}.json"
            if kept.exists():
                r = json.loads(kept.read_text())
                print(f"{arm} seed {seed}: read back from {kept}", flush=True)
            else:
                r = run_one(arm, seed, args, args.steps)
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(json.dumps(r, indent=1))
            table[arm].append(r)
            k = max(1, len(r["train_true"]) // 5)
            print(
                f"{arm} seed {seed}: held-out true accuracy {r['oracle'][0]:.3f} -> {r['oracle'][-1]:.3f}; "
                f"group reward std {r['group_reward_std']:.3f}, groups with signal {r['groups_with_signal']:.3f}, "
                f"training true accuracy first/last {k} steps {_mean(r['train_true'][:k]):.3f} -> "
                f"{_mean(r['train_true'][-k:]):.3f}, order accuracy {r['order_accuracy']:.3f}; "
                f"wall {r['wall_s']:.0f} s",
                flush=True,
            )

    def cell(xs: list[float], fmt: str = ".3f") -> str:
        return f"{_mean(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"

    print(f"\nmedvqa tiny, {args.steps} steps, seeds {args.seeds}: mean (min-max) over seeds")
    print(
        "| arm | held-out true accuracy, final | gain | group reward std | groups with signal | "
        "order accuracy | wall per seed (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for arm, runs in table.items():
        final = [r["oracle"][-1] for r in runs]
        gain = [r["oracle"][-1] - r["oracle"][0] for r in runs]
        cells = [
            cell(final),
            f"{_mean(gain):+.3f}",
            cell([r["group_reward_std"] for r in runs]),
            cell([r["groups_with_signal"] for r in runs]),
            "-" if arm != "arena" else cell([r["order_accuracy"] for r in runs]),
            cell([r["wall_s"] for r in runs], ".0f"),
        ]
        print(f"| {arm} | {' | '.join(cells)} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
