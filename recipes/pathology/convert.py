"""Converters from public pathology VQA formats to mmrl records scored by the ``pathology`` reward (docs/algorithms.md
§4, Patho-R1's <think>/<answer> format; the prompt is :func:`mmrl.recipes.pathology.data.prompt_text`).

- PathVQA (He et al., 2020) style: ``(image, question, answer)`` records. The HF release
  (``flaviagiammarino/path-vqa``) is parquet with ``image`` embedded as ``{"bytes", "path"}``; JSON/JSONL with
  ``image`` as a path relative to the file (or to ``image_dir``; a bare stem such as ``train_0422`` is looked up
  with the .jpg/.jpeg/.png suffixes, as the original release names its images) work too. Optional ``id`` and
  ``answer_type`` (``yes/no``, ``yes_no`` or ``closed`` -> a yes/no question; ``open``, ``other`` or
  ``free-form`` -> open even when the reference is yes or no). Without ``answer_type`` a yes/no reference makes a
  yes/no question. Embedded images are written to ``images/`` beside the output file.
- PathMMU (Sun et al., 2024): ``data.json`` is ``{subset: {split: [record, ...]}}`` (a list of records, or one
  subset's ``{split: [...]}``, also works); a record is ``{"No", "img", "question", "options": ["A) text", ...],
  "answer": "A) text", "explanation"?}`` with ``img`` in the ``images/`` folder beside ``data.json``. The answer's
  leading letter is the reference; the options' texts go to ``metadata["choices"]``.

Paths in the written records are relative to the output file's folder, so the dataset moves as a whole. Every bad
record raises :class:`ConvertError` naming the file, the record and what to fix.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

from PIL import Image

from mmrl.eval.base import EvalError
from mmrl.eval.loading import Record, read_records
from mmrl.recipes.pathology.data import prompt_text
from mmrl.rewards.text import normalize_text

YES_NO_TYPES = {"yes/no", "yes_no", "closed"}
OPEN_TYPES = {"open", "other", "free-form", "free_form"}
_OPTION = re.compile(r"^\s*\(?([A-Za-z])\s*[).:]\s*(.*)$", re.DOTALL)
_SUFFIXES = (".jpg", ".jpeg", ".png", ".JPG", ".JPEG", ".PNG")


class ConvertError(ValueError):
    pass


def _records(src: Path) -> list[Record]:
    try:
        return read_records(src)
    except EvalError as e:
        raise ConvertError(str(e)) from None


def _write(out: Path, records: list[dict[str, Any]]) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(out)
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _image_file(value: Any, base: Path, out: Path, rid: str, where: str) -> str:
    """The record's image as a path relative to ``out``'s folder; embedded bytes are written to ``images/``."""
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            with Image.open(io.BytesIO(data)) as im:
                fmt = (im.format or "PNG").lower()
        except OSError as e:
            raise ConvertError(f"{where}: the embedded image is not readable ({e}); re-export it") from None
        dest = out.parent / "images" / f"{_safe(rid)}.{'jpg' if fmt == 'jpeg' else fmt}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        return dest.relative_to(out.parent).as_posix()
    if not isinstance(value, str) or not value.strip():
        raise ConvertError(f"{where}: 'image' must be a path or embedded bytes, got {type(value).__name__}")
    p = Path(value) if Path(value).is_absolute() else base / value
    if not p.is_file() and not p.suffix:
        p = next((p.with_suffix(s) for s in _SUFFIXES if p.with_suffix(s).is_file()), p)
    if not p.is_file():
        raise ConvertError(
            f"{where}: image file not found: {p} (give image_dir= the folder holding the images)"
        )
    return Path(os.path.relpath(p.resolve(), out.parent.resolve())).as_posix()


def _question_type(answer: str, answer_type: Any, where: str) -> str:
    given = str(answer_type or "").strip().lower()
    if given and given not in YES_NO_TYPES | OPEN_TYPES:
        raise ConvertError(
            f"{where}: answer_type {answer_type!r} is not one of {sorted(YES_NO_TYPES | OPEN_TYPES)}"
        )
    is_yes_no = normalize_text(answer) in ("yes", "no")
    if given in YES_NO_TYPES and not is_yes_no:
        raise ConvertError(f"{where}: answer_type {answer_type!r} but the answer {answer!r} is not yes or no")
    return "yes_no" if is_yes_no and given not in OPEN_TYPES else "open"


def convert_pathvqa(
    src: str | Path, out: str | Path, *, image_dir: str | Path | None = None, prefix: str = "pathvqa"
) -> Path:
    """Write PathVQA-style ``(image, question, answer)`` records of ``src`` as mmrl records to ``out`` (JSONL)."""
    src, out = Path(src), Path(out)
    base = Path(image_dir) if image_dir else (src if src.is_dir() else src.parent)
    records, seen = [], set()
    for i, rec in enumerate(_records(src)):
        d = rec.data
        missing = [k for k in ("image", "question", "answer") if d.get(k) is None]
        if missing:
            raise ConvertError(
                f"{rec.where}: missing field(s) {missing} (a PathVQA record has image, question, answer)"
            )
        rid = f"{prefix}-{d.get('id', i)}"
        if rid in seen:
            raise ConvertError(f"{rec.where}: duplicate id {rid!r} (ids must be unique)")
        seen.add(rid)
        answer, question = str(d["answer"]).strip(), str(d["question"]).strip()
        if not answer or not question:
            raise ConvertError(f"{rec.where}: empty question or answer")
        meta = {
            "kind": "pathvqa",
            "question_type": _question_type(answer, d.get("answer_type"), rec.where),
            "source": src.name,
        }
        records.append(
            {
                "id": rid,
                "prompt": prompt_text(question),
                "images": [_image_file(d["image"], base, out, rid, rec.where)],
                "answer": answer,
                "metadata": meta,
            }
        )
    if not records:
        raise ConvertError(f"{src}: no records")
    return _write(out, records)


def _pathmmu_items(src: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(where, subset/split label, record) for every record of a PathMMU ``data.json``."""
    data = json.loads(src.read_text(encoding="utf-8"))
    items: list[tuple[str, str, dict[str, Any]]] = []

    def walk(node: Any, label: list[str]) -> None:
        if isinstance(node, list):
            for i, r in enumerate(node):
                if not isinstance(r, dict):
                    raise ConvertError(f"{src} {'/'.join(label)} item {i}: expected a JSON object")
                items.append((f"{src} {'/'.join(label) or 'list'} item {i}", "_".join(label), r))
        elif isinstance(node, dict) and "question" not in node:
            for k, v in node.items():
                walk(v, [*label, str(k)])
        else:
            raise ConvertError(
                f"{src} {'/'.join(label)}: expected {{subset: {{split: [records]}}}} or a list"
            )

    walk(data, [])
    return items


