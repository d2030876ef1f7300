"""Whole-slide images as training tiles with their annotations, streamed through OpenSlide.

A slide is never read whole: every pixel comes from one ``read_region`` call of one tile's window (a few hundred
pixels a side), so a 100,000 x 80,000 slide costs what its tiles cost. Annotations are regions in level-0 (full
resolution) pixels, as slide viewers export them; each tile gets the part of every region that falls inside it,
mapped to the tile's pixels and clipped to its border (Sutherland-Hodgman), ready for the ``pathology`` reward's
``metadata["region"]``.

- :func:`load_annotations`: a JSON list of ``{"label", "box": [x1, y1, x2, y2]}`` / ``{"label", "polygon": [[x, y],
  ...]}``, or a GeoJSON FeatureCollection as QuPath exports it (``Polygon`` geometries, outer ring; the label from
  ``properties.classification.name``, else ``properties.name`` / ``label``).
- :func:`tiles`: a grid of tiles at a chosen pyramid ``level``, or at a chosen ``downsample`` (read from the nearest
  finer level and resized, for slides whose pyramid lacks it), skipping background by the share of stained pixels.
- :func:`cut_region`: one tile around an annotation (with a margin), at a chosen level or downsample.
- :func:`write_records`: tiles as mmrl records: a yes/no question per tile ("is there a lesion?") and, for tiles a
  region reaches, a box question naming its label, scored by mask IoU.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

from mmrl.extras import require
from mmrl.recipes.pathology.data import QUESTIONS, prompt_text

Point = tuple[float, float]


class SlideError(ValueError):
    pass


class Slide(Protocol):
    """What is used of ``openslide.OpenSlide`` (any object with these works, e.g. a wrapper that counts reads)."""

    level_count: int
    level_dimensions: Sequence[tuple[int, int]]
    level_downsamples: Sequence[float]

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int]) -> Image.Image: ...

    def get_best_level_for_downsample(self, downsample: float) -> int: ...


@dataclass
class Annotation:
    label: str
    polygon: list[Point]  # level-0 pixels


@dataclass
class Tile:
    image: Image.Image  # RGB, size x size
    x: int  # level-0 pixel of the top-left corner
    y: int
    level: int  # the pyramid level read
    downsample: float  # level-0 pixels per tile pixel
    regions: list[Annotation] = field(default_factory=list)  # in tile pixels, clipped to the tile


def open_slide(path: str | Path) -> Any:
    """``openslide.OpenSlide(path)`` with an error that names the file when OpenSlide cannot read it."""
    require("pathology", "reading whole-slide images", ("openslide",))
    import openslide

    p = Path(path)
    if not p.is_file():
        raise SlideError(f"slide not found: {p}")
    try:
        return openslide.OpenSlide(str(p))
    except openslide.OpenSlideError as e:
        raise SlideError(
            f"{p}: OpenSlide cannot read it ({e}); convert it to a tiled pyramidal TIFF"
        ) from None


def _as_polygon(item: dict[str, Any], where: str) -> list[Point]:
    if "box" in item:
        box = item["box"]
        if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
            raise SlideError(f"{where}: 'box' must be [x1, y1, x2, y2] in level-0 pixels, got {box!r}")
        x1, x2 = sorted((float(box[0]), float(box[2])))
        y1, y2 = sorted((float(box[1]), float(box[3])))
        return [(x1, y1), (x2, y1), (x2, y2), (x1, y2)]
    pts = item.get("polygon")
    ok = isinstance(pts, list) and len(pts) >= 3
    ok = ok and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pts)
    if not ok:
        raise SlideError(f"{where}: give 'box' [x1, y1, x2, y2] or 'polygon' [[x, y], ...] (>= 3 points)")
    return [(float(x), float(y)) for x, y in pts]


def load_annotations(source: str | Path | list[dict[str, Any]] | dict[str, Any]) -> list[Annotation]:
    """Annotations from a JSON file or an already parsed object (formats in the module docstring)."""
    where = str(source) if isinstance(source, (str, Path)) else "annotations"
    data = json.loads(Path(source).read_text()) if isinstance(source, (str, Path)) else source
    out = []
    if isinstance(data, dict) and data.get("type") == "FeatureCollection":
        for i, feat in enumerate(data.get("features") or []):
            geom, props = feat.get("geometry") or {}, feat.get("properties") or {}
            if geom.get("type") != "Polygon":
                raise SlideError(
                    f"{where} feature {i}: geometry {geom.get('type')!r} is not supported; export Polygon shapes"
                )
            ring = geom["coordinates"][0]
            label = (props.get("classification") or {}).get("name") or props.get("name") or props.get("label")
            out.append(
                Annotation(
                    str(label or "lesion"), _as_polygon({"polygon": ring[:-1]}, f"{where} feature {i}")
                )
            )
        return out
    if not isinstance(data, list):
        raise SlideError(f"{where}: expected a list of {{label, box|polygon}} or a GeoJSON FeatureCollection")
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise SlideError(f"{where} item {i}: expected an object with 'label' and 'box' or 'polygon'")
        out.append(Annotation(str(item.get("label", "lesion")), _as_polygon(item, f"{where} item {i}")))
    return out


def clip_polygon(poly: Sequence[Point], x0: float, y0: float, x1: float, y1: float) -> list[Point]:
    """The part of ``poly`` inside the rectangle (Sutherland-Hodgman; a convex clip window keeps it exact)."""
    pts = list(poly)
    for inside, cross in (
        (lambda p: p[0] >= x0, lambda a, b: (x0, a[1] + (b[1] - a[1]) * (x0 - a[0]) / (b[0] - a[0]))),
        (lambda p: p[0] <= x1, lambda a, b: (x1, a[1] + (b[1] - a[1]) * (x1 - a[0]) / (b[0] - a[0]))),
        (lambda p: p[1] >= y0, lambda a, b: (a[0] + (b[0] - a[0]) * (y0 - a[1]) / (b[1] - a[1]), y0)),
        (lambda p: p[1] <= y1, lambda a, b: (a[0] + (b[0] - a[0]) * (y1 - a[1]) / (b[1] - a[1]), y1)),
    ):
        if not pts:
            break
        kept = []
        for a, b in zip(pts, pts[1:] + pts[:1]):
            if inside(b):
                if not inside(a):
                    kept.append(cross(a, b))
                kept.append(b)
            elif inside(a):
                kept.append(cross(a, b))
        pts = kept
    return pts


def polygon_area(poly: Sequence[Point]) -> float:
    return 0.5 * abs(sum(a[0] * b[1] - b[0] * a[1] for a, b in zip(poly, list(poly[1:]) + list(poly[:1]))))


def _level_for(slide: Slide, level: int | None, downsample: float | None) -> tuple[int, float]:
    """(pyramid level to read, level-0 pixels per output pixel)."""
    if (level is None) == (downsample is None):
        raise SlideError(
            "give exactly one of level= (a pyramid level) or downsample= (level-0 pixels per pixel)"
        )
    if level is not None:
        if not 0 <= level < slide.level_count:
            raise SlideError(
                f"level {level} does not exist: the slide has levels 0..{slide.level_count - 1} with downsamples "
                f"{[round(d, 2) for d in slide.level_downsamples]}"
            )
        return level, float(slide.level_downsamples[level])
    if downsample < 1:
        raise SlideError(f"downsample must be >= 1 (level-0 pixels per tile pixel), got {downsample}")
    return slide.get_best_level_for_downsample(downsample), float(downsample)


def read_tile(slide: Slide, x: int, y: int, size: int, read_level: int, downsample: float) -> Image.Image:
    """The ``size`` x ``size`` RGB tile whose top-left corner is level-0 ``(x, y)``, at ``downsample``: one
    ``read_region`` of the window on ``read_level`` (resized when that level is finer than asked)."""
    level_ds = float(slide.level_downsamples[read_level])
    side = max(1, round(size * downsample / level_ds))
    region = slide.read_region((int(x), int(y)), read_level, (side, side))
    rgb = Image.new("RGB", region.size, (255, 255, 255))  # transparent (outside the scanned area) -> white
    rgb.paste(region, mask=region.getchannel("A") if region.mode == "RGBA" else None)
    return rgb if side == size else rgb.resize((size, size), Image.LANCZOS)


def tissue_fraction(image: Image.Image) -> float:
    """Share of stained pixels: HSV saturation above 0.1 (glass and background are near white or grey)."""
    sat = np.asarray(image.convert("HSV"))[..., 1]
    return float((sat > 25).mean())


def _regions_in(annotations: Sequence[Annotation], x: float, y: float, ds: float, size: int, min_px: float):
    out = []
    for a in annotations:
        local = [((px - x) / ds, (py - y) / ds) for px, py in a.polygon]
        clipped = clip_polygon(local, 0.0, 0.0, float(size), float(size))
        if len(clipped) >= 3 and polygon_area(clipped) >= min_px:
            out.append(Annotation(a.label, clipped))
    return out


def tiles(
    slide: Slide,
    *,
    size: int = 224,
    level: int | None = None,
    downsample: float | None = None,
    stride: int | None = None,
    annotations: Sequence[Annotation] = (),
    min_tissue: float = 0.0,
    min_region_px: float = 16.0,
) -> Iterator[Tile]:
    """Tiles of ``size`` pixels on a grid (``stride`` tile pixels apart, default ``size``) over the whole slide at
    ``level`` or ``downsample``, in row-major order, each with the annotation parts that fall inside it (at least
    ``min_region_px`` tile pixels); tiles with less than ``min_tissue`` stained share are skipped."""
    read_level, ds = _level_for(slide, level, downsample)
    width, height = slide.level_dimensions[0]
    step = (stride or size) * ds  # level-0 pixels between tiles
    span = size * ds
    ny, nx = int((height - span) // step) + 1, int((width - span) // step) + 1
    if nx < 1 or ny < 1:
        raise SlideError(
            f"a {size}-pixel tile at downsample {ds:g} is larger than the {width}x{height} slide"
        )
    for j in range(ny):
        for i in range(nx):
            x, y = round(i * step), round(j * step)
            image = read_tile(slide, x, y, size, read_level, ds)
            if min_tissue and tissue_fraction(image) < min_tissue:
                continue
            yield Tile(image, x, y, read_level, ds, _regions_in(annotations, x, y, ds, size, min_region_px))


def cut_region(
    slide: Slide,
    annotation: Annotation,
    *,
    level: int | None = None,
    downsample: float | None = None,
    margin: float = 0.25,
    max_side: int = 2048,
) -> Tile:
    """A square tile around ``annotation`` (its bounding box grown by ``margin`` of its longer side) with the
    annotation in tile pixels; raises when the tile would exceed ``max_side`` pixels (choose a coarser level)."""
    read_level, ds = _level_for(slide, level, downsample)
    xs, ys = [p[0] for p in annotation.polygon], [p[1] for p in annotation.polygon]
    side0 = max(max(xs) - min(xs), max(ys) - min(ys)) * (1 + 2 * margin)
    size = max(1, math.ceil(side0 / ds))
    if size > max_side:
        raise SlideError(
            f"region {annotation.label!r} spans {size} pixels at downsample {ds:g} (> max_side {max_side}); "
            "cut it at a coarser level or downsample"
        )
    cx, cy = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2
    x, y = round(cx - size * ds / 2), round(cy - size * ds / 2)
    image = read_tile(slide, x, y, size, read_level, ds)
    return Tile(image, x, y, read_level, ds, _regions_in([annotation], x, y, ds, size, 0.0))


def write_records(
    slide_path: str | Path,
    annotations: Sequence[Annotation],
    out: str | Path,
    *,
    size: int = 224,
    level: int | None = None,
    downsample: float | None = None,
    min_tissue: float = 0.2,
    prefix: str | None = None,
) -> Path:
    """Tile a slide into ``out`` (JSONL) and ``images/`` beside it: a presence question per tile (yes when a region
    reaches it) and a box question (the label, and the region's bounding box) per tile a region reaches.

    Presence answers assume the annotations are exhaustive (every lesion on the slide is annotated)."""
    out = Path(out)
    (out.parent / "images").mkdir(parents=True, exist_ok=True)
    slide = open_slide(slide_path)
    stem = prefix or Path(slide_path).stem
    lines = []
    for t in tiles(
        slide, size=size, level=level, downsample=downsample, annotations=annotations, min_tissue=min_tissue
    ):
        tid = f"{stem}-x{t.x}-y{t.y}-d{t.downsample:g}"
        image = f"images/{tid}.png"
        t.image.save(out.parent / image)
        meta = {"slide": str(slide_path), "x": t.x, "y": t.y, "level": t.level, "downsample": t.downsample}
        lines.append(
            {
                "id": f"{tid}-presence",
                "prompt": prompt_text(QUESTIONS["presence"]),
                "images": [image],
                "answer": "yes" if t.regions else "no",
                "metadata": meta | {"kind": "presence", "question_type": "yes_no"},
            }
        )
        if t.regions:
            biggest = max(t.regions, key=lambda r: polygon_area(r.polygon))
            xs, ys = [p[0] for p in biggest.polygon], [p[1] for p in biggest.polygon]
            box = [math.floor(min(xs)), math.floor(min(ys)), math.ceil(max(xs)), math.ceil(max(ys))]
            lines.append(
                {
                    "id": f"{tid}-box",
                    "prompt": prompt_text(QUESTIONS["box"], "box"),
                    "images": [image],
                    "answer": biggest.label,
                    "metadata": meta | {"kind": "box", "question_type": "open", "region": box},
                }
            )
    slide.close()
    if not lines:
        raise SlideError(f"{slide_path}: no tile has {min_tissue:.0%} tissue; lower min_tissue")
    out.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return out
