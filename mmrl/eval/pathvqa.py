"""PathVQA (He et al., 2020) and pathology VQA sets in its layout: image, question, answer.

Layout: the HF release as parquet (or a saved dataset) with ``image`` embedded (``{"bytes", "path"}``),
``question``, ``answer``; or JSON/JSONL records with ``image`` as a path relative to the file. Optional: ``id``
(default: the row index), ``answer_type`` (``open`` makes even a yes/no reference an open question; otherwise a
reference that is yes or no makes a yes/no question), ``category``.

Scoring, of the ``<answer>`` content when tagged, else the whole response:
- yes/no questions: the first word of the normalised answer if it is yes or no, else the only one of yes/no that
  occurs; correct iff it equals the reference. An answer that says neither (or both) counts as wrong: some widely
  used scripts drop such answers or count a closed answer right whenever the reference word occurs anywhere in it,
  which inflates accuracy;
- open questions: ``exact_match`` (SQuAD normalisation: lowercase, no punctuation or articles; ``correct``),
  ``recall`` (the share of the reference's tokens found in the answer, the open-question metric of the PathVQA
  literature) and ``f1`` (SQuAD token F1).
Reported: ``accuracy`` over all items, and the parts ``yes_no`` (closed accuracy), ``exact_match``, ``recall`` and
``f1`` (open questions only).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrl.config import opt
from mmrl.eval.base import Benchmark, EvalError, EvalItem, Loaded, Score, register
from mmrl.eval.loading import Record, data_files, fill, media, read_records, require, user_turn
from mmrl.rewards.text import answer_text, normalize_text, token_f1
from mmrl.types import Sample


def yes_no(text: str) -> str | None:
    """yes/no read from an answer: its first word, else the only one of the two that occurs."""
    words = normalize_text(text).split()
    if words and words[0] in ("yes", "no"):
        return words[0]
    found = {w for w in words if w in ("yes", "no")}
    return found.pop() if len(found) == 1 else None


def token_recall(prediction: str, reference: str) -> float:
    """Share of the reference's normalised tokens (with multiplicity) present in the prediction."""
    pred, ref = Counter(normalize_text(prediction).split()), Counter(normalize_text(reference).split())
    total = sum(ref.values())
    return sum((pred & ref).values()) / total if total else float(not pred)


@dataclass
class PathVQAOptions:
    prompt: str = opt(
        "the user text, a str.format template over the record's fields",
        "{question}\nAnswer with a single word or phrase.",
    )


@register
class PathVQA(Benchmark):
    name = "pathvqa"
    Options = PathVQAOptions
    breakdowns = ("answer_type", "category")
    max_new_tokens = 64

    def load(self, path: Path) -> Loaded:
        base = path if path.is_dir() else path.parent
        return Loaded(
            [self._item(rec, i, base) for i, rec in enumerate(read_records(path))], data_files(path)
        )

    def _item(self, rec: Record, index: int, base: Path) -> EvalItem:
        require(rec, "image", "question", "answer")
        d = rec.data
        answer = str(d["answer"]).strip()
        given = str(d.get("answer_type") or "").lower()
        if given and given not in ("yes_no", "closed", "open"):
            raise EvalError(
                f"{rec.where}: answer_type must be yes_no, closed or open, got {d['answer_type']!r}"
            )
        kind = "yes_no" if normalize_text(answer) in ("yes", "no") and given != "open" else "open"
        rid = str(d.get("id", index))
        fields = {
            "question": d["question"],
            "answer": answer,
            "answer_type": kind,
            "category": d.get("category"),
        }
        text = fill(self.opts.prompt, d, rec.where)
        sample = Sample(
            rid, user_turn(text, n_images=1), [media(d["image"], base, rec, check=self.check_media)]
        )
        return EvalItem(rid, sample, fields)

    def extract(self, item: EvalItem, response: str) -> Any:
        text = answer_text(response)
        return yes_no(text) if item.fields["answer_type"] == "yes_no" else text

    def judge(self, item: EvalItem, extracted: Any) -> Score:
        gold = item.fields["answer"]
        if item.fields["answer_type"] == "yes_no":
            ok = extracted is not None and normalize_text(str(extracted)) == normalize_text(gold)
            return Score(extracted, ok, {"yes_no": float(ok)})
        pred = str(extracted or "")
        em = normalize_text(pred) == normalize_text(gold)
        parts = {"exact_match": float(em), "recall": token_recall(pred, gold), "f1": token_f1(pred, gold)}
        return Score(extracted, em, parts)
