"""load_image / prepare_image: every fixture is made here, in tmp_path, with PIL and numpy."""

import base64
import io
import pickle
import struct
import zlib

import numpy as np
import pytest
from media_errors import expect_media_error
from PIL import Image
from qwen_vl_utils import vision_process as vp

from mmrl.processors.errors import MediaError
from mmrl.processors.image import ImageGeometry, load_image, prepare_image, to_rgb

RID = "tbl-0042"


def _encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _noise(w: int = 64, h: int = 48, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _png_claiming_size(width: int, height: int) -> bytes:
    """A tiny PNG whose IHDR (with a valid CRC) claims ``width`` x ``height``; its pixel data is only 8x8."""
    data = bytearray(_encode(Image.new("1", (8, 8))))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])) & 0xFFFFFFFF)
    return bytes(data)


def _expect_error(src, *words, **kw) -> str:
    return expect_media_error(load_image, src, RID, *words, **kw)


# --- errors -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt, ext", [("PNG", "png"), ("JPEG", "jpg")])
def test_truncated_file(tmp_path, fmt, ext):
    data = _encode(_noise(), fmt)
    path = tmp_path / f"cut.{ext}"
    path.write_bytes(data[: len(data) // 2])
    _expect_error(path, "truncated", str(path))


def test_zero_byte_file(tmp_path):
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    _expect_error(path, "empty (0 bytes)", str(path))
    _expect_error(b"", "empty (0 bytes)")


def test_missing_path(tmp_path):
    _expect_error(str(tmp_path / "nope.png"), "image file not found", "nope.png", "check the path")
    _expect_error(
        "rel/nope.png", "not found", str(tmp_path / "rel" / "nope.png"), "dataset folder", base_dir=tmp_path
    )


def test_directory_path(tmp_path):
    _expect_error(tmp_path, "is a directory", str(tmp_path))


def test_non_image_file(tmp_path):
    path = tmp_path / "notes.png"
    path.write_text("this is not an image\n" * 10)
    _expect_error(path, "not a recognized image", str(path))


def test_decompression_bomb_refused_by_pil_limit(tmp_path):
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_claiming_size(100_000, 100_000))
    _expect_error(path, "too large to decode safely", "10000000000 pixels")


def test_decompression_bomb_refused_from_header_before_decoding(tmp_path):
    # 9000 x 8000 = 72 MP: under PIL's own limits, over ours. The file holds only 8x8 pixels, so decoding it would
    # fail as truncated; the size error proves the check came first.
    path = tmp_path / "big.png"
    path.write_bytes(_png_claiming_size(9000, 8000))
    _expect_error(path, "9000x8000 = 72000000 pixels", "over the limit of 64000000", "max_image_pixels")
    _expect_error(_noise(64, 64), "4096 pixels", "limit of 1000", max_image_pixels=1000)


def test_bad_base64_and_data_uri():
    _expect_error("data:image/png,rawbytes", "not base64-encoded")
    _expect_error("data:image/png;base64,@@@@", "not a recognized image")
    _expect_error("A" * 65, "neither an existing file nor valid base64")
    _expect_error(
        base64.b64encode(b"not an image at all, but long enough to pass" * 2).decode(), "not a recognized"
    )


def test_unsupported_source_type():
    _expect_error(12345, "unsupported image source of type int")


def test_media_error_pickles():
    err = pickle.loads(pickle.dumps(MediaError(RID, "image file not found: /x.png")))
    assert isinstance(err, MediaError) and err.record_id == RID
    assert str(err) == f"sample '{RID}': image file not found: /x.png"


# --- modes --------------------------------------------------------------------------------------------------------


def test_cmyk_jpeg(tmp_path):
    path = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(path)  # pure red in CMYK
    img = load_image(path, record_id=RID)
    assert img.mode == "RGB"
    assert np.abs(np.asarray(img, dtype=int) - [255, 0, 0]).max() <= 8


def test_16bit_grayscale_png_is_scaled_not_clipped(tmp_path):
    path = tmp_path / "g16.png"
    Image.fromarray(np.array([[0, 257, 32768, 65535]], dtype=np.uint16)).save(path)
    assert Image.open(path).mode.startswith("I;16")
    px = np.asarray(load_image(path, record_id=RID))
    assert px.shape == (1, 4, 3)
    assert px[0, :, 0].tolist() == [0, 1, 128, 255]
    assert (px == px[..., :1]).all()  # grey stays grey


def test_wide_modes_i_and_f():
    as_16bit = Image.fromarray(np.array([[0, 32768, 65535]], dtype=np.int32), mode="I")
    assert np.asarray(to_rgb(as_16bit))[0, :, 0].tolist() == [0, 128, 255]
    as_8bit = Image.fromarray(np.array([[0, 100, 255]], dtype=np.int32), mode="I")
    assert np.asarray(to_rgb(as_8bit))[0, :, 0].tolist() == [0, 100, 255]
    unit_float = Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32), mode="F")
    assert np.asarray(to_rgb(unit_float))[0, :, 0].tolist() == [0, 128, 255]
    wide_float = Image.fromarray(np.array([[-1.0, 0.0, 3.0]], dtype=np.float32), mode="F")
    assert np.asarray(to_rgb(wide_float))[0, :, 0].tolist() == [0, 64, 255]  # stretched min..max


