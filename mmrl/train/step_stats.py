"""A training step's logged statistics beside the update's own: rewards and their parts (``reward/*``), the reward
pool's per-step counters (``sys/reward_*``), response lengths and group signal (``rollout/*``), and the stage timings
with tokens per second (``time/*``, ``sys/*``). Pure functions of the step's :class:`mmrl.train.collect.Collected`; the
trainer (:class:`mmrl.train.trainer.Trainer`) calls them after each step and keeps the counters between steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmrl.algos import groups_with_signal
from mmrl.train.collect import Collected

POOL_COUNTERS = ("cache_hits", "cache_misses", "timeouts", "pool_restarts")
ENV_COUNTERS = ("failed", "timeouts", "crashes", "restarts", "replays", "lost")  # mmrl.envs.EnvPool.stats


def reward_stats(
    got: Collected,
    errors: list[dict[str, Any]],
    pool: dict[str, Any],
    prev: dict[str, int],
    env: dict[str, int] | None = None,
) -> tuple[dict[str, float], dict[str, int]]:
    """Mean/std reward, each part's mean, the error count and this rank's worker counters' increments since
    ``prev``: the reward pool's (``sys/reward_*``: cache, timeouts, restarts after a worker died) and the env pool's
    (``sys/env_*``: failed steps, timeouts, crashed workers, restarts, replayed and lost episodes). They are process
    diagnostics (the reward cache and the workers are not checkpointed), so they live under ``sys/``; the trainer sums
    them over the ranks. Returns the stats and the counters to pass as ``prev`` next step."""
    env = env or {}
    scores = got.rewards
    stats: dict[str, float] = {"reward/mean": scores.mean().item(), "reward/std": scores.std().item()}
    parts: dict[str, list[float]] = {}
    for r in got.results:
        for k, v in r.parts.items():
            parts.setdefault(f"reward/{k}", []).append(float(v))
    stats.update({k: sum(v) / len(v) for k, v in parts.items()})
    stats["reward/errors"] = len(errors)
    counts = {f"reward_{k}": pool[k] for k in POOL_COUNTERS if k in pool}
    counts |= {f"env_{k}": v for k, v in env.items() if k in ENV_COUNTERS}
    stats |= {f"sys/{k}": float(v - prev.get(k, 0)) for k, v in counts.items()}
    return stats, counts


def write_reward_errors(path: Path, step: int, errors: list[dict[str, Any]]) -> None:
    """Append the step's reward errors to ``reward_errors.jsonl`` (rank 0)."""
    with path.open("a") as f:
        for e in errors:
            f.write(json.dumps({"step": step, **e}) + "\n")


def rollout_stats(got: Collected, success_at: float = 1.0) -> dict[str, float]:
    """Response lengths and the groups' signal: ``rollout/groups_with_signal`` (some rewards differ: GRPO sees the
    group) and ``rollout/groups_solved`` (some response reaches ``success_at``, the run's ``eval.success_threshold``:
    on a continuous reward a group can carry signal and still hold no right answer, the cliff hint methods target)."""
    comps = [c for g in got.groups for c in g]
    lens = [len(c.token_ids) for c in comps]
    return {
        "response_length/mean": sum(lens) / len(lens),
        "response_length/max": max(lens),
        "rollout/truncated_frac": sum(c.finish_reason == "length" for c in comps) / len(lens),
        "rollout/groups_with_signal": groups_with_signal(got.rewards).float().mean().item(),
        "rollout/groups_solved": (got.rewards >= success_at - 1e-6).any(dim=1).float().mean().item(),
        # the spread of a group's rewards (population std, mean over groups): how much a group's scores separate
        # its responses, which a reward that compresses them (a pointwise judge) keeps small
        "rollout/group_reward_std": got.rewards.std(dim=1, correction=0).mean().item(),
    }


def throughput(
    got: Collected, timings: dict[str, float], reward_seconds: float, train_tokens: int
) -> dict[str, float]:
    """Stage timings (time/*) and tokens per second of the rollout and update stages (sys/*: diagnostics)."""
    t = timings
    rollout_tokens = sum(len(c.token_ids) for g in got.groups for c in g)
    out = {f"time/{k}": v for k, v in t.items()}
    # scoring time, in the background while generation and the log-prob passes ran (time/reward: the wait)
    out["time/reward_compute"] = reward_seconds
    out["sys/rollout_tokens_per_s"] = rollout_tokens / t["rollout"] if t.get("rollout") else 0.0
    out["sys/train_tokens_per_s"] = train_tokens / t["update"] if t.get("update") else 0.0
    return out
