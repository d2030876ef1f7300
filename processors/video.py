"""Read a video file into the stack of RGB frames a Qwen-style video tower takes (Qwen2/2.5-VL, Qwen3-VL, Qwen3.5).

The model's geometry is a parameter, read by the policy from the checkpoint's video processor
(:mod:`mmrl.model.geometry`): ``factor``, the side multiple (patch x merge: 28 for Qwen2/2.5-VL, the default; 32 for
Qwen3-VL and Qwen3.5), and ``temporal_patch``, the frames per temporal patch (2 for all of them, the default).

Frame selection follows ``qwen_vl_utils.vision_process.smart_nframes`` and its ``linspace(...).round()`` indexing:
``total_frames / source_fps * fps`` frames, clamped to ``[min_frames, max_frames]`` (rounded up / down to a
multiple of ``temporal_patch``) and to the frame count, then floored to a multiple of ``temporal_patch``, spread
uniformly over the whole video. Frames are resized with :func:`mmrl.processors.geometry.smart_resize` (sides
multiples of ``factor``) under the per-frame pixel budget, with PIL's antialiased bicubic filter (qwen-vl-utils
uses torchvision's antialiased bicubic).

Departures from qwen-vl-utils, on purpose: a one-frame video gives ``temporal_patch`` copies of its frame (the
model's temporal patch is 2 frames; qwen-vl-utils raises), the defaults are smaller (``min_frames=2``,
``max_frames=32``, about 192 tokens per frame), no URL is fetched, and every failure is a :class:`MediaError` naming
the sample.

It is written here rather than calling ``qwen_vl_utils.fetch_video`` because that needs torch and torchvision,
picks its backend from an environment variable read at import, and falls back to ``torchvision.io.read_video``,
which torchvision 0.29 (the version installed with this project) no longer has. Backends: decord when it is installed and opens the file, else
OpenCV. The OpenCV reader walks the stream with ``grab()`` and decodes only the chosen frames, because seeking with
``CAP_PROP_POS_FRAMES`` lands on the wrong frame for some codecs; if the container over-reports its frame count,
the selection is redone with the count actually read.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from mmrl.processors.errors import MediaError, resolve_media_path
from mmrl.processors.geometry import IMAGE_FACTOR, GeometryError, smart_resize

FRAME_FACTOR = 2  # the Qwen towers' temporal patch size (the default): frames enter the model in pairs
BACKENDS = ("auto", "decord", "opencv")
_DECORD_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


@dataclass
class VideoClip:
    """Frames chosen from one video. ``frame_indices[i]`` is the source index of ``frames[i]``; a padded last frame
    repeats its index. ``sample_fps = len(frames) / total_frames * source_fps``, as qwen-vl-utils reports it."""

    frames: np.ndarray  # [T, H, W, 3] uint8 RGB, T a multiple of the temporal patch
    sample_fps: float
    frame_indices: list[int]
    source_fps: float
    total_frames: int
    backend: str


def select_frame_indices(
    total_frames: int,
    source_fps: float,
    *,
    fps: float = 2.0,
    min_frames: int = 2,
    max_frames: int = 32,
    temporal_patch: int = FRAME_FACTOR,
) -> list[int]:
    """Source frame indices to keep: a multiple of ``temporal_patch``, uniform over the video (qwen-vl-utils'
    ``smart_nframes``)."""
    if total_frames < 1 or source_fps <= 0:
        raise ValueError(f"need total_frames >= 1 and source_fps > 0, got {total_frames} and {source_fps}")
    if temporal_patch < 1:
        raise ValueError(f"temporal_patch must be >= 1, got {temporal_patch}")
    lo = math.ceil(min_frames / temporal_patch) * temporal_patch
    hi = math.floor(max_frames / temporal_patch) * temporal_patch
    if fps <= 0 or min_frames < 1 or hi < max(lo, temporal_patch):
        raise ValueError(
            f"bad frame settings fps={fps}, min_frames={min_frames}, max_frames={max_frames}: need fps > 0, "
            f"min_frames >= 1 and max_frames >= max(min_frames, {temporal_patch})"
        )
    wanted = min(max(total_frames / source_fps * fps, lo), hi, total_frames)
    # 1 only for a video shorter than a temporal patch
    n = max(1, math.floor(wanted / temporal_patch) * temporal_patch)
    indices = np.linspace(0, total_frames - 1, n).round().astype(int).tolist()
    while len(indices) % temporal_patch:
        indices.append(indices[-1])
    return indices


def load_video(
    path: str | os.PathLike[str],
    *,
    record_id: str = "?",
    fps: float = 2.0,
    max_frames: int = 32,
    min_frames: int = 2,
    max_pixels: int = 360 * 420,
    min_pixels: int = 128 * 28 * 28 // 4,
    base_dir: str | os.PathLike[str] | None = None,
    backend: str = "auto",
    factor: int = IMAGE_FACTOR,
    temporal_patch: int = FRAME_FACTOR,
) -> VideoClip:
    """Read ``path`` (relative paths join ``base_dir``) and return its selected, resized frames: sides multiples
    of ``factor``, the frame count a multiple of ``temporal_patch`` (the model's geometry, see the module).

    ``backend`` is ``"auto"`` (decord if importable and it opens the file, else OpenCV), ``"decord"`` or
    ``"opencv"``. Raises :class:`MediaError` naming ``record_id`` for a missing, empty, unreadable or frameless
    file, ``ImportError`` when ``backend="decord"`` and decord is not installed.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels {min_pixels} > max_pixels {max_pixels}; fix the processor settings")
    if backend == "decord" and not _decord_available():
        raise ImportError(
            "backend='decord' needs the decord package (pip install decord); or use 'auto'/'opencv'"
        )
    p = resolve_media_path(path, base_dir=base_dir, record_id=record_id, kind="video")
    select = dict(fps=fps, min_frames=min_frames, max_frames=max_frames, temporal_patch=temporal_patch)
    if backend == "decord" or (backend == "auto" and _decord_available()):
        try:
            frames, indices, total, src_fps = _read_decord(p, record_id, select)
            name = "decord"
        except MediaError as e:
            if backend == "decord":
                raise
            frames, indices, total, src_fps = _read_opencv_after(p, record_id, select, e.cause)
            name = "opencv"
    else:
        frames, indices, total, src_fps = _read_opencv(p, record_id, select)
        name = "opencv"
    return VideoClip(
        frames=_resize_frames(frames, min_pixels, max_pixels, factor, record_id),
        sample_fps=len(indices) / total * src_fps,
        frame_indices=indices,
        source_fps=src_fps,
        total_frames=total,
        backend=name,
    )


def _decord_available() -> bool:
    try:
        import decord  # noqa: F401
    except ImportError:
        return False
    return True


def _check_counts(total: int, src_fps: float, p: Path, record_id: str, reader: str) -> None:
    if total <= 0:
        raise MediaError(
            record_id, f"video has no frames ({reader}): {p}; re-encode the video or drop the sample"
        )
    if not src_fps > 0:  # also catches NaN
        raise MediaError(
            record_id,
            f"video reports frame rate {src_fps} ({reader}): {p}; re-encode it with a fixed frame rate",
        )


def _read_decord(p: Path, record_id: str, select: dict) -> tuple[np.ndarray, list[int], int, float]:
    import decord

    try:
        vr = decord.VideoReader(str(p))
        total, src_fps = len(vr), float(vr.get_avg_fps())
    except (decord.DECORDError, RuntimeError) as e:  # decord raises both, depending on where it fails
        raise MediaError(record_id, f"decord cannot open the video {p}: {_first_line(e)}") from e
    _check_counts(total, src_fps, p, record_id, "decord")
    indices = select_frame_indices(total, src_fps, **select)
    try:
        frames = vr.get_batch(indices).asnumpy()  # [T, H, W, 3] RGB
    except (decord.DECORDError, RuntimeError) as e:
        raise MediaError(record_id, f"decord cannot decode frames of {p}: {_first_line(e)}") from e
    return frames, indices, total, src_fps


def _read_opencv_after(
    p: Path, record_id: str, select: dict, decord_cause: str
) -> tuple[np.ndarray, list[int], int, float]:
    """The OpenCV fallback of ``backend="auto"``; a failure reports what decord said too."""
    try:
        return _read_opencv(p, record_id, select)
    except MediaError as e:
        raise MediaError(record_id, f"{e.cause} (decord also failed: {decord_cause})") from e


def _read_opencv(p: Path, record_id: str, select: dict) -> tuple[np.ndarray, list[int], int, float]:
    cap = cv2.VideoCapture(str(p))
    try:
        if not cap.isOpened():
            raise MediaError(
                record_id,
                f"OpenCV cannot open the video {p} (unknown container or codec, or not a video); "
                "re-encode it, e.g. to H.264 MP4",
            )
        src_fps = float(cap.get(cv2.CAP_PROP_FPS))
        reported = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    finally:
        cap.release()
    total = reported if reported > 0 else _grab_frames(p, set(), None)[1]
    _check_counts(total, src_fps, p, record_id, "opencv")
    indices = select_frame_indices(total, src_fps, **select)
    got, seen = _grab_frames(p, set(indices), max(indices))
    if seen <= max(indices):  # the container over-reported its length: select again from what was read
        total = seen
        _check_counts(total, src_fps, p, record_id, "opencv")
        indices = select_frame_indices(total, src_fps, **select)
        got, seen = _grab_frames(p, set(indices), max(indices))
    missing = sorted(set(indices) - got.keys())
    if missing:
        raise MediaError(
            record_id,
            f"OpenCV could not decode frames {missing[:5]} of {p}; the file may be corrupt, re-encode it",
        )
    return np.stack([got[i] for i in indices]), indices, total, src_fps


def _grab_frames(p: Path, wanted: set[int], last: int | None) -> tuple[dict[int, np.ndarray], int]:
    """Walk the stream up to frame ``last`` (to the end when None); return the wanted frames as RGB and how many
    frames were walked."""
    cap = cv2.VideoCapture(str(p))
    got: dict[int, np.ndarray] = {}
    i = 0
    try:
        while (last is None or i <= last) and cap.grab():
            if i in wanted:
                ok, bgr = cap.retrieve()
                if ok:
                    got[i] = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            i += 1
    finally:
        cap.release()
    return got, i


def _resize_frames(
    frames: np.ndarray, min_pixels: int, max_pixels: int, factor: int, record_id: str
) -> np.ndarray:
    _, h, w, _ = frames.shape  # [T, H, W, 3]
    try:
        new_h, new_w = smart_resize(h, w, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    except GeometryError as e:
        raise MediaError(record_id, f"video frames cannot be resized for the model: {e}") from e
    if (new_h, new_w) == (h, w):
        return np.ascontiguousarray(frames, dtype=np.uint8)
    out = np.empty((len(frames), new_h, new_w, 3), dtype=np.uint8)
    for t, frame in enumerate(frames):
        out[t] = np.asarray(Image.fromarray(frame).resize((new_w, new_h), Image.Resampling.BICUBIC))
    return out


def _first_line(e: BaseException) -> str:
    """The first line of a decord error, without its ``[hh:mm:ss] /build/path/file.cc:123: `` prefix."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return _DECORD_PREFIX.sub("", lines[0] if lines else type(e).__name__)[:300]