def test_rgba_composited_on_white(tmp_path):
    rgba = np.zeros((2, 3, 4), dtype=np.uint8)
    rgba[0, 0] = (0, 0, 0, 0)  # fully transparent black
    rgba[0, 1] = (255, 0, 0, 255)  # opaque red
    rgba[0, 2] = (255, 0, 0, 128)  # half-transparent red
    path = tmp_path / "rgba.png"
    Image.fromarray(rgba, mode="RGBA").save(path)
    px = np.asarray(load_image(path, record_id=RID))
    assert px[0, 0].tolist() == [255, 255, 255]
    assert px[0, 1].tolist() == [255, 0, 0]
    assert px[0, 2, 0] == 255 and abs(int(px[0, 2, 1]) - 127) <= 1 and abs(int(px[0, 2, 2]) - 127) <= 1


def test_palette_with_transparency(tmp_path):
    pal = Image.new("P", (2, 1), 0)
    pal.putpalette([0, 0, 0, 0, 0, 255] + [0] * 762)
    pal.putpixel((1, 0), 1)
    path = tmp_path / "pal.png"
    pal.save(path, transparency=0)
    img = Image.open(path)
    assert img.mode == "P" and "transparency" in img.info
    px = np.asarray(load_image(path, record_id=RID))
    assert px[0, 0].tolist() == [255, 255, 255]
    assert px[0, 1].tolist() == [0, 0, 255]


def test_la_and_1bit(tmp_path):
    la = Image.fromarray(np.array([[[0, 0], [0, 255], [200, 255]]], dtype=np.uint8), mode="LA")
    path = tmp_path / "la.png"
    la.save(path)
    px = np.asarray(load_image(path, record_id=RID))
    assert px[0, :, 0].tolist() == [255, 0, 200]
    bits = Image.new("1", (2, 1), 0)
    bits.putpixel((1, 0), 1)
    assert np.asarray(load_image(bits))[0, :, 0].tolist() == [0, 255]


def test_exif_orientation_6_rotates(tmp_path):
    arr = np.zeros((20, 40, 3), dtype=np.uint8)
    arr[:, :20] = (255, 0, 0)  # left half red as stored
    arr[:, 20:] = (0, 0, 255)  # right half blue as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    path = tmp_path / "rot.jpg"
    Image.fromarray(arr).save(path, exif=exif, quality=95)
    img = load_image(path, record_id=RID)
    assert img.size == (20, 40)
    px = np.asarray(img, dtype=int)
    # Clockwise rotation puts the stored left edge on top.
    assert np.abs(px[5, 10] - [255, 0, 0]).max() <= 10
    assert np.abs(px[35, 10] - [0, 0, 255]).max() <= 10


# --- sources ------------------------------------------------------------------------------------------------------


