"""Episode start-up in the ``browser_app`` env: a new Chromium page per episode against a reused one
(:class:`mmrl.envs.browser.AppBrowser` keeps released pages, navigated to ``about:blank``, for the next episode).

Both sides run the same ``--episodes`` apps (``--kind``, seeds 0..N-1) in one process and one browser, in
``--rounds`` rounds of A B B A order: reset (page, app, first screenshot), one oracle action, close. ``fresh`` sets
the free list's size to 0, so every release closes its context and every reset opens a new page (the env before
pages were reused); ``reused`` keeps them. Per side it prints the median of the rounds' mean seconds per episode
for reset, step and close, and the process's CPU time with its children's (Chromium's renderers included) per
episode. The last line is ``episode start-up ms: fresh X reused Y ratio Z`` (reset + close, ratio = fresh / reused).

    OMP_NUM_THREADS=1 python benchmarks/env_reset.py [--episodes 24 --rounds 2 --kind panel_cue]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from mmrl.envs.browser import BrowserAppEnv, close_shared_browser, shared_browser
from mmrl.types import Sample


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def chromium_cpu() -> float:
    """CPU seconds of the browser's live processes (renderers are not reaped children until they exit)."""
    import psutil

    total = 0.0
    for root in shared_browser()._browser_procs:
        try:
            for p in [root, *root.children(recursive=True)]:
                c = p.cpu_times()
                total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


def run(kind: str, episodes: int, keep: int, work: Path) -> dict[str, float]:
    browser = shared_browser()
    browser.keep = keep
    t = {"reset": 0.0, "step": 0.0, "close": 0.0}
    cpu0, chrome0 = cpu_seconds(), chromium_cpu()
    for seed in range(episodes):
        env = BrowserAppEnv(workdir=work / f"{keep}-{seed}", check_first_image=False)
        t0 = time.perf_counter()
        env.reset(Sample(f"{kind}-{seed}", [], metadata={"app": kind, "seed": seed}))
        t1 = time.perf_counter()
        env.step(env.oracle())
        t2 = time.perf_counter()
        env.close()
        t3 = time.perf_counter()
        t["reset"] += t1 - t0
        t["step"] += t2 - t1
        t["close"] += t3 - t2
    out = {k: v / episodes for k, v in t.items()}
    out["cpu"] = (cpu_seconds() - cpu0 + max(0.0, chromium_cpu() - chrome0)) / episodes
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kind", default="panel_cue")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="env-reset-"))
    keep = shared_browser().keep
    run(args.kind, 4, keep, work / "warm")  # the browser's start and the first pages are nobody's cost
    sides: dict[str, list[dict[str, float]]] = {"fresh": [], "reused": []}
    for r in range(args.rounds):
        for side in ("fresh", "reused") if r % 2 == 0 else ("reused", "fresh"):
            sides[side].append(
                run(args.kind, args.episodes, 0 if side == "fresh" else keep, work / f"{side}{r}")
            )
    close_shared_browser()
    med = {s: {k: statistics.median(x[k] for x in rows) for k in rows[0]} for s, rows in sides.items()}
    for side, m in med.items():
        print(
            f"{side:7s} reset {m['reset'] * 1e3:6.1f} ms  step {m['step'] * 1e3:6.1f} ms  close {m['close'] * 1e3:6.1f} ms"
            f"  cpu {m['cpu'] * 1e3:6.1f} ms/episode"
        )
    f, u = (med[s]["reset"] + med[s]["close"] for s in ("fresh", "reused"))
    print(f"episode start-up ms: fresh {f * 1e3:.1f} reused {u * 1e3:.1f} ratio {f / u:.2f}")


if __name__ == "__main__":
    main()
