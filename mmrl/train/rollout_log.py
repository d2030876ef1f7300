"""The run's rollout log: ``rollouts.jsonl`` rows of a step's first groups (the report's gallery and ``mmrl eval``'s
readers), each response with its reward and reward parts, and for multi-turn runs each response's ``episode``
summary and ``turns`` (action, reward, state, the env's info and the new images, paths relative to the run folder).
Written by rank 0 after each step (:class:`mmrl.train.trainer.Trainer`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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


def episode_record(t: Any, out: Path) -> dict[str, Any]:
    """A trajectory's ``episode`` summary and ``turns`` (image paths relative to the run folder ``out``)."""
    rec = t.to_record()
    root = out.resolve()

    def rel(path: str) -> str:
        try:
            return os.path.relpath(path, root)
        except ValueError:  # another drive (Windows): keep it absolute
            return path

    for turn in rec["turns"]:
        turn["images"] = [rel(x) for x in turn["images"]]
    episode = {"end": rec["end"], "return": rec["return"], "turns_count": len(rec["turns"])}
    episode |= {"id": rec["episode_id"], "sampled_tokens": rec["sampled_tokens"]}
    if rec.get("error"):
        episode["error"] = rec["error"]
    return {"episode": episode, "turns": rec["turns"]}
