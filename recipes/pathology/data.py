"""Synthetic H&E-like tissue tiles with yes/no, multiple-choice, open and region questions (the pathology recipe's
data, scored by the ``pathology`` reward; docs/rewards.md#domain-rewards, Patho-R1's <think>/<answer> format).

Each tile is painted in stain space, then turned into RGB by Beer-Lambert with the usual haematoxylin and eosin
optical densities (Ruifrok and Johnston's H&E vectors): a haematoxylin map (nuclei, purple-blue) and an eosin map
(cytoplasm, fibres, pink). Four tissue classes differ in layout as pathologists know them: ``adipose`` (empty fat
cells with thin pink membranes), ``stroma`` (wavy pink fibres with a few long nuclei), ``lymphoid`` (crowded small
round nuclei) and ``epithelium`` (glands: a ring of nuclei around a white lumen). About half the tiles carry one
lesion, an ``ellipse`` or ``irregular`` polygon centred in one of the four quadrants (with jitter): ``tumour``
(crowded large dark pleomorphic nuclei) or ``necrosis`` (structureless hyper-eosinophilic area with nuclear debris).
Its exact outline is the annotation: region questions ask for a box (gold: the outline's bounding box) or a
polygon (gold: the outline), in original-image pixels, scored by mask IoU.

Question kinds (``metadata["kind"]``): ``presence`` (yes/no), ``tissue_mc`` (multiple choice over the four tissue
classes, shuffled), ``tissue_open`` and ``lesion_open`` (one word), ``box`` and ``polygon`` (name the lesion and mark
it). :func:`build` writes ``train``/``eval`` (RL and held out) and ``sft`` (warm start), three disjoint splits drawn
from their own seeds. An ``sft`` record's ``answer`` is the demonstration response (``<think>`` with what is seen,
``<answer>`` with the answer and, for region kinds, the mark in the model-input pixels of the given pixel budget),
because ``mmrl sft`` trains on the ``answer`` text; its true reference stays in ``metadata["reference"]``.
"""

from __future__ import annotations

import functools
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter
from scipy.spatial import cKDTree

from mmrl.model.checkpoint_files import ModelView

TISSUES = ("adipose", "stroma", "lymphoid", "epithelium")
LESIONS = ("tumour", "necrosis")
LESION_SHAPES = ("ellipse", "irregular")
KINDS = ("presence", "tissue_mc", "tissue_open", "lesion_open", "box", "polygon")
QUESTION_TYPES = {
    "presence": "yes_no",
    "tissue_mc": "multiple_choice",
    "tissue_open": "open",
    "lesion_open": "open",
    "box": "open",
    "polygon": "open",
}
# Optical densities per unit stain (haematoxylin, eosin), rows normalised, as in Ruifrok & Johnston (2001).
_H_OD = np.array([0.65, 0.70, 0.29]) / np.linalg.norm([0.65, 0.70, 0.29])
_E_OD = np.array([0.07, 0.99, 0.11]) / np.linalg.norm([0.07, 0.99, 0.11])

INSTRUCTION = "Think inside <think></think>, then answer inside <answer></answer>."
QUESTIONS = {
    "presence": "Is there a lesion in this tissue?",
    "tissue_mc": "Which tissue type is shown?",
    "tissue_open": "What tissue type is shown?",
    "lesion_open": "What kind of lesion is present?",
    "box": "What lesion is present? Mark it as <box>[x1, y1, x2, y2]</box>.",
    "polygon": "What lesion is present? Outline it as <polygon>[[x, y], ...]</polygon>.",
}

UNIFORM = dict.fromkeys(KINDS, 1.0)
# The GPU variant's mix: every kind, a third of the prompts asking for a region.
FULL_KIND_WEIGHTS = {
    "presence": 0.2,
    "tissue_mc": 0.2,
    "tissue_open": 0.15,
    "lesion_open": 0.15,
    "box": 0.2,
    "polygon": 0.1,
}
# The tiny variant's mix: the bundled ~1M-parameter model tells tissues and lesions apart by colour and texture
# within minutes; polygons (30+ tokens) are left to the GPU variant.
TINY_KIND_WEIGHTS = {
    "presence": 0.25,
    "tissue_mc": 0.25,
    "tissue_open": 0.2,
    "lesion_open": 0.15,
    "box": 0.15,
}
# The warm-start split over-represents one answer per kind (records with another answer are kept with
# probability ``sft_keep_other``): the prior that RL on the balanced prompts has to correct.
MAJORITY = {
    "presence": "no",
    "tissue_mc": "adipose",
    "tissue_open": "adipose",
    "lesion_open": "necrosis",
    "box": "necrosis",
    "polygon": "necrosis",
}