def test_bytes_base64_data_uri_and_relative_path_give_the_same_pixels(tmp_path):
    src = _noise(30, 20, seed=3)
    data = _encode(src)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.png").write_bytes(data)
    b64 = base64.b64encode(data).decode()
    expected = np.asarray(src)
    for source, kw in [
        (data, {}),
        (bytearray(data), {}),
        (b64, {}),
        (f"data:image/png;base64,{b64}", {}),
        ("sub/a.png", {"base_dir": tmp_path}),
        (f"file://{tmp_path / 'sub' / 'a.png'}", {}),
        (src, {}),
    ]:
        img = load_image(source, record_id=RID, **kw)
        assert img.mode == "RGB" and np.array_equal(np.asarray(img), expected), type(source)


def test_given_pil_image_is_not_modified():
    src = Image.new("RGBA", (4, 4), (10, 20, 30, 0))
    out = load_image(src)
    assert out is not src and src.mode == "RGBA" and out.getpixel((0, 0)) == (255, 255, 255)


# --- prepare_image ------------------------------------------------------------------------------------------------


def test_one_by_one_image():
    img = load_image(Image.new("RGB", (1, 1), (9, 8, 7)), record_id=RID)
    out, geo = prepare_image(img, record_id=RID)
    assert out.size == (56, 56) and geo == ImageGeometry((1, 1), (56, 56))  # raised to min_pixels = 4*28*28
    assert out.getpixel((30, 30)) == (9, 8, 7)
    out, geo = prepare_image(img, min_pixels=28 * 28, max_pixels=28 * 28 * 4, record_id=RID)
    assert out.size == (28, 28) and geo.model_size == (28, 28)


def test_extreme_aspect_ratio_raises_naming_the_record():
    with pytest.raises(MediaError) as info:
        prepare_image(Image.new("RGB", (300, 1)), record_id=RID)
    msg = str(info.value)
    assert msg.startswith(f"sample '{RID}': ") and "aspect ratio 300:1" in msg and "crop or pad" in msg


def test_min_pixels_over_max_pixels_is_a_settings_error():
    with pytest.raises(ValueError, match="min_pixels"):
        prepare_image(Image.new("RGB", (10, 10)), min_pixels=5000, max_pixels=1000)


def test_known_resize_and_exact_coordinate_mapping():
    # 1000x500 with max_pixels = 256*28*28: beta = sqrt(500000/200704) = 1.578, so 22*28 x 11*28 = 616x308.
    img = Image.new("RGB", (1000, 500), (1, 2, 3))
    out, geo = prepare_image(img, min_pixels=4 * 28 * 28, max_pixels=256 * 28 * 28, record_id=RID)
    assert out.size == (616, 308)
    assert geo.original_size == (1000, 500) and geo.model_size == (616, 308)
    assert geo.to_model(500, 250) == (308, 154)
    assert geo.to_original(616, 308) == (1000, 500)
    assert geo.box_to_model(0, 0, 1000, 500) == (0, 0, 616, 308)
    assert geo.box_to_original(154, 77, 308, 154) == (250, 125, 500, 250)
    for x, y in [(0, 0), (1, 1), (123, 456), (999, 499), (640.5, 12.25)]:
        assert geo.to_original(*geo.to_model(x, y)) == pytest.approx((x, y), abs=1e-9)
        assert geo.box_to_original(*geo.box_to_model(x, y, x + 1, y + 1)) == pytest.approx(
            (x, y, x + 1, y + 1), abs=1e-9
        )


def test_unchanged_size_is_returned_as_is():
    img = _noise(112, 56)  # on the 28-pixel grid and inside the default budget
    out, geo = prepare_image(img, record_id=RID)
    assert geo.model_size == (112, 56) and np.array_equal(np.asarray(out), np.asarray(img))


def test_resize_matches_qwen_vl_utils_fetch_image():
    img = _noise(333, 200, seed=5)
    budget = {"min_pixels": 4 * 28 * 28, "max_pixels": 64 * 28 * 28}
    ours, geo = prepare_image(img, **budget, record_id=RID)
    ref = vp.fetch_image({"image": img, **budget})
    assert ours.size == ref.size == geo.model_size
    assert np.array_equal(np.asarray(ours), np.asarray(ref))
