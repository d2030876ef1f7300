"""load_video / select_frame_indices: tiny videos are written here with cv2.VideoWriter into tmp_path.

Frame i of a test video shows i in binary as black/white bars across its top half, and its bottom half is pure
red, so a decoded frame says which source frame it is and whether the channels came out as RGB."""

import platform
import struct

import cv2
import numpy as np
import pytest
from media_errors import expect_media_error
from qwen_vl_utils import vision_process as vp

from mmrl.processors import video
from mmrl.processors.geometry import smart_resize
from mmrl.processors.video import load_video, select_frame_indices

RID = "vid-0007"
CODECS = [("MJPG", "avi"), ("mp4v", "mp4")]
BITS = 6  # frame numbers up to 63
# pyproject installs decord on x86_64 only (it has no wheels elsewhere); there it must be present, not skipped
DECORD = platform.machine() == "x86_64"


def _write_video(path, n_frames: int, fps: float = 10.0, size=(64, 48), fourcc: str = "MJPG"):
    w, h = size
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (w, h))
    assert writer.isOpened(), f"cv2.VideoWriter cannot write {fourcc} here"
    for i in range(n_frames):
        writer.write(_frame_bgr(i, w, h))
    writer.release()
    return path


def _frame_bgr(i: int, w: int, h: int) -> np.ndarray:
    frame = np.zeros((h, w, 3), np.uint8)
    frame[h // 2 :] = (0, 0, 255)  # red, in OpenCV's BGR order
    for b in range(BITS):
        if i >> b & 1:
            frame[: h // 2, round(b * w / BITS) : round((b + 1) * w / BITS)] = 255
    return frame


def _decoded_index(frame: np.ndarray) -> int:
    h, w, _ = frame.shape  # RGB, any size: the bars scale with the frame
    top = frame[: h // 4]
    return sum(1 << b for b in range(BITS) if top[:, int((b + 0.5) * w / BITS)].mean() > 128)


def _is_red_below(frame: np.ndarray) -> bool:
    bottom = frame[3 * frame.shape[0] // 4 :].reshape(-1, 3).mean(axis=0)
    return bool(np.abs(bottom - [255, 0, 0]).max() < 12)


def _backends() -> list[str]:
    return ["decord", "opencv"] if DECORD else ["opencv"]


def _expect_error(path, *words, **kw) -> str:
    return expect_media_error(load_video, path, RID, *words, **kw)


@pytest.mark.parametrize("fourcc, ext", CODECS)
def test_frame_count_shape_and_content(tmp_path, fourcc, ext):
    path = _write_video(tmp_path / f"v.{ext}", 20, fourcc=fourcc)
    for backend in _backends():
        clip = load_video(path, record_id=RID, backend=backend)
        # 20 frames at 10 fps = 2 s; at 2 fps that is 4 frames, at linspace(0, 19, 4).round() = 0, 6, 13, 19.
        assert clip.backend == backend
        assert clip.frame_indices == [0, 6, 13, 19]
        assert clip.frames.dtype == np.uint8 and clip.frames.shape == (4, 140, 196, 3)  # see test_geometry
        assert clip.total_frames == 20 and clip.source_fps == pytest.approx(10.0)
        assert clip.sample_fps == pytest.approx(2.0)
        assert [_decoded_index(f) for f in clip.frames] == clip.frame_indices
        assert all(_is_red_below(f) for f in clip.frames)


@pytest.mark.skipif(not DECORD, reason="decord is installed on x86_64 only; only the OpenCV reader runs here")
@pytest.mark.parametrize("fourcc, ext", CODECS)
def test_backends_agree(tmp_path, fourcc, ext):
    path = _write_video(tmp_path / f"v.{ext}", 31, fps=7.0, size=(90, 50), fourcc=fourcc)
    a = load_video(path, record_id=RID, backend="decord", fps=3.0)
    b = load_video(path, record_id=RID, backend="opencv", fps=3.0)
    assert a.frame_indices == b.frame_indices and a.frames.shape == b.frames.shape
    assert np.abs(a.frames.astype(int) - b.frames.astype(int)).mean() < 2.0


def test_auto_uses_decord_when_present_and_opencv_otherwise(tmp_path, monkeypatch):
    path = _write_video(tmp_path / "v.avi", 6)
    expected = "decord" if DECORD else "opencv"
    assert load_video(path, record_id=RID).backend == expected
    monkeypatch.setattr(video, "_decord_available", lambda: False)
    assert load_video(path, record_id=RID).backend == "opencv"
    with pytest.raises(ImportError, match="pip install decord"):
        load_video(path, record_id=RID, backend="decord")


def test_frame_budget_clamps_and_stays_even(tmp_path):
    path = _write_video(tmp_path / "v.avi", 40, fps=10.0)  # 4 s
    many = load_video(path, record_id=RID, fps=100.0, max_frames=9, backend="opencv")
    assert len(many.frames) == 8 and many.frame_indices == [0, 6, 11, 17, 22, 28, 33, 39]
    few = load_video(path, record_id=RID, fps=0.1, min_frames=3, backend="opencv")
    assert len(few.frames) == 4  # 0.4 frames wanted, min_frames 3 rounds up to 4
    assert [_decoded_index(f) for f in few.frames] == few.frame_indices == [0, 13, 26, 39]


def test_short_videos_pad_to_an_even_count(tmp_path):
    for n, expected in [(1, [0, 0]), (2, [0, 1]), (3, [0, 2])]:
        path = _write_video(tmp_path / f"v{n}.avi", n)
        for backend in _backends():
            clip = load_video(path, record_id=RID, min_frames=4, backend=backend)
            assert clip.frame_indices == expected and len(clip.frames) == 2
            assert [_decoded_index(f) for f in clip.frames] == expected
    one = load_video(tmp_path / "v1.avi", record_id=RID, backend="opencv")
    assert one.sample_fps == pytest.approx(20.0)  # 2 frames shown for 1 frame of a 10 fps video


def test_pixel_budget(tmp_path):
    path = _write_video(tmp_path / "big.avi", 4, size=(640, 360))
    clip = load_video(path, record_id=RID, max_pixels=200 * 28 * 28, backend="opencv")
    h, w = smart_resize(360, 640, min_pixels=128 * 28 * 28 // 4, max_pixels=200 * 28 * 28)
    assert clip.frames.shape[1:] == (h, w, 3) and h * w <= 200 * 28 * 28 and h % 28 == w % 28 == 0


def test_opencv_recovers_from_an_over_reported_frame_count(tmp_path):
    path = _write_video(tmp_path / "v.avi", 20)
    data = bytearray(path.read_bytes())
    for tag, offset in [(b"avih", 24), (b"strh", 40)]:  # AVI main header total frames, stream header length
        at = data.find(tag) + offset
        assert struct.unpack("<I", data[at : at + 4]) == (20,)
        data[at : at + 4] = struct.pack("<I", 40)
    path.write_bytes(bytes(data))
    assert cv2.VideoCapture(str(path)).get(cv2.CAP_PROP_FRAME_COUNT) == 40  # the lie is visible to OpenCV
    clip = load_video(path, record_id=RID, backend="opencv")
    assert clip.total_frames == 20 and clip.frame_indices == [0, 6, 13, 19]
    assert [_decoded_index(f) for f in clip.frames] == clip.frame_indices


def test_matches_qwen_vl_utils_frame_selection():
    for total in [2, 3, 7, 20, 31, 300, 1801]:
        for src_fps in [7.0, 24.0, 29.97, 60.0]:
            for fps, lo, hi in [(2.0, 4, 768), (1.0, 2, 32), (0.5, 2, 16), (4.0, 8, 64)]:
                ele = {"fps": fps, "min_frames": lo, "max_frames": hi}
                n = vp.smart_nframes(ele, total_frames=total, video_fps=src_fps)
                ref = np.linspace(0, total - 1, n).round().astype(int).tolist()
                ours = select_frame_indices(total, src_fps, fps=fps, min_frames=lo, max_frames=hi)
                assert ours == ref, (total, src_fps, fps, lo, hi)


def test_bad_settings():
    with pytest.raises(ValueError, match="max_frames"):
        select_frame_indices(10, 10.0, min_frames=8, max_frames=4)
    with pytest.raises(ValueError, match="backend"):
        load_video("x.mp4", backend="ffmpeg")


# --- errors -------------------------------------------------------------------------------------------------------


def test_missing_directory_and_empty_files(tmp_path):
    _expect_error(tmp_path / "nope.mp4", "video file not found", "nope.mp4", "check the path")
    _expect_error("clips/nope.mp4", "not found", str(tmp_path / "clips" / "nope.mp4"), base_dir=tmp_path)
    _expect_error(tmp_path, "is a directory", str(tmp_path))
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    _expect_error(empty, "empty (0 bytes)", str(empty))


@pytest.mark.parametrize("backend", ["auto", "opencv"])
def test_unreadable_file(tmp_path, backend):
    path = tmp_path / "notes.mp4"
    path.write_text("this is not a video\n" * 20)
    msg = _expect_error(path, "cannot open the video", str(path), "re-encode", backend=backend)
    if backend == "auto" and DECORD:
        assert "decord also failed" in msg


@pytest.mark.parametrize("backend", ["auto", "opencv"])
def test_zero_frame_video(tmp_path, backend):
    path = tmp_path / "zero.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (64, 48))
    writer.release()
    assert path.stat().st_size > 0
    _expect_error(path, "video has no frames", str(path), backend=backend)
