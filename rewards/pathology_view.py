"""What the ``pathology`` reward saw, for the run report's gallery: the tile with the annotated region (green) and
the region the response marked (red), parsed and mapped to image pixels by the reward's own functions.

The model marks regions in its coordinate frame; the reward maps them to the image with the sizes and frame the
trainer gives it. rollouts.jsonl keeps neither, so they are rebuilt here from the run's model settings
(:class:`mmrl.model.checkpoint_files.ModelView`: the checkpoint's geometry and family frame under its pixel budget; a bare
``(min_pixels, max_pixels)`` knows no model and means the 28 px grid), as the GUI overlay does
(``mmrl/run/report_html.py``).

The region is not part of a record's ``answer`` (the reward reads it from ``metadata["region"]``), so ``answer``
here is either a mapping holding ``"region"`` (the sample's metadata, with the reference under ``"answer"``) or
the bare reference, which has no region: then there is nothing to draw and :func:`overlay` returns None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from PIL import Image, ImageDraw

from mmrl.model.checkpoint_files import ModelView
from mmrl.rewards.gui import to_original
from mmrl.rewards.pathology import as_polygon, mask_iou, split_answer

TARGET = (0, 170, 0)
PREDICTED = (220, 0, 0)


def _fmt(poly: list[tuple[float, float]]) -> str:
    return "[" + ", ".join(f"({x:.0f}, {y:.0f})" for x, y in poly) + "]"


def overlay(
    image: Image.Image, answer: Any, sample_id: str, response: str, model: ModelView | tuple[int, int]
) -> tuple[Image.Image, str] | None:
    """A copy of ``image`` with the target region (green) and the predicted one (red), and a caption with the
    answer, the IoU the reward computes and the mapping from the model's frame to image pixels; None when the sample
    has no annotated region. ``model``: how the run's model saw the image (:class:`~mmrl.model.checkpoint_files.ModelView`)."""
    region = answer.get("region") if isinstance(answer, Mapping) else None
    gold = as_polygon(region) if region is not None else None
    if gold is None:
        return None
    w, h = image.size
    view = ModelView.of(model)
    meta = view.metadata(w, h)
    mapper = to_original(meta)
    out = image.convert("RGB")  # always a new image (PIL copies even when the mode is already RGB)
    draw = ImageDraw.Draw(out)
    width = max(1, round(max(w, h) / 160))
    draw.polygon(gold, outline=TARGET, width=width)
    text, mark = split_answer(response)
    reference = answer.get("answer") if isinstance(answer, Mapping) else None
    caption = f"{sample_id}: answer {text!r}" + (
        f" (reference {reference!r})" if reference is not None else ""
    )
    pred = as_polygon(mark) if mark is not None else None
    if pred is None:
        return out, caption + ("; no region marked" if mark is None else "; the region mark is unreadable")
    mapped = [mapper(px, py) for px, py in pred]
    draw.polygon(mapped, outline=PREDICTED, width=width)
    iou = mask_iou(mapped, gold, (w, h))
    mw, mh = meta["model_image_sizes"][0]
    where = f"{mw}x{mh} model input" if view.frame == "model_pixels" else f"{view.frame} frame"
    caption += f"; region IoU {iou:.2f}: {_fmt(pred)} in the {where} -> {_fmt(mapped)} in the {w}x{h} image"
    return out, caption


def report_overlay(
    image: Image.Image, row: Mapping[str, Any], response: str, model: ModelView
) -> tuple[Image.Image, str] | None:
    """The run report's entry point (the pathology reward's declared overlay, :attr:`mmrl.rewards.base.RewardSpec.overlay`): ``row`` is the group's rollouts.jsonl
    row, whose ``metadata`` holds the region."""
    meta = row.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return None
    return overlay(image, {**meta, "answer": row.get("answer")}, str(row.get("id", "?")), response, model)
