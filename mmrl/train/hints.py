"""Hint builders (``algo.augment_options.hints``, docs/cliff.md#hint-builders): for a training record, a ladder of
hints from the least to the most revealing, each a complete text to append to the record's question. GHPO and
Scaf-GRPO (:mod:`mmrl.train.hinting`) re-pose a prompt whose group failed with the lowest rung that helps.

A builder is a function ``(sample) -> list[str]`` registered by name with :func:`register_hints`; an empty list means
the record has nothing to hint with (its group stays as it was). Each recipe with references says how its hints are
made, in its own folder (``recipes/<domain>/hints.py``); ``reference_prefix`` is the generic one.

:func:`with_hint` puts a hint into the last user turn as a text part after everything there, so the record's images
and videos stay where they were: the hinted prompt is encoded, generated from and scored with the same media.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from mmrl.registry import Builtin, Registry
from mmrl.types import Sample

HintBuilder = Callable[[Sample], list[str]]

HINTS: Registry[HintBuilder] = Registry(
    "hint builder",
    {
        "reference_prefix": Builtin("mmrl.train.hints"),
        "geometry": Builtin("mmrl.recipes.geometry.hints"),
        "table2latex": Builtin("mmrl.recipes.table2latex.hints"),
        "pathology": Builtin("mmrl.recipes.pathology.hints"),
        "gui": Builtin("mmrl.recipes.gui.hints"),
    },
)


def register_hints(name: str) -> Callable[[HintBuilder], HintBuilder]:
    return HINTS.register(name)


def with_hint(sample: Sample, hint: str) -> Sample:
    """``sample`` with ``hint`` as a last text part of its last user turn (its media untouched); the id is kept (the
    record is the same; prompt caches key on content)."""
    messages = [dict(m) for m in sample.messages]
    k = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if k is None:
        raise ValueError(f"record {sample.id!r}: no user turn to put a hint in")
    content = messages[k]["content"]
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    parts.append({"type": "text", "text": "\n" + hint})
    messages[k] = {**messages[k], "content": parts}
    return replace(sample, messages=messages)


def reference_text(sample: Sample) -> str:
    """The record's worked solution (``metadata.solution``) when it has one, else its answer as text."""
    ref = sample.metadata.get("solution")
    if not isinstance(ref, str) or not ref.strip():
        ref = sample.answer if isinstance(sample.answer, str) else ""
    return ref.strip()


GHPO_LEAD = "The following text is the beginning part of the answer, which you can refer to for solving the problem:\n"


@register_hints("reference_prefix")
def reference_prefix(sample: Sample, fractions: tuple[float, ...] = (0.25, 0.5, 0.75)) -> list[str]:
    """GHPO's hints: the first 25%, 50% and 75% of the reference (characters, as GHPO's code counts), after GHPO's
    lead sentence; rungs that would be empty or repeat the previous one are left out."""
    ref = reference_text(sample)
    out: list[str] = []
    for w in fractions:
        cut = ref[: round(len(ref) * w)]
        if cut and (not out or out[-1] != GHPO_LEAD + cut):
            out.append(GHPO_LEAD + cut)
    return out
