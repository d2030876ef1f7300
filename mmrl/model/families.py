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

import json
import math
from dataclasses import asdict, dataclass, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from PIL import Image

from mmrl.processors.errors import MediaError
from mmrl.processors.geometry import GeometryError, model_to_original, original_to_model, smart_resize
from mmrl.processors.image import ImageGeometry, prepare_image, to_rgb

if TYPE_CHECKING:  # torch is imported where it is used: `mmrl train` checks a config before loading it
    import torch

# processor attributes that switch on multi-view tiling: the processor then owns the geometry (module docstring)
TILING_ATTRS = ("do_pan_and_scan", "do_image_splitting", "image_grid_pinpoints", "crop_to_patches")


CoordinateFrame = Literal["model_pixels", "relative_1000", "relative_1", "original_pixels"]
FRAMES: tuple[str, ...] = ("model_pixels", "relative_1000", "relative_1", "original_pixels")
RELATIVE_SCALE = 1000.0
# the scale of each relative frame: a coordinate is this fraction-times-scale of the image's width or height
RELATIVE = {"relative_1000": RELATIVE_SCALE, "relative_1": 1.0}
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
    "glm4v": "relative_1000",
    "glm4v_moe": "relative_1000",
    "internvl": "relative_1000",
    "llava_onevision": "relative_1",
}


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
    if frame in RELATIVE:
        return x * original_size[0] / RELATIVE[frame], y * original_size[1] / RELATIVE[frame]
    if frame == "original_pixels":
        return float(x), float(y)
    raise ValueError(f"unknown coordinate frame {frame!r} (one of {', '.join(FRAMES)})")


def original_to_frame(
    x: float, y: float, frame: str, original_size: tuple[int, int], model_size: tuple[int, int]
) -> tuple[float, float]:
    """The inverse of :func:`frame_to_original`: original-image pixels as a point in ``frame``."""
    if frame == "model_pixels":
        return original_to_model(x, y, original_size, model_size)
    if frame in RELATIVE:
        return x * RELATIVE[frame] / original_size[0], y * RELATIVE[frame] / original_size[1]
    if frame == "original_pixels":
        return float(x), float(y)
    raise ValueError(f"unknown coordinate frame {frame!r} (one of {', '.join(FRAMES)})")


def _checkpoint_file(path: str, name: str) -> Path | None:
    """``name`` in the checkpoint at ``path``: a local folder, else a hub id's copy in the local HF cache (never the
    network); None when it is in neither."""
    from mmrl.model.policy import resolve_model_path

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
    the model's path but holds no :class:`~mmrl.model.policy.Policy` (scorers, reports, data builders); None when no
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


