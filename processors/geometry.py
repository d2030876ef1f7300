"""Qwen2-VL/2.5-VL image geometry: the resize rule and exact coordinate mapping.

``smart_resize`` follows the rule used by Qwen's image processor and qwen-vl-utils: both sides become multiples of
``factor`` (patch size 14 x spatial merge 2 = 28), the pixel count is kept within ``[min_pixels, max_pixels]``, and the
aspect ratio is preserved as closely as the rounding allows. A model that sees the resized image answers in resized
pixel coordinates; GUI rewards map those back with :func:`model_to_original`. The mapping is a per-axis scale
(``orig / model``) because the resize is a per-axis stretch, not a letterbox.
"""

from __future__ import annotations

import math

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
