"""The run's rollout log: ``rollouts.jsonl`` rows of a step's first groups (the report's gallery and ``mmrl eval``'s
readers), each response with its reward and reward parts, and for multi-turn runs each response's ``episode``
summary and ``turns`` (action, reward, state, the env's info and the new images, paths relative to the run folder).
Written by rank 0 after each step (:class:`mmrl.train.trainer.Trainer`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmrl.rollout.episodes import Trajectory
from mmrl.train.collect import Collected


def rollout_rows(got: Collected, step: int, out: Path, keep: int) -> list[dict[str, Any]]:
    """The rows of the first ``keep`` groups of ``got``."""
    G, rows = len(got.groups[0]), []
    for b, (s, g) in enumerate(list(zip(got.samples, got.groups))[:keep]):
        results = got.results[b * G : (b + 1) * G]
        row = {
            "step": step,
            "id": s.id,
            "prompt": s.prompt_text,
            "images": [str(x) for x in s.images],
            "videos": [str(x) for x in s.videos],
            "answer": s.answer,
            "metadata": s.metadata,  # what some rewards judge by (a pathology region); the report reads it
            "responses": [
                {"text": c.text, "finish": c.finish_reason, "reward": r.score, "parts": r.parts}
                for c, r in zip(g, results)
            ],
        }
        for resp, t in zip(row["responses"], got.trajectories[b]):
            if t.end != "single_turn":  # an env episode's summary and turns
                resp |= episode_record(t, out)
        rows.append(row)
    return rows


def append_rollouts(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def episode_record(t: Trajectory, out: Path) -> dict[str, Any]:
    """A response's ``episode`` (the trajectory's record, :meth:`mmrl.rollout.episodes.Trajectory.to_record`, image
    paths relative to the run folder ``out``) with its ``turns`` beside it."""
    rec = t.to_record(out)
    return {"turns": rec.pop("turns"), "episode": rec}
