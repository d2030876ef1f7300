"""Generated geometry figures and bar charts with numeric or multiple-choice answers (the geometry recipe's data).

Visual math in the MSSR and VADE papers' domain (Geometry3k, MathVista-style figures), drawn with PIL from a
seeded RNG so that ``build(folder, seed)`` reproduces the same files. Six question kinds:

| kind | figure | question | answer |
|---|---|---|---|
| angle | a triangle with its two base angles labelled | the third angle | 180 - a - b (40..120) |
| area | a rectangle drawn to scale, sides labelled | its area | w h |
| perimeter | the same rectangle | its perimeter | 2 (w + h) |
| circle | a circle drawn to scale, radius labelled | its area in terms of pi | ``$r^2\\pi$`` |
| bar_max | three bars A, B, C over a labelled grid | which bar is tallest (choices A, B, C) | a letter |
| bar_value | the same chart | the value of one bar | 1..4 |

Numeric answers are scored by ``math_verify``; the multiple-choice kind stores its options in
``metadata["choices"]`` and is scored by ``mc_letter`` (``reward.py`` routes each record to the right one). Every
response is asked to be ``<think>reading</think><answer>value</answer>``; the ``sft`` split's ``answer`` is that
whole completion (what ``mmrl sft`` teaches), e.g. ``<think>180-50-70</think><answer>60</answer>``: the think part
holds the numbers read off the figure, so the bundled tiny model reads before it answers.

The value ranges are small on purpose, so the bundled tiny model (hidden 128, 2 layers) can learn them on a CPU:
every label is a short number in Pillow's bundled font, the angle and chart labels sit at fixed places (the side
and radius labels move with the figure, which is drawn to scale), and the images are 112 x 112 pixels (16 image
tokens at ``model.min_pixels = max_pixels = 12544``).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

SIZE = 112
PROMPT = "{question} Think briefly inside <think></think>, then give the answer inside <answer></answer>."
KINDS = ("angle", "area", "perimeter", "circle", "bar_max", "bar_value")
UNIFORM = {k: 1.0 for k in KINDS}
BASE_ANGLES = (30, 50, 70)
SIDES = (2, 3, 4)
RADII = (2, 3, 4)
BAR_NAMES = ("A", "B", "C")
BAR_VALUES = (1, 2, 3, 4)
INK = (20, 20, 20)
FILLS = ((235, 235, 250), (250, 235, 225), (230, 245, 230), (245, 245, 215))
BAR_COLOURS = ((60, 110, 200), (220, 120, 40), (60, 160, 90))


def _font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=13)  # Pillow's bundled font: the same glyphs on every machine


def _label(draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str) -> None:
    """Draw ``text`` centred on ``xy``, kept inside the canvas."""
    font = _font()
    x0, y0, x1, y1 = draw.textbbox((0, 0), text, font=font)
    w, h = x1 - x0, y1 - y0
    x = min(max(xy[0] - w / 2, 1), SIZE - w - 1)
    y = min(max(xy[1] - h / 2, 1), SIZE - h - 1)
    draw.text((x - x0, y - y0), text, fill=INK, font=font)


def _triangle(rng: random.Random) -> tuple[Image.Image, dict[str, Any]]:
    a, b = rng.choice(BASE_ANGLES), rng.choice(BASE_ANGLES)
    # apex over a base of length 1 from (0, 0) to (1, 0), then the whole triangle scaled into the drawing box
    ta, tb = math.tan(math.radians(a)), math.tan(math.radians(b))
    px = tb / (ta + tb)
    py = px * ta
    scale = min(84.0, 66.0 / py)
    left = (SIZE - scale) / 2 + rng.randint(-3, 3)
    base_y = 88 + rng.randint(-3, 3)
    pts = [(left, base_y), (left + scale, base_y), (left + px * scale, base_y - py * scale)]
    img = Image.new("RGB", (SIZE, SIZE), "white")
    draw = ImageDraw.Draw(img)
    draw.polygon(pts, fill=rng.choice(FILLS), outline=INK, width=2)
    _label(draw, (14, 102), f"{a}°")
    _label(draw, (98, 102), f"{b}°")
    _label(draw, (pts[2][0], max(pts[2][1] - 9, 8)), "x")
    c = 180 - a - b
    return img, {
        "question": "The triangle's base angles are labelled. What is the angle x in degrees?",
        "answer": str(c),
        "solution": f"180-{a}-{b}",
        "params": [a, b],
    }


def _rectangle(rng: random.Random, kind: str) -> tuple[Image.Image, dict[str, Any]]:
    w, h = rng.choice(SIDES), rng.choice(SIDES)
    unit = 18
    x0, y0 = 16 + rng.randint(-3, 3), 12 + rng.randint(-3, 3)
    x1, y1 = x0 + w * unit, y0 + h * unit
    img = Image.new("RGB", (SIZE, SIZE), "white")
    draw = ImageDraw.Draw(img)
    draw.rectangle([x0, y0, x1, y1], fill=rng.choice(FILLS), outline=INK, width=2)
    _label(draw, ((x0 + x1) / 2, y1 + 9), str(w))
    _label(draw, (x1 + 9, (y0 + y1) / 2), str(h))
    if kind == "area":
        q, ans, sol = "What is the area of the rectangle?", w * h, f"{w}*{h}"
    else:
        q, ans, sol = "What is the perimeter of the rectangle?", 2 * (w + h), f"2*({w}+{h})"
    return img, {"question": q, "answer": str(ans), "solution": sol, "params": [w, h]}


def _circle(rng: random.Random) -> tuple[Image.Image, dict[str, Any]]:
    r = rng.choice(RADII)
    radius = 10 * r + 4
    cx, cy = SIZE // 2 + rng.randint(-3, 3), SIZE // 2 + rng.randint(-3, 3)
    dx = rng.choice((-1, 1))  # the radius drawn to the left or the right
    img = Image.new("RGB", (SIZE, SIZE), "white")
    draw = ImageDraw.Draw(img)
    fill = rng.choice(FILLS)
    draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=fill, outline=INK, width=2)
    draw.line([(cx, cy), (cx + dx * radius, cy)], fill=INK, width=2)
    _label(draw, (cx + dx * radius / 2, cy - 8), str(r))
    return img, {
        "question": "The radius is labelled. What is the area of the circle, in terms of pi?",
        # in $...$: math_verify reads a bare "9\\pi" as 9 (see the recipe README)
        "answer": f"${r * r}\\pi$",
        "solution": f"{r}*{r}",
        "params": [r],
    }


def _bars(rng: random.Random, kind: str) -> tuple[Image.Image, dict[str, Any]]:
    if kind == "bar_max":  # a unique tallest bar
        values = rng.sample(BAR_VALUES, 3)
    else:
        values = [rng.choice(BAR_VALUES) for _ in BAR_NAMES]
    img = Image.new("RGB", (SIZE, SIZE), "white")
    draw = ImageDraw.Draw(img)
    floor, unit, left = 92, 19, 24
    for v in BAR_VALUES:  # grid lines with their values on the y axis
        y = floor - v * unit
        draw.line([(left, y), (SIZE - 4, y)], fill=(200, 200, 200), width=1)
        _label(draw, (11, y), str(v))
    draw.line([(left, floor), (SIZE - 4, floor)], fill=INK, width=2)
    for i, (name, v) in enumerate(zip(BAR_NAMES, values)):
        x = left + 6 + i * 28
        draw.rectangle([x, floor - v * unit, x + 18, floor], fill=rng.choice(BAR_COLOURS))
        _label(draw, (x + 9, floor + 10), name)
    reading = " ".join(f"{n}={v}" for n, v in zip(BAR_NAMES, values))
    if kind == "bar_max":
        best = BAR_NAMES[values.index(max(values))]
        return img, {
            "question": "Which bar is the tallest? Choices: A, B, C.",
            "answer": best,
            "choices": list(BAR_NAMES),
            "solution": reading,
            "params": values,
        }
    j = rng.randrange(3)
    return img, {
        "question": f"What is the value of bar {BAR_NAMES[j]}?",
        "answer": str(values[j]),
        "solution": f"{BAR_NAMES[j]}={values[j]}",
        "params": [*values, j],
    }


def make_figure(rng: random.Random, kind: str) -> tuple[Image.Image, dict[str, Any]]:
    """One figure of ``kind`` and its question, answer, solution (the think text) and drawing parameters."""
    if kind == "angle":
        return _triangle(rng)
    if kind in ("area", "perimeter"):
        return _rectangle(rng, kind)
    if kind == "circle":
        return _circle(rng)
    if kind in ("bar_max", "bar_value"):
        return _bars(rng, kind)
    raise ValueError(f"unknown geometry kind {kind!r}; choose from {', '.join(KINDS)}")


def completion(solution: str, answer: str) -> str:
    """The response the recipe asks for: the reading inside ``<think>``, the value inside ``<answer>``."""
    return f"<think>{solution}</think><answer>{answer}</answer>"


def make_record(
    rng: random.Random, idx: int, split: str, kind_weights: dict[str, float]
) -> tuple[dict[str, Any], Image.Image]:
    kind = rng.choices(list(kind_weights), weights=list(kind_weights.values()))[0]
    img, fig = make_figure(rng, kind)
    rid = f"geometry-{split}-{idx:05d}"
    meta: dict[str, Any] = {"kind": kind, "solution": fig["solution"], "answer": fig["answer"]}
    if "choices" in fig:
        meta["choices"] = fig["choices"]
    answer = completion(fig["solution"], fig["answer"]) if split == "sft" else fig["answer"]
    rec = {
        "id": rid,
        "prompt": PROMPT.format(question=fig["question"]),
        "images": [f"images/{rid}.png"],
        "answer": answer,
        "metadata": meta,
    }
    return rec, img


# RL and held-out prompts: mostly the kinds whose labels sit at fixed places (angles, chart values), which the
# bundled ~1M-parameter model reads after its warm start; the rectangles, whose labels move with the figure and whose
# answers combine two readings, it barely reads at all (see recipes/geometry/README.md).
RL_KIND_WEIGHTS = {
    "angle": 0.3,
    "bar_value": 0.3,
    "bar_max": 0.2,
    "circle": 0.1,
    "area": 0.05,
    "perimeter": 0.05,
}


def build(
    folder: str | Path,
    *,
    n_train: int = 512,
    n_eval: int = 200,
    n_sft: int = 3000,
    seed: int = 0,
    kind_weights: dict[str, float] | None = None,
) -> dict[str, Path]:
    """Write ``train.jsonl`` (RL prompts), ``eval.jsonl`` (held out), ``sft.jsonl`` (warm start) and ``images/``.

    ``train`` and ``eval`` draw kinds by ``kind_weights`` (default :data:`RL_KIND_WEIGHTS`), ``sft`` uniformly.
    The splits are disjoint: a figure whose pixels and question already appear in an earlier split (or earlier in
    the same split) is drawn again, so no held-out image is ever trained on, by SFT or RL. 512 RL prompts keep every prompt
    visited several times in a tiny run, which VADE's per-prompt counts and MSSR's per-prompt tracker need.
    """
    root = Path(folder)
    (root / "images").mkdir(parents=True, exist_ok=True)
    rl_weights = kind_weights or RL_KIND_WEIGHTS
    seen: set[str] = set()
    paths = {}
    splits = (  # sft first, so that reweighting the RL kinds leaves the warm start's records unchanged
        ("sft", n_sft, seed + 2_000_029, UNIFORM),
        ("eval", n_eval, seed + 1_000_003, rl_weights),
        ("train", n_train, seed, rl_weights),
    )
    for split, n, s, weights in splits:
        rng = random.Random(s)
        lines: list[str] = []
        draws = 0
        while len(lines) < n:
            draws += 1
            if draws > 20 * n:
                raise ValueError(
                    f"geometry build: only {len(lines)} distinct {split} figures after {draws} draws; "
                    f"ask for fewer records (n_{split}={n}) or widen the value ranges in data.py"
                )
            rec, img = make_record(rng, len(lines), split, weights)
            key = hashlib.sha1(img.tobytes() + rec["prompt"].encode()).hexdigest()
            if key in seen:
                continue
            seen.add(key)
            img.save(root / rec["images"][0], optimize=True)
            lines.append(json.dumps(rec))
        paths[split] = root / f"{split}.jsonl"
        tmp = paths[split].with_suffix(".jsonl.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(paths[split])
    return paths
