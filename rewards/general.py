"""General-purpose rewards: format, math equivalence, multiple choice, exact match, DAPO overlong shaping, and the
backward correction for noisy verifiers (docs/algorithms.md#grpo-family and §4).

- ``format_think_answer``: 1 when the response is exactly ``<think>...</think>`` then ``<answer>...</answer>`` (only
  whitespace around and between); with ``require_think=False`` a bare ``<answer>...</answer>`` also passes.
- ``math_verify``: HuggingFace ``math-verify`` decides equivalence. The gold answer is parsed as given and, when that
  finds nothing (bare LaTeX such as ``x^2+1``), again wrapped in ``$...$``; the response's ``<answer>`` content (or the
  whole response, where math-verify takes the last ``\\boxed{}`` or number) is parsed the same way. math-verify's
  timeouts use ``signal.alarm``, which only works in the main thread; elsewhere (a thread) they are disabled and the
  composite's pool timeout is the guard.
- ``mc_letter``: the chosen letter (see :func:`mmrl.rewards.text.extract_choice_letter`) against a reference letter,
  or option text resolved through ``metadata["choices"]``.
- ``exact_match``: SQuAD-normalised equality; a list reference accepts any of its strings.
- ``overlong_penalty``: DAPO's soft overlong punishment. The digest writes ``min(-(len - (L_max - L_buf)) / L_buf,
  0)``; the DAPO paper also clamps it at -1 beyond ``L_max``, as done here. The length is
  ``metadata["response_tokens"]`` (a count, or the token ids) when the trainer provides it, else the number of
  whitespace-separated words, which only approximates tokens.
- The answer-checking rewards (math_verify, mc_letter, exact_match, and the GUI and pathology rewards) do not apply
  (score None) to a sample whose reference is None, so a composite over mixed data scores each sample only with the
  rewards that fit it.
- Noisy-verifier corrections of rewards live with the trainer's algorithms (``algo.reward_correction``,
  :mod:`mmrl.algos.corrections`).
"""

from __future__ import annotations

import threading

from mmrl.rewards.base import register_reward
from mmrl.rewards.text import (
    answer_text,
    extract_answer,
    extract_choice_letter,
    is_think_answer,
    normalize_text,
    reference_letters,
)
from mmrl.types import RewardInput, RewardResult


@register_reward("format_think_answer")
def format_think_answer(batch: list[RewardInput], *, require_think: bool = True) -> list[RewardResult]:
    return [
        RewardResult(score=float(is_think_answer(x.response, require_think=require_think))) for x in batch
    ]


def math_parse(text: str, timeout: int | None) -> list:
    """math-verify's parse of ``text``: bare LaTeX first wrapped in ``$...$``, then as given, then wrapped when
    nothing was found (also the label-free rewards' reading, :mod:`mmrl.rewards.labelfree`)."""
    from math_verify import parse

    # bare LaTeX ("9\\pi", "\\frac{1}{2}") is read as math first: plain parsing takes "9\\pi" for the number 9
    if "\\" in text and "$" not in text:
        found = parse(f"${text}$", parsing_timeout=timeout)
        if found:
            return found
    found = parse(text, parsing_timeout=timeout)
    if not found and "$" not in text:
        found = parse(f"${text}$", parsing_timeout=timeout)
    return found


@register_reward("math_verify")
def math_verify(batch: list[RewardInput], *, timeout_s: int = 5) -> list[RewardResult]:
    """parts: ``format`` (an ``<answer>`` tag or a ``\\boxed{}`` was given), ``correct``; score = correct."""
    from math_verify import verify

    timeout = timeout_s if timeout_s > 0 and threading.current_thread() is threading.main_thread() else None
    out = []
    for x in batch:
        if x.reference is None:
            out.append(RewardResult(score=None))
            continue
        gold = math_parse(str(x.reference), timeout)
        if not gold:
            raise ValueError(
                f"sample {x.id!r}: math-verify cannot parse the reference {x.reference!r}; fix the record"
            )
        tagged = extract_answer(x.response)
        fmt = tagged is not None or "\\boxed" in x.response
        pred = math_parse(tagged if tagged is not None else x.response, timeout)
        correct = bool(pred) and verify(gold, pred, timeout_seconds=timeout)
        out.append(
            RewardResult(score=float(correct), parts={"format": float(fmt), "correct": float(correct)})
        )
    return out


@register_reward("mc_letter")
def mc_letter(batch: list[RewardInput]) -> list[RewardResult]:
    """parts: ``format`` (a letter was found), ``correct``; score = correct."""
    out = []
    for x in batch:
        if x.reference is None:
            out.append(RewardResult(score=None))
            continue
        choices = x.metadata.get("choices")
        gold = reference_letters(x.reference, choices, x.id)
        letter = extract_choice_letter(answer_text(x.response), choices)
        correct = float(letter in gold)
        out.append(
            RewardResult(score=correct, parts={"format": float(letter is not None), "correct": correct})
        )
    return out


@register_reward("exact_match")
def exact_match(batch: list[RewardInput], *, extract_answer_tag: bool = True) -> list[RewardResult]:
    """With ``extract_answer_tag`` the ``<answer>`` content is compared (the whole response when there is none)."""
    out = []
    for x in batch:
        if x.reference is None:
            out.append(RewardResult(score=None))
            continue
        pred = normalize_text(answer_text(x.response) if extract_answer_tag else x.response)
        refs = x.reference if isinstance(x.reference, (list, tuple)) else [x.reference]
        out.append(RewardResult(score=float(any(pred == normalize_text(str(r)) for r in refs))))
    return out


def _response_length(x: RewardInput) -> int:
    tokens = x.metadata.get("response_tokens")
    if tokens is None:
        return len(x.response.split())
    return tokens if isinstance(tokens, int) else len(tokens)


@register_reward("overlong_penalty")
def overlong_penalty(
    batch: list[RewardInput], *, max_length: int = 20480, buffer: int = 4096
) -> list[RewardResult]:
    """DAPO: 0 up to ``max_length - buffer``, then linear down to -1 at ``max_length``, -1 beyond. Defaults are
    DAPO's (L_max 20480, L_cache 4096). parts: ``length``."""
    if not 0 < buffer <= max_length:
        raise ValueError(
            f"overlong_penalty: need 0 < buffer <= max_length, got buffer={buffer}, max_length={max_length}"
        )
    out = []
    for x in batch:
        n = _response_length(x)
        penalty = max(min(-(n - (max_length - buffer)) / buffer, 0.0), -1.0)
        out.append(RewardResult(score=penalty, parts={"length": float(n)}))
    return out


__all__ = [
    "exact_match",
    "format_think_answer",
    "math_verify",
    "mc_letter",
    "overlong_penalty",
]
