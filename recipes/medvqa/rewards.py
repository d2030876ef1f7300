"""The tiny medvqa recipe's reward: MediX-R1's ``medix`` composite, unchanged in score, with two logged parts that
only synthetic data allows, because the truth of every answer is known there:

- ``oracle``: 1 when the answer names exactly the tile's tissue and lesion (:func:`language.read`, which knows
  every synonym of the recipe's vocabulary): the true accuracy the judge and the encoder approximate;
- ``judge_agrees``: 1 when the judge's YES/NO equals the oracle's verdict: the judge's accuracy on the policy's own
  answers, which drift during training away from anything the judge was trained on.

Neither part changes the score the policy is trained on. The GPU variant uses ``medix`` itself (real data has no
oracle). ``medvqa_oracle`` is the ``oracle`` part alone as a reward: the ``truth`` that the tournament variant
(``tiny-arena.yaml``) logs beside its ranks.
"""

from __future__ import annotations

from mmrl.recipes.medvqa.language import read
from mmrl.rewards.base import REWARDS, register_reward
from mmrl.rewards.medix import check_medix_options, strip_tag
from mmrl.rewards.text import answer_text
from mmrl.types import RewardInput, RewardResult


@register_reward("medix_with_oracle", check=check_medix_options)
def medix_with_oracle(
    batch: list[RewardInput],
    *,
    judge: dict = {},  # noqa: B006 - options are read, never mutated
    embedding: dict = {},  # noqa: B006
) -> list[RewardResult]:
    scored = REWARDS.get("medix").fn(batch, judge=judge, embedding=embedding)
    out = []
    for x, r in zip(batch, scored):
        if r.score is None:
            out.append(r)
            continue
        truth = (x.metadata["tissue"], x.metadata["lesion"])
        oracle = float(read(strip_tag(answer_text(x.response), "modality")) == truth)
        agrees = float(r.parts["judge"] == oracle and not r.parts["judge_unparseable"])
        out.append(RewardResult(score=r.score, parts={**r.parts, "oracle": oracle, "judge_agrees": agrees}))
    return out


@register_reward("medvqa_oracle")
def medvqa_oracle(batch: list[RewardInput]) -> list[RewardResult]:
    """1 when the answer names exactly the tile's tissue and lesion (``metadata``), as :func:`language.read` reads
    it; 0 otherwise."""
    out = []
    for x in batch:
        truth = (x.metadata["tissue"], x.metadata["lesion"])
        out.append(RewardResult(score=float(read(strip_tag(answer_text(x.response), "modality")) == truth)))
    return out
