"""GUI action reward (docs/rewards.md#domain-rewards): UI-R1 and GUI-R1 scoring of one predicted action.

Accepted answers, inside ``<answer>...</answer>`` after ``<think>...</think>``, as a Python literal or JSON (single or
double quotes), a list of actions or one action dict; the first action is scored:
- UI-R1 (github.com/lll6gg/UI-R1, ``src/ui_r1/src/open_r1/grpo_json_action_coord.py``):
  ``[{'action': 'click', 'coordinate': [x, y]}]``;
- GUI-R1 (github.com/ritzz-ai/GUI-R1, ``verl/utils/reward_score/r1gui.py``):
  ``[{'action': 'click', 'point': [x, y], 'input_text': 'no input text'}]``.
The text argument is read from ``input_text`` (or ``text``).

Reference (``RewardInput.reference``, a dict or its JSON string), in ORIGINAL image pixels: ``{"action": ...,
"bbox": [x1, y1, x2, y2]}`` or ``{"action": ..., "point": [x, y]}``, plus ``"text"`` for text actions. GUI-R1's own
keys are accepted too: ``gt_bbox`` (2 numbers = point, 4 = box) and ``input_text`` (``"no input text"`` = none).

The model answers in its family's coordinate frame, ``metadata["coordinate_frame"]`` (set by the collector from the
policy, :mod:`mmrl.model.geometry`: ``model_pixels`` for Qwen2.5-VL, ``relative_1000`` for Qwen3-VL and Qwen3.5,
``original_pixels``; ``model_pixels`` when absent); points are mapped to original pixels with
:func:`mmrl.processors.geometry.frame_to_original` using ``metadata["image_sizes"][0]`` (original ``[w, h]``) and
``metadata["model_image_sizes"][0]`` (model ``[w, h]``). Without those two the mapping is the identity (a warning is
logged once): give them whenever the model saw a resized image.

Parts (each 0/1): ``type`` (action names equal, case-insensitive); ``coord`` (type matches and, for a pointing
action with a target, the mapped point is inside the box, edges included, or closer than ``point_radius`` px to the
target point; a matching action without a target gets 1, as in UI-R1's code); ``text`` (token F1 >=
``text_f1_threshold`` when the reference has text, else 1); ``format`` (exactly
``<think>...</think><answer>...</answer>``, the answer parses to actions with a string ``action`` and, for a pointing
action, a two-number point). An answer that does not parse scores 0 on every part. A sample whose reference is None
is left out (score None).

Scores: ``scheme="ui_r1"``: type + coord + format, in [0, 3] (UI-R1's three rewards summed; ``text`` is logged only);
``scheme="gui_r1"``: 0.8 * accuracy + 0.2 * format with accuracy = type * coord * text (part ``accuracy``).
Departures from GUI-R1's code: text F1 is SQuAD's multiset token F1 on normalised text (theirs is a set F1 that also
accepts one-token substrings), the format check does not require the ``input_text`` key, and the point and text
checks follow the reference's fields rather than a fixed list of action names.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mmrl.processors.geometry import DEFAULT_FRAME, frame_to_original
from mmrl.rewards.base import register_reward
from mmrl.rewards.text import extract_answer, is_think_answer, token_f1
from mmrl.types import RewardInput, RewardResult

logger = logging.getLogger("mmrl.rewards")

POINTING_ACTIONS = frozenset({"click", "tap", "long_press", "double_click", "right_click"})
_NO_TEXT = {"", "no input text"}
_warned_identity = False


def to_original(metadata: Mapping[str, Any]) -> Callable[[float, float], tuple[float, float]]:
    """A point mapper from the model's coordinate frame (``metadata["coordinate_frame"]``, model-input pixels when
    absent) to original pixels for the sample's first image (identity without sizes)."""
    global _warned_identity
    sizes, model_sizes = metadata.get("image_sizes"), metadata.get("model_image_sizes")
    frame = metadata.get("coordinate_frame") or DEFAULT_FRAME
    if sizes and (model_sizes or frame != "model_pixels"):  # only model_pixels needs the model-input size
        orig, model = tuple(sizes[0]), tuple(model_sizes[0]) if model_sizes else None
        return lambda x, y: frame_to_original(x, y, frame, orig, model)
    if not _warned_identity:
        logger.warning(
            "a reward got no metadata['image_sizes'] / metadata['model_image_sizes']: predicted coordinates are "
            "taken as original pixels (identity mapping); wrong if the model saw a resized image"
        )
        _warned_identity = True
    return lambda x, y: (float(x), float(y))


