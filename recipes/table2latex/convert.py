"""Converters from the public table-recognition formats to table2latex records (docs/rewards.md#domain-rewards,
Table2LaTeX-RL).

Both write ``<split>.jsonl`` and ``images/`` in the README's data format, with the same prompt as the
generator (:data:`.data.PROMPT`) and a LaTeX ``answer``, so converted and synthetic data train and evaluate
alike:

- :func:`convert_pubtabnet`: PubTabNet annotation lines ``{filename, split, html: {structure: {tokens}, cells:
  [{tokens}]}}``. The HTML is rebuilt the way PubTabNet's ``format_html`` does
  (:func:`mmrl.eval.table.pubtabnet_html`) and converted with :func:`html_to_latex` (booktabs,
  ``\\multicolumn`` / ``\\multirow``), so the answer has the structure of the source: its ``latex_to_html``
  scores TEDS-S 1.0 against it. One ``<split>.jsonl`` per PubTabNet split (``train``, ``val``).
  ``metadata.difficulty`` is PubTabNet's own ``simple``/``complex`` (complex = a cell spans rows or columns).
- :func:`convert_pairs`: Table2LaTeX-RL-style image/LaTeX pairs, a JSON list/object, JSONL, parquet or saved
  HF dataset of ``{image, latex}`` (also read: ``image_path``/``images`` for the image and
  ``latex_code``/``answer`` for the LaTeX; the image a path relative to the data file or ``image_dir``, or
  embedded bytes).

Every record is checked before anything is written: missing fields, a structure whose cell slots do not match
its cells, a missing image, a table that :func:`latex_to_html` cannot read, and (``check_compile``, one
batched sandbox call) a reference that does not compile in the reward's preamble. A bad record raises
:class:`ConversionError` naming it (file and line, image name) and saying what to fix;
``on_bad_record="skip"`` leaves it out instead and lists it in ``skipped.jsonl``, for large dumps where a few
tables use glyphs pdfLaTeX lacks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lxml import html as lxml_html

from mmrl.eval.loading import Record, media, read_records
from mmrl.eval.table import pubtabnet_html
from mmrl.processors.image import load_image
from mmrl.recipes.table2latex.data import PROMPT
from mmrl.rewards.latex_table_html import LatexTableParseError, html_to_latex, latex_to_html
from mmrl.rewards.sandbox import render_latex

IMAGE_KEYS = ("image", "image_path", "images", "img")
LATEX_KEYS = ("latex", "latex_code", "answer")


class ConversionError(ValueError):
    """A source record that cannot become a table2latex record; the message names it and the fix."""


@dataclass
class _Converted:
    where: str
    rid: str
    split: str
    image: Any  # a path (str), bytes or a PIL image
    latex: str
    html: str
    source: str


def _span(td: Any, name: str) -> int:
    try:
        return max(1, int(td.get(name, "1")))
    except ValueError:  # browsers read a non-number as 1
        return 1


def table_shape(html: str) -> tuple[int, int, int]:
    """(rows, columns, spanning cells) of the first HTML table; columns count row spans carried down."""
    table = lxml_html.fragment_fromstring(html, create_parent="div").xpath(".//table")[0]
    covered: set[tuple[int, int]] = set()
    rows, spans = table.xpath(".//tr"), 0
    for r, tr in enumerate(rows):
        col = 0
        for td in tr.xpath("./td|./th"):
            while (r, col) in covered:
                col += 1
            cs, rs = _span(td, "colspan"), _span(td, "rowspan")
            spans += cs > 1 or rs > 1
            covered.update((r + i, col + j) for i in range(rs) for j in range(cs))
            col += cs
    return len(rows), max((c + 1 for _, c in covered), default=0), spans


def pubtabnet_record(data: dict[str, Any], where: str) -> tuple[str, str]:
    """(source HTML, LaTeX answer) of one PubTabNet annotation; a bad one raises :class:`ConversionError`
    naming ``where``."""
    ann = data.get("html")
    if not isinstance(data.get("filename"), str) or not isinstance(ann, dict):
        raise ConversionError(
            f"{where}: a PubTabNet record needs 'filename' (a string) and 'html' (an object with 'structure' "
            f"and 'cells'); have {sorted(data)}"
        )
    name = data["filename"]
    tokens = (ann.get("structure") or {}).get("tokens")
    cells = ann.get("cells")
    if (
        not isinstance(tokens, list)
        or not all(isinstance(t, str) for t in tokens)
        or not isinstance(cells, list)
    ):
        raise ConversionError(
            f"{where} ({name}): html.structure.tokens must be a list of strings and html.cells a list"
        )
    if not all(isinstance(c, dict) and isinstance(c.get("tokens"), list) for c in cells):
        raise ConversionError(f"{where} ({name}): every entry of html.cells needs a 'tokens' list")
    slots = sum(1 for t in tokens if t in ("<td>", ">"))
    if slots != len(cells):
        raise ConversionError(
            f"{where} ({name}): the structure has {slots} cells but html.cells has {len(cells)}; the "
            "annotation is truncated or from another table"
        )
    html = pubtabnet_html(ann)
    try:
        latex = html_to_latex(html)
        latex_to_html(latex)
    except LatexTableParseError as e:
        raise ConversionError(
            f"{where} ({name}): the table cannot be converted ({e}); fix its structure"
        ) from e
    return html, latex


def _image_path(name: str, split: str, base: Path, where: str) -> Path:
    for p in (base / name, base / split / name):
        if p.is_file():
            return p
    raise ConversionError(f"{where}: image {name!r} not found in {base} or {base / split}; pass image_dir")


def _read_pubtabnet(path: Path, image_dir: Path | None) -> list[_Converted]:
    base = image_dir or path.parent
    out = []
    for rec in read_records(path):
        html, latex = pubtabnet_record(rec.data, rec.where)
        name, split = rec.data["filename"], str(rec.data.get("split") or "train")
        image = str(_image_path(name, split, base, f"{rec.where} ({name})"))
        out.append(_Converted(rec.where, f"ptn-{Path(name).stem}", split, image, latex, html, "pubtabnet"))
    return out


def _is_file(source: Any) -> bool:
    """True for a path to a file; False for embedded data (a base64 string may be too long to be a path)."""
    return isinstance(source, str) and os.path.isfile(source)


def _field(rec: Record, keys: tuple[str, ...], what: str) -> Any:
    for k in keys:
        value = rec.data.get(k)
        if isinstance(value, list) and k == "images":
            value = value[0] if len(value) == 1 else None
        if value is not None:
            return value
    raise ConversionError(
        f"{rec.where}: missing the {what}: give one of the fields {list(keys)} (have {sorted(rec.data)})"
    )


def _read_pairs(path: Path, image_dir: Path | None, split: str) -> list[_Converted]:
    base = image_dir or path.parent
    out = []
    for i, rec in enumerate(read_records(path)):
        image = _field(rec, IMAGE_KEYS, "image (exactly one)")
        latex = _field(rec, LATEX_KEYS, "LaTeX table")
        if not isinstance(latex, str) or not latex.strip():
            raise ConversionError(f"{rec.where}: the LaTeX field is empty or not a string")
        try:
            source = media(image, base, rec)
            if not _is_file(source):  # embedded: decode now, so a bad image fails before anything is written
                source = load_image(source, record_id=rec.where)
        except ValueError as e:
            raise ConversionError(str(e)) from None
        try:
            html = latex_to_html(latex)
        except LatexTableParseError as e:
            raise ConversionError(
                f"{rec.where}: the LaTeX holds no readable table ({e}); give a tabular environment"
            ) from e
        stem = Path(source).stem if _is_file(source) else f"{i:06d}"
        rid = str(rec.data.get("id") or rec.key or f"t2l-{stem}")
        out.append(_Converted(rec.where, rid, split, source, latex.strip(), html, "table2latex"))
    return out


def _check_compiles(items: list[_Converted], dpi: float, timeout_s: float) -> dict[int, str]:
    """Index -> error of every item whose LaTeX does not compile in the reward's preamble (one batched
    call)."""
    results = render_latex([x.latex for x in items], dpi=dpi, timeout_s=timeout_s)
    return {i: str(r.error) for i, r in enumerate(results) if not r.ok}


def _write(
    items: list[_Converted],
    out_dir: Path,
    *,
    check_compile: bool,
    on_bad_record: Literal["error", "skip"],
    dpi: float,
    timeout_s: float,
) -> dict[str, Path]:
    if on_bad_record not in ("error", "skip"):
        raise ValueError(f"on_bad_record must be 'error' or 'skip', got {on_bad_record!r}")
    failures = _check_compiles(items, dpi, timeout_s) if check_compile and items else {}
    skipped = []
    for i, error in failures.items():
        message = f"{items[i].where}: the LaTeX answer does not compile in the reward's preamble: {error}"
        if on_bad_record == "error":
            raise ConversionError(message + "; fix the record or pass on_bad_record='skip'")
        skipped.append({"where": items[i].where, "id": items[i].rid, "error": message})
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[str]] = {}
    ids: set[str] = set()
    for i, x in enumerate(items):
        if i in failures:
            continue
        rid = re.sub(r"[^A-Za-z0-9_.-]", "_", x.rid)
        if rid in ids:
            raise ConversionError(
                f"{x.where}: id {x.rid!r} occurs twice; ids (or image names) must be unique"
            )
        ids.add(rid)
        if _is_file(x.image):
            rel = f"images/{rid}{Path(x.image).suffix.lower() or '.png'}"
            shutil.copyfile(x.image, out_dir / rel)
        else:
            rel = f"images/{rid}.png"
            load_image(x.image, record_id=x.where).save(out_dir / rel)
        rows, cols, spans = table_shape(x.html)
        meta = {"rows": rows, "cols": cols, "difficulty": "complex" if spans else "simple", "spans": spans,
                "source": x.source}  # fmt: skip
        record = {"id": rid, "prompt": PROMPT, "images": [rel], "answer": x.latex, "metadata": meta}
        lines.setdefault(x.split, []).append(json.dumps(record, ensure_ascii=False))
    paths = {}
    for split, split_lines in lines.items():
        paths[split] = out_dir / f"{split}.jsonl"
        paths[split].write_text("".join(line + "\n" for line in split_lines), encoding="utf-8")
    if skipped:
        (out_dir / "skipped.jsonl").write_text(
            "".join(json.dumps(s) + "\n" for s in skipped), encoding="utf-8"
        )
    return paths


def convert_pubtabnet(
    path: str | Path,
    out_dir: str | Path,
    *,
    image_dir: str | Path | None = None,
    check_compile: bool = True,
    on_bad_record: Literal["error", "skip"] = "error",
    dpi: float = 100,
    timeout_s: float = 30.0,
) -> dict[str, Path]:
    """PubTabNet annotations (``path``: JSONL/JSON/parquet; images in ``image_dir``, default the file's folder
    or its ``<split>/`` subfolder) -> one ``<split>.jsonl`` per PubTabNet split under ``out_dir``; returns
    split -> file."""
    image_base = Path(image_dir) if image_dir is not None else None
    items = _read_pubtabnet(Path(path), image_base)
    return _write(items, Path(out_dir), check_compile=check_compile, on_bad_record=on_bad_record, dpi=dpi,
                  timeout_s=timeout_s)  # fmt: skip


def convert_pairs(
    path: str | Path,
    out_dir: str | Path,
    *,
    image_dir: str | Path | None = None,
    split: str = "train",
    check_compile: bool = True,
    on_bad_record: Literal["error", "skip"] = "error",
    dpi: float = 100,
    timeout_s: float = 30.0,
) -> Path:
    """Table2LaTeX-RL-style ``{image, latex}`` pairs -> ``out_dir/<split>.jsonl``; returns that file."""
    image_base = Path(image_dir) if image_dir is not None else None
    items = _read_pairs(Path(path), image_base, split)
    paths = _write(items, Path(out_dir), check_compile=check_compile, on_bad_record=on_bad_record, dpi=dpi,
                   timeout_s=timeout_s)  # fmt: skip
    if split not in paths:
        raise ConversionError(
            f"{path}: no record was converted (all {len(items)} skipped, see skipped.jsonl)"
        )
    return paths[split]
