"""Table image -> LaTeX reward (Table2LaTeX-RL, docs/rewards.md#domain-rewards) and the plain HTML ``teds`` reward.

``latex_table`` scores a response holding a LaTeX table against the reference LaTeX table:

- ``compile``: 1 when the response compiles in the sandbox's fixed ``standalone`` preamble (:mod:`.sandbox`), else 0;
- ``teds_s``: structure-only TEDS of ``latex_to_html(response)`` against ``latex_to_html(reference)``; a response
  that cannot be parsed scores 0;
- ``visual``: the rendered response, grayscale, resized to the rendered reference's size, compared with
  ``cw_ssim`` (true complex steerable pyramid CW-SSIM, the metric the paper names) or ``haar_ssim`` (the Haar 2x2
  subband approximation the authors' evaluation code actually ran); 0 when the response does not compile.

``scheme="binary"`` is the paper's training reward, exactly: ``acc = 0 if teds_s < 0.3 or not compile else
1[visual > 0.6]``, ``form = 1[teds_s > 0.9]``, ``score = acc + form`` (0, 1 or 2). Note that ``form`` does not look
at ``compile``: a response that fails to compile but has the right structure still earns 1.
``scheme="continuous"`` (ours, for denser signal) is ``score = compile * (0.5 * teds_s + 0.5 * min(visual, 1))`` in
[0, 1] (``haar_ssim`` of identical images is slightly above 1, see :mod:`.ssim`). ``parts`` always holds ``compile``,
``teds_s`` and ``visual`` (the metric's raw value), plus ``acc`` and ``form`` in the binary scheme.

Departures from the paper: rendering is at ``dpi`` (default 100, the paper used 300; CW-SSIM is computed after
resizing to the reference either way, and 100 dpi is 9x fewer pixels); the response is taken from inside
``<answer>...</answer>`` and then from the first fenced code block (preferring one tagged latex/tex), if present,
otherwise as it is; nothing else is rewritten (a ``table`` float does not compile in ``standalone``, as in the
paper's preamble). When ``metadata["reference_format"] == "html"`` the reference is an HTML table (PubTabNet style):
structure is scored against it directly and the visual reference is ``html_to_latex(reference)`` rendered in the
same preamble. A reference that cannot be parsed or rendered is a dataset error: the sample scores 0 with an error
naming it.

An empty response (nothing to compile) counts as not compiling. When the sandbox cannot confine TeX (no Landlock and
no ``MMRL_ALLOW_UNCONFINED_RENDER=1``, see :mod:`.sandbox`) every sample scores 0 with the sandbox's error, which
names the opt-in; training goes on and the errors are logged. Hostile spans (``\\multicolumn{inf}``,
``\\multirow{-1e309}``) fail to parse and to compile, and score 0 like any unreadable table.

Speed: all distinct responses and not-yet-seen references of a batch go to ONE :func:`render_latex` call (batched
TeX runs on all cores); rendered references and parsed reference structures are cached by text for the life of the
process (LRU, 512 each); identical (response, reference) pairs are scored once; identical renders skip CW-SSIM (it
is exactly 1); the visual metric runs one reference at a time (:func:`visual_similarities`), the reference's side of
CW-SSIM computed once for all its responses and dropped before the next reference (1.4-1.6x for 8 responses per
reference; see :mod:`.ssim` for how CW-SSIM itself was made 3x faster). ``benchmarks/latex_reward.py`` (64
candidates, 20 of them a real model's PubTabNet predictions, 11 not compiling; shared 2-core machine under load):
18-21 tables/s (9.4-10.3 before the CW-SSIM speed-up) against 3.5-3.8 for one pdflatex + one pdftoppm per table
with the same metrics, and 38 against 3.8 with ``visual="haar_ssim"``. With CW-SSIM about half the time is still
the metric (~0.03 s a table at 100 dpi, most of it the inverse FFTs); rendering is ~0.02 s a table.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path
from typing import Literal

import cv2
import numpy as np
from PIL import Image

from mmrl.rewards.base import register_reward
from mmrl.rewards.latex_table_html import LatexTableParseError, html_to_latex, latex_to_html
from mmrl.rewards.sandbox import RenderResult, SandboxUnavailableError, render_latex
from mmrl.rewards.ssim import CwSsimReference, cw_ssim, haar_ssim
from mmrl.rewards.teds import teds
from mmrl.types import RewardInput, RewardResult, render_stem

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.S)
_OPEN_FENCE = re.compile(r"```[ \t]*[\w+-]*[^\n]*\n(.*)\Z", re.S)
_VISUAL = {"cw_ssim": cw_ssim, "haar_ssim": haar_ssim}
_CACHE_SIZE = 512
_MIN_SIDE = 16
_REF_RENDERS: OrderedDict[tuple[str, float], RenderResult] = OrderedDict()
_REF_HTML: OrderedDict[tuple[str, str], str] = OrderedDict()


def extract_block(response: str, languages: tuple[str, ...]) -> str:
    """The answer inside ``<answer>`` tags and/or a fenced code block (preferring a fence tagged with one of
    ``languages``; an unclosed fence, as in a truncated generation, counts); else the whole response, stripped."""
    answers = _ANSWER.findall(response)
    text = answers[-1] if answers else response
    fences = _FENCE.findall(text)
    if fences:
        tagged = [body for lang, body in fences if lang.lower() in languages]
        return (tagged or [fences[0][1]])[0].strip()
    unclosed = _OPEN_FENCE.search(text)
    return (unclosed.group(1) if unclosed else text).strip()


def _cached(cache: OrderedDict, key, make):
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = make()
    cache[key] = value
    if len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value


def _reference(item: RewardInput) -> tuple[str, str]:
    """(LaTeX to render, HTML for structure) of the sample's reference; raises ValueError naming the sample."""
    fmt = str(item.metadata.get("reference_format", "latex")).lower()
    ref = item.reference
    if not isinstance(ref, str) or not ref.strip():
        raise ValueError(
            f"sample {item.id!r}: the reference must be a non-empty LaTeX (or HTML) table string"
        )
    try:
        if fmt == "html":
            return _cached(_REF_HTML, ("html->latex", ref), lambda: html_to_latex(ref)), ref
        if fmt == "latex":
            return ref, _cached(_REF_HTML, ("latex", ref), lambda: latex_to_html(ref))
    except LatexTableParseError as e:
        raise ValueError(
            f"sample {item.id!r}: the reference table cannot be parsed ({e}); fix the record"
        ) from e
    raise ValueError(f"sample {item.id!r}: metadata reference_format must be 'latex' or 'html', got {fmt!r}")


