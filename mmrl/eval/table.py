"""Table recognition: a table image to LaTeX or HTML, scored with TEDS, TEDS-Structure, CW-SSIM and compile rate
(the metrics of PubTabNet and Table2LaTeX-RL, docs/rewards.md#domain-rewards).

Layouts, each a JSON/JSONL/parquet file (or saved HF dataset) with images beside it (option ``image_dir``, relative
to the data file's folder; ``<split>/<file name>`` is tried too, PubTabNet's own tree):

- PubTabNet's annotation lines: ``{filename, split, html: {structure: {tokens}, cells: [{tokens}]}}``, rebuilt into
  HTML the way PubTabNet's ``format_html`` does (cell tokens inserted after each ``<td>``/``<td ...>``,
  single characters HTML-escaped);
- PubTabNet's evaluation ground truth: a JSON object ``file name -> {"html": ..., "type": simple|complex}``;
- plain records: ``{id?, image (path or embedded), html | latex, category?}``.

``category`` (or PubTabNet's ``type``/``split``) gives the breakdown.

Scoring. A response holding ``<table`` is read as HTML (inside an ``html`` fence or ``<answer>`` when present), any
other response as LaTeX (inside a ``latex``/``tex`` fence or ``<answer>``), whichever the prompt asked for (option
``output``):

- ``teds`` (``correct``): TEDS of the prediction's HTML (``latex_to_html`` for LaTeX) against the reference's HTML,
  :func:`mmrl.rewards.teds.teds` (IBM's PubTabNet metric); an unparsable prediction scores 0;
- ``teds_s``: the same with structure only;
- ``compile``: the prediction (HTML converted with ``html_to_latex``) compiles in the rendering sandbox's fixed
  preamble; the compile rate is its mean;
- ``cw_ssim`` (or ``haar_ssim``, option ``visual``): the rendered prediction against the rendered reference, exactly
  as the ``latex_table`` reward computes it; 0 when the prediction does not compile. ``visual=none`` skips rendering
  (no ``compile`` and no visual part).

A reference that cannot be parsed is an error naming the record; one that does not render leaves that item's visual
and compile parts out, with the render error in the item's ``extracted.reference_error``.
"""

from __future__ import annotations

import html as html_lib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mmrl.config import opt
from mmrl.eval.base import NOT_GIVEN, Benchmark, EvalError, EvalItem, Loaded, Score, register
from mmrl.eval.loading import Record, data_files, fill, media, read_records, user_turn
from mmrl.rewards.latex_table import extract_block, visual_similarities
from mmrl.rewards.latex_table_html import LatexTableParseError, html_to_latex, latex_to_html
from mmrl.rewards.teds import teds
from mmrl.types import Sample

PROMPTS = {
    "latex": "Convert the table in this image to LaTeX: write one tabular environment that reproduces its rows, "
    "columns, merged cells and text.",
    "html": "Convert the table in this image to HTML: write one <table> with <tr> rows and <td> cells (colspan and "
    "rowspan for merged cells) that reproduces its structure and text.",
}


def pubtabnet_html(annotation: dict[str, Any]) -> str:
    """PubTabNet's structure tokens with the cell tokens put back (its ``format_html``), as a full HTML page."""
    tokens = list(annotation["structure"]["tokens"])
    slots = [i for i, t in enumerate(tokens) if t in ("<td>", ">")]
    cells = annotation["cells"]
    for i, cell in reversed(list(zip(slots, cells))):
        if cell["tokens"]:
            tokens.insert(i + 1, "".join(html_lib.escape(t) if len(t) == 1 else t for t in cell["tokens"]))
    return f"<html><body><table>{''.join(tokens)}</table></body></html>"


def _is_html(text: str) -> bool:
    return "<table" in text.lower() or "<tr" in text.lower()


@dataclass
class TableOptions:
    output: Literal["latex", "html"] = opt("what the default prompt asks the model to write", "latex")
    visual: Literal["cw_ssim", "haar_ssim", "none"] = opt(
        "visual metric of the rendered tables (none: no rendering, so no compile rate either)", "cw_ssim"
    )
    dpi: int = opt("rendering resolution", 100)
    timeout_s: float = opt("per-render time limit", 10.0)
    image_dir: str | None = opt("image folder, relative to the data file's folder (None = that folder)", None)
    prompt: str | None = opt("the user text, a str.format template over the record (None = by output)", None)


