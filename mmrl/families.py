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

Every number used here is in the processor config, so there is no per-family table yet; what no config says (such
as the coordinate frame a family answers in) belongs in one here, keyed by ``model_type``, when it is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image

from mmrl.processors.geometry import smart_resize
from mmrl.processors.image import ImageGeometry, prepare_image

# processor attributes that switch on multi-view tiling, which mmrl does not reproduce (see the module docstring)
TILING_ATTRS = ("do_pan_and_scan", "do_image_splitting", "image_grid_pinpoints", "crop_to_patches")


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