def _structure(pred: str, ref_html: str) -> float:
    try:
        pred_html = latex_to_html(pred)
    except LatexTableParseError:
        return 0.0
    return float(teds(pred_html, ref_html, structure_only=True))


def _fit(pred: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The prediction resized to the reference's shape: area averaging when it shrinks in both directions,
    bicubic otherwise."""
    h, w = shape
    if pred.shape == shape:
        return pred
    shrink = pred.shape[0] >= h and pred.shape[1] >= w
    pred = cv2.resize(pred, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_CUBIC)
    return np.clip(pred, 0.0, 1.0)


def _pad(image: np.ndarray) -> np.ndarray:
    """White padding to at least ``_MIN_SIDE`` pixels a side (only tiny renders: the pyramid needs 8x8)."""
    h, w = image.shape
    if min(h, w) >= _MIN_SIDE:
        return image
    return np.pad(image, ((0, max(0, _MIN_SIDE - h)), (0, max(0, _MIN_SIDE - w))), constant_values=1.0)


def visual_similarities(preds: list[np.ndarray], ref: np.ndarray, metric: str) -> list[float]:
    """:func:`visual_similarity` of every prediction against ONE reference. With CW-SSIM the reference's pyramid
    is computed once for all of them (:class:`CwSsimReference`), so a group of G responses to one reference costs
    G + 1 pyramids instead of 2 G (and none for the reference when every response renders identically)."""
    if metric not in _VISUAL:
        raise ValueError(f"unknown visual metric {metric!r}; use one of {sorted(_VISUAL)}")
    ref_padded = _pad(ref)
    reference = None
    out = []
    for pred in preds:
        pred = _fit(pred, ref.shape)
        if metric == "cw_ssim" and np.array_equal(pred, ref):
            # CW-SSIM of identical images is exactly 1; exact matches are common late in training
            out.append(1.0)
        elif metric == "cw_ssim":
            if reference is None:
                reference = CwSsimReference(ref_padded)
            out.append(reference.score(_pad(pred)))
        else:
            out.append(float(_VISUAL[metric](_pad(pred), ref_padded)))
    return out


def visual_similarity(pred: np.ndarray, ref: np.ndarray, metric: str) -> float:
    """``metric`` of the prediction, resized to the reference's shape (area averaging when it shrinks in both
    directions, bicubic otherwise), against the reference. Both are padded with white to at least
    ``_MIN_SIDE`` pixels a side first (only tiny renders: the steerable pyramid needs 8x8). Identical images skip
    CW-SSIM, whose value for them is exactly 1."""
    return visual_similarities([pred], ref, metric)[0]


def _visual_scores(
    pairs: list[tuple[str, str]], rendered: dict[str, RenderResult], metric: str
) -> dict[tuple[str, str], float]:
    """Visual similarity of every (response, reference LaTeX) pair whose both sides rendered, one reference at
    a time, so each reference's side of the metric is computed once and then dropped (bounded memory)."""
    groups: dict[str, list[str]] = {}
    for pred, ref in pairs:
        if rendered[ref].ok and rendered[pred].ok and pred.strip():
            groups.setdefault(ref, []).append(pred)
    out = {}
    for ref, group in groups.items():
        scores = visual_similarities([rendered[p].image for p in group], rendered[ref].image, metric)
        out.update({(p, ref): s for p, s in zip(group, scores)})
    return out


