"""The GUI grounding recipe's hints (``algo.augment_options.hints: gui``, docs/cliff.md#hint-builders): the target
element's kind and name (``metadata.target``), then that with the quadrant of the screen its box lies in
(``metadata.elements``' boxes, in screen pixels, against the screen's size)."""

from __future__ import annotations

from mmrl.recipes.pathology.hints import quadrant
from mmrl.train.hints import register_hints
from mmrl.types import Sample


@register_hints("gui")
def gui_hints(sample: Sample) -> list[str]:
    meta = sample.metadata
    target = meta.get("target")
    if not target:
        return []
    first = f"Hint: act on the {target['kind']} named '{target['name']}'."
    box = next((e["bbox"] for e in meta.get("elements", []) if e.get("id") == target.get("id")), None)
    size = meta.get("screen_size") or meta.get("image_size")
    if box is None or not size:
        return [first]
    return [first, f"{first} It is in the {quadrant(box, tuple(size))} quadrant of the screen."]
