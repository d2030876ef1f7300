"""ScreenSpot (Cheng et al., SeeClick, 2024) GUI grounding: does the predicted click land on the element?

Layout: a folder with ``screenspot_mobile.json``, ``screenspot_desktop.json`` and ``screenspot_web.json`` (or any of
them given as the data path; ScreenSpot-v2's ``screenspot_*_v2.json`` too) and the screenshots in
``screenspot_imgs/`` beside them (option ``image_dir`` to change). Each file is a JSON list of ``{img_filename,
instruction, bbox: [x, y, w, h] in original pixels, data_type: text | icon, data_source}``; the platform is the
file's. Item ids are ``<platform>-<index in its file>``.

Scoring: the point the response names (:func:`mmrl.eval.extract.screen_point`: Qwen2.5-VL's ``bbox_2d``/``point_2d``
JSON, UI-R1 action lists, ``(x, y)``, ``[x1, y1, x2, y2]`` -> centre, ...) is mapped to original pixels and is
correct iff ``x <= px <= x + w`` and ``y <= py <= y + h`` (edges included). The mapping is the option ``coords``:

- ``model`` (default): the model's own coordinate frame, as the GUI reward uses it (:mod:`mmrl.model.geometry`:
  ``model.coordinate_frame``, else the frame of the checkpoint's family at ``model.path``, ``absolute`` pixels for
  Qwen2.5-VL, ``normalized_1000`` for Qwen3-VL and Qwen3.5), mapped by :func:`mmrl.processors.geometry.frame_to_original`.
- ``absolute``: pixels of the image the model saw, resized on the checkpoint's own geometry (its processor at
  ``model.path``: a 28 or 32 px grid, or a fixed-size tower) with the run's ``min_pixels``/``max_pixels``; mapped back
  per axis. When scoring a prediction file, pass the model and the budget the predictions were made with; with no
  processor at ``model.path`` the 28 px grid of Qwen2/2.5-VL is assumed.
- ``normalized``: 0-1 fractions of the width and height; ``normalized_1000``: 0-1000 (Qwen2-VL, Qwen3-VL, Qwen3.5,
  CogAgent, many others); ``original``: already original pixels.

Breakdowns: platform x data type (``group``, e.g. ``mobile/icon``, the table SeeClick reports), platform, data type
and data source. A response without a point is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from mmrl.config import opt
from mmrl.eval.base import Benchmark, EvalError, EvalItem, Loaded, Score, register
from mmrl.eval.extract import screen_point
from mmrl.eval.loading import Record, fill, image_size, media, read_records, require, user_turn
from mmrl.model.checkpoint_files import ModelView
from mmrl.processors.geometry import frame_to_original
from mmrl.types import Sample

EDGE_EPS = 1e-6  # pixels: a point on an edge stays on it after the float round trip of the coordinate mapping
_FILE = re.compile(r"screenspot.*?_(mobile|desktop|web)", re.I)
PROMPT = "In this screenshot, where should I click to do this: {instruction}\nAnswer with the click point as (x, y)."


@dataclass
class ScreenSpotOptions:
    coords: Literal["model", "absolute", "normalized", "normalized_1000", "original"] = opt(
        "how the model writes points: model (its family's frame, mmrl.model.geometry), absolute (resized-image pixels, "
        "Qwen2.5-VL), normalized (0-1), normalized_1000 (0-1000, Qwen3-VL, Qwen3.5) or original (original pixels)",
        "model",
    )
    image_dir: str | None = opt(
        "screenshot folder, relative to the data files' folder (None = screenspot_imgs)", None
    )
    prompt: str = opt("the user text, a str.format template over the record's fields", PROMPT)


@register
class ScreenSpot(Benchmark):
    name = "screenspot"
    Options = ScreenSpotOptions
    breakdowns = ("group", "platform", "data_type", "data_source")
    max_new_tokens = 64

    def load(self, path: Path) -> Loaded:
        files = sorted(p for p in path.glob("*.json") if _FILE.match(p.stem)) if path.is_dir() else [path]
        if not files:
            raise EvalError(f"{path}: no screenspot_{{mobile,desktop,web}}.json files in this folder")
        items = []
        for f in files:
            m = _FILE.match(f.stem)
            platform = m.group(1).lower() if m else f.stem
            images = f.parent / (self.opts.image_dir or "screenspot_imgs")
            items += [self._item(rec, i, platform, images) for i, rec in enumerate(read_records(f))]
        return Loaded(items, files)

    def _item(self, rec: Record, index: int, platform: str, images: Path) -> EvalItem:
        require(rec, "img_filename", "instruction", "bbox")
        d = rec.data
        bbox = d["bbox"]
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
            raise EvalError(f"{rec.where}: bbox must be [x, y, w, h] in pixels, got {bbox!r}")
        src = media(d["img_filename"], images, rec)
        data_type = d.get("data_type")
        fields = {
            "platform": platform,
            "data_type": data_type,
            "data_source": d.get("data_source"),
            "group": f"{platform}/{data_type}",
            "instruction": d["instruction"],
            "img_filename": d["img_filename"],
            "bbox": [float(v) for v in bbox],
            "image_size": list(image_size(src)),
        }
        rid = f"{platform}-{index}"
        sample = Sample(rid, user_turn(fill(self.opts.prompt, d, rec.where), n_images=1), [src])
        return EvalItem(rid, sample, fields)

    @cached_property
    def view(self) -> ModelView:
        """How the model saw the screenshots: the checkpoint at ``model.path`` (its geometry and its family's frame)
        under the run's budget; no checkpoint there means Qwen2/2.5-VL's 28 px grid (:class:`ModelView`)."""
        return ModelView.of_model(self.model)

    @cached_property
    def frame(self) -> str:
        """The :mod:`mmrl.model.geometry` frame the option ``coords`` names (``normalized`` is mapped on its own)."""
        if self.opts.coords == "model":
            return self.view.frame
        return {"absolute": "model_pixels", "normalized_1000": "relative_1000"}.get(
            self.opts.coords, "original_pixels"
        )

    def to_original(self, item: EvalItem, x: float, y: float) -> tuple[float, float]:
        w, h = item.fields["image_size"]
        if self.opts.coords == "normalized":
            return x * w, y * h
        model = self.view.model_size(w, h) if self.frame == "model_pixels" else (w, h)
        return frame_to_original(x, y, self.frame, (w, h), model)

    def extract(self, item: EvalItem, response: str) -> Any:
        point = screen_point(response)
        return None if point is None else [point[0], point[1]]

    def judge(self, item: EvalItem, extracted: Any) -> Score:
        if not (isinstance(extracted, (list, tuple)) and len(extracted) == 2):
            return Score(extracted, False)
        px, py = self.to_original(item, float(extracted[0]), float(extracted[1]))
        x, y, w, h = item.fields["bbox"]
        inside = x - EDGE_EPS <= px <= x + w + EDGE_EPS and y - EDGE_EPS <= py <= y + h + EDGE_EPS
        return Score(extracted, inside, normalized=[px, py])