def _render_all(
    preds: list[str], ref_latex: list[str | None], dpi: float, timeout_s: float
) -> dict[str, RenderResult]:
    """Renders of every distinct response and reference; references not cached yet go into the same batched call."""
    refs = list(dict.fromkeys(x for x in ref_latex if x is not None))
    known = {r: _REF_RENDERS[(r, dpi)] for r in refs if (r, dpi) in _REF_RENDERS}
    texts = list(dict.fromkeys([*preds, *(r for r in refs if r not in known)]))
    rendered = dict(zip(texts, render_latex(texts, dpi=dpi, timeout_s=timeout_s)))
    for r in refs:
        _cached(_REF_RENDERS, (r, dpi), lambda r=r: rendered[r])
    return {**rendered, **known}


@register_reward("latex_table", heavy=True)
def latex_table(
    batch: list[RewardInput],
    *,
    scheme: Literal["binary", "continuous"] = "binary",
    visual: Literal["cw_ssim", "haar_ssim"] = "cw_ssim",
    dpi: int = 100,
    timeout_s: float = 10.0,
) -> list[RewardResult]:
    preds = [extract_block(x.response, ("latex", "tex")) for x in batch]
    refs: list[tuple[str, str] | str] = []
    for item in batch:
        try:
            refs.append(_reference(item))
        except ValueError as e:
            refs.append(str(e))
    try:
        rendered = _render_all(preds, [r[0] if isinstance(r, tuple) else None for r in refs], dpi, timeout_s)
    except SandboxUnavailableError as e:  # no Landlock and no opt-in: every sample scores 0, saying why
        return [RewardResult(score=0.0, error=str(e)) for _ in batch]
    pairs = dict.fromkeys((p, r[0]) for p, r in zip(preds, refs) if isinstance(r, tuple))
    vis = _visual_scores(list(pairs), rendered, visual)
    scored: dict[tuple[str, str], RewardResult] = {}
    out = []
    for item, pred, ref in zip(batch, preds, refs):
        if isinstance(ref, str):
            out.append(RewardResult(score=0.0, error=ref))
            continue
        if item.metadata.get("render_dir"):
            save_renders(Path(item.metadata["render_dir"]), item.id, rendered[pred], rendered[ref[0]])
        if (pred, ref[0]) not in scored:
            scored[(pred, ref[0])] = _score(
                item, rendered[pred], rendered[ref[0]], pred, ref[1], scheme, vis.get((pred, ref[0]), 0.0)
            )
        out.append(scored[(pred, ref[0])])
    return out


def save_renders(folder: Path, sample_id: str, pred: RenderResult, ref: RenderResult) -> None:
    """Keep the renders for a person to look at (``mmrl reward ... --render-dir DIR``): ``<id>-response.png`` and
    ``<id>-reference.png``, or ``<id>-response.error.txt`` saying why the response did not render."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = render_stem(sample_id)
    for name, r in (("response", pred), ("reference", ref)):
        if r.ok and r.image is not None:
            Image.fromarray((np.clip(r.image, 0.0, 1.0) * 255).round().astype(np.uint8)).save(
                folder / f"{stem}-{name}.png"
            )
        else:
            (folder / f"{stem}-{name}.error.txt").write_text(str(r.error) + "\n")


def _score(item, pred_render, ref_render, pred, ref_html, scheme, visual: float) -> RewardResult:
    if not ref_render.ok:
        error = (
            f"sample {item.id!r}: the reference table does not render ({ref_render.error}); fix the record"
        )
        return RewardResult(score=0.0, error=error)
    compiled = 1.0 if pred_render.ok and pred.strip() else 0.0
    teds_s = _structure(pred, ref_html)
    vis = visual if compiled else 0.0
    parts = {"compile": compiled, "teds_s": teds_s, "visual": vis}
    if scheme == "continuous":
        return RewardResult(score=compiled * (0.5 * teds_s + 0.5 * min(vis, 1.0)), parts=parts)
    acc = 0.0 if teds_s < 0.3 or not compiled else float(vis > 0.6)
    form = float(teds_s > 0.9)
    return RewardResult(score=acc + form, parts={**parts, "acc": acc, "form": form})


@register_reward("teds")
def teds_reward(batch: list[RewardInput], *, structure_only: bool = False) -> list[RewardResult]:
    """TEDS of an HTML table response (inside ``<answer>`` tags or an html fence, if present) against the HTML
    reference; structure only when asked. An unparsable response or one without a table scores 0."""
    out = []
    for item in batch:
        if not isinstance(item.reference, str) or not item.reference.strip():
            out.append(
                RewardResult(
                    score=0.0, error=f"sample {item.id!r}: the reference must be an HTML table string"
                )
            )
            continue
        pred = extract_block(item.response, ("html",))
        out.append(RewardResult(score=float(teds(pred, item.reference, structure_only=structure_only))))
    return out


__all__ = ["extract_block", "latex_table", "teds_reward", "visual_similarities", "visual_similarity"]
