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
* **Processor-owned geometry** (tiling processors: Gemma 3 pan-and-scan, Idefics3/SmolVLM2 image splitting,
  LLaVA-OneVision anyres, InternVL dynamic tiles, Llama 4 tiles; and any processor whose resize mmrl does not model,
  such as Gemma 4's resize to a soft-token budget): mmrl hands the processor the original image and lets it resize and
  tile as the model was trained, with its own settings (``max_patches``, ``size``, ``max_soft_tokens``...; the run's
  ``model.min_pixels``/``max_pixels`` do not apply). The number of vision tokens is then the processor's by
  construction, for both engines (vLLM runs the same HF processor on the same image), and
  ``EncodedPrompt.model_image_sizes`` is the size of the image the processor got (the original): the ``model_pixels``
  frame of such a family is the original image's pixels. Videos of a video processor without patch merging
  (LLaVA-OneVision, SmolVLM2, InternVL) are likewise resized by the processor: mmrl selects the frames and bounds
  their pixels by ``model.video_max_pixels``.

Every geometry number used here is in the processor config. What no config says is in a small table keyed by the
checkpoint's ``model_type``: the **coordinate frame** a family writes points and boxes in (:data:`COORDINATE_FRAMES`),
which grounding rewards and scorers map to original-image pixels with :func:`frame_to_original`:

* ``model_pixels``: absolute pixels of the resized image the model saw (Qwen2.5-VL: its technical report grounds in
  the input image's actual pixel coordinates rather than relative ones);
* ``relative_1000``: 0-1000 of the image's width and height, the same fraction of the original as of the model-input
  image since the resize is a per-axis stretch (Qwen2-VL's ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>`` in
  [0, 1000); Qwen3-VL and Qwen3.5: relative coordinates on a 0-1000 scale, per their model cards and cookbooks;
  GLM-4.1V and GLM-4.5V: 0-1000 of the image's width and height, top-left origin, per zai-org's GLM-V grounding
  documentation; InternVL: ``<box>[[x1, y1, x2, y2]]</box>`` normalised to 0-1000, per InternVL's documentation);
* ``relative_1``: fractions 0-1 of the width and height: LLaVA-1.5's box format (``[x1, y1, x2, y2]`` with 3
  decimals), which LLaVA-OneVision's grounding data inherits; OneVision's own release does not restate it, so this is
  an assumption that ``model.coordinate_frame`` overrides;
* ``original_pixels``: pixels of the original image (a data set whose prompts say so; only by override).

Gemma 3, Gemma 4, Mistral 3, Llama 4, Idefics3 and SmolVLM2 releases document no grounding output format, so they and every
family missing from the table take ``model_pixels``: an assumption, which ``model.coordinate_frame`` overrides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PIL import Image

from mmrl.processors.errors import MediaError
from mmrl.processors.geometry import GeometryError, smart_resize
from mmrl.processors.image import ImageGeometry, prepare_image, to_rgb

if TYPE_CHECKING:  # torch is imported where it is used: `mmrl train` checks a config before loading it
    pass

# processor attributes that switch on multi-view tiling: the processor then owns the geometry (module docstring)
TILING_ATTRS = ("do_pan_and_scan", "do_image_splitting", "image_grid_pinpoints", "crop_to_patches")


@dataclass(frozen=True)
class VisionGeometry:
    """How one checkpoint turns an image (and a video frame) into model-input pixels.

    ``factor``: model-input sides are multiples of it (patch x merge); ``fixed_size``: ``(width, height)`` of a
    fixed-size tower (then neither ``factor`` nor a pixel budget applies); ``min_pixels``/``max_pixels``:
    the processor's own budget; ``resample``: the PIL filter of the processor's resize; ``video_factor`` and
    ``temporal_patch``: the video processor's side multiple and frames per temporal patch (None when the
    checkpoint's processor takes no video). ``tiling``: the processor setting that makes it tile (or ``"resize"``
    for a resize mmrl does not model), when the processor owns the image geometry (then the image is handed over
    as it is); ``video_resizes``: the video processor resizes frames itself (no patch merging to align to);
    ``max_side``: the longest side the processor lets through unresized (Pixtral's ``size.longest_edge``: vLLM's
    Pixtral processor resizes anything longer even when told not to, so mmrl keeps images within it)."""

    factor: int
    fixed_size: tuple[int, int] | None
    min_pixels: int | None
    max_pixels: int | None
    resample: Image.Resampling
    video_factor: int | None
    temporal_patch: int | None
    tiling: str | None = None
    video_resizes: bool = False
    max_side: int | None = None

    @property
    def processor_resizes(self) -> bool:
        """Whether the processor resizes (and tiles) images itself (module docstring)."""
        return self.tiling is not None

    def model_size(
        self, width: int, height: int, min_pixels: int | None = None, max_pixels: int | None = None
    ) -> tuple[int, int]:
        """``(width, height)`` the model sees for a ``width x height`` image under the given (else the
        processor's) pixel budget; the image as it is when the processor owns the geometry."""
        if self.processor_resizes:
            return width, height
        if self.fixed_size is not None:
            return self.fixed_size
        lo = self.min_pixels if min_pixels is None else min_pixels
        hi = self.max_pixels if max_pixels is None else max_pixels
        h, w = smart_resize(height, width, factor=self.factor, min_pixels=lo, max_pixels=hi)
        if self.max_side is not None and max(h, w) > self.max_side:
            # a longest-side cap (Pixtral) wins over the budget: scale to fit it, then floor to the grid
            scale = self.max_side / max(height, width)
            h = max(self.factor, math.floor(height * scale / self.factor) * self.factor)
            w = max(self.factor, math.floor(width * scale / self.factor) * self.factor)
        return w, h

    def prepare_image(
        self, img: Image.Image, *, min_pixels: int, max_pixels: int, record_id: str = "?"
    ) -> tuple[Image.Image, ImageGeometry]:
        """:func:`mmrl.processors.image.prepare_image` with this checkpoint's factor, fixed size and filter; the
        RGB image unresized when the processor owns the geometry."""
        if self.processor_resizes:
            rgb = img if img.mode == "RGB" else to_rgb(img, record_id=record_id)
            return rgb, ImageGeometry(original_size=img.size, model_size=img.size)
        if self.max_side is not None:
            try:
                fixed = self.model_size(*img.size, min_pixels=min_pixels, max_pixels=max_pixels)
            except GeometryError as e:
                raise MediaError(record_id, f"image cannot be resized for the model: {e}") from e
            return prepare_image(img, fixed_size=fixed, resample=self.resample, record_id=record_id)
        return prepare_image(
            img,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            factor=self.factor,
            fixed_size=self.fixed_size,
            resample=self.resample,
            record_id=record_id,
        )

    def processor_kwargs(self) -> dict[str, dict[str, Any]]:
        """What the policy and the vLLM engine pass the HF processor besides the media: no resize of what mmrl
        has already resized, and no frame sampling (mmrl selects the frames)."""
        images = {} if self.processor_resizes else {"do_resize": False}
        videos: dict[str, Any] = {"do_sample_frames": False}
        if not self.video_resizes:
            videos["do_resize"] = False
        return {"images_kwargs": images, "videos_kwargs": videos}


def vision_geometry(processor: Any) -> VisionGeometry:
    """Read :class:`VisionGeometry` from a loaded HF processor (``AutoProcessor.from_pretrained``)."""
    ip = processor.image_processor
    size = dict(getattr(ip, "size", None) or {})
    patch = _int_attr(ip, "patch_size")
    # Pixtral (Mistral 3) keeps the merge on the processor
    merge = _int_attr(ip, "merge_size") or _int_attr(processor, "spatial_merge_size")
    resample = Image.Resampling(int(getattr(ip, "resample", None) or Image.Resampling.BICUBIC))
    video_factor, temporal, video_resizes = _video(getattr(processor, "video_processor", None))
    common = dict(
        resample=resample, video_factor=video_factor, temporal_patch=temporal, video_resizes=video_resizes
    )
    tiling = _tiling(processor, ip)
    if tiling is None and patch and merge:
        # Qwen's size bounds are pixel counts (shortest_edge and longest_edge); Pixtral's longest_edge is a side
        pixels = "shortest_edge" in size or "longest_edge" not in size
        return VisionGeometry(
            factor=patch * merge,
            fixed_size=None,
            min_pixels=size.get("shortest_edge", getattr(ip, "min_pixels", None)) if pixels else None,
            max_pixels=size.get("longest_edge", getattr(ip, "max_pixels", None)) if pixels else None,
            max_side=None if pixels else int(size["longest_edge"]),
            **common,
        )
    if tiling is None and set(size) == {"height", "width"}:
        return VisionGeometry(
            factor=patch or 1,
            fixed_size=(int(size["width"]), int(size["height"])),
            min_pixels=None,
            max_pixels=None,
            **common,
        )
    return VisionGeometry(
        factor=1, fixed_size=None, min_pixels=None, max_pixels=None, tiling=tiling or "resize", **common
    )


def _tiling(processor: Any, ip: Any) -> str | None:
    """The image processor setting that makes a processor call tile an image into several views, or None. A
    processor's own call defaults win over its image processor's settings (Gemma3Processor passes
    ``do_pan_and_scan=False`` unless a call asks), as in transformers' ``ProcessorMixin._merge_kwargs``."""
    defaults = _call_defaults(processor).get("images_kwargs", {})
    for attr in TILING_ATTRS:
        if defaults.get(attr, getattr(ip, attr, None)):
            return attr
    # Llama 4 always tiles up to max_patches; GotOcr2 (InternVL) only with crop_to_patches, checked above
    if not hasattr(ip, "crop_to_patches") and (_int_attr(ip, "max_patches") or 0) > 1:
        return "max_patches"
    return None


def _call_defaults(processor: Any) -> dict[str, dict[str, Any]]:
    """What a processor call passes its image and video processors unless told otherwise: the processor's
    ``images_kwargs``/``videos_kwargs`` attributes (transformers >= 5.23), over the ``_defaults`` of its kwargs class
    (``<Processor>Kwargs`` in its module, earlier versions)."""
    import sys
    import warnings

    module = sys.modules.get(type(processor).__module__)
    with warnings.catch_warnings():  # transformers >= 5.23 deprecates the kwargs classes it keeps as aliases
        warnings.simplefilter("ignore", FutureWarning)
        kwargs_cls = getattr(module, f"{type(processor).__name__}Kwargs", None)
    out = {
        k: dict(v) for k, v in (getattr(kwargs_cls, "_defaults", None) or {}).items() if isinstance(v, dict)
    }
    for modality in ("images_kwargs", "videos_kwargs"):
        attr = getattr(type(processor), modality, None)
        if isinstance(attr, dict):
            out.setdefault(modality, {}).update(attr)
    return out


def _int_attr(obj: Any, name: str) -> int | None:
    v = getattr(obj, name, None)
    if isinstance(v, dict) and v.get("height") == v.get("width"):  # Pixtral: patch_size {height, width}
        v = v.get("height")
    return int(v) if isinstance(v, int) and v > 0 else None


def _video(vp: Any) -> tuple[int | None, int | None, bool]:
    """The video processor's side multiple, temporal patch and whether it resizes frames itself; ``(None, None,
    False)`` when there is no video processor."""
    if vp is None:
        return None, None, False
    patch, merge = _int_attr(vp, "patch_size"), _int_attr(vp, "merge_size")
    if not (patch and merge):
        return 1, 1, True
    return patch * merge, _int_attr(vp, "temporal_patch_size") or 1, False
