"""The ``zoom`` env: questions about details too small to read at the model's pixel budget (small text in a chart, a
cell in a large pathology tile, a code in a cluttered scene). The model may call ``zoom`` on a box of the image it
was shown and receives that region at full resolution as a new image; the answer is judged at the end.

Actions (one per turn; in the text after the last ``</think>`` when there is one, so the model may think about
actions freely; the FIRST action in that text wins and the rest is ignored):

- ``<tool_call>{"name": "zoom", "arguments": {"bbox": [x1, y1, x2, y2]}}</tool_call>``: a Qwen3-style JSON tool
  call (``bbox_2d`` is accepted for ``bbox``; ``arguments`` may be a JSON string; a Python literal with single quotes
  parses too; the closing tag may be missing when generation stopped at it);
- ``zoom(x1, y1, x2, y2)``: the plain form (also ``zoom([x1, y1, x2, y2])``, ``zoom(bbox=[...])`` and
  ``zoom((x1, y1), (x2, y2))``);
- ``<answer>...</answer>``: the final answer (the closing tag may be missing too).

Anything else is an invalid action: the observation says what was wrong and what is expected, reward 0,
``info["invalid"] = True``. It uses a call like a zoom does. With ``invalid: end`` (a strict tool API) it ends the
episode instead, with reward 0 and ``info["reason"] = "invalid"``: an answer after a malformed call can no longer be
rewarded, which a policy sampled at temperature 1 otherwise learns to exploit (recipes/zoom/README.md).

Coordinates are in the model's coordinate frame of the ORIGINAL image (the first image of the sample, the one the
prompt showed), also on later turns: a crop is something to read, not a new frame. The frame and sizes come from
the sample's metadata as the collector gives rewards (:mod:`mmrl.model.geometry`): ``coordinate_frame`` (``model_pixels``
when absent), ``image_sizes[0]`` (the original ``[w, h]``; it must match the image file) and
``model_image_sizes[0]`` (the ``[w, h]`` the model saw; without it ``model_pixels`` are taken as original pixels).
Corners are mapped with :func:`mmrl.processors.geometry.frame_to_original`, sorted, and the box is clamped to the image
(floor of the left/top edge, ceiling of the right/bottom, in original pixels); a box wholly outside the image is
invalid. A box smaller than ``min_crop_side`` on an axis grows about its centre to that size (within the image);
a crop of more than ``max_crop_pixels`` is downscaled (aspect kept, Lanczos) to fit. The crop is written as a PNG
under the episode's folder; the observation says ``Zoomed view of [x1, y1, x2, y2] (N zooms left):`` with the box
actually shown, in the model's frame, followed by the image.

State key (GiGPO's anchor state): the sample id and the view shown, ``full`` after reset or the clamped crop box in
original pixels rounded to a ``state_grid`` px grid; an invalid action leaves the state as it was.

Reward, on the answer step only (the other steps give 0): 1 if the answer equals the sample's ``answer`` after
:func:`mmrl.rewards.text.normalize_text` (SQuAD normalisation), else 0; minus ``call_penalty`` per call (zooms and
invalid actions), floored at 0 so a wrong answer scores 0 however it was reached. After ``max_calls`` calls the
model must answer: a further call ends the episode with reward 0 and ``info["reason"] = "max_calls"``.

``info`` per step: ``action`` (``zoom``, ``answer`` or ``invalid``), ``calls`` (so far), on a zoom ``box`` (original
pixels) and ``zoom_hit`` (when the metadata has ``target_box``: the crop contains it whole), on the answer
``correct``, and ``reason`` on the last step. ``target_hit`` is the step's correctness under the key the
``browser_app`` env uses too, so per-step metrics read one key for both: on a zoom ``zoom_hit`` (False without
``target_box``), on the answer ``correct``, False on an invalid action or one past the call budget.

The oracle (:meth:`ZoomEnv.oracle`, teacher-forced episodes and the multi-turn SFT warm start): while no zoom so far
has held the whole ``target_box`` (and calls are left), a tool call zooming on it grown by :data:`ORACLE_MARGIN`
original pixels (clamped to the image), mapped to the model's frame and rounded outward at the precision the env
writes boxes in (whole numbers; 3 decimals in ``relative_1``), so the env's own parsing gives ``zoom_hit``; then
``<answer>ANSWER</answer>`` with the sample's answer. A sample without ``target_box`` has no oracle zoom (an error
naming the sample). With ``oracle_grid: n`` the oracle zooms instead on the cell of an n x n split of its current
view (the image, then its last crop) that holds the target's centre, until a zoom has held the whole target (and,
with ``oracle_view``, until the view is at most that many pixels a side): the coarse strategy a model that sees the
image at a few tokens can learn (the tiny recipe's data keeps every target inside one cell of a 4 x 4 grid, so
``oracle_grid: 2, oracle_view: 84`` zooms on its quadrant, then on its quarter of the quadrant).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from mmrl.envs.base import Env, Observation, StepResult, register_env
from mmrl.processors.geometry import DEFAULT_FRAME, frame_to_original, original_to_frame
from mmrl.rewards.gui import parse_literal
from mmrl.rewards.text import normalize_text
from mmrl.types import Sample

EXPECTED = (
    'expected <tool_call>{"name": "zoom", "arguments": {"bbox": [x1, y1, x2, y2]}}</tool_call>, '
    "zoom(x1, y1, x2, y2) or <answer>...</answer>"
)
_OPENERS = re.compile(r"<tool_call>|\bzoom\s*\(|<answer>", re.IGNORECASE)
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_FOUR = re.compile(rf"^({_NUMBER}),({_NUMBER}),({_NUMBER}),({_NUMBER})$")
_KEYWORD = re.compile(r"^\s*(?:bbox_2d|bbox|box)\s*=\s*")
ORACLE_MARGIN = 4  # original pixels around the target box in the oracle's zoom


class Invalid(ValueError):
    """A malformed action; the message is what the model is told."""


def parse_action(text: str) -> tuple[str, Any]:
    """The first action of a turn: ``("zoom", (x1, y1, x2, y2))`` in the model's frame or ``("answer", text)``;
    raises :class:`Invalid` saying what was wrong."""
    text = text.rsplit("</think>", 1)[-1]
    m = _OPENERS.search(text)
    if m is None:
        raise Invalid("no action found")
    opener, rest = m.group(0).lower(), text[m.end() :]
    if opener == "<answer>":
        return "answer", re.split(r"</answer>", rest, maxsplit=1, flags=re.IGNORECASE)[0].strip()
    if opener == "<tool_call>":
        body = re.split(r"</tool_call>", rest, maxsplit=1, flags=re.IGNORECASE)[0]
        return "zoom", _tool_call_box(body)
    return "zoom", _plain_box(rest)


def _tool_call_box(body: str) -> tuple[float, ...]:
    call = parse_literal(body.strip())
    if not isinstance(call, dict):
        raise Invalid("the tool call is not a JSON object")
    if call.get("name") != "zoom":
        raise Invalid(f"unknown tool {call.get('name')!r}: the only tool is zoom")
    args = call.get("arguments", call.get("parameters"))
    if isinstance(args, str):
        args = parse_literal(args)
    if not isinstance(args, dict):
        raise Invalid('zoom needs "arguments": {"bbox": [x1, y1, x2, y2]}')
    box = args.get("bbox", args.get("bbox_2d"))
    if not (isinstance(box, (list, tuple)) and len(box) == 4):
        raise Invalid("bbox must be a list of 4 numbers [x1, y1, x2, y2]")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box):
        raise Invalid("bbox must be a list of 4 numbers [x1, y1, x2, y2]")
    return tuple(float(v) for v in box)


def _plain_box(rest: str) -> tuple[float, ...]:
    depth, end = 1, None
    for i, ch in enumerate(rest):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            end = i
            break
    if end is None:
        raise Invalid("zoom( has no closing parenthesis")
    args = re.sub(r"[\s()\[\]]", "", _KEYWORD.sub("", rest[:end]))
    m = _FOUR.match(args)
    if m is None:
        raise Invalid("zoom takes 4 numbers: zoom(x1, y1, x2, y2)")
    return tuple(float(v) for v in m.groups())


def _grow(lo: int, hi: int, size: int, side: int) -> tuple[int, int]:
    """``[lo, hi)`` grown about its centre to at least ``side`` (at most ``size``), kept within ``[0, size)``."""
    side = min(side, size)
    if hi - lo >= side:
        return lo, hi
    start = math.floor((lo + hi - side) / 2)
    start = min(max(start, 0), size - side)
    return start, start + side


@register_env("zoom")
class ZoomEnv(Env):
    """See the module docstring. Options: ``max_calls`` (zoom budget before the answer), ``call_penalty``
    (subtracted per call from the answer's reward, floored at 0), ``max_crop_pixels`` (larger crops are
    downscaled to fit), ``min_crop_side`` (px), ``state_grid`` (px grid of the crop box in the state key),
    ``oracle_grid`` (0: the oracle zooms on the target box; n: on the cell of an n x n split of its current view that
    holds the target's centre, as a model that sees coarsely would), ``oracle_format`` (``tool_call``: the Qwen3-style
    JSON call; ``plain``: ``zoom(x1, y1, x2, y2)``, a quarter of the tokens, which a tiny model samples intact),
    ``oracle_view`` (0, or: the oracle zooms on until its view's longer side is at most this many original pixels),
    ``invalid`` (``retry``: a malformed action is told what was wrong and uses a call; ``end``: it ends the episode
    with reward 0)."""

    deterministic = True

    def __init__(
        self,
        *,
        workdir: Path,
        max_calls: int = 4,
        call_penalty: float = 0.0,
        max_crop_pixels: int = 200_704,
        min_crop_side: int = 16,
        state_grid: int = 8,
        oracle_grid: int = 0,
        oracle_format: str = "tool_call",
        oracle_view: int = 0,
        invalid: str = "retry",
    ) -> None:
        super().__init__(workdir=workdir)
        self.check_options(
            {
                "max_calls": max_calls,
                "call_penalty": call_penalty,
                "max_crop_pixels": max_crop_pixels,
                "min_crop_side": min_crop_side,
                "state_grid": state_grid,
                "oracle_grid": oracle_grid,
                "oracle_format": oracle_format,
                "oracle_view": oracle_view,
                "invalid": invalid,
            }
        )
        self.end_on_invalid = invalid == "end"
        self.oracle_grid, self.oracle_format, self.oracle_view = oracle_grid, oracle_format, oracle_view
        self.max_calls, self.call_penalty = max_calls, float(call_penalty)
        self.max_crop_pixels, self.min_crop_side, self.state_grid = max_crop_pixels, min_crop_side, state_grid
        self.calls = 0
        self.state_key = ""
        self.hit = self.finished = False  # a zoom so far held the target box; the episode is over

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        lows = {
            "max_calls": 0,
            "call_penalty": 0,
            "max_crop_pixels": 1,
            "min_crop_side": 1,
            "state_grid": 1,
            "oracle_grid": 0,
            "oracle_view": 0,
        }
        for key, low in lows.items():
            if key in options and not options[key] >= low:
                raise ValueError(f"env 'zoom': option {key!r} must be >= {low}, got {options[key]!r}")
        if options.get("invalid", "retry") not in ("retry", "end"):
            raise ValueError(
                f"env 'zoom': option 'invalid' must be 'retry' or 'end', got {options['invalid']!r}"
            )
        if options.get("oracle_format", "tool_call") not in ("tool_call", "plain"):
            raise ValueError(
                f"env 'zoom': option 'oracle_format' must be 'tool_call' or 'plain', got {options['oracle_format']!r}"
            )
        side, most = options.get("min_crop_side", 16), options.get("max_crop_pixels", 200_704)
        if side * side > most:
            raise ValueError(
                f"env 'zoom': min_crop_side {side} squared is more than max_crop_pixels {most}; lower the first or "
                "raise the second"
            )

    def reset(self, sample: Sample) -> Observation:
        if not sample.images:
            raise ValueError(f"sample {sample.id!r}: the zoom env needs an image")
        if sample.answer is None:
            raise ValueError(f"sample {sample.id!r}: the zoom env needs the reference answer (`answer`)")
        self.sample = sample
        with Image.open(sample.images[0]) as img:
            self.image = img.convert("RGB")
        size = self.image.size
        meta = sample.metadata or {}
        given = meta.get("image_sizes")
        if given and tuple(given[0]) != size:
            raise ValueError(
                f"sample {sample.id!r}: metadata image_sizes[0] is {list(given[0])} but the image is "
                f"{size[0]}x{size[1]}; coordinates would be mapped wrongly"
            )
        self.frame = meta.get("coordinate_frame") or DEFAULT_FRAME
        model = meta.get("model_image_sizes")
        self.model_size = tuple(model[0]) if model else size
        self.target = meta.get("target_box")
        self.calls = 0
        self.hit = self.finished = False
        self.view = (0, 0, *self.image.size)  # what the model sees last: the image, then the last crop
        self.state_key = self._key("full")
        return Observation(text="", images=[], state_key=self.state_key)

    def step(self, action_text: str) -> StepResult:
        try:
            kind, value = parse_action(str(action_text))
            if kind == "answer":
                return self._answer(value)
            if self.calls >= self.max_calls:
                return self._over("zoom")
            box = self._crop_box(value)
        except Invalid as bad:
            if self.calls >= self.max_calls or self.end_on_invalid:
                return self._over("invalid")
            self.calls += 1
            text = f"invalid action: {bad}; {EXPECTED}. {self._left()}"
            info = {"action": "invalid", "invalid": True, "calls": self.calls, "target_hit": False}
            return StepResult(Observation(text=text, images=[], state_key=self.state_key), 0.0, False, info)
        self.calls += 1
        return self._zoom(box)

    def close(self) -> None:
        self.image = None

    def oracle(self) -> str | None:
        """A zoom on the target box until one has held it (while calls are left), then the answer (module
        docstring); None once the episode is over."""
        if self.finished:
            return None
        view = max(self.view[2] - self.view[0], self.view[3] - self.view[1])
        close = self.hit and (not self.oracle_view or view <= self.oracle_view)
        if close or self.calls >= self.max_calls:
            return f"<answer>{self.sample.answer}</answer>"
        if self.target is None:
            raise ValueError(
                f"sample {self.sample.id!r}: the zoom env's oracle needs metadata target_box (the box to zoom on, "
                "[x1, y1, x2, y2] in original pixels); build the data with it"
            )
        w, h = self.image.size
        x1, y1, x2, y2 = self.target
        m = ORACLE_MARGIN
        if self.oracle_grid:  # the grid cell of the current view that holds the target's centre
            vx1, vy1, vx2, vy2 = self.view
            n, cx, cy = self.oracle_grid, (x1 + x2) / 2, (y1 + y2) / 2
            i = min(n - 1, max(0, int((cx - vx1) * n // (vx2 - vx1))))
            j = min(n - 1, max(0, int((cy - vy1) * n // (vy2 - vy1))))
            x1, x2 = vx1 + (vx2 - vx1) * i / n, vx1 + (vx2 - vx1) * (i + 1) / n
            y1, y2 = vy1 + (vy2 - vy1) * j / n, vy1 + (vy2 - vy1) * (j + 1) / n
            m = 0
        a = original_to_frame(max(0, x1 - m), max(0, y1 - m), self.frame, (w, h), self.model_size)
        b = original_to_frame(min(w, x2 + m), min(h, y2 + m), self.frame, (w, h), self.model_size)
        scale = 1000 if self.frame == "relative_1" else 1  # the precision _shown writes: 3 decimals or whole
        lo = [math.floor(v * scale) / scale if scale > 1 else math.floor(v) for v in a]
        hi = [math.ceil(v * scale) / scale if scale > 1 else math.ceil(v) for v in b]
        if self.oracle_format == "plain":
            return f"zoom({', '.join(str(v) for v in (*lo, *hi))})"
        call = {"name": "zoom", "arguments": {"bbox": [*lo, *hi]}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"

    def _answer(self, answer: str) -> StepResult:
        correct = normalize_text(answer) == normalize_text(str(self.sample.answer))
        reward = max(0.0, float(correct) - self.call_penalty * self.calls)
        info = {
            "action": "answer",
            "correct": correct,
            "success": correct,
            "target_hit": correct,
            "calls": self.calls,
        }
        self.finished = True
        return StepResult(None, reward, True, info | {"reason": "answer"})

    def _over(self, kind: str) -> StepResult:
        self.finished = True
        reason = "max_calls" if self.calls >= self.max_calls else "invalid"
        info = {
            "action": kind,
            "calls": self.calls,
            "target_hit": False,
            "success": False,
            "reason": reason,
        }
        if kind == "invalid":
            info["invalid"] = True
        return StepResult(None, 0.0, True, info)

    def _left(self) -> str:
        left = self.max_calls - self.calls
        return f"{left} zoom{'s' if left != 1 else ''} left" if left else "no zooms left: answer now"

    def _crop_box(self, box: tuple[float, ...]) -> tuple[int, int, int, int]:
        """The model's box as a crop box in original pixels (module docstring); raises Invalid."""
        if not all(math.isfinite(v) for v in box):
            raise Invalid("the box has a non-finite number")
        w, h = self.image.size
        x1, y1 = frame_to_original(box[0], box[1], self.frame, (w, h), self.model_size)
        x2, y2 = frame_to_original(box[2], box[3], self.frame, (w, h), self.model_size)
        (x1, x2), (y1, y2) = sorted((x1, x2)), sorted((y1, y2))
        if not all(math.isfinite(v) for v in (x1, y1, x2, y2)) or x2 < 0 or y2 < 0 or x1 > w or y1 > h:
            raise Invalid("the box lies outside the image")
        left, right = _grow(max(0, math.floor(x1)), min(w, math.ceil(x2)), w, self.min_crop_side)
        top, bottom = _grow(max(0, math.floor(y1)), min(h, math.ceil(y2)), h, self.min_crop_side)
        return left, top, right, bottom

    def _zoom(self, box: tuple[int, int, int, int]) -> StepResult:
        crop = self.image.crop(box)
        cw, ch = crop.size
        if cw * ch > self.max_crop_pixels:
            scale = math.sqrt(self.max_crop_pixels / (cw * ch))
            crop = crop.resize((max(1, int(cw * scale)), max(1, int(ch * scale))), Image.Resampling.LANCZOS)
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / f"zoom-{self.calls:02d}.png"
        crop.save(path, format="PNG")
        g = self.state_grid
        self.state_key = self._key(",".join(str(round(v / g)) for v in box))
        text = f"Zoomed view of {self._shown(box)} ({self._left()}):"
        info: dict[str, Any] = {"action": "zoom", "calls": self.calls, "box": list(box), "target_hit": False}
        if self.target is not None:
            tx1, ty1, tx2, ty2 = self.target
            info["zoom_hit"] = box[0] <= tx1 and box[1] <= ty1 and box[2] >= tx2 and box[3] >= ty2
            info["target_hit"] = info["zoom_hit"]
            self.hit = self.hit or info["zoom_hit"]
        self.view = box
        return StepResult(
            Observation(text=text, images=[str(path)], state_key=self.state_key), 0.0, False, info
        )

    def _shown(self, box: tuple[int, int, int, int]) -> str:
        """The crop box in the model's frame, as the model would write it."""
        size = self.image.size
        a = original_to_frame(box[0], box[1], self.frame, size, self.model_size)
        b = original_to_frame(box[2], box[3], self.frame, size, self.model_size)
        digits = 3 if self.frame == "relative_1" else 0
        return json.dumps([round(v, digits) if digits else round(v) for v in (*a, *b)])

    def _key(self, view: str) -> str:
        return hashlib.sha1(f"{self.sample.id}|{view}".encode()).hexdigest()[:16]
