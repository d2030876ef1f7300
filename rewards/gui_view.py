"""What the ``gui_action`` reward saw, for the run report's gallery: the screenshot with the target (green) and the
predicted click (red), parsed and mapped to original pixels by the reward's own functions. The model-input size and
coordinate frame come from the run's model settings (:class:`mmrl.model.checkpoint_files.ModelView`), since
rollouts.jsonl keeps no sizes."""

from __future__ import annotations

from typing import Any

from PIL import Image, ImageDraw

from mmrl.model.checkpoint_files import ModelView
from mmrl.processors.image import thumbnail
from mmrl.rewards.gui import POINTING_ACTIONS, parse_action, parse_reference, to_original

SIDE = 384  # drawn at the report's thumbnail size, so the marks keep their width on the page


def overlay(
    screen: Image.Image, row: dict[str, Any], text: str, view: ModelView | tuple[int, int]
) -> tuple[Image.Image, str] | None:
    """The screenshot with the target (green) and the predicted click mapped to original pixels (red); None when
    the answer is not a GUI action."""
    answer, sample_id = row.get("answer"), str(row.get("id", "?"))
    if not isinstance(answer, (str, dict)):
        return None
    try:
        target = parse_reference(answer, sample_id)
    except (ValueError, TypeError):
        return None
    w, h = screen.size
    model = ModelView.of(view)
    meta = model.metadata(w, h)
    mapper = to_original(meta)
    thumb, s = thumbnail(screen, SIDE)
    draw = ImageDraw.Draw(thumb)
    if target.box is not None:
        x1, y1, x2, y2 = (v * s for v in target.box)
        draw.rectangle([x1, y1, x2, y2], outline=(0, 170, 0), width=3)
    elif target.point is not None:
        tx, ty = target.point[0] * s, target.point[1] * s
        draw.ellipse([tx - 6, ty - 6, tx + 6, ty + 6], outline=(0, 170, 0), width=3)
    pred = parse_action(text)
    if pred is None:
        return thumb, "no action parsed from the answer"
    caption = f"action {pred.action!r}, target {target.action!r}"
    if pred.point is None:
        return thumb, caption + (", no point" if pred.action in POINTING_ACTIONS else "")
    ox, oy = mapper(*pred.point)
    px, py = ox * s, oy * s
    draw.line([px - 9, py, px + 9, py], fill=(220, 0, 0), width=3)
    draw.line([px, py - 9, px, py + 9], fill=(220, 0, 0), width=3)
    draw.ellipse([px - 6, py - 6, px + 6, py + 6], outline=(220, 0, 0), width=2)
    off = "" if 0 <= ox <= w and 0 <= oy <= h else " (off screen)"
    mw, mh = meta["model_image_sizes"][0]
    where = f"{mw}x{mh} model input" if model.frame == "model_pixels" else f"{model.frame} frame"
    caption += (
        f"; click ({pred.point[0]:g}, {pred.point[1]:g}) in the {where} -> "
        f"({ox:.0f}, {oy:.0f}) in the {w}x{h} screenshot{off}"
    )
    return thumb, caption
