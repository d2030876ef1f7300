"""MediX-R1's composite reward for open-ended medical answers (docs/rewards.md#domain-rewards) and its modality-tag reward.

``medix`` = ``0.9 * (0.575 * judge + 0.375 * embedding + 0.05 * modality) + 0.1 * format`` with the paper's
weights as defaults (``judge_weight``, ``embedding_weight``, ``modality_weight``, ``accuracy_weight``,
``format_weight``):
- ``judge``: the :mod:`judge <mmrl.rewards.judge>` reward's strict YES/NO verdict on the answer;
- ``embedding``: :mod:`embedding_similarity <mmrl.rewards.embedding>` thresholded at ``similarity_threshold``
  (0.8, the paper's), so a paraphrase or terminology variant the judge rejects still earns this part;
- ``modality``: :func:`modality_tag` (the image modality named in ``<modality>...</modality>``);
- ``format``: ``<think>...</think><answer>...</answer>`` and nothing else.
The judge and the encoder see the ``<answer>`` content with the modality tag removed. Their own options are nested:
``options: {judge: {model: PATH, ...}, embedding: {model: PATH, ...}}``, checked at pre-flight against those
rewards' signatures. A record without a modality in its metadata has no modality term, and the accuracy part is
renormalised over judge and embedding. An unparseable or timed-out verdict scores the judge term 0 and is counted
in part ``judge_unparseable`` / ``judge_timeout`` (logged, with the sample id, by logger ``mmrl.rewards``); the
other terms keep their scores.

The paper does not spell out the modality tag's exact markup; ``<modality>`` is this project's choice (option
``tag``). Accepted names: ``metadata["modality"]`` and its aliases in :data:`MODALITY_ALIASES` or
``metadata["modality_aliases"]``, compared case- and punctuation-insensitively.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Any

from mmrl.rewards.base import REWARDS, call_reward, register_reward, validate_options
from mmrl.rewards.text import answer_text, is_think_answer
from mmrl.types import RewardInput, RewardResult

logger = logging.getLogger("mmrl.rewards")

MODALITY_ALIASES: dict[str, tuple[str, ...]] = {
    "histopathology": ("histopathology", "histology", "pathology", "microscopy", "h&e", "whole slide image"),
    "x-ray": ("x-ray", "xray", "radiograph", "radiography", "cxr", "chest x-ray"),
    "ct": ("ct", "computed tomography", "ct scan"),
    "mri": ("mri", "magnetic resonance imaging", "mr"),
    "ultrasound": ("ultrasound", "sonography", "us", "echography"),
    "endoscopy": ("endoscopy", "colonoscopy", "gastroscopy"),
    "fundus": ("fundus", "fundus photography", "retinal photograph"),
    "oct": ("oct", "optical coherence tomography"),
    "mammography": ("mammography", "mammogram"),
    "dermoscopy": ("dermoscopy", "dermatoscopy"),
}


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9&]+", " ", s.lower()).strip()


def _tag(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.DOTALL)


def accepted_modalities(metadata: dict[str, Any]) -> set[str]:
    name = metadata.get("modality")
    if not name:
        return set()
    names = {_norm(str(name))} | {_norm(a) for a in metadata.get("modality_aliases", [])}
    for aliases in MODALITY_ALIASES.values():
        normed = {_norm(a) for a in aliases}
        if names & normed:
            names |= normed
    return names


@register_reward("modality_tag")
def modality_tag(batch: list[RewardInput], *, tag: str = "modality") -> list[RewardResult]:
    """1 when the first ``<tag>...</tag>`` names the record's modality; records without one do not apply."""
    pattern = _tag(tag)
    out = []
    for x in batch:
        accepted = accepted_modalities(x.metadata)
        if not accepted:
            out.append(RewardResult(score=None))
            continue
        m = pattern.search(x.response)
        out.append(RewardResult(score=float(m is not None and _norm(m[1]) in accepted)))
    return out


def strip_tag(text: str, tag: str) -> str:
    return re.sub(r"\s+", " ", _tag(tag).sub(" ", text)).strip()


def check_medix_options(options: dict[str, Any]) -> None:
    """Pre-flight: the nested judge and embedding options, checked as those rewards check their own."""
    for part, reward in (("judge", "judge"), ("embedding", "embedding_similarity")):
        try:
            validate_options(REWARDS.get(reward), options.get(part, {}))
        except ValueError as e:
            raise ValueError(f"reward 'medix', option {part!r}: {e}") from None


@register_reward("medix", check=check_medix_options)
def medix(
    batch: list[RewardInput],
    *,
    judge: dict = {},  # noqa: B006 - options are read, never mutated
    embedding: dict = {},  # noqa: B006
    similarity_threshold: float = 0.8,
    tag: str = "modality",
    judge_weight: float = 0.575,
    embedding_weight: float = 0.375,
    modality_weight: float = 0.05,
    accuracy_weight: float = 0.9,
    format_weight: float = 0.1,
) -> list[RewardResult]:
    """MediX-R1's composite (see the module docstring); records without a reference do not apply."""
    answers = [replace(x, response=strip_tag(answer_text(x.response), tag)) for x in batch]
    judged = call_reward(REWARDS.get("judge").fn, "judge", answers, {**judge, "answer_only": False})
    emb_opts = {"threshold": similarity_threshold, **embedding, "answer_only": False}
    embedded = call_reward(REWARDS.get("embedding_similarity").fn, "embedding_similarity", answers, emb_opts)
    modality = modality_tag(batch, tag=tag)
    out = []
    for x, j, e, m in zip(batch, judged, embedded, modality):
        if j.score is None and e.score is None:
            out.append(RewardResult(score=None))
            continue
        if j.error:
            logger.warning("sample %r: medix judge term 0: %s", x.id, j.error)
        terms = [(judge_weight, j.score or 0.0), (embedding_weight, e.score or 0.0)]
        if m.score is not None:
            terms.append((modality_weight, m.score))
        accuracy = sum(w * s for w, s in terms) / sum(w for w, _ in terms)
        fmt = float(is_think_answer(x.response))
        parts = {
            "judge": j.score or 0.0,
            "judge_unparseable": j.parts.get("unparseable", 0.0),
            "judge_timeout": j.parts.get("timeout", 0.0),
            "embedding": e.score or 0.0,
            "cosine": e.parts.get("cosine", 0.0),
            "format": fmt,
        }
        if m.score is not None:
            parts["modality"] = m.score
        out.append(RewardResult(score=accuracy_weight * accuracy + format_weight * fmt, parts=parts))
    return out
