"""The geometry recipe's answer reward: ``mc_letter`` for records with options, ``math_verify`` for the others.

Geometry3k problems are multiple choice (a letter over ``metadata["choices"]``) while generated figures ask for a
number; the shared ``mc_letter`` raises on a numeric reference without options and ``math_verify`` cannot read a
bare letter, so a mixed dataset needs each record scored by the reward that fits it. Both keep their parts
(``format``: an answer was found, ``correct``) and their score (correct or not). Use it in a config as
``{name: recipes/geometry/reward.py:geometry_answer}`` (the path is relative to the working directory, the
repository root for the shipped configs).
"""

from __future__ import annotations

from mmrl.rewards.general import math_verify, mc_letter
from mmrl.types import RewardInput, RewardResult


def geometry_answer(batch: list[RewardInput], *, timeout_s: int = 5) -> list[RewardResult]:
    """parts: ``format``, ``correct``; score = correct. ``timeout_s`` is math_verify's parsing budget."""
    with_choices = [i for i, x in enumerate(batch) if x.metadata.get("choices")]
    numeric = [i for i, x in enumerate(batch) if not x.metadata.get("choices")]
    results: dict[int, RewardResult] = {}
    if with_choices:
        results |= zip(with_choices, mc_letter([batch[i] for i in with_choices]))
    if numeric:
        results |= zip(numeric, math_verify([batch[i] for i in numeric], timeout_s=timeout_s))
    return [results[i] for i in range(len(batch))]