def prompt_text(question: str, mark: str | None = None) -> str:
    """The user turn: the image, the question, the <think>/<answer> instruction (and where marks go)."""
    where = f" Put the {mark} inside <answer> after the answer, in pixels of the image." if mark else ""
    return f"<image>{question}\n{INSTRUCTION}{where}"


def _smooth_noise(rng: np.random.Generator, size: int, cell: int) -> np.ndarray:
    """Value noise in [0, 1]: a coarse random grid upsampled bicubically (blotchy staining)."""
    n = max(2, size // cell + 2)
    grid = Image.fromarray(rng.random((n, n)).astype(np.float32), mode="F")
    return np.clip(np.asarray(grid.resize((size, size), Image.BICUBIC)), 0.0, 1.0)


@functools.cache
def _unit_circle(n: int) -> tuple[np.ndarray, np.ndarray]:
    t = 2 * np.pi * np.arange(n) / n
    return np.cos(t), np.sin(t)


def _ellipse(
    cx: float, cy: float, a: float, b: float, theta: float, n: int = 12
) -> list[tuple[float, float]]:
    cos_t, sin_t = _unit_circle(n)
    c, s = math.cos(theta), math.sin(theta)
    x, y = a * cos_t, b * sin_t
    return list(zip((cx + x * c - y * s).tolist(), (cy + x * s + y * c).tolist()))


class _Stamp:
    """A stain map drawn as filled polygons on an 8-bit canvas, then softened (nuclei have blurred rims)."""

    def __init__(self, size: int):
        self.img = Image.new("L", (size, size), 0)
        self.draw = ImageDraw.Draw(self.img)

    def poly(self, pts: list[tuple[float, float]], value: float) -> None:
        self.draw.polygon(pts, fill=int(max(0.0, min(1.0, value)) * 255))

    def array(self, blur: float = 0.7) -> np.ndarray:
        return np.asarray(self.img.filter(ImageFilter.GaussianBlur(blur)), dtype=np.float32) / 255.0


def _nuclei(
    rng: np.random.Generator, size: int, count: int, radius: tuple[float, float], **kw: Any
) -> np.ndarray:
    """``count`` nuclei at random places: elongation ``elong`` (axis ratio), orientation ``theta`` (None: random),
    darkness ``dark`` (a range within [0, 1], the stamp's scale), restricted to ``where`` (a boolean mask) when
    given."""
    stamp = _Stamp(size)
    where = kw.get("where")
    ys, xs = np.nonzero(where) if where is not None else (None, None)
    for _ in range(count):
        if ys is not None:
            if len(ys) == 0:
                break
            i = rng.integers(len(ys))
            cx, cy = float(xs[i]), float(ys[i])
        else:
            cx, cy = rng.uniform(0, size, 2)
        r = rng.uniform(*radius)
        theta = kw.get("theta")
        theta = rng.uniform(0, math.pi) if theta is None else theta + rng.normal(0, 0.2)
        stamp.poly(
            _ellipse(cx, cy, r, r / kw.get("elong", 1.0), theta), rng.uniform(*kw.get("dark", (0.7, 0.9)))
        )
    return stamp.array()


def _tissue(rng: np.random.Generator, tissue: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(haematoxylin, eosin) concentration maps of one tissue class, each [size, size] in about [0, 1]."""
    noise = _smooth_noise(rng, size, max(4, size // 8))
    area = size * size
    if tissue == "adipose":  # fat cells: Voronoi cells whose borders (near-equidistant pixels) are membranes
        pts = rng.uniform(0, size, (max(4, area // 700), 2))
        yy, xx = np.mgrid[0:size, 0:size]
        d, _ = cKDTree(pts).query(np.stack([xx.ravel(), yy.ravel()], 1), k=2)  # [S*S, 2]
        membrane = ((d[:, 1] - d[:, 0]) < 1.6).reshape(size, size)
        e = 0.04 + 0.05 * noise + 0.55 * membrane
        h = _nuclei(rng, size, max(1, area // 2500), (1.5, 2.2), elong=2.5, where=membrane, dark=(0.5, 0.7))
        return h, e
    if tissue == "stroma":
        theta = rng.uniform(0, math.pi)
        yy, xx = np.mgrid[0:size, 0:size]
        u = xx * math.cos(theta) + yy * math.sin(theta)
        wave = np.sin(u / rng.uniform(1.5, 2.5) + 3 * noise)
        e = 0.55 + 0.2 * wave + 0.1 * noise
        h = _nuclei(rng, size, max(2, area // 600), (2.5, 3.5), elong=3.5, theta=theta, dark=(0.6, 0.8))
        return h, e
    if tissue == "lymphoid":
        e = 0.18 + 0.1 * noise
        h = _nuclei(rng, size, area // 45, (1.6, 2.3), dark=(0.8, 1.0))
        return h, e
    e = 0.35 + 0.15 * noise  # epithelium: glands in a loose stroma
    stamp_h, stamp_lumen, stamp_cyto = _Stamp(size), _Stamp(size), _Stamp(size)
    glands: list[tuple[float, float, float]] = []
    for _ in range(4 * max(2, area // 2500)):
        if len(glands) == max(2, area // 2500):
            break
        cx, cy = rng.uniform(0, size, 2)
        r = rng.uniform(11, 18)
        if any(math.hypot(cx - gx, cy - gy) < 1.05 * (r + gr) for gx, gy, gr in glands):
            continue
        glands.append((cx, cy, r))
        stamp_cyto.poly(_ellipse(cx, cy, r, r, 0.0, 24), 1.0)
        stamp_lumen.poly(_ellipse(cx, cy, 0.55 * r, 0.55 * r, 0.0, 24), 1.0)
        n_nuc = max(6, int(2 * math.pi * 0.78 * r / 3.2))
        for k in range(n_nuc):
            t = 2 * math.pi * k / n_nuc + rng.normal(0, 0.05)
            nx, ny = cx + 0.78 * r * math.cos(t), cy + 0.78 * r * math.sin(t)
            stamp_h.poly(_ellipse(nx, ny, 2.2, 1.3, t, 8), rng.uniform(0.75, 0.95))
    cyto, lumen = stamp_cyto.array(1.0), stamp_lumen.array(1.0)
    e = e * (1 - cyto) + 0.62 * cyto
    e = e * (1 - lumen) + 0.03 * lumen
    return stamp_h.array(), e


def _lesion_outline(rng: np.random.Generator, shape: str, size: int) -> list[tuple[float, float]]:
    """The lesion's outline: centred in a random quadrant (jittered), radius 13-20% of the tile."""
    q = rng.integers(4)
    cx = size * (0.25 + 0.5 * (q % 2)) + rng.normal(0, size / 32)
    cy = size * (0.25 + 0.5 * (q // 2)) + rng.normal(0, size / 32)
    r = rng.uniform(0.13, 0.2) * size
    if shape == "ellipse":
        pts = _ellipse(cx, cy, r, r * rng.uniform(0.6, 0.9), rng.uniform(0, math.pi), 16)
    else:
        n = int(rng.integers(7, 11))
        base = rng.uniform(0, 2 * math.pi)
        pts = [
            (
                cx + r * f * math.cos(base + 2 * math.pi * k / n),
                cy + r * f * math.sin(base + 2 * math.pi * k / n),
            )
            for k, f in enumerate(rng.uniform(0.65, 1.2, n))
        ]
    return [(float(np.clip(round(x), 0, size - 1)), float(np.clip(round(y), 0, size - 1))) for x, y in pts]


def _paint_lesion(
    rng: np.random.Generator, lesion: str, outline: list[tuple[float, float]], h: np.ndarray, e: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    size = h.shape[0]
    stamp = _Stamp(size)
    stamp.poly(outline, 1.0)
    hard = np.asarray(stamp.img) > 0
    soft = stamp.array(1.2)
    noise = _smooth_noise(rng, size, max(4, size // 10))
    n_inside = int(hard.sum())
    if lesion == "tumour":
        lh = 0.2 + _nuclei(
            rng, size, max(3, n_inside // 22), (2.6, 4.2), elong=1.4, where=hard, dark=(1.0, 1.0)
        )
        le = 0.3 + 0.15 * noise
    else:
        lh = _nuclei(rng, size, max(3, n_inside // 40), (0.8, 1.3), where=hard, dark=(0.6, 0.9))
        le = 0.85 + 0.1 * noise
    return h * (1 - soft) + lh * soft, e * (1 - soft) + le * soft


def render(h: np.ndarray, e: np.ndarray) -> Image.Image:
    """Beer-Lambert: RGB = 250 exp(-1.25 (c_H OD_H + c_E OD_E)) (250: the slide's white; no pixel noise, which
    would only make the PNGs larger)."""
    od = 1.25 * (h[..., None] * _H_OD + e[..., None] * _E_OD)  # [S, S, 3]
    rgb = 250.0 * np.exp(-od)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), mode="RGB")


def bounding_box(outline: list[tuple[float, float]]) -> list[int]:
    xs, ys = [p[0] for p in outline], [p[1] for p in outline]
    return [int(min(xs)), int(min(ys)), int(max(xs)), int(max(ys))]


def make_tile(rng: np.random.Generator, size: int, tissue: str, lesion: str | None, shape: str):
    """(image, outline or None) for one tissue tile, with the lesion painted in when given."""
    h, e = _tissue(rng, tissue, size)
    outline = None
    if lesion is not None:
        outline = _lesion_outline(rng, shape, size)
        h, e = _paint_lesion(rng, lesion, outline, h, e)
    return render(h, e), outline


def make_record(
    rng: random.Random, idx: int, split: str, kind_weights: dict[str, float]
) -> tuple[dict[str, Any], int]:
    """One record without its image, and the seed that paints the image (:func:`paint`), so that records a split
    leaves out cost no rendering. The region is filled in by :func:`paint`."""
    kind = rng.choices(list(kind_weights), weights=list(kind_weights.values()))[0]
    tissue = rng.choice(TISSUES)
    needs_lesion = kind in ("lesion_open", "box", "polygon")
    lesion = rng.choice(LESIONS) if needs_lesion or rng.random() < 0.5 else None
    shape = rng.choice(LESION_SHAPES)
    meta: dict[str, Any] = {"kind": kind, "question_type": QUESTION_TYPES[kind], "tissue": tissue}
    meta |= {"lesion": lesion, "lesion_shape": shape} if lesion else {"lesion": "none"}
    question, mark = QUESTIONS[kind], None
    if kind == "presence":
        answer: str = "yes" if lesion else "no"
    elif kind == "tissue_mc":
        choices = rng.sample(TISSUES, len(TISSUES))
        meta["choices"] = choices
        question += " " + " ".join(f"{'ABCD'[i]}. {c}" for i, c in enumerate(choices))
        answer = "ABCD"[choices.index(tissue)]
    elif kind == "tissue_open":
        answer = tissue
    else:
        answer = lesion
        mark = kind if kind in ("box", "polygon") else None
    rid = f"patho-{split}-{idx:05d}"
    rec = {
        "id": rid,
        "prompt": prompt_text(question, mark),
        "images": [f"images/{rid}.png"],
        "answer": answer,
    }
    rec["metadata"] = meta
    return rec, rng.getrandbits(64)


def paint(rec: dict[str, Any], image_seed: int, size: int) -> Image.Image:
    """The record's tile; sets ``metadata["region"]`` (box or outline, original pixels) for region kinds."""
    meta = rec["metadata"]
    lesion = None if meta["lesion"] == "none" else meta["lesion"]
    image, outline = make_tile(
        np.random.default_rng(image_seed), size, meta["tissue"], lesion, meta.get("lesion_shape", "ellipse")
    )
    if meta["kind"] == "box":
        meta["region"] = bounding_box(outline)
    elif meta["kind"] == "polygon":
        meta["region"] = [list(p) for p in outline]
    return image


def _answer_word(rec: dict[str, Any]) -> str:
    meta = rec["metadata"]
    return meta["choices"]["ABCD".index(rec["answer"])] if meta["kind"] == "tissue_mc" else rec["answer"]


def target_response(
    rec: dict[str, Any], image_size: tuple[int, int], model: ModelView | tuple[int, int]
) -> str:
    """The demonstration response for a record: what is seen in <think>, the answer (and the region, in the frame
    the model writes in, :class:`~mmrl.model.checkpoint_files.ModelView`; a bare ``(min_pixels, max_pixels)`` budget knows no
    model and means the model-input pixels of Qwen2/2.5-VL's 28 px grid) in <answer>."""
    meta = rec["metadata"]
    seen = meta["tissue"] + ("" if meta["lesion"] == "none" else f" {meta['lesion']}")
    answer = rec["answer"]
    region = meta.get("region")
    if region is not None:
        view, (w, h) = ModelView.of(model), image_size

        def to_frame(x: float, y: float) -> list[int]:
            return [round(v) for v in view.to_frame(x, y, w, h)]

        if meta["kind"] == "box":
            scaled = to_frame(*region[:2]) + to_frame(*region[2:])
            answer += f" <box>{json.dumps(scaled, separators=(',', ':'))}</box>"
        else:
            pts = [to_frame(x, y) for x, y in region]
            answer += f" <polygon>{json.dumps(pts, separators=(',', ':'))}</polygon>"
    return f"<think>{seen}</think><answer>{answer}</answer>"


def build(
    folder: str | Path,
    *,
    n_train: int = 4000,
    n_eval: int = 300,
    n_sft: int = 0,
    seed: int = 0,
    size: int = 336,
    kind_weights: dict[str, float] | None = None,
    sft_keep_other: float = 0.25,
    sft_pixels: tuple[int, int] = (3136, 3136),
    sft_model: str | None = None,
) -> dict[str, Path]:
    """Write ``train.jsonl``, ``eval.jsonl`` (and ``sft.jsonl`` when ``n_sft``) with ``images/`` into ``folder``.

    ``train`` and ``eval`` draw kinds by ``kind_weights`` (default :data:`FULL_KIND_WEIGHTS`) and tissues and lesions
    uniformly. ``sft`` draws kinds uniformly over ``kind_weights``'s kinds and keeps a record whose answer is not its
    kind's :data:`MAJORITY` answer with probability ``sft_keep_other``; its answers are the demonstration responses
    for a model that sees the images at ``sft_pixels`` (the warm start's ``model.min_pixels``/``max_pixels``), on the
    geometry and in the coordinate frame of the checkpoint at ``sft_model`` (the warm start's ``model.path``; None:
    no model known, the 28 px grid and model-input pixels of Qwen2/2.5-VL).
    """
    lo, hi = sft_pixels
    sft_view = (
        ModelView.of_model({"path": sft_model, "min_pixels": lo, "max_pixels": hi}) if sft_model else (lo, hi)
    )
    root = Path(folder)
    (root / "images").mkdir(parents=True, exist_ok=True)
    weights = kind_weights or FULL_KIND_WEIGHTS
    splits = [("train", n_train, seed, 1.0, weights), ("eval", n_eval, seed + 1_000_003, 1.0, weights)]
    if n_sft:
        splits.append(("sft", n_sft, seed + 2_000_029, sft_keep_other, dict.fromkeys(weights, 1.0)))
    paths = {}
    for split, n, s, keep_other, w in splits:
        rng = random.Random(s)
        lines: list[str] = []
        i = 0
        while len(lines) < n:
            rec, image_seed = make_record(rng, i, split, w)
            i += 1
            if _answer_word(rec) != MAJORITY[rec["metadata"]["kind"]] and rng.random() >= keep_other:
                continue
            img = paint(rec, image_seed, size)
            if split == "sft":
                rec["metadata"]["reference"] = rec["answer"]
                rec["answer"] = target_response(rec, img.size, sft_view)
            img.save(root / rec["images"][0], compress_level=1)
            lines.append(json.dumps(rec))
        paths[split] = root / f"{split}.jsonl"
        tmp = paths[split].with_suffix(".jsonl.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(paths[split])
    return paths


TINY_MODEL = "assets/tiny-qwen2.5-vl"  # recipes/pathology/sft.yaml's model.path


def build_tiny(folder: str | Path) -> dict[str, Path]:
    """The tiny variant's data: 112 px tiles (the model sees them at 56 px), :data:`TINY_KIND_WEIGHTS`, and a
    warm-start split for ``recipes/pathology/sft.yaml``."""
    return build(
        folder,
        n_train=800,
        n_eval=200,
        n_sft=1200,
        size=112,
        kind_weights=TINY_KIND_WEIGHTS,
        sft_model=TINY_MODEL,
    )
