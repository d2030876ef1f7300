"""Qwen2-VL/2.5-VL image geometry: the resize rule and exact coordinate mapping.

``smart_resize`` follows the rule used by Qwen's image processor and qwen-vl-utils: both sides become multiples of
``factor`` (patch size 14 x spatial merge 2 = 28), the pixel count is kept within ``[min_pixels, max_pixels]``, and the
aspect ratio is preserved as closely as the rounding allows. A model that sees the resized image answers in resized
pixel coordinates; GUI rewards map those back with :func:`model_to_original`. The mapping is a per-axis scale
(``orig / model``) because the resize is a per-axis stretch, not a letterbox.
"""

from __future__ import annotations

import math
from typing import Literal

IMAGE_FACTOR = 28
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 16384 * 28 * 28
MAX_RATIO = 200


class GeometryError(ValueError):
    pass


def smart_resize(
    height: int,
    width: int,
    factor: int = IMAGE_FACTOR,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> tuple[int, int]:
    """Return ``(new_height, new_width)``: multiples of ``factor`` with ``min_pixels <= h*w <= max_pixels``."""
    if height <= 0 or width <= 0:
        raise GeometryError(f"image size must be positive, got {width}x{height}")
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise GeometryError(
            f"aspect ratio {max(height, width) / min(height, width):.0f}:1 of a {width}x{height} image exceeds "
            f"{MAX_RATIO}:1; crop or pad the image"
        )
    if min_pixels > max_pixels:
        raise GeometryError(f"min_pixels {min_pixels} > max_pixels {max_pixels}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def model_to_original(
    x: float, y: float, original_size: tuple[int, int], model_size: tuple[int, int]
) -> tuple[float, float]:
    """Map a point from model-input pixels to original pixels. Sizes are ``(width, height)``."""
    (ow, oh), (mw, mh) = original_size, model_size
    return x * ow / mw, y * oh / mh


def original_to_model(
    x: float, y: float, original_size: tuple[int, int], model_size: tuple[int, int]
) -> tuple[float, float]:
    """Map a point from original pixels to model-input pixels. Sizes are ``(width, height)``."""
    (ow, oh), (mw, mh) = original_size, model_size
    return x * mw / ow, y * mh / oh


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
