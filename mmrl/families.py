"""What differs between VLM families, read from the checkpoint itself; the policy owns it (:attr:`Policy.geometry`).

Image geometry comes from the checkpoint's own image (and video) processor config, never from the model's name:

* **Dynamic-resolution towers** (Qwen2-VL, Qwen2.5-VL, Qwen3-VL dense and MoE, Qwen3.5 dense and MoE: processors
  with ``patch_size`` and ``merge_size``): model-input sides are multiples of ``patch_size x merge_size`` (28 for
  Qwen2/2.5-VL, 32 for Qwen3-VL and Qwen3.5), found by :func:`mmrl.processors.geometry.smart_resize`. The pixel
  budget is the run's ``model.min_pixels``/``max_pixels`` (as qwen-vl-utils' per-call budget overrides the
  processor's); the processor's own ``size`` bounds are kept in :class:`VisionGeometry` for callers without a run
  config. Videos use the video processor's ``patch_size x merge_size`` and its ``temporal_patch_size`` (frames per
  temporal patch: the frame count is padded to a multiple of it).
* **Fixed-size towers** (Gemma 3's SigLIP: ``size = {height, width}`` and no patch merging): every image becomes
  exactly ``width x height``. mmrl resizes it there itself, with the processor's own resampling filter, and hands
  the processor (``do_resize=False``) the pixels the model will see, rather than letting the processor resize.
  Why: one path for every family and both engines. The policy always gives the HF processor and the vLLM engine the
  same model-size pixels (``EncodedPrompt.images``), so ``EncodedPrompt.model_image_sizes`` is by construction the
  size of what the model saw; and the map between original and model pixels stays the per-axis scale of
  :class:`mmrl.processors.image.ImageGeometry` (the processor's resize is a per-axis stretch too, not a letterbox),
  exact in both directions, which the GUI and pathology rewards rely on.
* **Tiling processors** (Gemma 3 pan-and-scan, Idefics3/SmolVLM image splitting, LLaVA-OneVision anyres, InternVL
  dynamic tiles) are refused with a clear error when their tiling is switched on: one resized view is not the layout
  those models were trained on.

Every geometry number used here is in the processor config. What no config says is in a small table keyed by the
checkpoint's ``model_type``: the **coordinate frame** a family writes points and boxes in (:data:`COORDINATE_FRAMES`),
which grounding rewards and scorers map to original-image pixels with :func:`frame_to_original`:

* ``model_pixels``: absolute pixels of the resized image the model saw (Qwen2.5-VL: its technical report grounds in
  the input image's actual pixel coordinates rather than relative ones);
* ``relative_1000``: 0-1000 of the image's width and height, the same fraction of the original as of the model-input
  image since the resize is a per-axis stretch (Qwen2-VL's ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>`` in
  [0, 1000); Qwen3-VL and Qwen3.5: relative coordinates on a 0-1000 scale, per their model cards and cookbooks);
* ``original_pixels``: pixels of the original image (a data set whose prompts say so; only by override).

Gemma 3's release (model card and technical report) documents no grounding output format, so Gemma 3 and every
family missing from the table take ``model_pixels``: an assumption, which ``model.coordinate_frame`` overrides.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

from PIL import Image

from mmrl.processors.geometry import model_to_original, original_to_model, smart_resize
from mmrl.processors.image import ImageGeometry, prepare_image

# processor attributes that switch on multi-view tiling, which mmrl does not reproduce (see the module docstring)
TILING_ATTRS = ("do_pan_and_scan", "do_image_splitting", "image_grid_pinpoints", "crop_to_patches")


CoordinateFrame = Literal["model_pixels", "relative_1000", "original_pixels"]
FRAMES: tuple[str, ...] = ("model_pixels", "relative_1000", "original_pixels")
RELATIVE_SCALE = 1000.0
# families missing from the table below take this frame (an assumption; see the module docstring)
DEFAULT_FRAME = "model_pixels"
# the frame each family's release answers in, by the checkpoint's config.json ``model_type`` (no config says it)
COORDINATE_FRAMES: dict[str, str] = {
    "qwen2_vl": "relative_1000",
    "qwen2_5_vl": "model_pixels",
    "qwen3_vl": "relative_1000",
    "qwen3_vl_moe": "relative_1000",
    "qwen3_5": "relative_1000",
    "qwen3_5_moe": "relative_1000",
}


class UnsupportedGeometry(ValueError):
    """The checkpoint's processor resizes or tiles images in a way mmrl cannot reproduce exactly."""