# ---------------------------------------------------------------------------------------------- language model
def language_model_prefix(model: Any) -> str:
    """The module name of the text decoder inside an HF VLM (``model.language_model``, Idefics3's
    ``model.text_model``, ...): the module ``get_decoder()`` returns, else the first ``language_model`` or
    ``text_model``. Everything outside it but the output head is the vision side (tower and projector)."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    names = dict(model.named_modules())
    for name, module in names.items():
        if name and module is decoder:
            return name
    for name in names:
        if name.rsplit(".", 1)[-1] in ("language_model", "text_model"):
            return name
    raise ValueError(
        f"cannot find the language model inside {type(model).__name__}: no get_decoder() and no module named "
        "language_model or text_model; set model.lora.target_modules explicitly"
    )


def is_vision_param(name: str, decoder: str) -> bool:
    """Whether parameter ``name`` belongs to the vision side: neither the text decoder nor the output head."""
    return not (name.startswith(f"{decoder}.") or name.split(".")[0] == "lm_head")


def lora_targets(linears: list[str], decoder: str, vision: bool = False) -> list[str]:
    """peft's ``target_modules`` for the default LoRA set, as whole module names (a list: peft 0.21 reads a leaf
    name such as ``down_proj`` in a regex as a fused-expert parameter too, and would adapt the experts): every
    ``Linear`` of the text decoder by its leaf name (attention, MLP, fused projections such as GLM-4V's
    ``gate_up_proj``, Qwen3.5's linear-attention ``in_proj_qkv``/``in_proj_z``/``in_proj_b``/``in_proj_a``/
    ``out_proj``, shared experts and their ``shared_expert_gate``), and with ``vision`` every ``Linear`` of the
    vision tower and projector too. Fused MoE expert weights are 3-D parameters, not ``Linear`` modules: they stay
    frozen, and ``model.lora.experts`` is refused (:func:`mmrl.model.lora.lora_config`)."""
    text = [n for n in linears if n.startswith(f"{decoder}.")]
    if not text:
        raise ValueError(f"no Linear layer under {decoder}: set model.lora.target_modules explicitly")
    return text + ([n for n in linears if is_vision_param(n, decoder)] if vision else [])


def expert_params(model: Any) -> list[str]:
    """Fused MoE expert weights (3-D parameters under an ``experts`` module) of the model."""
    return [n for n, p in model.named_parameters() if p.dim() == 3 and ".experts." in f".{n}"]


def release_transposes(model: Any) -> list[tuple[str, int, int]]:
    """``(pattern, dim0, dim1)`` of weights whose released layout is the in-memory one transposed, read from
    transformers' conversion mapping: its shape-checked ``Transpose`` converters (Qwen3-VL-MoE's fused experts:
    ``gate_up_proj`` and ``down_proj`` are stored [experts, in, out] at release, [experts, out, in] in memory).
    transformers' own ``save_pretrained`` never transposes them back (the check compares a tensor with the model's
    own parameter, which always matches), so its saves are not in the release layout, while vLLM reads only that."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import Transpose, WeightConverter
    except ImportError:  # a transformers without conversion mappings
        return []
    out = []
    for conv in get_model_conversion_mapping(model, add_legacy=False):
        ops = getattr(conv, "operations", None) or []
        if not isinstance(conv, WeightConverter) or not ops:
            continue
        if (
            all(isinstance(op, Transpose) and getattr(op, "check_dims", False) for op in ops)
            and len(ops) == 1
        ):
            out += [(str(p), ops[0].dim0, ops[0].dim1) for p in conv.target_patterns]
    return out


