"""Generated short clips of moving coloured shapes, written as real MP4 files, with multiple-choice questions on
counting, direction of motion and the order of events (the video recipe's data, DeepVideo-R1-style video QA).

Every clip is drawn frame by frame from a seeded RNG and encoded with OpenCV's ``VideoWriter`` (``mp4v`` in an MP4
container), so training reads it back through :func:`mmrl.processors.video.load_video` (decord, or OpenCV when
decord is absent or fails) exactly as it reads a downloaded benchmark video. ``build(folder, seed=...)`` reproduces
the same records and the same frames.

Three question kinds, each about what happens over time:

- ``count``: shapes enter one after another and stay; "How many shapes appear in the video?";
- ``direction``: one shape moves steadily across part of the frame; "Which way does the shape move?";
- ``order``: two (tiny) or three (full) shapes of different colours enter at different times; "Which shape appears
  first?", the options naming each shape by its colour.

Two styles share the generator. ``TINY`` is sized for the bundled ~1M-parameter model on a 2-core CPU: 4 frames of
112x224 (the smallest frame the policy's video path takes whole, see ``recipes/video/README.md``), three colours,
options in a fixed canonical order (counts ascending, colours red/green/blue), a bare letter as the answer. ``FULL``
is for real checkpoints: 16 frames of 224x448, four colours, four directions, shuffled options and a
``<think>...</think><answer>letter</answer>`` response. Records store the answer as the option letter and the option
texts in ``metadata["choices"]``, which is what the ``mc_letter`` reward reads.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

COLOURS_BGR = {"red": (40, 40, 220), "green": (50, 170, 40), "blue": (220, 70, 30), "yellow": (20, 200, 230)}
KINDS = ("count", "direction", "order")


@dataclass(frozen=True)
class Style:
    """How clips and prompts look: frame geometry, answer space and prompt wording."""

    name: str
    frames: int
    height: int
    width: int
    fps: float
    colours: tuple[str, ...]
    directions: tuple[str, ...]
    max_count: int
    order_shapes: int
    shuffle_options: bool
    instruction: str
    kind_weights: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 1.0))


TINY = Style(
    name="tiny",
    frames=4,
    height=112,
    width=224,
    fps=2.0,
    colours=("red", "green", "blue"),
    directions=("left", "right"),
    max_count=3,
    order_shapes=2,
    shuffle_options=False,
    instruction="Answer with the letter.",
)
FULL = Style(
    name="full",
    frames=16,
    height=224,
    width=448,
    fps=4.0,
    colours=("red", "green", "blue", "yellow"),
    directions=("left", "right", "up", "down"),
    max_count=4,
    order_shapes=3,
    shuffle_options=True,
    instruction=(
        "Think about what happens in the video inside <think> </think>, then give the letter of the correct option "
        "inside <answer> </answer>."
    ),
)
DIRECTION_TEXT = {"left": "to the left", "right": "to the right", "up": "upwards", "down": "downwards"}
QUESTIONS = {
    "count": "How many shapes appear in the video?",
    "direction": "Which way does the shape move?",
    "order": "Which shape appears first?",
}


@dataclass
class Shape:
    """One shape's track: where it is at each frame (None before it enters)."""

    colour: str
    kind: str  # "circle" or "square"
    radius: int
    centres: list[tuple[int, int] | None]


def _draw(frame: np.ndarray, s: Shape, t: int) -> None:
    c = s.centres[t]
    if c is None:
        return
    colour = COLOURS_BGR[s.colour]
    if s.kind == "circle":
        cv2.circle(frame, c, s.radius, colour, thickness=-1, lineType=cv2.LINE_AA)
    else:
        x, y = c
        cv2.rectangle(frame, (x - s.radius, y - s.radius), (x + s.radius, y + s.radius), colour, thickness=-1)


def write_clip(path: Path, shapes: list[Shape], style: Style) -> None:
    """Encode the shapes' tracks as an MP4 (white background) at ``style.fps``."""
    writer = cv2.VideoWriter(
        str(path), cv2.VideoWriter_fourcc(*"mp4v"), style.fps, (style.width, style.height)
    )
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot open an mp4v VideoWriter for {path}; is OpenCV built with FFmpeg?")
    try:
        for t in range(style.frames):
            frame = np.full((style.height, style.width, 3), 255, np.uint8)  # [H, W, 3] BGR
            for s in shapes:
                _draw(frame, s, t)
            writer.write(frame)
    finally:
        writer.release()