def parse_literal(content: str) -> Any:
    """JSON or a Python literal (single quotes); None when neither parses."""
    for load in (json.loads, ast.literal_eval):
        try:
            with warnings.catch_warnings():  # model text like "48,6]" makes the parser warn, not only fail
                warnings.simplefilter("ignore", SyntaxWarning)
                return load(content)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return None


def _number_pair(value: Any) -> tuple[float, float] | None:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
            return float(value[0]), float(value[1])
    return None


@dataclass
class _Action:
    action: str
    point: tuple[float, float] | None
    text: str | None


def parse_action(response: str) -> _Action | None:
    """The first action in the response's ``<answer>``; None if missing or malformed."""
    content = extract_answer(response)
    value = parse_literal(content) if content is not None else None
    if isinstance(value, dict):
        value = [value]
    if not (isinstance(value, list) and value and all(isinstance(a, dict) for a in value)):
        return None
    first = value[0]
    if not isinstance(first.get("action"), str):
        return None
    point = _number_pair(first.get("coordinate", first.get("point")))
    text = first.get("input_text", first.get("text"))
    return _Action(first["action"].strip().lower(), point, text if isinstance(text, str) else None)


@dataclass
class _Target:
    action: str
    box: tuple[float, float, float, float] | None
    point: tuple[float, float] | None
    text: str | None


def parse_reference(ref: Any, sample_id: str) -> _Target:
    if isinstance(ref, str):
        ref = parse_literal(ref)
    if not isinstance(ref, dict) or not isinstance(ref.get("action"), str):
        raise ValueError(
            f"sample {sample_id!r}: GUI reference must be a dict with an 'action' string and 'bbox' or 'point', "
            f"got {ref!r}"
        )
    target = next((ref[k] for k in ("bbox", "point", "gt_bbox") if ref.get(k) is not None), None)
    box = point = None
    if target is not None:
        nums = [float(v) for v in target]
        if len(nums) == 4:
            box = (nums[0], nums[1], nums[2], nums[3])
        elif len(nums) == 2:
            point = (nums[0], nums[1])
        else:
            raise ValueError(
                f"sample {sample_id!r}: GUI target must have 2 (point) or 4 (box) numbers, got {target!r}"
            )
    text = ref.get("text", ref.get("input_text"))
    text = None if text is None or str(text).strip().lower() in _NO_TEXT else str(text)
    return _Target(ref["action"].strip().lower(), box, point, text)


def _hit(xy: tuple[float, float], target: _Target, radius: float) -> bool:
    x, y = xy
    if target.box is not None:
        x1, y1, x2, y2 = target.box
        return x1 <= x <= x2 and y1 <= y <= y2
    return math.hypot(x - target.point[0], y - target.point[1]) < radius


def score_action(x: RewardInput, scheme: str, point_radius: float, text_f1_threshold: float) -> RewardResult:
    target = parse_reference(x.reference, x.id)
    pred = parse_action(x.response)
    pointing = target.action in POINTING_ACTIONS and (target.box or target.point) is not None
    if pred is None:
        parts = {"type": 0.0, "coord": 0.0, "text": 0.0, "format": 0.0}
    else:
        type_ok = pred.action == target.action
        if pointing and type_ok:
            coord_ok = pred.point is not None and _hit(
                to_original(x.metadata)(*pred.point), target, point_radius
            )
        else:
            coord_ok = type_ok
        text_ok = target.text is None or token_f1(pred.text or "", target.text) >= text_f1_threshold
        fmt = is_think_answer(x.response) and (pred.action not in POINTING_ACTIONS or pred.point is not None)
        parts = {
            "type": float(type_ok),
            "coord": float(coord_ok),
            "text": float(text_ok),
            "format": float(fmt),
        }
    if scheme == "ui_r1":
        return RewardResult(score=parts["type"] + parts["coord"] + parts["format"], parts=parts)
    parts["accuracy"] = parts["type"] * parts["coord"] * parts["text"]
    return RewardResult(score=0.8 * parts["accuracy"] + 0.2 * parts["format"], parts=parts)


@register_reward("gui_action", overlay="mmrl.rewards.gui_view:overlay")
def gui_action(
    batch: list[RewardInput],
    *,
    scheme: Literal["ui_r1", "gui_r1"] = "ui_r1",
    point_radius: float = 140.0,
    text_f1_threshold: float = 0.5,
) -> list[RewardResult]:
    if scheme not in ("ui_r1", "gui_r1"):
        raise ValueError(f"gui_action: scheme must be 'ui_r1' or 'gui_r1', got {scheme!r}")
    return [
        RewardResult(score=None)
        if x.reference is None
        else score_action(x, scheme, point_radius, text_f1_threshold)
        for x in batch
    ]