def media_blocks(model: Any, processor: Any = None) -> tuple[str, tuple[int, ...], frozenset[str]] | None:
    """Where media tokens attend to each other both ways (within one image or video's run of tokens), as the model's
    own masks make them: ``(key, values, layer types)``: the per-token input naming media tokens, the values that mark
    them, and the layer types whose mask gets the two-way blocks. Read from the checkpoint, as transformers' masks do:

    - the processor emits ``token_type_ids`` (Gemma 3: 1 marks image tokens): every layer, full and sliding;
    - ``use_bidirectional_attention: vision`` (Gemma 4: ``mm_token_type_ids`` 1 or 2, image or video tokens):
      sliding-window layers only, global layers stay causal.

    None where attention is causal everywhere."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    names = getattr(processor, "model_input_names", None) or []
    if any(getattr(c, "use_bidirectional_attention", None) == "vision" for c in (config, text)):
        return "mm_token_type_ids", (1, 2), frozenset({"sliding_attention"})
    if "token_type_ids" in names:
        return "token_type_ids", (1,), frozenset({"full_attention", "sliding_attention"})
    return None


def packing_support(model: Any, processor: Any = None, attn: str | None = None) -> tuple[bool, str]:
    """Whether a micro-batch of this model can be scored as one packed row (:func:`mmrl.model.packing.packed_hidden`)
    with the padded path's log-probs, and if not why. Read from the checkpoint, never from a family's name:

    - linear-attention layers (``layer_types`` holding ``linear_attention``: Qwen3.5's Gated-DeltaNet) pack with
      :mod:`mmrl.model.linear_attention`'s convolution and recurrence, which restart at each sequence (transformers' own
      torch path refuses packed rows, and its convolution would run across the boundary even with ``fla``);
    - media tokens that attend to each other both ways (:func:`media_blocks`: Gemma 3, Gemma 4) pack under
      ``mmrl_sdpa``, which builds each sequence's own mask with those blocks (:mod:`mmrl.model.attention`); not under
      flash-attention (``attn``), whose kernels are causal only; ``use_bidirectional_attention: all`` (no causal
      mask at all) never;
    - everything else (1-D RoPE, multimodal RoPE with ``get_rope_index``) packs exactly (tests/test_packing.py)."""
    from mmrl.model.linear_attention import packable

    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if "linear_attention" in (getattr(text, "layer_types", None) or []):
        ok, why = packable(model)
        if not ok:
            return False, why
    if any(getattr(c, "use_bidirectional_attention", None) in (True, "all") for c in (config, text)):
        return (
            False,
            "bidirectional attention over the whole sequence: a packed row has no causal order to keep",
        )
    if media_blocks(model, processor) and (attn or "").startswith("flash_attention"):
        return (
            False,
            "bidirectional media attention: flash-attention's kernels are causal only; "
            "model.attn_implementation: mmrl_sdpa packs it",
        )
    return True, ""


def rope_positions(
    model: Any, row: torch.Tensor, mm: dict[str, torch.Tensor], seq: dict[str, torch.Tensor]
) -> torch.Tensor | None:
    """A multimodal-RoPE model's positions ``[k, L]`` of one sequence alone (its own image/video grids), as the
    model computes them for that sequence in a padded batch; None for a model with plain 1-D positions."""
    import torch

    backbone = getattr(model, "model", None)
    rope_index = getattr(backbone, "get_rope_index", None)
    if rope_index is None:
        return None
    L = len(row)
    grids = {k: mm[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in mm}
    types = seq.get("mm_token_type_ids")
    if not any(k in grids for k in ("image_grid_thw", "video_grid_thw")) or types is None:
        return torch.arange(L).expand(3, L)
    dev = next(model.parameters()).device
    pos, _ = rope_index(
        input_ids=row[None].to(dev),
        mm_token_type_ids=types[None].to(dev),
        attention_mask=torch.ones((1, L), dtype=torch.long, device=dev),
        **{k: v.to(dev) for k, v in grids.items()},
    )
    return pos[:, 0].cpu()


def encoder_calls(model: Any) -> dict[str, tuple[str, Any, set[str]]]:
    """``modality -> (pixel input name, the backbone's feature function, the input names it takes)`` for a model whose
    forward takes precomputed vision features (transformers' ``mm_encoder_outputs``); empty otherwise."""
    import inspect

    backbone = getattr(model, "model", None) or model  # Llama 4 has no multimodal backbone: the model itself
    forward = getattr(backbone, "forward", None)
    if forward is None or "mm_encoder_outputs" not in inspect.signature(forward).parameters:
        return {}
    out = {}
    for modality, pixels, name in (
        ("image", "pixel_values", "get_image_features"),
        ("video", "pixel_values_videos", "get_video_features"),
    ):
        fn = getattr(backbone, name, None)
        if fn is not None:
            out[modality] = (pixels, fn, set(inspect.signature(fn).parameters))
    return out


def concat_encoder_outputs(outputs: list[Any]) -> Any:
    """Vision encoder outputs of several prompts as one batch's, for the fields a forward reads from
    ``mm_encoder_outputs``: ``pooler_output`` (a tensor over images or tiles: concatenated; a tuple of per-image
    features: joined), DeepStack's per-layer ``deepstack_features`` (joined layer by layer) and, where there is no
    pooled output (Llama 4), ``last_hidden_state``. The other fields (per-layer hidden states) are left out."""
    import torch

    def join(values: list[Any]) -> Any:
        if isinstance(values[0], torch.Tensor):
            return torch.cat(values, dim=0)
        return type(values[0])(x for v in values for x in v)

    first = outputs[0]
    keep = ["pooler_output", "deepstack_features"]
    if first.get("pooler_output") is None:
        keep.append("last_hidden_state")
    merged = {}
    for key in keep:
        values = [o.get(key) for o in outputs]
        if values[0] is None:
            continue
        if key == "deepstack_features":
            merged[key] = [join(list(layer)) for layer in zip(*values)]
        else:
            merged[key] = join(values)
    return type(first)(**merged)


# the inputs that hold one row per item of a vision encoder's output (an image, a video), where the pixel input's
# dim 0 counts something else (Qwen's patches, Gemma 4's video frames)
ITEM_SIZE_INPUTS = ("image_grid_thw", "video_grid_thw", "image_sizes", "num_frames_per_video")


def encoder_items(mm: dict[str, torch.Tensor], pixels: str, takes: set[str]) -> int:
    """How many items one prompt's media ``mm`` make along dim 0 of the vision encoder's output, for the feature
    function that takes ``pixels`` and the inputs ``takes`` (:func:`encoder_calls`): the rows of the per-item size
    input it takes (:data:`ITEM_SIZE_INPUTS`: grids of Qwen and GLM, image sizes of Mistral 3 and LLaVA-OneVision,
    Gemma 4's frames per video; only its own: a prompt with images and videos has a grid of each), else the pixel
    input's dim 0 (images of Gemma 3 and 4 and LLaVA-OneVision's videos, tiles of InternVL and Llama 4, Idefics3's one
    row of tiles per prompt)."""
    size = next((k for k in ITEM_SIZE_INPUTS if k in takes and k in mm), pixels)
    return int(mm[size].shape[0])


def encoder_tiles(mm: dict[str, torch.Tensor], pixels: str) -> int | None:
    """For a prompt whose pixel input stacks tiles per row (``[rows, tiles, C, H, W]``: Idefics3, SmolVLM2), the tiles
    that are not all zero: the feature function drops the all-zero padding tiles, and transformers before 5.23 returns
    one tensor over the real tiles rather than one entry per row; None for other inputs."""
    x = mm[pixels]
    return int((x.flatten(2) != 0).any(-1).sum()) if x.dim() == 5 else None


def split_encoder_outputs(output: Any, counts: list[int], name: str) -> list[Any]:
    """One vision encoder output of several prompts' media, encoded as one batch, split back into each prompt's: the
    inverse of :func:`concat_encoder_outputs`, for the same fields. ``counts`` are the prompts' items in order
    (:func:`encoder_items`). A field over items (a tuple or list of per-item tensors, or a tensor whose dim 0 is the
    items) is cut into runs of ``counts``; a DeepStack layer is cut likewise when it holds the same items, or by the
    prompts' tokens (their items' lengths in ``pooler_output``) when it is one tensor over all items' tokens. The
    pieces are slices of the one encoding, so gradients flow back into it. Raises, naming ``name`` (the family and
    modality) and the field, where a field does not hold the items the inputs say."""
    import torch

    def runs(sizes: list[int]) -> list[slice]:
        ends = torch.tensor(sizes, dtype=torch.long).cumsum(0).tolist()
        return [slice(e - n, e) for n, e in zip(sizes, ends)]

    def cut(value: Any, sizes: list[int], field: str) -> list[Any]:
        if isinstance(value, torch.Tensor) and value.dim() and len(value) == sum(sizes):
            return list(torch.split(value, sizes))
        if isinstance(value, (list, tuple)) and len(value) == sum(sizes):
            return [type(value)(value[r]) for r in runs(sizes)]
        held = f"a {type(value).__name__}"
        if isinstance(value, torch.Tensor):
            held = f"a tensor of shape {tuple(value.shape)}"
        elif isinstance(value, (list, tuple)):
            held += f" of {len(value)}"
        raise ValueError(
            f"{name}: cannot split the vision encoder's {field} ({held}) into the prompts' items {sizes} "
            f"(sum {sum(sizes)}): a layout mmrl.model.families.split_encoder_outputs does not know"
        )

    keep = ["pooler_output", "deepstack_features"]
    if output.get("pooler_output") is None:
        keep.append("last_hidden_state")
    parts: list[dict[str, Any]] = [{} for _ in counts]
    for key in keep:
        value = output.get(key)
        if value is None:
            continue
        if key == "deepstack_features":
            pooled = output.get("pooler_output")
            layers = []
            for i, layer in enumerate(value):
                sizes = counts
                if isinstance(layer, torch.Tensor) and isinstance(pooled, (list, tuple)):  # over all tokens
                    sizes = [sum(len(t) for t in pooled[r]) for r in runs(counts)]
                layers.append(cut(layer, sizes, f"{key}[{i}]"))
            pieces = [list(layer_pieces) for layer_pieces in zip(*layers)] if layers else [[] for _ in counts]
        else:
            pieces = cut(value, counts, key)
        for part, piece in zip(parts, pieces):
            part[key] = piece
    if not parts or not parts[0]:
        raise ValueError(f"{name}: the vision encoder's output holds none of {keep}; nothing to split")
    return [type(output)(**part) for part in parts]