@dataclass(frozen=True)
class VisionGeometry:
    """How one checkpoint turns an image (and a video frame) into model-input pixels.

    ``factor``: model-input sides are multiples of it (patch x merge); ``fixed_size``: ``(width, height)`` of a
    fixed-size tower (then neither ``factor`` nor a pixel budget applies); ``min_pixels``/``max_pixels``:
    the processor's own budget; ``resample``: the PIL filter of the processor's resize; ``video_factor`` and
    ``temporal_patch``: the video processor's side multiple and frames per temporal patch (None when the
    checkpoint's processor takes no video)."""

    factor: int
    fixed_size: tuple[int, int] | None
    min_pixels: int | None
    max_pixels: int | None
    resample: Image.Resampling
    video_factor: int | None
    temporal_patch: int | None

    def model_size(
        self, width: int, height: int, min_pixels: int | None = None, max_pixels: int | None = None
    ) -> tuple[int, int]:
        """``(width, height)`` the model sees for a ``width x height`` image under the given (else the
        processor's) pixel budget."""
        if self.fixed_size is not None:
            return self.fixed_size
        h, w = smart_resize(
            height,
            width,
            factor=self.factor,
            min_pixels=self.min_pixels if min_pixels is None else min_pixels,
            max_pixels=self.max_pixels if max_pixels is None else max_pixels,
        )
        return w, h

    def prepare_image(
        self, img: Image.Image, *, min_pixels: int, max_pixels: int, record_id: str = "?"
    ) -> tuple[Image.Image, ImageGeometry]:
        """:func:`mmrl.processors.image.prepare_image` with this checkpoint's factor, fixed size and filter."""
        return prepare_image(
            img,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            factor=self.factor,
            fixed_size=self.fixed_size,
            resample=self.resample,
            record_id=record_id,
        )


def vision_geometry(processor: Any) -> VisionGeometry:
    """Read :class:`VisionGeometry` from a loaded HF processor (``AutoProcessor.from_pretrained``)."""
    ip = processor.image_processor
    name = type(ip).__name__
    tiling = [a for a in TILING_ATTRS if getattr(ip, a, None)]
    if tiling:
        raise UnsupportedGeometry(
            f"{name} tiles images ({', '.join(f'{a}={getattr(ip, a)!r}' for a in tiling)}): mmrl gives the model "
            "one resized view, not the tiles it was trained on; switch the tiling off in the checkpoint's "
            "preprocessor config (or processor_config.json) if the model accepts a single view"
        )
    size = dict(getattr(ip, "size", None) or {})
    patch, merge = _int_attr(ip, "patch_size"), _int_attr(ip, "merge_size")
    resample = Image.Resampling(int(getattr(ip, "resample", None) or Image.Resampling.BICUBIC))
    video_factor, temporal = _video(getattr(processor, "video_processor", None))
    if patch and merge:
        return VisionGeometry(
            factor=patch * merge,
            fixed_size=None,
            min_pixels=size.get("shortest_edge", getattr(ip, "min_pixels", None)),
            max_pixels=size.get("longest_edge", getattr(ip, "max_pixels", None)),
            resample=resample,
            video_factor=video_factor,
            temporal_patch=temporal,
        )
    if "height" in size and "width" in size:
        return VisionGeometry(
            factor=patch or 1,
            fixed_size=(int(size["width"]), int(size["height"])),
            min_pixels=None,
            max_pixels=None,
            resample=resample,
            video_factor=video_factor,
            temporal_patch=temporal,
        )
    raise UnsupportedGeometry(
        f"cannot read the image geometry of {name} (size={size}, patch_size={getattr(ip, 'patch_size', None)!r}, "
        f"merge_size={getattr(ip, 'merge_size', None)!r}): mmrl supports dynamic-resolution processors (patch_size "
        "and merge_size) and fixed-size ones (size with height and width)"
    )


def _int_attr(obj: Any, name: str) -> int | None:
    v = getattr(obj, name, None)
    return int(v) if isinstance(v, int) and v > 0 else None


def _video(vp: Any) -> tuple[int | None, int | None]:
    """The video processor's side multiple and temporal patch, or ``(None, None)`` when there is none mmrl can
    feed (no video processor, or one without patch merging)."""
    patch, merge = (
        (_int_attr(vp, "patch_size"), _int_attr(vp, "merge_size")) if vp is not None else (None, None)
    )
    if not (patch and merge):
        return None, None
    return patch * merge, _int_attr(vp, "temporal_patch_size") or 1


def coordinate_frame(model_type: str | None, override: str | None = None) -> str:
    """The frame a checkpoint of ``model_type`` answers in: ``override`` (``model.coordinate_frame``) when given,
    else :data:`COORDINATE_FRAMES`, else :data:`DEFAULT_FRAME`."""
    if override is not None:
        if override not in FRAMES:
            raise ValueError(f"coordinate frame must be one of {', '.join(FRAMES)}, got {override!r}")
        return override
    return COORDINATE_FRAMES.get(model_type or "", DEFAULT_FRAME)


def frame_to_original(
    x: float, y: float, frame: str, original_size: tuple[int, int], model_size: tuple[int, int]
) -> tuple[float, float]:
    """A point in ``frame`` as original-image pixels; sizes are ``(width, height)`` (``model_size`` is what the
    model saw, used by ``model_pixels`` only)."""
    if frame == "model_pixels":
        return model_to_original(x, y, original_size, model_size)
    if frame == "relative_1000":
        return x * original_size[0] / RELATIVE_SCALE, y * original_size[1] / RELATIVE_SCALE
    if frame == "original_pixels":
        return float(x), float(y)
    raise ValueError(f"unknown coordinate frame {frame!r} (one of {', '.join(FRAMES)})")


