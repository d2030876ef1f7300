"""The pathology recipe's hints (``algo.augment_options.hints: pathology``, docs/cliff.md#hint-builders): for a record
that asks for a region, the quadrant of the image holding the region's centre, then that with the lesion's name; for
the others, the question type (one word, or yes/no) and then the answer's first letter."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from mmrl.train.hints import register_hints
from mmrl.types import Sample


def quadrant(box: list[float], size: tuple[int, int]) -> str:
    """``top-left`` ... ``bottom-right``: where the box's centre lies in an image of ``size`` (w, h)."""
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return f"{'top' if cy < size[1] / 2 else 'bottom'}-{'left' if cx < size[0] / 2 else 'right'}"


@register_hints("pathology")
def pathology_hints(sample: Sample) -> list[str]:
    meta, answer = sample.metadata, str(sample.answer or "")
    region = meta.get("region")
    if region and sample.images and Path(sample.images[0]).is_file():
        with Image.open(sample.images[0]) as im:  # the header only: the size
            where = quadrant(region, im.size)
        first = f"Hint: the lesion lies in the {where} quadrant of the image."
        return [first, f"{first} It is {answer}."] if answer else [first]
    if meta.get("question_type") == "closed":
        kind = "Hint: the answer is yes or no."
    else:
        kind = "Hint: the answer is one word."
    return [kind, f"{kind} It begins with '{answer[0]}'."] if answer else [kind]