def _option(text: Any, index: int, where: str) -> str:
    if not isinstance(text, str):
        raise ConvertError(f"{where}: option {index} must be a string like 'A) text', got {text!r}")
    m = _OPTION.match(text)
    if m and m.group(1).upper() == "ABCDEFGHIJ"[index]:
        return m.group(2).strip()
    return text.strip()


def convert_pathmmu(
    src: str | Path, out: str | Path, *, image_dir: str | Path | None = None, prefix: str = "pathmmu"
) -> Path:
    """Write PathMMU multiple-choice records of ``src`` (its ``data.json``) as mmrl records to ``out`` (JSONL)."""
    src, out = Path(src), Path(out)
    base = Path(image_dir) if image_dir else src.parent / "images"
    records, seen = [], set()
    for n, (where, label, d) in enumerate(_pathmmu_items(src)):
        missing = [k for k in ("img", "question", "options", "answer") if d.get(k) is None]
        if missing:
            raise ConvertError(
                f"{where}: missing field(s) {missing} (a PathMMU record has img, question, options, answer)"
            )
        options = d["options"]
        if not isinstance(options, list) or not 2 <= len(options) <= 10:
            raise ConvertError(f"{where}: 'options' must be a list of 2-10 strings like 'A) text'")
        choices = [_option(o, i, where) for i, o in enumerate(options)]
        m = _OPTION.match(str(d["answer"])) or re.fullmatch(r"\s*\(?([A-Za-z])\)?\s*", str(d["answer"]))
        letter = m.group(1).upper() if m else None
        if letter is None or ord(letter) - ord("A") >= len(choices):
            raise ConvertError(
                f"{where}: answer {d['answer']!r} does not start with one of the option letters "
                f"{'ABCDEFGHIJ'[: len(choices)]} (PathMMU answers look like 'B) text')"
            )
        rid = f"{prefix}-{label + '-' if label else ''}{d.get('No', n)}"
        if rid in seen:
            raise ConvertError(
                f"{where}: duplicate id {rid!r} ('No' must be unique within a subset and split)"
            )
        seen.add(rid)
        listed = " ".join(f"{'ABCDEFGHIJ'[i]}. {c}" for i, c in enumerate(choices))
        meta = {"kind": "pathmmu", "question_type": "multiple_choice", "choices": choices, "subset": label}
        if d.get("explanation"):
            meta["explanation"] = str(d["explanation"])
        records.append(
            {
                "id": rid,
                "prompt": prompt_text(
                    f"{str(d['question']).strip()} {listed}\nAnswer with the option's letter."
                ),
                "images": [_image_file(d["img"], base, out, rid, where)],
                "answer": letter,
                "metadata": meta,
            }
        )
    if not records:
        raise ConvertError(f"{src}: no records")
    return _write(out, records)
