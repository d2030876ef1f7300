"""Load an image from anything a dataset holds, make it 8-bit RGB, and resize it to a model's input geometry.

:func:`load_image` accepts a path, raw bytes, a base64 string, a ``data:`` URI or a PIL image, applies the EXIF
orientation and converts every PIL mode to 8-bit RGB. It is written here rather than taken from
``qwen_vl_utils.fetch_image`` because that function fetches URLs at run time, never applies EXIF orientation,
clips 16-bit images through PIL's ``convert`` (every value above 255 becomes white), has no per-call
decompression-bomb limit, and raises bare ``ValueError``/``OSError`` that do not say which sample failed.

Departures and choices, each on purpose:

* Transparency is composited onto white (as ``qwen_vl_utils.to_rgb`` does for RGBA), for every mode that carries
  alpha or a ``transparency`` key (LA, PA, palette and RGB/L with a tRNS colour).
* 16-bit modes (``I;16*``) are scaled by 255/65535 with rounding. Mode ``I`` (32-bit int) and ``F`` (float) carry
  no bit depth, so their range is read from the data: values within 0..255 are kept, within 0..65535 (``I``) or
  0..1 (``F``) are scaled to 0..255, anything else is stretched min..max.
* CMYK is converted with PIL's formula; embedded ICC profiles are not applied.
* The pixel limit is checked from the header, before any pixel is decoded, and nothing global in PIL is changed.
  PIL still refuses, on its own, images over ``2 * PIL.Image.MAX_IMAGE_PIXELS`` at open; that is reported with the
  same message.
* Multi-frame files (GIF, APNG, TIFF) give their first frame.

:func:`prepare_image` resizes to the model's grid and returns an :class:`ImageGeometry` that maps points and boxes
between original and model pixels. The grid is a parameter, read by the policy from the checkpoint's processor
(:mod:`mmrl.model.geometry`): for a dynamic-resolution tower, :func:`mmrl.processors.geometry.smart_resize` with the side
multiple ``factor`` (patch x merge: 28 for Qwen2/2.5-VL, the default here; 32 for Qwen3-VL and Qwen3.5); for a
fixed-size tower (Gemma 3's SigLIP), a stretch to ``fixed_size``. Either way the resize is a per-axis stretch, so the
mapping is a per-axis scale and exact. Resampling is bicubic by default (PIL's default for ``Image.resize``, which
``qwen_vl_utils.fetch_image`` uses); the policy passes the processor's own filter.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from mmrl.processors.errors import MediaError, resolve_media_path
from mmrl.processors.geometry import (
    IMAGE_FACTOR,
    MAX_PIXELS,
    MIN_PIXELS,
    GeometryError,
    model_to_original,
    original_to_model,
    smart_resize,
)

ImageSource = str | os.PathLike | bytes | bytearray | memoryview | Image.Image

DEFAULT_MAX_IMAGE_PIXELS = 64_000_000
_WHITE = (255, 255, 255, 255)
_ALPHA_MODES = {"RGBA", "RGBa", "LA", "La", "PA"}
_WIDE_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I", "F"}
# Long strings drawn only from the base64 alphabet are treated as inline image data, not as paths.
_BASE64_RE = re.compile(r"[A-Za-z0-9+/\s]+={0,2}")
_MIN_BASE64_LEN = 64


def load_image(
    src: ImageSource,
    *,
    record_id: str = "?",
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    base_dir: str | os.PathLike[str] | None = None,
) -> Image.Image:
    """Return ``src`` as a fully decoded 8-bit RGB image, upright per its EXIF orientation.

    ``src`` is a path (relative paths join ``base_dir``; ``file://`` accepted), raw bytes, a base64 string, a
    ``data:image/...;base64,`` URI or a PIL image. Raises :class:`MediaError` naming ``record_id`` when the source
    is missing, empty, not an image, truncated, over ``max_image_pixels`` or in a mode that cannot become RGB.
    """
    if isinstance(src, Image.Image):
        return _finish(src, "the given PIL image", record_id, max_image_pixels)
    data, what = _source_bytes_or_path(src, record_id, base_dir)
    try:
        opened = Image.open(io.BytesIO(data) if isinstance(data, bytes) else data)
    except Image.DecompressionBombError as e:
        raise MediaError(record_id, f"{what} is too large to decode safely ({e}); downscale the image") from e
    except UnidentifiedImageError as e:
        raise MediaError(
            record_id, f"{what} is not a recognized image (unknown or corrupt file type); replace the file"
        ) from e
    except OSError as e:
        raise MediaError(
            record_id, f"cannot read {what}: {e}; check that the file is readable and intact"
        ) from e
    with opened:
        return _finish(opened, what, record_id, max_image_pixels)


def _source_bytes_or_path(
    src: ImageSource, record_id: str, base_dir: str | os.PathLike[str] | None
) -> tuple[bytes | Path, str]:
    """Return the encoded image bytes or the checked file path, and a description of ``src`` for messages."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        data = bytes(src)
        if not data:
            raise MediaError(
                record_id, "image data is empty (0 bytes); check how the dataset stores the image"
            )
        return data, f"image data ({len(data)} bytes)"
    if isinstance(src, str) and src.startswith("data:"):
        return _decode_data_uri(src, record_id), "data-URI image"
    if (
        isinstance(src, str)
        and len(src) >= _MIN_BASE64_LEN
        and _BASE64_RE.fullmatch(src)
        and not _is_file(src)
    ):
        try:
            return base64.b64decode(src, validate=False), "base64 image"
        except (binascii.Error, ValueError) as e:
            raise MediaError(
                record_id,
                f"string is neither an existing file nor valid base64 image data ({e}); fix the field",
            ) from e
    if isinstance(src, (str, os.PathLike)):
        path = resolve_media_path(src, base_dir=base_dir, record_id=record_id, kind="image")
        return path, f"image file {path}"
    raise MediaError(
        record_id,
        f"unsupported image source of type {type(src).__name__}; give a path, bytes, base64 or PIL image",
    )


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except OSError:  # e.g. a name longer than the file system allows: certainly not a file
        return False


def _decode_data_uri(uri: str, record_id: str) -> bytes:
    header, sep, payload = uri.partition(",")
    if not sep or not header.endswith(";base64"):
        raise MediaError(
            record_id,
            "data URI is not base64-encoded; only 'data:image/...;base64,<data>' URIs are supported",
        )
    try:
        return base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError) as e:
        raise MediaError(record_id, f"data URI holds invalid base64 ({e}); re-encode the image") from e


