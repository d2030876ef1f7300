"""Rule-based answer extraction shared by the benchmark families: the last ``\\boxed{}`` (braces balanced), an
"answer is" phrase, the last number, a Python-style list, an option letter, and a screen point.

Rules, not a judge model: the MathVista and MATH-Vision authors extract with GPT-4 or hand-written rules; the rules
here follow the order their rule paths use (an exact option text, a boxed answer, an "answer is" phrase, then the
last value of the expected type) so that a local evaluation needs no API.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from mmrl.rewards.text import answer_text, extract_choice_letter

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_ANSWER_IS = re.compile(
    r"(?:final answer|correct answer|answer)\s*(?:is|should be|:)\s*:?\s*(.+?)(?:\.\s|\.?$|\n)", re.I | re.S
)
_PAIR = rf"\(?\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\)?"


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces kept; None without one."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1].strip() if depth == 0 else text[i:].strip()


def answer_phrase(text: str) -> str | None:
    """What follows the last "the answer is" / "Answer:" phrase, up to the end of its sentence or line."""
    found = _ANSWER_IS.findall(text)
    return found[-1].strip().strip("$ ").rstrip(".") if found else None


def final_answer(response: str) -> str:
    """The model's final answer text: the ``<answer>`` content, then its last ``\\boxed{}`` or "answer is" phrase;
    the whole (tag-stripped) response when none is present."""
    text = answer_text(response)
    for rule in (last_boxed, answer_phrase):
        found = rule(text)
        if found:
            return found
    return text.strip()


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (thousands separators removed), or None."""
    found = _NUMBER_RE.findall(text)
    return found[-1].replace(",", "") if found else None


def last_list(text: str) -> str | None:
    """The last ``[...]`` holding only numbers, written as Python prints a list (MathVista's list answers)."""
    for m in reversed(re.findall(r"\[[^\[\]]*\]", text)):
        try:
            value = ast.literal_eval(m)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            return str(value)
    return None


def option_letter(text: str, choices: Sequence[Any] | None, n_options: int | None = None) -> str | None:
    """The chosen option letter: :func:`mmrl.rewards.text.extract_choice_letter` (exact option text, a bare letter,
    "answer is (B)", "(B)", option text), else a standalone capital letter within range (last one wins)."""
    letter = extract_choice_letter(text, choices)
    if letter is not None:
        return letter
    n = len(choices) if choices else n_options or 26
    valid = "".join(chr(ord("A") + i) for i in range(n))
    found = re.findall(rf"(?<![A-Za-z])([{valid}])(?![A-Za-z])", text)
    return found[-1] if found else None


def screen_point(response: str) -> tuple[float, float] | None:
    """The point a GUI-grounding answer names, in the model's own coordinates.

    Accepted, first match wins: a JSON/Python dict (or a list of them) with ``bbox_2d``/``bbox`` (centre taken),
    ``point_2d``/``point``/``coordinate``/``position`` (Qwen2.5-VL's grounding JSON, UI-R1's action lists); two
    pairs ``(x1,y1),(x2,y2)`` (Qwen2-VL's box tokens: the centre); a bracketed 4-tuple (a box: the centre); a
    bracketed or parenthesised pair; ``x=.., y=..``.
    """
    text = answer_text(response)
    point = _point_from_json(text)
    if point is not None:
        return point
    two = re.search(rf"{_PAIR}\s*,?\s*(?:to|-)?\s*{_PAIR}", text)
    if two and "(" in two.group(0):
        x1, y1, x2, y2 = (_num(g) for g in two.groups())
        return (x1 + x2) / 2, (y1 + y2) / 2
    box = re.search(rf"\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]", text)
    if box:
        x1, y1, x2, y2 = (_num(g) for g in box.groups())
        return (x1 + x2) / 2, (y1 + y2) / 2
    pair = re.search(rf"[\[(]\s*({_NUMBER})\s*,\s*({_NUMBER})\s*[\])]", text)
    if pair:
        return _num(pair.group(1)), _num(pair.group(2))
    xy = re.search(rf"x\s*[=:]\s*({_NUMBER}).{{0,20}}?y\s*[=:]\s*({_NUMBER})", text, re.I | re.S)
    if xy:
        return _num(xy.group(1)), _num(xy.group(2))
    return None


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def _point_from_json(text: str) -> tuple[float, float] | None:
    for m in re.finditer(r"[\[{]", text):
        candidate = _balanced(text, m.start())
        if candidate is None:
            continue
        value = _literal(candidate)
        if isinstance(value, list) and value and isinstance(value[0], dict):
            value = value[0]
        if not isinstance(value, dict):
            continue
        for key in ("bbox_2d", "bbox", "box"):
            box = _numbers(value.get(key), 4)
            if box:
                return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        for key in ("point_2d", "point", "coordinate", "position", "click"):
            pt = _numbers(value.get(key), 2)
            if pt:
                return pt[0], pt[1]
    return None


def _balanced(text: str, start: int) -> str | None:
    pairs = {"[": "]", "{": "}"}
    stack = []
    for j in range(start, len(text)):
        c = text[j]
        if c in pairs:
            stack.append(pairs[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return text[start : j + 1]
    return None


def _literal(text: str) -> Any:
    for load in (json.loads, ast.literal_eval):
        try:
            return load(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return None


def _numbers(value: Any, n: int) -> list[float] | None:
    if isinstance(value, (list, tuple)) and len(value) == n:
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return [float(v) for v in value]
    return None
