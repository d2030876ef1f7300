"""Continuous against lockstep episodes (docs/agents.md#continuous-episodes): the same policy, engine and env, the
same latencies, one batch of episodes at a time.

The bundled tiny Qwen2.5-VL (``assets/tiny-qwen2.5-vl``, HF engine, temperature 1.0) plays ``--samples`` x ``--n``
episodes of ``--turns`` turns in the ``latency`` env (:mod:`latency_env`: each step sleeps a lognormal latency,
median ``--median-s``, shape ``--sigma``, and shows a new picture), in an env pool of ``--workers`` processes.
Each round runs both schedules on the same latencies (the round's seed), in A B B A order over rounds; it prints
each run's wall time, its engine calls and the engine's share of the wall time, and per round the ratio
lockstep / continuous (above 1: continuous is faster), then the median and range over rounds.

    OMP_NUM_THREADS=1 python benchmarks/episode_schedule.py [--samples 8 --n 2 --turns 4 --workers 16]
        [--median-s 0.5 --sigma 1.0 --min-ready 0.5 --rounds 4]

What bounds the gain: a batch ends with its slowest episode under either schedule, so the win is the engine time
that overlaps the env steps and the per-turn waits on the slowest step that a continuous episode skips; a worker
runs its episodes' steps one after the other, so fewer workers queue steps behind a slow one.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from latency_env import latency  # also registers the env
from machine import describe, spread
from PIL import Image

from mmrl.config import EpisodeConfig, ModelConfig
from mmrl.envs import EnvPool
from mmrl.model.policy import Policy
from mmrl.rollout import HFEngine, SamplingParams
from mmrl.rollout.episodes import run_episodes
from mmrl.types import Sample

TINY = Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl"


class _Timed(HFEngine):
    def __init__(self, policy: Policy):
        super().__init__(policy)
        self.calls, self.seconds = 0, 0.0

    def generate(self, prompts, params):
        t0 = time.perf_counter()
        try:
            return super().generate(prompts, params)
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - t0


def run(policy, samples, args, schedule: str, seed: int, root: Path) -> dict:
    settings = EpisodeConfig(
        max_turns=args.turns,
        env_options={"steps": args.turns, "median_s": args.median_s, "sigma": args.sigma, "seed": seed},
        env_workers=args.workers,
        schedule=schedule,
        min_ready=args.min_ready,
    )
    engine = _Timed(policy)
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens)
    with EnvPool(root / f"{schedule}-{seed}", workers=args.workers, timeout_s=120) as pool:
        pool.reset([(f"warm{w}", "latency", {"median_s": 0.0}, samples[0]) for w in range(args.workers)])
        pool.close_episode(*[f"warm{w}" for w in range(args.workers)])  # workers started before the clock
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        trajs = run_episodes(
            policy, engine, samples, params, pool=pool, env_name="latency", settings=settings
        )
        wall = time.perf_counter() - t0
    turns = sum(len(t.turns) for row in trajs for t in row)
    return {"wall": wall, "calls": engine.calls, "engine_s": engine.seconds, "turns": turns}


def latency_options(p: argparse.ArgumentParser, samples: int) -> None:
    """The options of a benchmark on the ``latency`` env (this one and :mod:`episode_batches`)."""
    p.add_argument("--samples", type=int, default=samples)
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--median-s", type=float, default=0.5)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--min-ready", type=float, default=0.5)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=4)


def tasks(root: Path, ids: list[str]) -> list[Sample]:
    """One task per id: a small red picture (written under ``root``) and "Work the screen."."""
    Image.new("RGB", (56, 56), (200, 30, 30)).save(root / "task.png")
    content = [{"type": "image"}, {"type": "text", "text": "Work the screen."}]
    return [Sample(i, [{"role": "user", "content": content}], images=[str(root / "task.png")]) for i in ids]


def tiny_policy() -> Policy:
    print(describe())
    return Policy.from_pretrained(ModelConfig(path=str(TINY), min_pixels=3136, max_pixels=3136))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    latency_options(p, samples=8)
    args = p.parse_args()
    policy = tiny_policy()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        samples = tasks(root, [f"task{i}" for i in range(args.samples)])
        run(policy, samples[:2], args, "lockstep", 999, root)  # warm-up (kernels, the processor)
        ratios, bounds = [], []
        for r in range(args.rounds):
            order = ["lockstep", "continuous"] if r % 2 == 0 else ["continuous", "lockstep"]
            got = {s: run(policy, samples, args, s, r, root) for s in order}
            for s in ("lockstep", "continuous"):
                g = got[s]
                print(
                    f"round {r} {s:10s}: wall {g['wall']:.2f} s, {g['calls']} engine calls, engine "
                    f"{g['engine_s']:.2f} s ({g['engine_s'] / g['wall']:.0%} of the wall), {g['turns']} turns",
                    flush=True,
                )
            ratios.append(got["lockstep"]["wall"] / got["continuous"]["wall"])
            lat = [
                [latency(r, s.id, k, args.median_s, args.sigma) for k in range(args.turns)] for s in samples
            ]
            lock_wait = sum(
                max(x[k] for x in lat) for k in range(args.turns)
            )  # each turn waits for the slowest
            cont_wait = max(sum(x) for x in lat)  # the slowest episode's own steps
            bounds.append(lock_wait / cont_wait)
            print(
                f"round {r}: lockstep / continuous {ratios[-1]:.3f}; env waits alone (one worker per episode, no "
                f"engine time) {lock_wait:.2f} s / {cont_wait:.2f} s = {bounds[-1]:.3f}",
                flush=True,
            )
    print(
        f"{args.samples} x {args.n} episodes, {args.turns} turns, {args.workers} workers, latency median "
        f"{args.median_s} s sigma {args.sigma}: lockstep / continuous {spread(ratios)}; the env waits' own ratio "
        f"{spread(bounds)}"
    )


if __name__ == "__main__":
    main()
