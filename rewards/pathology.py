"""Pathology VQA reward with an optional region term (docs/rewards.md#domain-rewards: Patho-R1 does not publish its reward
details, so this is our own design on its <think>/<answer> format).

Question type: ``metadata["question_type"]`` in {"yes_no", "multiple_choice", "open"}; when absent it is inferred:
a yes/no reference -> yes_no, ``metadata["choices"]`` -> multiple_choice, else open.

Answer text: the ``<answer>`` content (the whole response without one), with region marks removed; when that content
is a JSON/Python dict, its ``"answer"`` value. Answer part (``answer``):
- yes_no: the first word of the normalised answer if it is yes/no, else the only one of yes/no that occurs;
- multiple_choice: the option letter (or one option's text, via ``metadata["choices"]``) equals the reference;
- open: ``answer_em`` (SQuAD-normalised exact match) and ``answer_f1`` (token F1); ``answer`` = 1 when em, else f1,
  so a partly right free-text answer still earns partial credit. A list reference takes the best of its strings.

Region (only when ``metadata["region"]`` is annotated, a box ``[x1, y1, x2, y2]`` or a polygon ``[[x, y], ...]`` in
original pixels). Accepted marks, searched in the ``<answer>`` content (the whole response without one): the first
``<box>[x1, y1, x2, y2]</box>`` or ``<polygon>[[x, y], ...]</polygon>`` tag, else a dict answer's ``"box"`` or
``"polygon"`` key, e.g. ``<answer>{"answer": "tumour", "box": [10, 20, 200, 220]}</answer>``. Predicted coordinates
are in the model's coordinate frame (``metadata["coordinate_frame"]``: model-input pixels for Qwen2.5-VL, 0-1000 for
Qwen3-VL and Qwen3.5, :mod:`mmrl.model.geometry`) and are mapped to original pixels like the GUI reward
(``metadata["image_sizes"]`` / ``["model_image_sizes"]``; identity without them). Both shapes are rasterised with PIL ``ImageDraw.polygon`` on the
image's pixel grid and scored by mask IoU (``region``). Only the window of the grid covering the two shapes is drawn
(the IoU is the same, and whole-slide images stay cheap); shapes are clipped to the image when its size is known
(``metadata["image_sizes"][0]`` or the first image's size). No mark, or a malformed one -> region 0; no region
annotated -> no ``region`` part.

A sample whose reference is None is left out (score None).
Score = answer_weight * answer + region_weight * region + format_weight * format, with defaults 0.7 / 0.2 / 0.1;
without an annotated region the region weight is added to the answer's (0.9 * answer + 0.1 * format). ``format`` is
1 for exactly ``<think>...</think><answer>...</answer>``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from mmrl.rewards.base import register_reward
from mmrl.rewards.gui import parse_literal, to_original
from mmrl.rewards.text import (
    answer_text,
    extract_choice_letter,
    is_think_answer,
    normalize_text,
    reference_letters,
    token_f1,
)
from mmrl.types import RewardInput, RewardResult

QUESTION_TYPES = ("yes_no", "multiple_choice", "open")
_MARKS = re.compile(r"<(box|polygon)>(.*?)</\1>", re.DOTALL)
Polygon = list[tuple[float, float]]


def question_type(x: RewardInput) -> str:
    qt = x.metadata.get("question_type")
    if qt is not None:
        if qt not in QUESTION_TYPES:
            raise ValueError(
                f"sample {x.id!r}: metadata['question_type'] must be one of {QUESTION_TYPES}, got {qt!r}"
            )
        return qt
    if _yes_no_word(x.reference) is not None:
        return "yes_no"
    return "multiple_choice" if x.metadata.get("choices") else "open"


def _yes_no_word(value: Any) -> str | None:
    if isinstance(value, bool):
        return "yes" if value else "no"
    norm = normalize_text(str(value))
    return norm if norm in ("yes", "no") else None


def _predicted_yes_no(text: str) -> str | None:
    words = normalize_text(text).split()
    if words and words[0] in ("yes", "no"):
        return words[0]
    found = {w for w in words if w in ("yes", "no")}
    return found.pop() if len(found) == 1 else None


def split_answer(response: str) -> tuple[str, Any]:
    """(answer text, region mark or None) from the response, as described in the module docstring."""
    content = answer_text(response)
    mark: Any = None
    m = _MARKS.search(content)
    if m:
        mark = parse_literal(m.group(2).strip())
        mark = mark if mark is not None else "malformed"
    parsed = parse_literal(content) if content.startswith("{") else None
    if isinstance(parsed, dict):
        if mark is None:
            mark = parsed.get("box", parsed.get("polygon"))
        return str(parsed.get("answer", "")), mark
    return " ".join(_MARKS.sub(" ", content).split()), mark


def answer_parts(x: RewardInput, text: str) -> dict[str, float]:
    qt = question_type(x)
    if qt == "yes_no":
        gold = _yes_no_word(x.reference)
        if gold is None:
            raise ValueError(
                f"sample {x.id!r}: yes/no question with reference {x.reference!r}; use 'yes' or 'no'"
            )
        return {"answer": float(_predicted_yes_no(text) == gold)}
    if qt == "multiple_choice":
        choices = x.metadata.get("choices")
        gold = reference_letters(x.reference, choices, x.id)
        return {"answer": float(extract_choice_letter(text, choices) in gold)}
    refs = x.reference if isinstance(x.reference, (list, tuple)) else [x.reference]
    em = float(any(normalize_text(text) == normalize_text(str(r)) for r in refs))
    f1 = max(token_f1(text, str(r)) for r in refs)
    return {"answer_em": em, "answer_f1": f1, "answer": 1.0 if em else f1}


def as_polygon(shape: Any) -> Polygon | None:
    """A box ``[x1, y1, x2, y2]`` or a polygon ``[[x, y], ...]`` (>= 3 points) as a vertex list; None if malformed."""
    if not isinstance(shape, (list, tuple)):
        return None
    if len(shape) == 4 and all(_is_num(v) for v in shape):
        x1, x2 = sorted((float(shape[0]), float(shape[2])))
        y1, y2 = sorted((float(shape[1]), float(shape[3])))
        return [(x1, y1), (x2, y1), (x2, y2), (x1, y2)]
    pts = [p for p in shape if isinstance(p, (list, tuple)) and len(p) == 2 and all(_is_num(v) for v in p)]
    if len(pts) != len(shape) or len(pts) < 3:
        return None
    return [(float(px), float(py)) for px, py in pts]


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def mask_iou(a: Polygon, b: Polygon, image_size: tuple[int, int] | None) -> float:
    """IoU of the two polygons rasterised on the image's pixel grid (a window of it that covers both)."""
    xs = [p[0] for p in a + b]
    ys = [p[1] for p in a + b]
    x0, y0 = math.floor(min(xs)), math.floor(min(ys))
    x1, y1 = math.ceil(max(xs)) + 1, math.ceil(max(ys)) + 1
    if image_size is not None:
        x0, y0 = max(x0, 0), max(y0, 0)
        x1, y1 = min(x1, image_size[0]), min(y1, image_size[1])
    if x1 <= x0 or y1 <= y0:
        return 0.0
    masks = []
    for poly in (a, b):
        canvas = Image.new("L", (x1 - x0, y1 - y0), 0)
        ImageDraw.Draw(canvas).polygon([(px - x0, py - y0) for px, py in poly], fill=1, outline=1)
        masks.append(np.asarray(canvas, dtype=bool))
    union = np.logical_or(*masks).sum()
    return float(np.logical_and(*masks).sum() / union) if union else 0.0


