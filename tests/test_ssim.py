"""Image similarity: identity, pyssim's published numbers, and the behaviour each variant is chosen for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mmrl.rewards.ssim import cw_ssim, haar_ssim, pyssim_cw_ssim, steerable_pyramid
from PIL import Image

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PYSSIM = DATA / "pyssim" / "test-images"
TABLE = DATA / "pubtabnet" / "mini_val" / "PMC5755158_010_01.png"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared reference data not found: {path}")
    return path


def _table() -> np.ndarray:
    """A real table image (PubTabNet), grayscale in [0, 1]."""
    return np.asarray(Image.open(_need(TABLE)).convert("L"), dtype=np.float64) / 255.0


def _shift(x: np.ndarray, pixels: int) -> np.ndarray:
    """Move the content right by ``pixels``, filling with white paper."""
    out = np.ones_like(x)
    out[:, pixels:] = x[:, : x.shape[1] - pixels]
    return out


def test_identical_images_score_one() -> None:
    img = _table()
    assert cw_ssim(img, img) == pytest.approx(1.0, abs=1e-12)
    # their covariance uses ddof=1 and the variances ddof=0, so identity scores n/(n-1) per subband at most
    n = (img.shape[0] // 2) * (img.shape[1] // 2)
    assert 1.0 <= haar_ssim(img, img) <= n / (n - 1)
    pil = Image.open(_need(PYSSIM / "test3-orig.jpg")).resize((64, 64), Image.LANCZOS)
    assert pyssim_cw_ssim(pil, pil) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    ("name", "expected"), [("test3-rot.jpg", 0.8724), ("test3-lig.jpg", 0.9668), ("test3-cro.jpg", 0.7171)]
)
def test_pyssim_published_numbers(name: str, expected: float) -> None:
    load = lambda n: Image.open(_need(PYSSIM / n)).resize((256, 256), Image.LANCZOS)  # noqa: E731
    assert round(pyssim_cw_ssim(load("test3-orig.jpg"), load(name)), 4) == expected


def test_cw_ssim_decreases_with_shift() -> None:
    img = _table()
    scores = [cw_ssim(img, _shift(img, s)) for s in (1, 2, 4, 8, 16)]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] > 0.95 and scores[-1] < 0.8


def test_structurally_different_images_score_low() -> None:
    img = _table()
    blank = np.ones_like(img)
    noise = np.random.default_rng(0).random(img.shape)
    for other in (blank, noise):
        assert cw_ssim(img, other) < 0.35
        assert haar_ssim(img, other) < 0.35


def test_uniform_brightness_change() -> None:
    """The pyramid has no DC band, so cw_ssim ignores a uniform offset; the Haar version's A band does not."""
    img = _table()
    darker = img - 0.2
    assert cw_ssim(img, darker) == pytest.approx(1.0, abs=1e-9)
    assert haar_ssim(img, darker) < 1.0 - 1e-3


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="same shape"):
        cw_ssim(np.zeros((32, 32)), np.zeros((32, 30)))
    with pytest.raises(ValueError, match="too small"):
        cw_ssim(np.zeros((6, 6)), np.zeros((6, 6)))


def test_steerable_pyramid_is_a_tight_frame_per_orientation_pair() -> None:
    """Opposite one-sided angular masks add up to the real pyramid: every level halves the band size."""
    img = np.random.default_rng(1).random((64, 48))
    bands = steerable_pyramid(img, levels=3, orientations=4)
    assert [b.shape for b in bands[::4]] == [(64, 48), (32, 24), (16, 12)]
    assert all(np.iscomplexobj(b) and np.abs(b.imag).max() > 0 for b in bands)
