"""The geometry recipe's hints (``algo.augment_options.hints: geometry``, docs/cliff.md#hint-builders): the answer's
type first (a number, or one of the choices' letters), then the reasoning steps of the record's solution
(``metadata.solution``, e.g. ``180-50-70``), then the first half of the answer with them."""

from __future__ import annotations

from mmrl.train.hints import register_hints
from mmrl.types import Sample


@register_hints("geometry")
def geometry_hints(sample: Sample) -> list[str]:
    meta = sample.metadata
    choices = meta.get("choices")
    if choices:
        letters = ", ".join(chr(ord("A") + i) for i in range(len(choices)))
        kind = f"Hint: the answer is one of the letters {letters}."
    else:
        kind = "Hint: the answer is a number."
    out = [kind]
    steps = meta.get("solution")
    if isinstance(steps, str) and steps.strip():
        out.append(f"{kind} Compute {steps.strip()}.")
    answer = str(meta.get("answer", sample.answer or "")).strip()
    if len(answer) > 1 and len(out) > 1:
        out.append(f"{out[-1]} The answer begins with {answer[: len(answer) // 2]}.")
    return out
