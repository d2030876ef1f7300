"""Episodes across batches (docs/async.md#episodes-across-batches): consecutive batches of multi-turn episodes played
one after another (each batch starts when the previous one's last episode ended: what a producer running ahead did
before ``rollout.episode.next_batch_at``) against across batches (the next batch starts once at most
``--next-at`` of this batch's episodes still run, and joins its engine calls). Both use the continuous schedule, the
same policy, engine, env and latencies.

The bundled tiny Qwen2.5-VL (``assets/tiny-qwen2.5-vl``, HF engine, temperature 1.0) plays ``--batches`` batches of
``--samples`` x ``--n`` episodes of ``--turns`` turns in the ``latency`` env (:mod:`latency_env`: each step sleeps a
lognormal latency, median ``--median-s``, shape ``--sigma``), in an env pool of ``--workers`` processes. Each round
runs both ways on the same latencies (the round's seed), in A B B A order over rounds, and prints each run's wall
time, engine calls and the engine's share of the wall, the mean time between two batches' ends (what a trainer
waits per step when generation is the slow side), and the ratio one-after-another / across (above 1: across is
faster); then the median and range over rounds.

    OMP_NUM_THREADS=1 python benchmarks/episode_batches.py [--batches 4 --samples 4 --n 2 --turns 4 --workers 16]
        [--median-s 0.5 --sigma 1.0 --next-at 0.5 --rounds 4]

What bounds the gain: one after another, every batch ends with its slowest episode and the engine idles while that
episode's last steps wait; across batches the next batch's first turns fill that wait, so the gain is at most the
tail waits of all batches but the last.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from episode_schedule import _Timed, latency_options, tasks, tiny_policy
from latency_env import latency  # noqa: F401  (registers the env)
from machine import spread

from mmrl.config import EpisodeConfig
from mmrl.envs import EnvPool
from mmrl.rollout import SamplingParams
from mmrl.rollout.episodes import EpisodeDriver, Limits, reset_episodes


def run(policy, batches, args, across: bool, seed: int, root: Path) -> dict:
    settings = EpisodeConfig(
        max_turns=args.turns,
        env_options={"steps": args.turns, "median_s": args.median_s, "sigma": args.sigma, "seed": seed},
        env_workers=args.workers,
        schedule="continuous",
        min_ready=args.min_ready,
    )
    engine = _Timed(policy)
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens)
    name = "across" if across else "after"
    with EnvPool(root / f"{name}-{seed}", workers=args.workers, timeout_s=120) as pool:
        pool.reset([(f"warm{w}", "latency", {"median_s": 0.0}, batches[0][0]) for w in range(args.workers)])
        pool.close_episode(*[f"warm{w}" for w in range(args.workers)])  # workers started before the clock
        driver = EpisodeDriver(
            policy, engine, pool, params, Limits.of(policy, settings, params), args.min_ready
        )
        prompts = [[policy.encode(s) for s in b] for b in batches]

        def start(b: int) -> None:
            trajs = reset_episodes(
                policy, pool, batches[b], prompts[b], args.n, "latency", settings.env_options
            )
            driver.add([t for row in trajs for t in row], tag=b)

        torch.manual_seed(seed)
        t0 = time.perf_counter()
        ends, started = [], {0}
        start(0)
        for b in range(len(batches)):
            if b not in started:
                start(b)
                started.add(b)
            total = len(batches[b]) * args.n

            def between(b=b, total=total) -> bool:
                nxt = b + 1
                if (
                    across
                    and nxt < len(batches)
                    and nxt not in started
                    and driver.running[b] <= args.next_at * total
                ):
                    start(nxt)
                    started.add(nxt)
                return False

            driver.run(b, between)
            ends.append(time.perf_counter() - t0)
        driver.close()
        wall = time.perf_counter() - t0
    gaps = [e - s for s, e in zip([0.0, *ends[:-1]], ends)]
    return {"wall": wall, "calls": engine.calls, "engine_s": engine.seconds, "gap": statistics.mean(gaps)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    latency_options(p, samples=4)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--next-at", type=float, default=0.5)
    args = p.parse_args()
    policy = tiny_policy()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ids = [[f"b{b}task{i}" for i in range(args.samples)] for b in range(args.batches)]
        batches = [tasks(root, row) for row in ids]
        run(policy, [batches[0][:2]], args, False, 999, root)  # warm-up (kernels, the processor)
        ratios = []
        for r in range(args.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            got = {a: run(policy, batches, args, a, r, root) for a in order}
            for a in (False, True):
                g = got[a]
                print(
                    f"round {r} {'across' if a else 'after':6s}: wall {g['wall']:.2f} s, {g['calls']} engine calls, "
                    f"engine {g['engine_s']:.2f} s ({g['engine_s'] / g['wall']:.0%} of the wall), a batch every "
                    f"{g['gap']:.2f} s",
                    flush=True,
                )
            ratios.append(got[False]["wall"] / got[True]["wall"])
            print(f"round {r}: one after another / across {ratios[-1]:.3f}", flush=True)
    print(
        f"{args.batches} batches of {args.samples} x {args.n} episodes, {args.turns} turns, {args.workers} workers, "
        f"latency median {args.median_s} s sigma {args.sigma}, next batch at {args.next_at}: one after another / "
        f"across {spread(ratios)}"
    )


if __name__ == "__main__":
    main()
