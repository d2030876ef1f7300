"""MathVista (Lu et al., 2024): ``testmini.json`` and its reference scorer's normalisation.

Layout: ``testmini.json``, a JSON object ``pid -> record`` (or the HF release as JSONL/parquet/a saved dataset, one
record per row with ``pid``), images by path relative to the file (``image: "images/1.jpg"``) or embedded
(``decoded_image``). Record fields: ``pid, question, query?, image, choices, unit, precision, answer,
question_type (multi_choice | free_form), answer_type (text | integer | float | list), metadata {split, language,
source, category, task, context, grade, skills}``. The prompt is the record's ``query`` (hint, question, choices:
the released zero-shot prompt); without one it is built the same way: the hint for the question and answer type,
``Question: ...`` with ``(Unit: ...)``, then ``Choices:`` with ``(A) ...`` lines.

Extraction is rule-based (the reference uses GPT-4 with a few-shot prompt, plus the same quick rules first): an
exact option text; the whole response as an integer/float when the answer type is numeric; else the final answer
(``<answer>``, last ``\\boxed{}``, "the answer is ...") reduced to an option letter, a Python list or the last number.

Normalisation and judgement reproduce ``evaluation/calculate_score.py`` of lupantech/MathVista: for
``multi_choice`` a ``(X)`` letter inside the extraction is taken; a letter within range becomes its option text,
anything else becomes the option nearest by Levenshtein distance (first on ties, so an empty extraction maps to the
shortest option); ``integer`` answers are ``str(int(float(x)))``; ``float`` answers ``str(round(float(x),
precision))``; ``list`` answers ``str(x)``; unparsable numbers become None. Correct iff the result equals the
record's ``answer`` string. Prediction files in the reference output format (``pid -> record`` with ``response``
and, when present, ``extraction``) are judged from ``extraction`` directly, as the reference scorer does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapidfuzz.distance import Levenshtein

from mmrl.config import opt
from mmrl.eval.base import Benchmark, EvalError, EvalItem, Loaded, Score, register
from mmrl.eval.extract import final_answer, last_list, last_number, option_letter
from mmrl.eval.loading import Record, data_files, fill, media, read_records, require, user_turn
from mmrl.types import Sample

META_KEYS = ("split", "language", "source", "category", "task", "context", "grade", "skills")
HINTS = {
    "multi_choice": "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at "
    "the end.",
    "integer": "Hint: Please answer the question requiring an integer answer and provide the final value, e.g., 1, "
    "2, 3, at the end.",
    (
        "float",
        1,
    ): "Hint: Please answer the question requiring a floating-point number with one decimal place and "
    "provide the final value, e.g., 1.2, 1.3, 1.4, at the end.",
    (
        "float",
        2,
    ): "Hint: Please answer the question requiring a floating-point number with two decimal places and "
    "provide the final value, e.g., 1.23, 1.34, 1.45, at the end.",
    "list": "Hint: Please answer the question requiring a Python list as an answer and provide the final list, "
    "e.g., [1, 2, 3], [1.2, 1.3, 1.4], at the end.",
}


def build_query(rec: dict[str, Any]) -> str:
    """The released zero-shot query for a record that has none: hint, question (with unit), choices."""
    if rec["question_type"] == "multi_choice":
        hint = HINTS["multi_choice"]
    elif rec["answer_type"] == "float":
        hint = HINTS.get(("float", rec.get("precision")), HINTS[("float", 1)])
    else:
        hint = HINTS.get(rec["answer_type"], HINTS["integer"])
    question = f"Question: {rec['question']}"
    if rec.get("unit"):
        question += f" (Unit: {rec['unit']})"
    lines = [hint, question]
    if rec.get("choices"):
        lines.append("\n".join(["Choices:", *(f"({chr(65 + i)}) {c}" for i, c in enumerate(rec["choices"]))]))
    return "\n".join(lines).strip()


def normalize(
    extraction: Any, choices: list[str] | None, question_type: str, answer_type: str, precision: Any
):
    """The reference scorer's normalisation of an extracted answer (see the module docstring)."""
    if question_type == "multi_choice":
        text = extraction.strip() if isinstance(extraction, str) else str(extraction)
        letters = re.findall(r"\(([a-zA-Z])\)", text)
        if letters:
            text = letters[0].upper()
        options = [chr(ord("A") + i) for i in range(len(choices or []))]
        if text in options:
            return choices[options.index(text)]
        distances = [Levenshtein.distance(text, c) for c in choices]
        return choices[distances.index(min(distances))]
    try:
        if answer_type == "integer":
            return str(int(float(extraction)))
        if answer_type == "float":
            return str(round(float(extraction), precision))
    except (TypeError, ValueError, OverflowError):
        return None
    if answer_type == "list":
        return str(extraction)
    return extraction


@dataclass
class MathVistaOptions:
    prompt: str = opt("the user text, a str.format template over the record's fields", "{query}")


@register
class MathVista(Benchmark):
    name = "mathvista"
    Options = MathVistaOptions
    breakdowns = ("question_type", "answer_type", *META_KEYS)
    max_new_tokens = 1024
    extraction_key = "extraction"

    def load(self, path: Path) -> Loaded:
        base = path if path.is_dir() else path.parent
        return Loaded([self._item(rec, base) for rec in read_records(path)], data_files(path))

    def _item(self, rec: Record, base: Path) -> EvalItem:
        d = dict(rec.data)
        if d.get("pid") is None and rec.key is not None:
            d["pid"] = rec.key
        require(Record(rec.where, d), "pid", "question", "question_type", "answer_type", "answer")
        if d["question_type"] == "multi_choice" and not d.get("choices"):
            raise EvalError(f"{rec.where}: a multi_choice record needs 'choices'")
        image = d.get("decoded_image") or d.get("image")
        if image is None:
            require(rec, "image")
        fields = {
            "pid": str(d["pid"]),
            "question_type": d["question_type"],
            "answer_type": d["answer_type"],
            "choices": d.get("choices"),
            "precision": d.get("precision"),
            "unit": d.get("unit"),
            "answer": str(d["answer"]),
        }
        meta = d.get("metadata") or {}
        fields.update({k: meta[k] for k in META_KEYS if meta.get(k) is not None})
        prompt_fields = {**d, "query": d.get("query") or build_query(d)}
        text = fill(self.opts.prompt, prompt_fields, rec.where)
        sample = Sample(
            str(d["pid"]),
            user_turn(text, n_images=1),
            [media(image, base, rec, check=self.check_media)],
            [],
            d["answer"],
        )
        return EvalItem(str(d["pid"]), sample, fields)

    def extract(self, item: EvalItem, response: str) -> Any:
        f = item.fields
        text = response.strip()
        if not text:
            return ""
        if f["question_type"] == "multi_choice" and text in f["choices"]:
            return text
        if f["answer_type"] in ("integer", "float") and re.fullmatch(r"[-+]?\d+(\.\d*)?|[-+]?\.\d+", text):
            return str(int(text)) if f["answer_type"] == "integer" and text.lstrip("+-").isdigit() else text
        answer = final_answer(response)
        if f["question_type"] == "multi_choice":
            return option_letter(answer, f["choices"]) or answer
        if f["answer_type"] == "list":
            return last_list(answer) or last_list(text) or answer
        return last_number(answer) or last_number(text) or answer

    def judge(self, item: EvalItem, extracted: Any) -> Score:
        f = item.fields
        pred = normalize(extracted, f["choices"], f["question_type"], f["answer_type"], f["precision"])
        return Score(extracted=extracted, correct=pred == f["answer"], normalized=pred)