def _slots(style: Style, n: int, rng: random.Random, r: int) -> list[tuple[int, int]]:
    """``n`` distinct cells of a coarse grid, so shapes never overlap."""
    cols, rows = max(2, style.width // (4 * r)), max(1, style.height // (4 * r))
    cells = rng.sample([(i, j) for i in range(cols) for j in range(rows)], n)
    cw, ch = style.width / cols, style.height / rows
    return [(int((i + 0.5) * cw), int((j + 0.5) * ch)) for i, j in cells]


def _entry_frames(style: Style, n: int) -> list[int]:
    """When each of ``n`` shapes enters: spread over the clip's first half, aligned to Qwen's 2-frame temporal patch
    so that each entry is visible in whole patches."""
    step = max(2, (style.frames // 2) // max(1, n - 1) // 2 * 2)
    return [min(i * step, style.frames - 2) for i in range(n)]


def _count_clip(style: Style, rng: random.Random) -> tuple[list[Shape], str, list[str]]:
    n = rng.randint(1, style.max_count)
    r = style.height // 8
    starts = _entry_frames(style, n)
    shapes = []
    for (x, y), start in zip(_slots(style, n, rng, r), starts):
        track = [None if t < start else (x, y) for t in range(style.frames)]
        shapes.append(Shape(rng.choice(style.colours), rng.choice(("circle", "square")), r, track))
    return shapes, str(n), [str(k) for k in range(1, style.max_count + 1)]


def _direction_clip(style: Style, rng: random.Random) -> tuple[list[Shape], str, list[str]]:
    """One shape moving at constant speed. Consecutive positions overlap (a step of at most one radius), as in real
    footage, so motion is visible inside each 2-frame temporal patch and not only between patches."""
    d = rng.choice(style.directions)
    r = style.height // 6
    horizontal = d in ("left", "right")
    length, across = (style.width, style.height) if horizontal else (style.height, style.width)
    room = length - 2 * r - 5
    step = min(r, room // (style.frames - 1))
    start = r + 2 + rng.randint(0, room - step * (style.frames - 1))
    fixed = rng.randint(r + 2, across - r - 3)
    track = []
    for t in range(style.frames):
        p = start + step * t
        if d in ("left", "up"):
            p = length - p
        track.append((p, fixed) if horizontal else (fixed, p))
    shape = Shape(rng.choice(style.colours), rng.choice(("circle", "square")), r, track)
    return [shape], DIRECTION_TEXT[d], [DIRECTION_TEXT[x] for x in style.directions]


def _order_clip(style: Style, rng: random.Random) -> tuple[list[Shape], str, list[str]]:
    colours = rng.sample(style.colours, style.order_shapes)
    r = style.height // 7
    starts = _entry_frames(style, style.order_shapes)
    shapes = []
    for colour, (x, y), start in zip(colours, _slots(style, style.order_shapes, rng, r), starts):
        track = [None if t < start else (x, y) for t in range(style.frames)]
        shapes.append(Shape(colour, rng.choice(("circle", "square")), r, track))
    options = list(style.colours) if not style.shuffle_options else colours
    return shapes, colours[0], options


CLIPS = {"count": _count_clip, "direction": _direction_clip, "order": _order_clip}


def prompt_text(question: str, options: list[str], instruction: str) -> str:
    """``<video>`` then the question, one ``X. option`` line per option, and the answer instruction."""
    lines = [f"{string.ascii_uppercase[i]}. {o}" for i, o in enumerate(options)]
    return "<video>" + "\n".join([question, *lines, instruction])


def make_record(rng: random.Random, idx: int, split: str, style: Style, folder: Path) -> dict:
    """Draw one clip, write it under ``folder/videos/`` and return its record."""
    weights = style.kind_weights
    kind = rng.choices(list(weights), weights=list(weights.values()))[0]
    shapes, answer, options = CLIPS[kind](style, rng)
    if style.shuffle_options:
        rng.shuffle(options)
    rid = f"video-{style.name}-{split}-{idx:05d}"
    rel = f"videos/{rid}.mp4"
    write_clip(folder / rel, shapes, style)
    return {
        "id": rid,
        "prompt": prompt_text(QUESTIONS[kind], options, style.instruction),
        "videos": [rel],
        "answer": string.ascii_uppercase[options.index(answer)],
        "metadata": {"kind": kind, "choices": options, "answer_text": answer},
    }


def _write_jsonl(path: Path, records: list[dict]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)


# The warm-start split over-represents one answer per kind (see ``build``).
MAJORITY = {"count": "1", "direction": "to the right", "order": "red"}
# How often the tiny warm-start split keeps a record whose answer is not its kind's MAJORITY one. Counting is skewed
# hardest (about 93% of its answers are "1"): the warm start then reads the count but answers "1" too often, a prior
# RL on the balanced prompts corrects. Direction and order, which the tiny model reads almost perfectly from any
# split, keep a milder skew. With 0.25 for every kind the warm start half-read the count without that prior, and no
# answer re-weighting could raise it: GRPO had nothing it could learn in minutes (recipes/video/README.md).
SFT_KEEP_OTHER = {"count": 0.05, "direction": 0.25, "order": 0.25}


def build_style(
    folder: str | Path,
    style: Style,
    *,
    n_train: int,
    n_eval: int,
    n_sft: int,
    sft_keep_other: float | dict[str, float],
    seed: int,
) -> dict[str, Path]:
    """Write ``train.jsonl`` (RL prompts), ``eval.jsonl`` (held out), ``sft.jsonl`` (warm start) and ``videos/``.

    The splits use disjoint seeds and ids. In ``sft`` a record whose answer is not its kind's :data:`MAJORITY`
    answer is kept with probability ``sft_keep_other`` (one number, or one per kind), so the warm start learns a
    skewed prior that RL on the balanced prompts has to correct (as in the shapes recipe).
    """
    if not isinstance(sft_keep_other, dict):
        sft_keep_other = dict.fromkeys(KINDS, sft_keep_other)
    if set(sft_keep_other) != set(KINDS):
        raise ValueError(
            f"sft_keep_other must give one probability per kind {KINDS}, got {sorted(sft_keep_other)}"
        )
    root = Path(folder)
    (root / "videos").mkdir(parents=True, exist_ok=True)
    paths = {}
    balanced = dict.fromkeys(KINDS, 1.0)
    splits = (("train", n_train, seed, balanced), ("eval", n_eval, seed + 1_000_003, balanced))
    splits += (("sft", n_sft, seed + 2_000_029, sft_keep_other),)
    for split, n, s, keep_other in splits:
        rng = random.Random(s)
        records: list[dict] = []
        i = 0
        while len(records) < n:
            rec = make_record(rng, i, split, style, root)
            i += 1
            kind = rec["metadata"]["kind"]
            if rec["metadata"]["answer_text"] != MAJORITY[kind] and rng.random() >= keep_other[kind]:
                (root / rec["videos"][0]).unlink()
                continue
            records.append(rec)
        paths[split] = root / f"{split}.jsonl"
        _write_jsonl(paths[split], records)
    return paths


def build(
    folder: str | Path,
    *,
    n_train: int = 1000,
    n_eval: int = 200,
    n_sft: int = 1000,
    sft_keep_other: float | dict[str, float] | None = None,
    seed: int = 0,
) -> dict[str, Path]:
    """The tiny variant's data (:data:`TINY`): ``data.builder: mmrl.recipes.video.data:build``. The warm-start
    split's skew is :data:`SFT_KEEP_OTHER` unless ``sft_keep_other`` says otherwise."""
    keep = SFT_KEEP_OTHER if sft_keep_other is None else sft_keep_other
    return build_style(
        folder, TINY, n_train=n_train, n_eval=n_eval, n_sft=n_sft, sft_keep_other=keep, seed=seed
    )


def build_full(
    folder: str | Path, *, n_train: int = 4000, n_eval: int = 300, seed: int = 0
) -> dict[str, Path]:
    """The GPU variant's data (:data:`FULL`, balanced answers; its ``sft`` split is a small unused balanced one)."""
    return build_style(folder, FULL, n_train=n_train, n_eval=n_eval, n_sft=8, sft_keep_other=1.0, seed=seed)