def _image_size(x: RewardInput) -> tuple[int, int] | None:
    sizes = x.metadata.get("image_sizes")
    if sizes:
        return int(sizes[0][0]), int(sizes[0][1])
    if not x.images:
        return None
    first = x.images[0]
    if isinstance(first, Image.Image):
        return first.size
    with Image.open(first) as im:
        return im.size


def region_score(x: RewardInput, mark: Any) -> float:
    gold = as_polygon(x.metadata["region"])
    if gold is None:
        raise ValueError(
            f"sample {x.id!r}: metadata['region'] must be [x1, y1, x2, y2] or [[x, y], ...] with >= 3 points, "
            f"got {x.metadata['region']!r}"
        )
    pred = as_polygon(mark)
    if pred is None:
        return 0.0
    mapper = to_original(x.metadata)
    return mask_iou([mapper(px, py) for px, py in pred], gold, _image_size(x))


def _score(x: RewardInput, weights: Mapping[str, float]) -> RewardResult:
    text, mark = split_answer(x.response)
    parts = answer_parts(x, text)
    parts["format"] = float(is_think_answer(x.response))
    answer_w = weights["answer"]
    score = weights["format"] * parts["format"]
    if x.metadata.get("region") is not None:
        parts["region"] = region_score(x, mark)
        score += weights["region"] * parts["region"]
    else:
        answer_w += weights["region"]
    return RewardResult(score=score + answer_w * parts["answer"], parts=parts)


@register_reward("pathology", overlay="mmrl.rewards.pathology_view:report_overlay")
def pathology(
    batch: list[RewardInput],
    *,
    answer_weight: float = 0.7,
    region_weight: float = 0.2,
    format_weight: float = 0.1,
) -> list[RewardResult]:
    weights = {"answer": answer_weight, "region": region_weight, "format": format_weight}
    return [RewardResult(score=None) if x.reference is None else _score(x, weights) for x in batch]


__all__ = ["as_polygon", "mask_iou", "pathology", "question_type", "split_answer"]
