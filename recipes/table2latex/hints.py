"""The table2latex recipe's hints (``algo.augment_options.hints: table2latex``, docs/cliff.md#hint-builders): the
first rows of the reference LaTeX, one more row per rung (rows end at ``\\\\``; the preamble up to the first row's
end is the first rung)."""

from __future__ import annotations

import re

from mmrl.train.hints import register_hints
from mmrl.types import Sample

LEAD = "Hint: the table's LaTeX begins with:\n"


@register_hints("table2latex")
def table_hints(sample: Sample, rungs: int = 3) -> list[str]:
    ref = sample.answer if isinstance(sample.answer, str) else ""
    ends = [m.end() for m in re.finditer(r"\\\\", ref)]
    return [LEAD + ref[:end] for end in ends[: max(0, min(rungs, len(ends) - 1))]]