def _finish(img: Image.Image, what: str, record_id: str, max_image_pixels: int) -> Image.Image:
    """Check the size from the header, decode every pixel, apply EXIF orientation, convert to RGB."""
    w, h = img.size
    if w * h > max_image_pixels:
        raise MediaError(
            record_id,
            f"{what} is {w}x{h} = {w * h} pixels, over the limit of {max_image_pixels} pixels "
            "(possible decompression bomb); downscale the image or raise max_image_pixels",
        )
    try:
        img.load()
        upright = ImageOps.exif_transpose(img)
    except Image.DecompressionBombError as e:
        raise MediaError(record_id, f"{what} is too large to decode safely ({e}); downscale the image") from e
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError) as e:
        raise MediaError(
            record_id, f"cannot decode {what}: file is truncated or corrupt ({e}); re-export or replace it"
        ) from e
    return to_rgb(upright, record_id=record_id)


def to_rgb(img: Image.Image, *, record_id: str = "?") -> Image.Image:
    """Return a new 8-bit RGB copy of ``img``: transparency composited onto white, wide modes scaled (see module)."""
    if img.mode in _WIDE_MODES:
        return Image.fromarray(np.repeat(_wide_to_uint8(img)[..., None], 3, axis=2), mode="RGB")
    if img.mode in _ALPHA_MODES or "transparency" in img.info:
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", img.size, _WHITE), rgba).convert("RGB")
    try:
        return img.convert("RGB")
    except ValueError as e:
        raise MediaError(
            record_id, f"image mode {img.mode!r} cannot be converted to RGB ({e}); re-save the image as RGB"
        ) from e


def _wide_to_uint8(img: Image.Image) -> np.ndarray:
    a = np.asarray(img)  # [H, W]
    if img.mode.startswith("I;16"):
        return ((a.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
    a = np.nan_to_num(a.astype(np.float64))
    lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    if img.mode == "F" and lo >= 0 and hi <= 1:
        scaled = a * 255
    elif lo >= 0 and hi <= 255:
        scaled = a
    elif img.mode == "I" and lo >= 0 and hi <= 65535:
        scaled = a * 255 / 65535
    else:
        scaled = (a - lo) * 255 / max(hi - lo, 1e-12)
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class ImageGeometry:
    """Sizes of one image before and after :func:`prepare_image`, as ``(width, height)``, with exact mappings."""

    original_size: tuple[int, int]
    model_size: tuple[int, int]

    def to_original(self, x: float, y: float) -> tuple[float, float]:
        """Map a point in model-input pixels to original pixels."""
        return model_to_original(x, y, self.original_size, self.model_size)

    def to_model(self, x: float, y: float) -> tuple[float, float]:
        """Map a point in original pixels to model-input pixels."""
        return original_to_model(x, y, self.original_size, self.model_size)

    def box_to_original(
        self, x1: float, y1: float, x2: float, y2: float
    ) -> tuple[float, float, float, float]:
        return (*self.to_original(x1, y1), *self.to_original(x2, y2))

    def box_to_model(self, x1: float, y1: float, x2: float, y2: float) -> tuple[float, float, float, float]:
        return (*self.to_model(x1, y1), *self.to_model(x2, y2))


def prepare_image(
    img: Image.Image,
    *,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
    factor: int = IMAGE_FACTOR,
    fixed_size: tuple[int, int] | None = None,
    resample: Image.Resampling = Image.Resampling.BICUBIC,
    record_id: str = "?",
) -> tuple[Image.Image, ImageGeometry]:
    """Resize ``img`` to the model's grid: sides multiples of ``factor`` with the pixel count within the budget, or
    exactly ``fixed_size`` ``(width, height)`` for a fixed-size tower (the budget then does not apply).

    Returns the RGB image the model sees and its :class:`ImageGeometry`. Raises :class:`MediaError` when the aspect
    ratio is beyond what a dynamic-resolution model accepts (over 200:1) and ``ValueError`` when
    ``min_pixels > max_pixels``.
    """
    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels {min_pixels} > max_pixels {max_pixels}; fix the processor settings")
    w, h = img.size
    if fixed_size is not None:
        model_w, model_h = fixed_size
    else:
        try:
            model_h, model_w = smart_resize(h, w, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
        except GeometryError as e:
            raise MediaError(record_id, f"image cannot be resized for the model: {e}") from e
    rgb = img if img.mode == "RGB" else to_rgb(img, record_id=record_id)
    if (model_w, model_h) != (w, h):
        rgb = rgb.resize((model_w, model_h), resample)
    return rgb, ImageGeometry(original_size=(w, h), model_size=(model_w, model_h))


def thumbnail(img: Image.Image, side: int) -> tuple[Image.Image, float]:
    """An RGB copy of ``img`` whose longest side is at most ``side`` pixels, and the scale applied (1.0: unchanged)."""
    scale = min(1.0, side / max(img.size))
    if scale < 1.0:
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))))
    return img.convert("RGB"), scale
