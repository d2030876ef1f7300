"""Text helpers shared by the answer-checking rewards: tag extraction, SQuAD-style normalisation and token F1,
the think/answer format check, and multiple-choice letter extraction.

Written here rather than taken from a library because each is a few lines and the rewards need exactly these
conventions (the SQuAD v1.1 evaluation script's normalisation and F1, which every VQA-style reward reuses).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# Content that holds no other think/answer tag, so "<answer>a</answer><answer>b</answer>" is not one answer.
_FREE = r"(?:(?!</?(?:think|answer)>).)*"
_THINK_ANSWER = re.compile(rf"\s*<think>{_FREE}</think>\s*<answer>{_FREE}</answer>\s*", re.DOTALL)
_ANSWER_ONLY = re.compile(rf"\s*<answer>{_FREE}</answer>\s*", re.DOTALL)
_PUNCT = str.maketrans("", "", string.punctuation)


def extract_answer(text: str) -> str | None:
    """The content of the last ``<answer>...</answer>``, stripped; None when there is no such tag."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def answer_text(text: str) -> str:
    """The ``<answer>`` content when present, else the whole response (stripped)."""
    found = extract_answer(text)
    return text.strip() if found is None else found


def is_think_answer(text: str, *, require_think: bool = True) -> bool:
    """``<think>...</think>`` then ``<answer>...</answer>`` and nothing else but whitespace."""
    if _THINK_ANSWER.fullmatch(text):
        return True
    return not require_think and _ANSWER_ONLY.fullmatch(text) is not None


def normalize_text(s: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and the articles a/an/the, collapse whitespace."""
    s = s.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD token F1 over normalised tokens (multiset overlap). Both empty -> 1.0; one empty -> 0.0."""
    pred, ref = normalize_text(prediction).split(), normalize_text(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


_ANSWER_IS = r"(?i:answer)\s*(?:(?i:is)|:)?\s*:?\s*"
_LETTER_PATTERNS = [
    re.compile(r"^\(?([A-Za-z])\)?[.):]?$"),
    re.compile(_ANSWER_IS + r"\(?([A-Z])\b"),
    re.compile(_ANSWER_IS + r"(?:\(([a-z])\)|([a-z])[.)]?\s*$)"),
    re.compile(r"\(([A-Z])\)"),
    re.compile(r"^([A-Z])[.)]\s"),
]


def _letters(n_choices: int | None) -> str:
    return string.ascii_uppercase[: n_choices or 26]


def extract_choice_letter(text: str, choices: Sequence[Any] | None = None) -> str | None:
    """The chosen option letter (uppercase) in ``text``, or None.

    Accepted, first match wins: the text is exactly one option's text; the whole text is a letter (``B``, ``(B)``,
    ``B.``, ``B)``); an "answer is/:" phrase (``Answer: B``, ``the answer is (C)``, ``the answer is b``); a
    parenthesised capital ``(B)``; a leading ``B.``/``B)``; and, with ``choices``, the normalised text of one option
    (or the only option it contains). A lowercase letter counts only when it stands alone at the end or in
    parentheses, so "the answer is a cat" is not option A. Letters beyond the number
    of choices are ignored.
    """
    valid = _letters(len(choices) if choices else None)
    s = text.strip()
    exact = [i for i, c in enumerate(choices or []) if str(c).strip() == s]
    if exact:
        return string.ascii_uppercase[exact[0]]
    for pattern in _LETTER_PATTERNS:
        for m in pattern.finditer(s):
            letter = next(g for g in m.groups() if g).upper()
            if letter in valid:
                return letter
    if choices:
        return choice_letter_of_text(s, choices)
    return None


def choice_letter_of_text(text: str, choices: Sequence[Any]) -> str | None:
    """The letter of the option whose normalised text equals ``text``, else of the only option it contains."""
    norm = normalize_text(text)
    options = [normalize_text(str(c)) for c in choices]
    for i, opt in enumerate(options):
        if opt and norm == opt:
            return string.ascii_uppercase[i]
    inside = [i for i, opt in enumerate(options) if opt and re.search(rf"\b{re.escape(opt)}\b", norm)]
    return string.ascii_uppercase[inside[0]] if len(inside) == 1 else None


def reference_letters(reference: Any, choices: Sequence[Any] | None, sample_id: str) -> set[str]:
    """The gold letters: with ``choices``, those of every option whose text equals the reference (exactly, else after
    normalisation; several when options repeat); otherwise, or when no option matches, a bare letter reference
    (``B``, ``(b)``, ``B.``). Raises naming the sample when neither resolves."""
    ref = str(reference).strip()
    if choices:
        texts = [str(c).strip() for c in choices]
        found = {string.ascii_uppercase[i] for i, t in enumerate(texts) if t == ref}
        found = found or {
            string.ascii_uppercase[i] for i, t in enumerate(texts) if normalize_text(t) == normalize_text(ref)
        }
        if found:
            return found
    bare = re.fullmatch(r"\(?([A-Za-z])\)?[.)]?", ref)
    if bare and bare.group(1).upper() in _letters(len(choices) if choices else None):
        return {bare.group(1).upper()}
    raise ValueError(
        f"sample {sample_id!r}: reference {reference!r} is neither an option letter nor the text of one of "
        f"metadata['choices'] ({list(choices or [])}); store the letter or the exact option text"
    )
