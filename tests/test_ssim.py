"""Image similarity: identity, pyssim's published numbers, and the behaviour each variant is chosen for."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.rewards.ssim import CwSsimReference, cw_ssim, haar_ssim, pyssim_cw_ssim, steerable_pyramid

DATA = Path(__file__).resolve().parent / "data"
PYSSIM = DATA / "pyssim" / "test-images"
TABLE = DATA / "pubtabnet" / "mini_val" / "PMC5755158_010_01.png"


def _table() -> np.ndarray:
    """A real table image (PubTabNet), grayscale in [0, 1]."""
    return np.asarray(Image.open(TABLE).convert("L"), dtype=np.float64) / 255.0


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
    pil = Image.open(PYSSIM / "test3-orig.jpg").resize((64, 64), Image.LANCZOS)
    assert pyssim_cw_ssim(pil, pil) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    ("name", "expected"), [("test3-rot.jpg", 0.8724), ("test3-lig.jpg", 0.9668), ("test3-cro.jpg", 0.7171)]
)
def test_pyssim_published_numbers(name: str, expected: float) -> None:
    load = lambda n: Image.open(PYSSIM / n).resize((256, 256), Image.LANCZOS)  # noqa: E731
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


@pytest.mark.parametrize(
    ("direction", "best"), [((1, 0), 0), ((1, 1), 1), ((0, 1), 2), ((1, -1), 3)], ids=["0", "45", "90", "135"]
)
def test_steerable_pyramid_bands_are_oriented_and_analytic(direction: tuple[int, int], best: int) -> None:
    """A cosine grating whose frequency points at angle k * 45 degrees puts its energy in orientation k (none in the
    orthogonal one), and because the angular masks are one-sided the band is an analytic signal: a complex
    exponential whose magnitude is flat, where a real (two-sided) pyramid would ripple at twice the frequency."""
    yy, xx = np.mgrid[:64, :64]
    grating = np.cos(2 * np.pi * 8 * (direction[0] * xx + direction[1] * yy) / 64)
    bands = steerable_pyramid(grating, levels=3, orientations=4)
    assert [b.shape for b in bands[::4]] == [(64, 64), (32, 32), (16, 16)]
    energy = np.array([np.square(np.abs(b)).sum() for b in bands]).reshape(3, 4)  # [level, orientation]
    level = int(energy.max(axis=1).argmax())
    assert int(energy[level].argmax()) == best
    assert energy[level, (best + 2) % 4] < 1e-6 * energy[level, best]
    magnitude = np.abs(bands[4 * level + best])[4:-4, 4:-4]
    assert magnitude.std() < 1e-4 * magnitude.mean()


def _direct_cw_ssim(
    a: np.ndarray, b: np.ndarray, K: float, window: int, levels: int, orientations: int
) -> float:
    """The plain float64 port of ``buildSCFpyr`` + CW-SSIM that the fast implementation replaced: centred
    spectra, masks interpolated from matlabPyrTools' tables for every band, summed-area-table window sums."""
    h, w = a.shape
    xr, yr = np.meshgrid((np.arange(w) - w // 2) / (w / 2), (np.arange(h) - h // 2) / (h / 2))
    angle, rad = np.arctan2(yr, xr), np.hypot(xr, yr)
    rad[h // 2, w // 2] = rad[h // 2, w // 2 - 1]
    log_rad = np.log2(rad)
    x = np.pi * np.arange(-257, 2) / 512
    yrcos = np.cos(x) ** 2
    yrcos[0], yrcos[-1] = yrcos[1], yrcos[-2]
    xrcos, yrcos = -0.5 + (2 / np.pi) * (x + np.pi / 4), np.sqrt(yrcos)
    yircos = np.sqrt(1 - yrcos**2)
    order = orientations - 1
    const = 2 ** (2 * order) * math.factorial(order) ** 2 / (orientations * math.factorial(2 * order))
    xcosn = np.pi * np.arange(-2049, 1026) / 1024
    alpha = np.mod(np.pi + xcosn, 2 * np.pi) - np.pi
    ycosn = 2 * np.sqrt(const) * np.cos(xcosn) ** order * (np.abs(alpha) < np.pi / 2)
    lodft = np.fft.fftshift(np.fft.fft2(np.stack([a, b])), axes=(-2, -1)) * np.interp(log_rad, xrcos, yircos)

    def crop(z: np.ndarray) -> np.ndarray:
        dims = np.array(z.shape[-2:])
        lodims = np.ceil((dims - 0.5) / 2).astype(int)
        start = np.ceil((dims + 0.5) / 2).astype(int) - np.ceil((lodims + 0.5) / 2).astype(int)
        return z[..., start[0] : start[0] + lodims[0], start[1] : start[1] + lodims[1]]

    def box(z: np.ndarray) -> np.ndarray:
        c = np.pad(np.cumsum(np.cumsum(z, axis=-2), axis=-1), [(1, 0), (1, 0)])
        n = window
        return c[n:, n:] - c[:-n, n:] - c[n:, :-n] + c[:-n, :-n]

    scores = []
    for _ in range(min(levels, int(math.log2(min(h, w))) - 2)):
        xrcos = xrcos - 1
        himask = np.interp(log_rad, xrcos, yrcos)
        for k in range(orientations):
            mask = np.interp(angle, xcosn + np.pi * k / orientations, ycosn) * himask
            c1, c2 = np.fft.ifft2(np.fft.ifftshift(lodft * mask, axes=(-2, -1)))
            s = (2 * np.abs(box(c1 * np.conj(c2))) + K) / (box(np.abs(c1) ** 2 + np.abs(c2) ** 2) + K)
            scores.append(s.mean())
        log_rad, angle, lodft = crop(log_rad), crop(angle), crop(lodft)
        lodft = lodft * np.interp(log_rad, xrcos, yircos)
    return float(np.mean(scores))


@pytest.mark.parametrize(
    ("shape", "levels", "orientations", "window"),
    [
        ((64, 48), 3, 4, 7),
        ((33, 70), 4, 8, 5),
        ((97, 131), 4, 8, 7),
        ((17, 200), 4, 6, 3),
        ((50, 51), 2, 8, 8),
    ],
)
def test_cw_ssim_matches_the_direct_float64_pyramid(shape, levels, orientations, window) -> None:
    """float32 FFTs, FFT-order cached masks, closed-form angular masks and OpenCV window sums change the score
    by rounding only (the benchmark's 48 render pairs: at most 5e-7)."""
    rng = np.random.default_rng(sum(shape))
    a = rng.random(shape)
    b = np.clip(a + 0.2 * rng.standard_normal(shape), 0, 1)
    for x, y in ((a, b), (a, _shift(a, 3)), (a, np.ones(shape))):
        direct = _direct_cw_ssim(x, y, 0.01, window, levels, orientations)
        fast = cw_ssim(x, y, levels=levels, orientations=orientations, window=window)
        assert fast == pytest.approx(direct, abs=1e-5)


def test_cw_ssim_matches_the_direct_float64_pyramid_on_a_table() -> None:
    img = _table()
    for other in (
        _shift(img, 2),
        np.clip(img + 0.1 * np.random.default_rng(2).standard_normal(img.shape), 0, 1),
    ):
        assert cw_ssim(img, other) == pytest.approx(_direct_cw_ssim(img, other, 0.01, 7, 4, 8), abs=1e-5)


def test_reference_reuse_gives_the_pairwise_scores() -> None:
    rng = np.random.default_rng(3)
    ref = rng.random((70, 90))
    others = [np.clip(ref + s * rng.standard_normal(ref.shape), 0, 1) for s in (0.05, 0.2, 0.5)]
    reference = CwSsimReference(ref, window=5, levels=3)
    scores = [reference.score(o) for o in others]
    assert scores == [cw_ssim(o, ref, window=5, levels=3) for o in others]
    assert scores == sorted(scores, reverse=True)
    assert reference.score(ref) == 1.0
    assert cw_ssim(ref, others[1]) == pytest.approx(cw_ssim(others[1], ref), abs=1e-6)  # symmetric
    with pytest.raises(ValueError, match="same shape"):
        reference.score(ref[:, :80])
