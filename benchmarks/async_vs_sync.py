"""Asynchronous rollouts against the synchronous trainer on this machine (docs/async.md#separate-placement): the
same tiny recipe and seed with ``rollout.max_staleness`` 0 (synchronous, one process) and k = 1, 2, ... in the
separate placement (``torchrun --nproc_per_node 2``: one process generates, one trains). Each run is a separate
launch; this script follows its ``metrics.jsonl`` as it grows and stamps every row with the wall-clock second it
appeared, so it reports, per run: seconds per step, the final held-out score, the seconds to first reach the
synchronous run's final held-out score (same seed), the idle shares and the staleness; and from the synchronous run's
stage times the bound (t_gen + t_train) / max(t_gen, t_train) that overlapping the two could give at best.

Fair to the synchronous side: it gets both cores (2 torch threads in its one process); an asynchronous run splits
them (1 torch thread in each of its two processes). ``--colocated`` runs k >= 1 in one process instead (the producer
thread beside the trainer, 1 torch thread each): on the tiny models Python's GIL serialises most of the two threads'
work, which is why the separate placement is the one measured by default.

    python benchmarks/async_vs_sync.py [--recipe shapes/tiny] [--steps 100] [--eval-every 25] [--seeds 0,1,2]
        [--ks 0,1,2] [--colocated] [--set KEY=VALUE ...] [--set-async KEY=VALUE ...]

Prints one row per (seed, k) and a summary per k: the median over seeds of the wall-clock ratio to the synchronous run
(time to its final score, and whole-run time) with the range.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASYNC = ["algo.old_logprobs=interpolate", "algo.rollout_correction=tis_token"]
GEN = ("time/sample", "time/encode", "time/rollout", "time/reward")
TRAIN = ("time/old_logprobs", "time/ref_logprobs", "time/advantages", "time/update", "time/sync_weights")


def run(
    recipe: str,
    out: Path,
    steps: int,
    every: int,
    seed: int,
    k: int,
    extra: list[str],
    colocated: bool,
    sync_threads: int = 2,
) -> list[dict]:
    """One run; its metrics rows, each with ``wall`` = seconds since the start when the row appeared."""
    separate = k > 0 and not colocated
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd = [*launch, "-m", "mmrl"] if separate else [sys.executable, "-m", "mmrl"]
    cmd += ["train", f"recipes/{recipe}.yaml", "--output-dir", str(out)]
    cmd += ["--max-steps", str(steps), f"train.seed={seed}", f"eval.every={every}", "train.progress=false"]
    cmd += ["train.save_every=0", f"rollout.max_staleness={k}", *(ASYNC if k else []), *extra]
    cmd += ["rollout.placement=separate"] if separate else []
    threads = "1" if k else str(sync_threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1"}
    metrics = out / "metrics.jsonl"
    rows: list[dict] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    seen = 0
    while True:
        done = proc.poll() is not None
        if metrics.exists():
            lines = metrics.read_text().splitlines()
            for line in lines[seen:]:
                if line.strip():
                    rows.append({**json.loads(line), "wall": time.perf_counter() - t0})
            seen = len(lines)
        if done:
            break
        time.sleep(0.1)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr.read()[-3000:]}")
    return rows


def summary(rows: list[dict], target: float | None) -> dict:
    steps = [r for r in rows if "reward/mean" in r]
    evals = [r for r in rows if "eval/accuracy" in r and r.get("step", 0) > 0]  # trained: not the start score
    reached = next((r["wall"] for r in evals if target is not None and r["eval/accuracy"] >= target), None)
    step_s = (steps[-1]["wall"] - steps[0]["wall"]) / max(len(steps) - 1, 1) if steps else float("nan")
    total = lambda keys: sum(r.get(k, 0.0) for r in steps for k in keys)  # noqa: E731
    stale = [r["async/staleness_mean"] for r in steps if "async/staleness_mean" in r]
    return {
        "s_per_step": step_s,
        "wall": rows[-1]["wall"] if rows else float("nan"),
        "final": evals[-1]["eval/accuracy"] if evals else float("nan"),
        "to_target": reached,
        "gen_s": total(GEN),
        "train_s": total(TRAIN),
        "train_idle": total(("time/train_idle",)),
        "rollout_idle": total(("time/rollout_idle",)),
        "staleness": statistics.mean(stale) if stale else 0.0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="shapes/tiny")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--ks", default="0,1,2")
    p.add_argument("--set", action="append", default=[], help="an override for every run, KEY=VALUE")
    p.add_argument(
        "--set-async",
        action="append",
        default=[],
        help="an override for the k >= 1 runs only, KEY=VALUE (rollout.episode.next_batch_at=1.0)",
    )
    p.add_argument("--colocated", action="store_true", help="k >= 1 in one process (threads), not separate")
    p.add_argument(
        "--sync-threads",
        type=int,
        default=2,
        help="torch threads of the synchronous run (2: both cores, the fair peer)",
    )
    a = p.parse_args()
    seeds, ks = [int(x) for x in a.seeds.split(",")], [int(x) for x in a.ks.split(",")]
    if ks[0] != 0:
        raise SystemExit("--ks must start with 0: the synchronous run is the reference")
    print(
        f"{a.recipe}, {a.steps} steps, eval every {a.eval_every}, seeds {seeds}; sync: 1 process x {a.sync_threads} torch threads, "
        f"async: {'1 process, 2 threads' if a.colocated else '2 processes (generate | train)'} x 1 torch thread"
    )
    print(
        "seed  k  s/step  gen/step  train/step   wall  final  to_sync_final  train_idle  rollout_idle  staleness  "
        "bound(sync)"
    )
    ratios: dict[int, list[tuple[float, float]]] = {k: [] for k in ks[1:]}
    with tempfile.TemporaryDirectory(prefix="mmrl-async-bench-") as tmp:
        for seed in seeds:
            ref = None
            for k in ks:
                extra = [*a.set, *(a.set_async if k else [])]
                rows = run(
                    a.recipe, Path(tmp) / f"s{seed}-k{k}", a.steps, a.eval_every, seed, k, extra, a.colocated
                )
                s = summary(rows, None if ref is None else ref["final"])
                if ref is None:
                    s["to_target"] = s["wall"] if s["final"] == s["final"] else None
                    ref = s
                bound = (ref["gen_s"] + ref["train_s"]) / max(ref["gen_s"], ref["train_s"], 1e-9)
                to = f"{s['to_target']:.1f}" if s["to_target"] is not None else "never"
                print(
                    f"{seed:>4} {k:>2} {s['s_per_step']:7.3f} {s['gen_s'] / a.steps:9.3f} "
                    f"{s['train_s'] / a.steps:11.3f} {s['wall']:6.1f} {s['final']:6.3f} {to:>14} "
                    f"{s['train_idle'] / s['wall']:10.1%} {s['rollout_idle'] / s['wall']:13.1%} "
                    f"{s['staleness']:10.2f} {bound:12.2f}",
                    flush=True,
                )
                if k and s["to_target"] is not None:
                    ratios[k].append((ref["to_target"] / s["to_target"], ref["wall"] / s["wall"]))
                elif k:
                    ratios[k].append((float("nan"), ref["wall"] / s["wall"]))
    print("k  speed-up to the sync run's final score (median, range)   whole run (median, range)")
    for k, rs in ratios.items():
        to = [r[0] for r in rs if r[0] == r[0]]
        whole = [r[1] for r in rs]
        fmt = lambda v: f"{statistics.median(v):.2f}x ({min(v):.2f}-{max(v):.2f})" if v else "never reached"  # noqa: E731
        print(f"{k}  {fmt(to):>40}   {fmt(whole)}")


if __name__ == "__main__":
    main()
