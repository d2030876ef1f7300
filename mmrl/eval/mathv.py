"""MATH-Vision (Wang et al., 2024): ``testmini.jsonl`` / ``test.jsonl`` of mathllm/MATH-V.

Layout: one JSON record per line (or the HF release as parquet/a saved dataset): ``id, question`` (the text, with
``<image1>``... markers where the figure's panels are referred to), ``options`` (option texts; empty for free-form
questions), ``answer`` (an option letter, or the value), ``image`` (path relative to the file, or embedded
``decoded_image``), ``level`` (1-5), ``subject``. The image goes first and the question text keeps its markers, as in
the authors' evaluation.

Extraction: the last ``\\boxed{}`` of the answer text (``<answer>`` content when tagged), else the last "the answer
is ..." phrase, else the last line. Judgement, as the authors' ``evaluate.py`` does it (``correct`` iff the answer
equals the gold letter, or the gold option's value): a bare option letter (``B``, ``(B)``, ``B.``) is compared with
the gold letter; any other answer is compared with the gold value (the option text for multiple-choice questions)
by math-verify's equivalence (HuggingFace ``math-verify``: numbers, fractions, LaTeX expressions, sets). The authors'
own ``is_equal`` is a hand-written string/number comparison; math-verify is the maintained equivalent. Prediction
files: JSONL with ``id`` and ``response``; ``model_answer`` (the authors' extraction key), when present, is judged
directly. Breakdowns: subject and level.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrl.config import opt
from mmrl.eval.base import Benchmark, EvalItem, Loaded, Score, register
from mmrl.eval.extract import answer_phrase, last_boxed
from mmrl.eval.loading import Record, data_files, fill, media, read_records, require, user_turn
from mmrl.rewards.text import answer_text
from mmrl.types import Sample

PROMPT = (
    "{question}{options_text}\nPlease solve the problem step by step and put your final answer in one "
    "\\boxed{{}}. If it is a multiple choice question, only one letter is allowed in the \\boxed{{}}."
)


def math_equal(gold: str, pred: str) -> bool:
    """Equivalence by math-verify (string equality short-cuts it); both sides parsed as given, then in ``$...$``."""
    if not pred:
        return False
    if gold.strip() == pred.strip():
        return True
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None

    def parsed(text: str) -> list:
        found = parse(text, parsing_timeout=timeout)
        return found or parse(f"${text}$", parsing_timeout=timeout)

    g, p = parsed(gold), parsed(pred)
    return bool(g and p) and verify(g, p, timeout_seconds=timeout)


@dataclass
class MathVOptions:
    prompt: str = opt(
        "the user text, a str.format template over the record's fields plus {options_text}", PROMPT
    )


@register
class MathVision(Benchmark):
    name = "mathv"
    Options = MathVOptions
    breakdowns = ("subject", "level")
    max_new_tokens = 2048
    extraction_key = "model_answer"

    def load(self, path: Path) -> Loaded:
        base = path if path.is_dir() else path.parent
        return Loaded([self._item(rec, base) for rec in read_records(path)], data_files(path))

    def _item(self, rec: Record, base: Path) -> EvalItem:
        require(rec, "id", "question", "answer")
        d = rec.data
        image = d.get("decoded_image") or d.get("image")
        if image is None:
            require(rec, "image")
        options = [str(o) for o in d.get("options") or []]
        options_text = ""
        if options:
            options_text = "\nOptions: " + " ".join(f"({chr(65 + i)}) {o}" for i, o in enumerate(options))
        fields = {
            "answer": str(d["answer"]),
            "options": options,
            "level": d.get("level"),
            "subject": d.get("subject"),
        }
        text = fill(self.opts.prompt, {**d, "options_text": options_text}, rec.where)
        rid = str(d["id"])
        sample = Sample(rid, user_turn(text, n_images=1), [media(image, base, rec, check=self.check_media)])
        return EvalItem(rid, sample, fields)

    def extract(self, item: EvalItem, response: str) -> Any:
        text = answer_text(response)
        boxed = last_boxed(text)
        if boxed is not None:
            return boxed
        phrase = answer_phrase(text)
        if phrase:
            return phrase
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else ""

    def judge(self, item: EvalItem, extracted: Any) -> Score:
        pred = str(extracted).strip().rstrip(".").strip()
        gold, options = item.fields["answer"], item.fields["options"]
        letter = re.fullmatch(r"\(?([A-Za-z])\)?", pred)
        if options and letter:
            return Score(extracted, letter.group(1).upper() == gold.upper())
        index = ord(gold.upper()) - 65 if re.fullmatch(r"[A-Za-z]", gold) else -1
        value = options[index] if 0 <= index < len(options) else gold
        return Score(extracted, math_equal(value, pred))
