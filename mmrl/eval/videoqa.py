"""Multiple-choice video QA in the Video-MME and MVBench layouts.

Layouts (JSON/JSONL/parquet or a saved HF dataset; one file, or a folder of per-task JSON files as MVBench ships):

- Video-MME: ``videoID``, ``question_id``, ``question``, ``options`` (``["A. ...", ...]``), ``answer`` (a letter),
  ``task_type``, ``duration``, ``domain``, ``sub_category``; the video is ``<video_dir>/<videoID>.mp4``;
- MVBench: ``video`` (path), ``question``, ``candidates`` (option texts), ``answer`` (the correct text); the task
  is the file's name;
- anything between: ``video`` or ``videoID``, ``options`` or ``candidates``, ``answer`` as a letter or an option's
  text, ``id``/``question_id`` (default ``<file>-<row>``), ``task_type``.

Video paths resolve against ``video_dir`` (option, relative to the data file's folder; default that folder, and
``videos/`` for ``videoID``). The prompt lists the options as ``A. text`` lines and asks for the letter (the
Video-MME prompt's wording); the answer letter is extracted with :func:`mmrl.eval.extract.option_letter` and is
correct iff it is the gold letter. Breakdowns: task type, duration, domain, sub-category.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrl.config import opt
from mmrl.eval.base import Benchmark, EvalError, EvalItem, Loaded, Score, register
from mmrl.eval.extract import option_letter
from mmrl.eval.loading import Record, fill, media, read_records, require, user_turn
from mmrl.rewards.text import answer_text, reference_letters
from mmrl.types import Sample

PROMPT = (
    "Select the best answer to the following multiple-choice question based on the video. Respond with only the "
    "letter of the correct option.\n{question}\n{options_text}\nThe best answer is:"
)
_LETTERED = re.compile(r"^\(?([A-Z])[.):]\s*")


@dataclass
class VideoQAOptions:
    video_dir: str | None = opt("video folder, relative to the data file's folder", None)
    prompt: str = opt(
        "the user text, a str.format template over the record's fields plus {options_text}", PROMPT
    )


@register
class VideoQA(Benchmark):
    name = "videoqa"
    Options = VideoQAOptions
    breakdowns = ("task_type", "duration", "domain", "sub_category")
    max_new_tokens = 16

    def load(self, path: Path) -> Loaded:
        files = (
            sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl")) if path.is_dir() else [path]
        )
        if not files:
            raise EvalError(f"{path}: no .json/.jsonl task files in this folder")
        items = []
        for f in files:
            items += [self._item(rec, i, f) for i, rec in enumerate(read_records(f))]
        return Loaded(items, files)

    def _item(self, rec: Record, index: int, file: Path) -> EvalItem:
        require(rec, "question", "answer")
        d = rec.data
        raw = d.get("options") if d.get("options") is not None else d.get("candidates")
        if not isinstance(raw, list) or len(raw) < 2:
            raise EvalError(
                f"{rec.where}: needs 'options' or 'candidates', a list of at least two option texts"
            )
        texts = [_LETTERED.sub("", str(o)).strip() for o in raw]
        answer = str(d["answer"]).strip()
        try:
            gold = sorted(reference_letters(answer, texts, str(d.get("question_id", index))))[0]
        except ValueError as e:
            raise EvalError(f"{rec.where}: {e}") from None
        folder = file.parent / (self.opts.video_dir or "")
        if d.get("video"):
            video = media(d["video"], folder, rec, kind="video", check=self.check_media)
        elif d.get("videoID"):
            sub = folder if self.opts.video_dir else folder / "videos"
            video = media(f"{d['videoID']}.mp4", sub, rec, kind="video", check=self.check_media)
        else:
            raise EvalError(f"{rec.where}: needs 'video' (a path) or 'videoID' (Video-MME)")
        rid = str(d.get("question_id") or d.get("id") or f"{file.stem}-{index}")
        fields = {
            "answer": gold,
            "options": texts,
            "task_type": d.get("task_type") or file.stem,
            "duration": d.get("duration"),
            "domain": d.get("domain"),
            "sub_category": d.get("sub_category"),
        }
        options_text = "\n".join(f"{string.ascii_uppercase[i]}. {t}" for i, t in enumerate(texts))
        text = fill(self.opts.prompt, {**d, "options_text": options_text}, rec.where)
        return EvalItem(rid, Sample(rid, user_turn(text, n_videos=1), [], [video]), fields)

    def extract(self, item: EvalItem, response: str) -> Any:
        return option_letter(answer_text(response), item.fields["options"])

    def judge(self, item: EvalItem, extracted: Any) -> Score:
        return Score(extracted, extracted is not None and str(extracted).upper() == item.fields["answer"])
