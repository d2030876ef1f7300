"""Synthetic coloured-shape images with colour, shape, count and position questions (the shapes recipe's data).

Position questions name a shape by its colour ("Is the red shape on the left or the right?"): the bundled tiny
model's 2-layer vision tower learns colour and layout quickly but shape identity slowly.

Every image is drawn by this module from a seeded RNG, so ``build(folder, seed)`` reproduces the same files. Answers
are single words (``red``, ``circle``, ``2``, ``left``) scored by the ``exact_match`` reward.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (230, 200, 20)}
SHAPES = ("circle", "square", "triangle")
NUMBER_WORDS = {1: "1", 2: "2", 3: "3"}
SIZE = 56


def _draw(draw: ImageDraw.ImageDraw, shape: str, colour: str, cx: int, cy: int, r: int) -> None:
    fill = COLOURS[colour]
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill)
    else:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)


def _canvas() -> tuple[Image.Image, ImageDraw.ImageDraw]:
    img = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    return img, ImageDraw.Draw(img)


def make_record(
    rng: random.Random, idx: int, split: str, kind_weights: dict[str, float] | None = None
) -> tuple[dict, Image.Image]:
    weights = kind_weights or UNIFORM
    kind = rng.choices(list(weights), weights=list(weights.values()))[0]
    img, draw = _canvas()
    if kind in ("colour", "shape"):
        shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
        r = rng.randint(8, 14)
        _draw(draw, shape, colour, rng.randint(r + 2, SIZE - r - 3), rng.randint(r + 2, SIZE - r - 3), r)
        q = "What colour is the shape?" if kind == "colour" else "What shape is shown?"
        answer = colour if kind == "colour" else shape
    elif kind == "count":
        n = rng.randint(1, 3)
        slots = rng.sample([(14, 14), (42, 14), (14, 42), (42, 42)], n)
        for cx, cy in slots:
            _draw(draw, rng.choice(SHAPES), rng.choice(list(COLOURS)), cx, cy, 8)
        q, answer = "How many shapes are there?", NUMBER_WORDS[n]
    else:
        ca, cb = rng.sample(list(COLOURS), 2)
        left_first = rng.random() < 0.5
        ya, yb = rng.randint(12, 44), rng.randint(12, 44)
        _draw(draw, rng.choice(SHAPES), ca, 14 if left_first else 42, ya, 9)
        _draw(draw, rng.choice(SHAPES), cb, 42 if left_first else 14, yb, 9)
        q = f"Is the {ca} shape on the left or the right?"
        answer = "left" if left_first else "right"
    rid = f"shapes-{split}-{idx:05d}"
    rec = {
        "id": rid,
        "prompt": q,
        "images": [f"images/{rid}.png"],
        "answer": answer,
        "metadata": {"kind": kind},
    }
    return rec, img


UNIFORM = {"colour": 1.0, "shape": 1.0, "count": 1.0, "position": 1.0}
# RL and held-out prompts: mostly colour and count, the attributes the bundled ~1M-parameter model learns within
# minutes on a CPU; layout and shape identity it learns far more slowly (see recipes/shapes/README.md).
RL_KIND_WEIGHTS = {"colour": 0.55, "count": 0.25, "position": 0.1, "shape": 0.1}
# The warm-start split over-represents one answer per question kind (see ``build``).
MAJORITY = {"colour": "red", "shape": "circle", "count": "1", "position": "left"}


def build(
    folder: str | Path,
    *,
    n_train: int = 2000,
    n_eval: int = 200,
    n_sft: int = 2000,
    sft_keep_other: float = 0.2,
    seed: int = 0,
    kind_weights: dict[str, float] | None = None,
) -> dict[str, Path]:
    """Write ``train.jsonl`` (RL prompts), ``eval.jsonl`` (held out), ``sft.jsonl`` (warm start) and ``images/``.

    ``train`` and ``eval`` draw question kinds by ``kind_weights`` (default :data:`RL_KIND_WEIGHTS`) and answers
    uniformly. ``sft`` draws kinds uniformly and is a disjoint split whose records with a non-majority
    answer are kept with probability ``sft_keep_other``, so its answers are skewed towards ``MAJORITY`` (about 60%
    "red" among colour questions instead of 25%): the mismatch between supervised data and the RL prompt
    distribution that RL on balanced prompts has to correct.
    """
    root = Path(folder)
    (root / "images").mkdir(parents=True, exist_ok=True)
    paths = {}
    rl_weights = kind_weights or RL_KIND_WEIGHTS
    splits = (
        ("train", n_train, seed, 1.0, rl_weights),
        ("eval", n_eval, seed + 1_000_003, 1.0, rl_weights),
        ("sft", n_sft, seed + 2_000_029, sft_keep_other, UNIFORM),
    )
    for split, n, s, keep_other, weights in splits:
        rng = random.Random(s)
        lines: list[str] = []
        i = 0
        while len(lines) < n:
            rec, img = make_record(rng, i, split, weights)
            i += 1
            if rec["answer"] != MAJORITY[rec["metadata"]["kind"]] and rng.random() >= keep_other:
                continue
            img.save(root / rec["images"][0], optimize=True)
            lines.append(json.dumps(rec))
        paths[split] = root / f"{split}.jsonl"
        tmp = paths[split].with_suffix(".jsonl.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(paths[split])
    return paths
