"""How a gui_agent run's training episodes fail, early and late: for the logged episodes (``rollouts.jsonl``) of the
first and the last ``--steps`` steps, the share won and, for the others, what their first wrong action was (the
env's ``target_hit`` false): a press on a wrong control (a wrong tile, or Done too early: the app's state moves and
the task may be lost), a click on no control (the header, empty space: nothing changes), or a malformed action.
A run that learns to act on the screen turns wrong presses into wins (recipes/gui_agent/README.md).

    python benchmarks/agent_failures.py RUN_DIR [RUN_DIR ...] [--steps 10]

One line per run and period: ``RUN first|last N steps: E episodes, won W, wrong control A, no control B,
malformed C, none wrong D`` (D: lost without a wrong action, e.g. out of actions).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def first_miss(turns: list[dict]) -> str:
    """What an episode's turns say of it: ``won``, or the kind of its first wrong action."""
    if any(t["info"].get("success") for t in turns):
        return "won"
    for t in turns:
        info = t["info"]
        if not info.get("target_hit"):
            if info.get("invalid"):
                return "malformed"
            return "wrong control" if info.get("hit") else "no control"
    return "none wrong"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--steps", type=int, default=10, help="steps in each period")
    a = ap.parse_args()
    kinds = ("won", "wrong control", "no control", "malformed", "none wrong")
    for run in a.runs:
        rows = [
            json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines() if line.strip()
        ]
        steps = sorted({r["step"] for r in rows})
        periods = {"first": set(steps[: a.steps]), "last": set(steps[-a.steps :])}
        for name, keep in periods.items():
            count = Counter(first_miss(e["turns"]) for r in rows if r["step"] in keep for e in r["responses"])
            parts = ", ".join(f"{k} {count[k]}" for k in kinds)
            print(f"{run} {name} {a.steps} steps: {sum(count.values())} episodes, {parts}")


if __name__ == "__main__":
    main()
