"""Large cluttered images with one tiny code in a red box: the zoom recipe's data (the ``zoom`` env's world).

Each image is drawn with PIL from a seeded RNG: a light background, muted shapes (never red), small distractor
labels (other codes, white on dark blue, green, grey, purple or black boxes, or bare dark text) and one target label:
a short code in white on a filled red box. The red box stays a visible red blob after the model's resize, so the
model can find it; the code's glyphs (Pillow's bundled font, 7-8 px high) blur away once the image is downscaled
4x or more, so the model must call ``zoom`` on the box and read the crop at full resolution (:mod:`mmrl.envs.zoom`).

Records (``train.jsonl``, ``eval.jsonl``; images under ``images/``): ``answer`` is the code; ``metadata`` holds
``target_box`` ``[x1, y1, x2, y2]`` (the red box in original pixels, right and bottom edges exclusive) and ``code``;
the env reads ``target_box`` for its ``zoom_hit`` metric.

Sizes. Legibility was measured with the bundled tiny model's geometry (``assets/tiny-qwen2.5-vl``: Qwen2.5-VL's
28 px grid and bicubic resize, :meth:`mmrl.model.geometry.VisionGeometry.prepare_image`) by a nearest-template reader
that knows the font, the code's length and the box's place to within a few pixels but not its sub-pixel phase
(``tests/test_env_zoom.py`` keeps the tiny case as a test); this reader is far stronger than the tiny model.

- :func:`build_tiny`: 336 x 336 images, 2-digit codes (font size 11). With ``min_pixels = max_pixels = 3136`` the
  model sees 56 x 56 (4 image tokens, a 6x downscale): the red box is a 3 x 2 px red blob and the reader gets 6 %
  (chance 1 %; single digits would be read 23 % against 10 %, and a 224 x 224 image, a 4x downscale, 13 %). A crop
  of the box up to 56 px a side, seen under the same budget (upscaled to 56 x 56 when smaller), is read 100 %,
  80 px 90 %.
- :func:`build`: 2048 x 1536 images, 4 characters from :data:`ALPHABET` (font size 10). Downscaled 4x
  (``max_pixels`` = 196,608, about the 200,704 budget of the pathology and medvqa GPU recipes) the reader gets
  12 % (3x: 35 %, 2x: 52 %; chance 0.5 % among its 200 candidates); crops of 64-256 px under that budget read
  100 %. Keep the downscale at 4x or more: a larger budget needs a larger ``size``.

Everything comes from ``random.Random(seed)`` per split (eval's seed is offset so the splits are disjoint draws),
and PIL draws the same pixels for the same calls, so a build is reproducible byte for byte on one machine.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

PROMPT = (
    "<image>What is the code written in the small red box? Its text is too small to read at this resolution. "
    'You may zoom in: call <tool_call>{{"name": "zoom", "arguments": {{"bbox": [x1, y1, x2, y2]}}}}</tool_call> '
    "with a box in this image's coordinates (the same coordinates you would point with) and you get that region "
    "at full resolution; you may zoom up to {max_calls} times. Give the final answer as <answer>CODE</answer>."
)
# The tiny model learns the action format from its warm start, so its prompt is the question alone.
TINY_PROMPT = "<image>What is the code in the red box?"
ALPHABET = "34679ACDEFGHJKLMNPRTUVWXY"  # no look-alikes (0/O, 1/I, 2/Z, 5/S, 8/B) and no Q
DIGITS = "0123456789"
PAD = 3  # pixels between a label's box and its text
TARGET_FILL = (214, 28, 28)
# distractor box fills: dark or grey, none of them red, orange or pink
DISTRACTOR_FILLS = ((30, 60, 150), (20, 110, 60), (90, 90, 90), (25, 25, 25), (90, 40, 140), (0, 110, 130))
CLUTTER = (
    (170, 190, 220),
    (190, 215, 180),
    (220, 215, 170),
    (200, 200, 200),
    (180, 170, 210),
    (160, 200, 200),
)


@dataclass(frozen=True)
class Style:
    """What one build draws: image ``size`` ``(w, h)``, the code's characters and length range, the font size, the
    ranges of distractor labels and clutter shapes per image, and the prompt."""

    size: tuple[int, int]
    alphabet: str
    code_len: tuple[int, int]
    font_size: int
    distractors: tuple[int, int]
    clutter: tuple[int, int]
    prompt: str
    mark_box: int = 42  # the marks variants: the red box's side, its dot's side, and the grid the box lies in
    mark_dot: int = 9
    mark_cells: int = 4


FULL = Style((2048, 1536), ALPHABET, (4, 4), 10, (50, 100), (100, 200), PROMPT.format(max_calls=4))
TINY = Style((336, 336), DIGITS, (2, 2), 11, (4, 8), (8, 16), TINY_PROMPT)
# The tiny recipe's variant: the detail is a dot's colour, which the bundled tiny model's vision tower can learn
# (it does not learn to read glyphs); see build_marks.
MARK_COLOURS = {
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (235, 205, 20),
    "white": (255, 255, 255),
}
MARKS_ALPHABET = "marks"  # Style.alphabet of the marks variant
MARKS_PROMPT = "<image>What colour is the dot in the red box?"
# build_marks: 42 px boxes (7 px blobs at 56x56) with 9 px dots (1.5 px there, 3 px in a quadrant) among look-alikes
MARKS = Style((336, 336), MARKS_ALPHABET, (1, 1), 0, (4, 8), (8, 16), MARKS_PROMPT)
# The tiny recipe's world since it moved to the tiny Qwen3-VL (build_mark): one red box, no look-alike boxes.
MARK = replace(MARKS, distractors=(0, 0), mark_box=100, mark_dot=24, mark_cells=3)


@lru_cache(maxsize=4)
def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)  # Pillow's bundled font: the same glyphs on every machine


def _code(rng: random.Random, style: Style) -> str:
    return "".join(rng.choice(style.alphabet) for _ in range(rng.randint(*style.code_len)))


def _place(
    rng: random.Random, size: tuple[int, int], w: int, h: int, taken: list[tuple[int, int, int, int]]
) -> tuple[int, int, int, int] | None:
    """A ``w x h`` box inside the image (2 px margin), 3 px or more from every taken box; None after 200 tries."""
    for _ in range(200):
        x, y = rng.randint(2, size[0] - w - 2), rng.randint(2, size[1] - h - 2)
        box = (x, y, x + w, y + h)
        if all(box[2] + 3 <= t[0] or t[2] + 3 <= x or box[3] + 3 <= t[1] or t[3] + 3 <= y for t in taken):
            return box
    return None


def _label(
    rng: random.Random, draw: ImageDraw.ImageDraw, style: Style, taken: list, text: str, fill: Any, ink: Any
) -> tuple[int, int, int, int] | None:
    """Draw ``text`` on a ``fill`` box (None: bare text) at a free place; returns the box, or None if none is free."""
    font = _font(style.font_size)
    x0, y0, x1, y1 = font.getbbox(text)
    box = _place(rng, style.size, x1 - x0 + 2 * PAD, y1 - y0 + 2 * PAD, taken)
    if box is None:
        return None
    if fill is not None:
        draw.rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=fill)
    draw.text((box[0] + PAD - x0, box[1] + PAD - y0), text, fill=ink, font=font)
    taken.append(box)
    return box


def _clutter(rng: random.Random, draw: ImageDraw.ImageDraw, style: Style) -> None:
    w, h = style.size
    for _ in range(rng.randint(*style.clutter)):
        colour = rng.choice(CLUTTER)
        x0, y0 = rng.randint(0, w - 1), rng.randint(0, h - 1)
        x1, y1 = x0 + rng.randint(4, max(5, w // 6)), y0 + rng.randint(4, max(5, h // 6))
        kind = rng.randrange(3)
        if kind == 0:
            draw.rectangle([x0, y0, x1, y1], fill=colour)
        elif kind == 1:
            draw.ellipse([x0, y0, x1, y1], outline=colour, width=rng.randint(1, 3))
        else:
            draw.line([(x0, y0), (x1, y1)], fill=colour, width=rng.randint(1, 3))


def make_image(rng: random.Random, style: Style) -> tuple[Image.Image, str, list[int]]:
    """One image: ``(image, code, target_box)``, the box in original pixels (right and bottom edges exclusive)."""
    shade = rng.randint(238, 250)
    img = Image.new("RGB", style.size, (shade, shade, rng.randint(232, 250)))
    draw = ImageDraw.Draw(img)
    _clutter(rng, draw, style)
    code, taken = _code(rng, style), []
    target = _label(rng, draw, style, taken, code, TARGET_FILL, (255, 255, 255))
    if target is None:
        raise ValueError(f"zoom data: a {code!r} label does not fit a {style.size[0]}x{style.size[1]} image")
    for _ in range(rng.randint(*style.distractors)):
        fill = rng.choice(DISTRACTOR_FILLS) if rng.random() < 0.75 else None
        _label(rng, draw, style, taken, _code(rng, style), fill, (255, 255, 255) if fill else (40, 40, 40))
    return img, code, list(target)


def make_marks_image(rng: random.Random, style: Style) -> tuple[Image.Image, str, list[int]]:
    """A :data:`MARKS` image: ``(image, colour name, target_box)``: a red box with a small dot of one of
    :data:`MARK_COLOURS` in it, wholly inside one cell of a 4 x 4 grid of the image (the zoom env's ``oracle_grid: 2``
    zooms on its quadrant, then on its quarter of the quadrant), among distractor boxes (other fills, dots of any of
    those colours) and clutter."""
    shade = rng.randint(238, 250)
    img = Image.new("RGB", style.size, (shade, shade, rng.randint(232, 250)))
    draw = ImageDraw.Draw(img)
    _clutter(rng, draw, style)
    taken: list[tuple[int, int, int, int]] = []

    def box_with_dot(fill: Any, quadrant: bool = False) -> tuple[tuple[int, int, int, int] | None, str]:
        colour = rng.choice(sorted(MARK_COLOURS))
        box = _place(rng, style.size, style.mark_box, style.mark_box, taken)
        while quadrant and box is not None and not _in_one_quadrant(box, style.size, style.mark_cells):
            box = _place(rng, style.size, style.mark_box, style.mark_box, taken)
        if box is None:
            return None, colour
        draw.rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=fill)
        jx, jy = rng.randint(-2, 2), rng.randint(-2, 2)
        cx, cy = (box[0] + box[2]) // 2 + jx, (box[1] + box[3]) // 2 + jy
        h = style.mark_dot // 2
        draw.rectangle(
            [cx - h, cy - h, cx - h + style.mark_dot - 1, cy - h + style.mark_dot - 1],
            fill=MARK_COLOURS[colour],
        )
        taken.append(box)
        return box, colour

    target, colour = box_with_dot(TARGET_FILL, quadrant=True)
    if target is None:
        raise ValueError(
            f"zoom data: a {style.mark_box} px box does not fit a {style.size[0]}x{style.size[1]} image"
        )
    for _ in range(rng.randint(*style.distractors)):
        box_with_dot(rng.choice(DISTRACTOR_FILLS))
    return img, colour, list(target)


def _in_one_quadrant(box: tuple[int, int, int, int], size: tuple[int, int], cells: int = 4) -> bool:
    """The box lies wholly inside one cell of a ``cells`` x ``cells`` grid of the image (2 px from its edges), so
    inside one quadrant, and inside one quarter of that quadrant (the zoom env's ``oracle_grid: 2`` twice)."""
    w, h = size[0] / cells, size[1] / cells
    ok_x = int((box[0] - 2) // w) == int((box[2] + 1) // w) and box[0] >= 2
    ok_y = int((box[1] - 2) // h) == int((box[3] + 1) // h) and box[1] >= 2
    return ok_x and ok_y


def make_record(rng: random.Random, rid: str, style: Style, root: Path) -> dict[str, Any]:
    img, code, box = (make_marks_image if style.alphabet == MARKS_ALPHABET else make_image)(rng, style)
    rel = f"images/{rid}.png"
    img.save(root / rel)
    return {
        "id": rid,
        "prompt": style.prompt,
        "images": [rel],
        "answer": code,
        "metadata": {"target_box": box, "code": code},
    }


def _write(root: Path, style: Style, prefix: str, n_train: int, n_eval: int, seed: int) -> dict[str, Path]:
    (root / "images").mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for split, n, s in (("train", n_train, seed), ("eval", n_eval, seed + 1_000_003)):
        rng = random.Random(s)
        lines = [json.dumps(make_record(rng, f"{prefix}-{split}-{i:05d}", style, root)) for i in range(n)]
        paths[split] = root / f"{split}.jsonl"
        tmp = paths[split].with_suffix(".jsonl.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(paths[split])
    return paths


def build(
    folder: str | Path,
    *,
    n_train: int = 2000,
    n_eval: int = 200,
    seed: int = 0,
    size: tuple[int, int] = FULL.size,
    max_calls: int = 4,
) -> dict[str, Path]:
    """Write ``train.jsonl``, ``eval.jsonl`` and ``images/`` under ``folder``: ``size`` ``(w, h)`` images with a
    4-character code (font size 10) among distractor labels and clutter as dense as in the default size.
    ``max_calls`` is the zoom budget the prompt states (give the env the same ``max_calls``)."""
    w, h = size
    area = w * h / (FULL.size[0] * FULL.size[1])
    style = replace(
        FULL,
        size=(w, h),
        distractors=tuple(max(1, round(n * area)) for n in FULL.distractors),
        clutter=tuple(max(1, round(n * area)) for n in FULL.clutter),
        prompt=PROMPT.format(max_calls=max_calls),
    )
    return _write(Path(folder), style, "zoom", n_train, n_eval, seed)


def build_tiny(
    folder: str | Path, *, n_train: int = 1000, n_eval: int = 200, seed: int = 0
) -> dict[str, Path]:
    """The tiny split for the bundled ~1M-parameter model on 2 CPU cores: 336 x 336 images with 2-digit codes
    among 4-8 distractor labels, for ``model.min_pixels = max_pixels = 3136`` (module docstring)."""
    return _write(Path(folder), TINY, "zoom-tiny", n_train, n_eval, seed)


def build_marks(
    folder: str | Path, *, n_train: int = 1000, n_eval: int = 200, seed: int = 0
) -> dict[str, Path]:
    """The zoom recipe's tiny split: 336 x 336 images, the question "What colour is the dot in the red box?" (green,
    blue, yellow or white), for ``model.min_pixels = max_pixels = 3136`` (seen at 56 x 56; module docstring)."""
    return _write(Path(folder), MARKS, "zoom-marks", n_train, n_eval, seed)


def build_marks_demo(folder: str | Path, *, n: int = 1000, seed: int = 1) -> dict[str, Path]:
    """Demonstration records for the tiny recipe's warm start (``mmrl sft recipes/zoom/sft.yaml`` plays the env's
    oracle on them): :func:`build_marks` records from another seed, so they are not the RL or held-out images."""
    return _write(Path(folder), MARKS, "zoom-marks-demo", n, 0, seed)


def build_mark(
    folder: str | Path, *, n_train: int = 1000, n_eval: int = 200, seed: int = 0
) -> dict[str, Path]:
    """The zoom recipe's tiny split (``tiny.yaml``, the tiny Qwen3-VL at 64 x 64): 336 x 336 scenes with one red box
    (100 px, wholly inside one cell of a 3 x 3 split) among muted clutter, and the question "What colour is the dot in
    the red box?". The 24 px dot is under 5 px in the 64 x 64 view and 14 px in the crop of its cell. Unlike
    :func:`build_marks` there are no look-alike boxes of other fills and the box is held to a cell: with look-alikes
    (1,400 supervised steps) or a box free within its quadrant (800), the tiny models did not learn where the box is
    (recipes/zoom/README.md, benchmarks/grounding_probe.py)."""
    return _write(Path(folder), MARK, "zoom-mark", n_train, n_eval, seed)


def build_mark_demo(folder: str | Path, *, n: int = 1000, seed: int = 1) -> dict[str, Path]:
    """Demonstration records for ``sft.yaml`` (the env's oracle plays them): :func:`build_mark` from another seed."""
    return _write(Path(folder), MARK, "zoom-mark-demo", n, 0, seed)
