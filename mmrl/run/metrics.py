"""Metrics sinks: ``metrics.jsonl`` (appended, one object per step, never truncated) and the experiment trackers of
``train.trackers`` (:mod:`mmrl.run.trackers`), which get the same numbers and the images of the logged rollouts."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from mmrl.run.trackers import LoggedImage, Tracker, open_trackers

IMAGE_SIDE = 384  # longest side of an image sent to a tracker: thumbnails keep its storage small
TEXT_CHARS = 200  # characters of a response in a caption


class MetricsLogger:
    def __init__(
        self,
        output_dir: Path,
        trackers: list[str] | tuple[str, ...] = (),
        tracker_options: dict[str, dict[str, Any]] | None = None,
        *,
        purge_step: int | None = None,
        enabled: bool = True,
        config: dict[str, Any] | None = None,
    ):
        """``purge_step``: set when resuming, the first step the resumed run logs; ``config``: the run's settings,
        shown by the trackers that keep them."""
        self.enabled = enabled  # only rank 0 writes in multi-process training
        self.out = output_dir
        self.path = output_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.trackers: list[Tracker] = []
        if enabled and trackers:
            self.trackers = open_trackers(
                output_dir, list(trackers), tracker_options or {}, resume_step=purge_step, config=config or {}
            )

    def log(self, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()
        }
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
            f.flush()
        if self.trackers:
            step = int(metrics["step"])
            numbers = {k: float(v) for k, v in metrics.items() if k != "step" and isinstance(v, (int, float))}
            for tracker in self.trackers:
                tracker.log_metrics(numbers, step)

    def log_rollout_images(self, step: int, rows: list[dict[str, Any]]) -> None:
        """The images of the groups this step wrote to rollouts.jsonl (``rows``), to every tracker."""
        if not (self.enabled and self.trackers):
            return
        images = rollout_images(self.out, step, rows)
        if images:
            for tracker in self.trackers:
                tracker.log_images(images, step)

    def close(self) -> None:
        # called in the trainer's `finally`: an exception on its way out means the run failed
        failed = sys.exc_info()[0] is not None
        for tracker in self.trackers:
            tracker.close(failed)
        self.trackers = []


def rollout_images(out: Path, step: int, rows: list[dict[str, Any]]) -> list[LoggedImage]:
    """What the report's gallery shows of a step's logged groups, as thumbnails: each group's input images
    (``rollouts/<b>/input``, ``input_1``, ...) captioned with its id, answer and rewards, and, where
    ``train.keep_renders`` kept them, the target render and the renders of its best and worst response
    (``rollouts/<b>/target_render``, ``best_render``, ``worst_render``). Files that are not there are left out."""
    from mmrl.types import render_stem

    images: list[LoggedImage] = []
    for b, row in enumerate(rows):
        responses = row.get("responses") or []
        ranked = sorted(range(len(responses)), key=lambda j: _score(responses[j]))
        caption = _group_caption(row, responses, ranked)
        for i, path in enumerate(row.get("images") or []):
            im = _thumbnail(Path(str(path)))
            if im is not None:
                images.append(LoggedImage(f"rollouts/{b}/input" + (f"_{i}" if i else ""), im, caption))
        stem = render_stem(str(row.get("id", "")))
        folders = [out / "renders" / f"step-{step}" / f"{stem}-{j}" for j in range(len(responses))]
        targets = [f / f"{stem}-reference.png" for f in folders]  # the same target, beside every response
        target = next((_thumbnail(t) for t in targets if t.is_file()), None)
        if target is not None:
            images.append(LoggedImage(f"rollouts/{b}/target_render", target, f"{row.get('id')}: target"))
        for label, j in [("best", ranked[-1]), ("worst", ranked[0])][: min(2, len(ranked))]:
            im = _thumbnail(folders[j] / f"{stem}-response.png")
            if im is not None:
                text = _response_text(j, responses[j])
                images.append(LoggedImage(f"rollouts/{b}/{label}_render", im, f"{row.get('id')}: {text}"))
    return images


def _score(response: dict[str, Any]) -> float:
    r = response.get("reward")
    return float(r) if isinstance(r, (int, float)) and math.isfinite(r) else -math.inf


def _response_text(j: int, response: dict[str, Any]) -> str:
    text = str(response.get("text", ""))
    cut = text[:TEXT_CHARS] + ("..." if len(text) > TEXT_CHARS else "")
    return f"response {j} (reward {_score(response):.3f}): {cut}"


def _group_caption(row: dict[str, Any], responses: list[dict[str, Any]], ranked: list[int]) -> str:
    answer = row.get("answer")
    answer = answer if isinstance(answer, str) else json.dumps(answer)
    rewards = " ".join(f"{_score(r):.2f}" for r in responses)
    best = f" | best {_response_text(ranked[-1], responses[ranked[-1]])}" if ranked else ""
    return f"{row.get('id')} | answer: {answer[:TEXT_CHARS]} | rewards: {rewards}{best}"


def _thumbnail(path: Path) -> Any:
    """An RGB thumbnail of the image file at ``path``; None when there is none (a missing or unreadable file)."""
    from PIL import Image

    if not path.is_file():
        return None
    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
    except (OSError, ValueError):
        return None
    im.thumbnail((IMAGE_SIDE, IMAGE_SIDE))
    return im


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl; where a resumed run logged a step twice, the later row wins."""
    rows: dict[int, dict[str, Any]] = {}
    extra: list[dict[str, Any]] = []
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                if n == len(
                    lines
                ):  # a run still writing (or killed mid-line): the torn last row is not a row yet
                    break
                raise ValueError(f"{path}:{n}: not a JSON object") from None
            if "step" in r:
                rows[int(r["step"])] = r
            else:
                extra.append(r)
    return [rows[k] for k in sorted(rows)] + extra