def original_to_frame(
    x: float, y: float, frame: str, original_size: tuple[int, int], model_size: tuple[int, int]
) -> tuple[float, float]:
    """The inverse of :func:`frame_to_original`: original-image pixels as a point in ``frame``."""
    if frame == "model_pixels":
        return original_to_model(x, y, original_size, model_size)
    if frame == "relative_1000":
        return x * RELATIVE_SCALE / original_size[0], y * RELATIVE_SCALE / original_size[1]
    if frame == "original_pixels":
        return float(x), float(y)
    raise ValueError(f"unknown coordinate frame {frame!r} (one of {', '.join(FRAMES)})")


def _checkpoint_file(path: str, name: str) -> Path | None:
    """``name`` in the checkpoint at ``path``: a local folder, else a hub id's copy in the local HF cache (never the
    network); None when it is in neither."""
    from mmrl.policy import resolve_model_path

    folder = Path(resolve_model_path(path))
    if folder.is_dir():
        return folder / name if (folder / name).is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(path, name)
    except ValueError:  # not a hub id either
        return None
    return Path(found) if isinstance(found, str) else None


def checkpoint_model_type(path: str) -> str | None:
    """``model_type`` in the checkpoint's config.json (:func:`_checkpoint_file`); None when it is not there."""
    cfg = _checkpoint_file(path, "config.json")
    return json.loads(cfg.read_text()).get("model_type") if cfg is not None else None


@lru_cache(maxsize=8)
def checkpoint_geometry(path: str) -> VisionGeometry | None:
    """:class:`VisionGeometry` of the checkpoint's processor (a local folder or the HF cache), for code that knows
    the model's path but holds no :class:`~mmrl.policy.Policy` (scorers, reports, data builders); None when no
    processor config is there."""
    found = _checkpoint_file(path, "preprocessor_config.json") or _checkpoint_file(
        path, "processor_config.json"
    )
    if found is None:
        return None
    from transformers import AutoProcessor

    return vision_geometry(AutoProcessor.from_pretrained(found.parent, local_files_only=True))


class ModelView(NamedTuple):
    """How a run's model saw an image and writes points in it, rebuilt from the run's model settings, for code that
    holds only the original image (report overlays, scorers, SFT data builders; rollouts.jsonl keeps no sizes).

    ``geometry`` None means no model is known (no checkpoint folder at the path: a prediction file scored on another
    machine, a data builder told only a pixel budget): the 28 px grid of Qwen2/2.5-VL is then assumed, with the
    ``model_pixels`` frame. A bare ``(min_pixels, max_pixels)`` tuple is such a view (:meth:`of`)."""

    min_pixels: int
    max_pixels: int
    geometry: VisionGeometry | None = None
    frame: str = DEFAULT_FRAME

    @classmethod
    def of(cls, view: ModelView | tuple[int, int]) -> ModelView:
        return view if isinstance(view, ModelView) else cls(int(view[0]), int(view[1]))

    @classmethod
    def of_model(cls, model: Any) -> ModelView:
        """From a :class:`~mmrl.config.ModelConfig` or its dict (a run's saved config; missing keys take the
        defaults): the checkpoint at ``path`` gives the geometry and the family's frame."""
        from mmrl.config import ModelConfig

        given = asdict(model) if is_dataclass(model) else dict(model or {})
        m = {
            **asdict(ModelConfig()),
            **{k: v for k, v in given.items() if v is not None or k == "coordinate_frame"},
        }
        path = str(m["path"])
        frame = coordinate_frame(checkpoint_model_type(path), m.get("coordinate_frame"))
        return cls(int(m["min_pixels"]), int(m["max_pixels"]), checkpoint_geometry(path), frame)

    def model_size(self, width: int, height: int) -> tuple[int, int]:
        """``(width, height)`` the model sees for a ``width x height`` image under this budget."""
        if self.geometry is None:  # no model known: Qwen2/2.5-VL's 28 px grid
            h, w = smart_resize(height, width, min_pixels=self.min_pixels, max_pixels=self.max_pixels)
            return w, h
        return self.geometry.model_size(width, height, min_pixels=self.min_pixels, max_pixels=self.max_pixels)

    def metadata(self, width: int, height: int) -> dict[str, Any]:
        """What the collector gives a reward about a ``width x height`` first image (sizes and frame)."""
        return {
            "image_sizes": [[width, height]],
            "model_image_sizes": [list(self.model_size(width, height))],
            "coordinate_frame": self.frame,
        }

    def to_frame(self, x: float, y: float, width: int, height: int) -> tuple[float, float]:
        """Original pixels of a ``width x height`` image as a point in the model's frame."""
        return original_to_frame(x, y, self.frame, (width, height), self.model_size(width, height))