@register
class Table(Benchmark):
    name = "table"
    Options = TableOptions
    breakdowns = ("category",)
    continuous = True
    max_new_tokens = 2048

    def load(self, path: Path) -> Loaded:
        base = path if path.is_dir() else path.parent
        images = base / self.opts.image_dir if self.opts.image_dir else base
        items = [self._item(rec, i, images) for i, rec in enumerate(read_records(path))]
        return Loaded(items, data_files(path))

    def _item(self, rec: Record, index: int, images: Path) -> EvalItem:
        d = rec.data
        filename = d.get("filename") or rec.key
        rid = str(d.get("id") or filename or index)
        if isinstance(d.get("html"), dict):
            ref, fmt = pubtabnet_html(d["html"]), "html"
        elif isinstance(d.get("html"), str):
            ref, fmt = d["html"], "html"
        elif isinstance(d.get("latex"), str):
            ref, fmt = d["latex"], "latex"
        else:
            raise EvalError(f"{rec.where}: a table record needs 'html' (a string or PubTabNet's structure/cells) or "
                            "'latex'")  # fmt: skip
        try:
            ref_html = ref if fmt == "html" else latex_to_html(ref)
        except LatexTableParseError as e:
            raise EvalError(
                f"{rec.where}: the reference LaTeX table cannot be parsed ({e}); fix the record"
            ) from e
        image = d.get("image")
        if image is None and filename:
            split_path = images / str(d.get("split", "")) / filename
            image = str(split_path) if d.get("split") and split_path.is_file() else filename
        if image is None:
            raise EvalError(f"{rec.where}: a table record needs 'image' or 'filename'")
        fields = {
            "category": d.get("category") or d.get("type") or d.get("split"),
            "reference_format": fmt,
            "reference": ref,
        }
        if fmt == "latex":
            fields["reference_html"] = ref_html
        text = fill(self.opts.prompt or PROMPTS[self.opts.output], d, rec.where)
        src = media(image, images, rec, check=self.check_media)
        return EvalItem(rid, Sample(rid, user_turn(text, n_images=1), [src]), fields)

    def extract(self, item: EvalItem, response: str) -> Any:
        html_block = extract_block(response, ("html",))
        return html_block if _is_html(html_block) else extract_block(response, ("latex", "tex"))

    def score(
        self, items: list[EvalItem], responses: list[str], given: list[Any] | None = None
    ) -> list[Score]:
        given = given or [NOT_GIVEN] * len(items)
        preds = [
            self.extract(it, r) if g is NOT_GIVEN else str(g) for it, r, g in zip(items, responses, given)
        ]
        scores = [self._structure(it, p) for it, p in zip(items, preds)]
        if self.opts.visual != "none":
            self._visual(items, preds, scores)
        return scores

    def judge(self, item: EvalItem, extracted: Any) -> Score:
        return self.score([item], [""], [extracted])[0]

    def _structure(self, item: EvalItem, pred: str) -> Score:
        ref_html = item.fields.get("reference_html", item.fields["reference"])
        try:
            pred_html = pred if _is_html(pred) else latex_to_html(pred)
        except LatexTableParseError:
            return Score(pred, 0.0, {"teds": 0.0, "teds_s": 0.0})
        full = float(teds(pred_html, ref_html))
        return Score(
            pred, full, {"teds": full, "teds_s": float(teds(pred_html, ref_html, structure_only=True))}
        )

    def _visual(self, items: list[EvalItem], preds: list[str], scores: list[Score]) -> None:
        from mmrl.rewards.sandbox import render_latex

        pred_tex = [_as_latex(p) for p in preds]
        ref_tex = [_as_latex(it.fields["reference"]) for it in items]
        texts = list(dict.fromkeys(t for t in [*pred_tex, *ref_tex] if t))
        rendered = dict(zip(texts, render_latex(texts, dpi=self.opts.dpi, timeout_s=self.opts.timeout_s)))
        groups: dict[str, list[int]] = {}
        for i, (p, r) in enumerate(zip(pred_tex, ref_tex)):
            ref = rendered.get(r) if r else None
            if ref is None or not ref.ok:
                reason = ref.error if ref is not None else "the HTML reference has no table to convert"
                scores[i].extracted = {"table": preds[i], "reference_error": reason}
                continue
            ok = bool(p) and rendered[p].ok
            scores[i].parts["compile"] = float(ok)
            scores[i].parts[self.opts.visual] = 0.0
            if ok:
                groups.setdefault(r, []).append(i)
        for r, idx in groups.items():
            values = visual_similarities(
                [rendered[pred_tex[i]].image for i in idx], rendered[r].image, self.opts.visual
            )
            for i, v in zip(idx, values):
                scores[i].parts[self.opts.visual] = float(v)


def _as_latex(table: str) -> str | None:
    """LaTeX to render: the text itself, or ``html_to_latex`` of HTML (None when the HTML holds no table)."""
    if not table.strip():
        return None
    if not _is_html(table):
        return table
    try:
        return html_to_latex(table)
    except ValueError:
        return None
