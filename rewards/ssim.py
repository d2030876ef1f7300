"""Image similarity for the visual part of the table reward (ALGORITHMS.md §4): three named variants.

``cw_ssim(a, b)`` — the complex wavelet SSIM of Wang & Simoncelli (ICASSP 2005) and Sampat et al. (IEEE TIP 2009).
Both grayscale images (same shape, intensities in [0, 1]) are decomposed by a complex steerable pyramid built in the
Fourier domain (a numpy port of Portilla & Simoncelli's ``buildSCFpyr``: raised-cosine radial bands one octave apart,
``orientations`` one-sided angular masks, so every oriented band is complex/analytic). For every oriented subband
and every ``window`` x ``window`` neighbourhood (valid positions only)

    S = (2 |sum c1 c2*| + K) / (sum |c1|^2 + sum |c2|^2 + K),

the paper's form, which equals the product of a magnitude term ``(2 sum |c1||c2| + K) / (sum |c1|^2 + sum |c2|^2 + K)``
and a phase-consistency term ``(2 |sum c1 c2*| + K) / (2 sum |c1 c2*| + K)`` when K = 0. The score is the mean of S
over positions, then over all ``levels`` x ``orientations`` subbands (the high- and low-pass residuals are not used).
Departures: Sampat's MATLAB ``cwssim_index`` scores only the coarsest level and weights positions with a Gaussian;
we average every level uniformly, as the paper's text describes. ``K`` is absolute, so its weight depends on the
intensity scale: with [0, 1] images blank regions score exactly 1 and inked regions are dominated by the data.
``levels`` is reduced to ``floor(log2(min(h, w))) - 2`` for small images (the pyramid's limit).

``haar_ssim(a, b)`` — what Table2LaTeX-RL's evaluation code actually computed under the name CW-SSIM
(``cw_ssim.ipynb`` in newLLing/Table2LaTeX-RL): after cropping to even size, one 2x2 block transform
``A = (p00 + p01 + p10 + p11) / 4``, ``H = (p00 - p10) / 2``, ``V = (p00 - p01) / 2``, ``D = (p00 - p11) / 2``
(not an orthonormal Haar transform: the detail bands are single differences), then ONE global SSIM per subband
(``C1 = (0.01 L)^2``, ``C2 = (0.03 L)^2``; means and variances with ``ddof = 0`` but the covariance with ``ddof = 1``,
exactly as their code, so identical images score up to ``n / (n - 1)``), averaged over the 4 subbands, not clipped.
Departure: their notebook feeds uint8 arrays, so ``p00 + p01 + ...`` wraps modulo 256; we compute in floating point
(``L = data_range``). The authors resized the prediction to the reference's size (PIL default filter) beforehand.

``pyssim_cw_ssim(a, b)`` — pyssim's CW-SSIM as published in its notebook (test3-rot 0.8724, test3-lig 0.9668,
test3-cro 0.7171 at 256x256): grayscale (PIL ``L``), ``b`` resized to ``a``'s size with LANCZOS, both images
flattened row by row into one 1-D signal, a 1-D continuous wavelet transform with Ricker wavelets of widths
1..``width`` (``scipy.signal.cwt`` semantics: kernel of ``min(10 w, n)`` points, ``convolve(..., mode='same')``), and
per sample the product of the magnitude and phase terms above with K = 0.01 summed over widths, averaged. It is a
translation-sensitive 1-D measure, kept only for comparison with numbers reported using pyssim. Why our own code:
``scipy.signal.cwt``/``ricker`` were removed in SciPy 1.15, and pyssim 0.7.1 itself switched to ``pywt.cwt('mexh')``,
which no longer reproduces its own published numbers (it gives 0.7172 for test3-cro); pyssim is not a dependency.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageOps
from scipy import fft
from scipy.signal import convolve

__all__ = ["cw_ssim", "haar_ssim", "pyssim_cw_ssim"]


def _check_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(
            f"expected two grayscale images of the same shape, got {a.shape} and {b.shape}; "
            "convert to grayscale and resize the prediction to the reference's size first"
        )
    return a, b


# ---------------------------------------------------------------------------------------------- steerable pyramid
def _raised_cosine(width: float = 1.0, position: float = -0.5) -> tuple[np.ndarray, np.ndarray]:
    """Lookup table of a raised-cosine step in log2-frequency (``rcosFn`` of matlabPyrTools)."""
    size = 256
    x = np.pi * np.arange(-size - 1, 2) / (2 * size)
    y = np.cos(x) ** 2
    y[0], y[-1] = y[1], y[-2]  # repeat the end values so interpolation extrapolates flat
    return position + (2 * width / np.pi) * (x + np.pi / 4), y


def _polar_grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """log2 radius and angle of the centred (fftshifted) frequency grid; radius 1 is the Nyquist frequency."""
    cy, cx = h // 2, w // 2
    xr, yr = np.meshgrid((np.arange(w) - cx) / (w / 2), (np.arange(h) - cy) / (h / 2))
    angle = np.arctan2(yr, xr)
    rad = np.hypot(xr, yr)
    rad[cy, cx] = rad[cy, cx - 1]  # avoid log(0) at DC
    return np.log2(rad), angle


def _crop_centre(x: np.ndarray) -> np.ndarray:
    """The centred half-size block of a centred spectrum (one octave down), as ``buildSCFpyrLevs`` crops it."""
    dims = np.array(x.shape[-2:])
    ctr = np.ceil((dims + 0.5) / 2).astype(int)
    lodims = np.ceil((dims - 0.5) / 2).astype(int)
    loctr = np.ceil((lodims + 0.5) / 2).astype(int)
    start = ctr - loctr
    return x[..., start[0] : start[0] + lodims[0], start[1] : start[1] + lodims[1]]


def steerable_pyramid(images: np.ndarray, levels: int, orientations: int) -> list[np.ndarray]:
    """Complex oriented subbands of a complex steerable pyramid, finest level first.

    ``images`` is ``[..., H, W]``; each returned band is ``[..., h_l, w_l]`` complex with ``h_l ~ H / 2**l``.
    """
    log_rad, angle = _polar_grid(*images.shape[-2:])
    xrcos, yrcos = _raised_cosine()
    yrcos = np.sqrt(yrcos)
    yircos = np.sqrt(1.0 - yrcos**2)
    spectrum = fft.fftshift(fft.fft2(images), axes=(-2, -1))
    lodft = spectrum * np.interp(log_rad, xrcos, yircos)  # drop the high-pass residual
    order = orientations - 1
    const = (2 ** (2 * order)) * math.factorial(order) ** 2 / (orientations * math.factorial(2 * order))
    lut = 1024
    xcosn = np.pi * np.arange(-(2 * lut + 1), lut + 2) / lut
    alpha = np.mod(np.pi + xcosn, 2 * np.pi) - np.pi
    ycosn = 2 * np.sqrt(const) * np.cos(xcosn) ** order * (np.abs(alpha) < np.pi / 2)  # one-sided: analytic
    bands = []
    for _ in range(levels):
        xrcos = xrcos - 1.0  # one octave down
        himask = np.interp(log_rad, xrcos, yrcos)
        for k in range(orientations):
            anglemask = np.interp(angle, xcosn + np.pi * k / orientations, ycosn)
            banddft = (-1j) ** order * lodft * (anglemask * himask)
            bands.append(fft.ifft2(fft.ifftshift(banddft, axes=(-2, -1))))
        log_rad, angle, lodft = _crop_centre(log_rad), _crop_centre(angle), _crop_centre(lodft)
        lodft = lodft * np.interp(log_rad, xrcos, yircos)
    return bands


def _box_sum(x: np.ndarray, n: int) -> np.ndarray:
    """Sums over every ``n`` x ``n`` window fully inside the last two axes (a 'valid' box filter)."""
    c = np.cumsum(np.cumsum(x, axis=-2), axis=-1)
    c = np.pad(c, [(0, 0)] * (x.ndim - 2) + [(1, 0), (1, 0)])
    return c[..., n:, n:] - c[..., :-n, n:] - c[..., n:, :-n] + c[..., :-n, :-n]


def cw_ssim(
    a: np.ndarray, b: np.ndarray, *, K: float = 0.01, window: int = 7, levels: int = 4, orientations: int = 8
) -> float:
    """Complex-wavelet SSIM of two same-shape grayscale images in [0, 1] (steerable pyramid; see module doc)."""
    a, b = _check_pair(a, b)
    max_levels = int(math.floor(math.log2(min(a.shape)))) - 2
    if max_levels < 1:
        raise ValueError(
            f"image of shape {a.shape} is too small for a steerable pyramid (needs at least 8x8)"
        )
    bands = steerable_pyramid(np.stack([a, b]), min(levels, max_levels), orientations)
    scores = []
    for band in bands:
        if min(band.shape[-2:]) < window:
            raise ValueError(f"subband {band.shape[-2:]} is smaller than the {window}x{window} window")
        c1, c2 = band[0], band[1]
        corr = _box_sum(c1 * np.conj(c2), window)
        energy = _box_sum(np.abs(c1) ** 2 + np.abs(c2) ** 2, window)
        scores.append(np.mean((2 * np.abs(corr) + K) / (energy + K)))
    return float(np.mean(scores))


# ---------------------------------------------------------------------------------------------- Table2LaTeX-RL
def _block_subbands(x: np.ndarray) -> tuple[np.ndarray, ...]:
    x = x[: x.shape[0] - x.shape[0] % 2, : x.shape[1] - x.shape[1] % 2]
    p00, p01, p10, p11 = x[0::2, 0::2], x[0::2, 1::2], x[1::2, 0::2], x[1::2, 1::2]
    return (p00 + p01 + p10 + p11) / 4, (p00 - p10) / 2, (p00 - p01) / 2, (p00 - p11) / 2


def _global_ssim(x: np.ndarray, y: np.ndarray, c1: float, c2: float) -> float:
    n = x.size
    mx, my = x.mean(), y.mean()
    cov = float(((x - mx) * (y - my)).sum() / (n - 1)) if n > 1 else 0.0  # ddof=1, as their code
    num = (2 * mx * my + c1) * (2 * cov + c2)
    return float(num / ((mx**2 + my**2 + c1) * (x.var() + y.var() + c2)))


def haar_ssim(a: np.ndarray, b: np.ndarray, *, data_range: float = 1.0) -> float:
    """Table2LaTeX-RL's evaluation "CW-SSIM": 2x2 block subbands, one global SSIM each, averaged (see module doc)."""
    a, b = _check_pair(a, b)
    if min(a.shape) < 2:
        raise ValueError(f"image of shape {a.shape} is too small for a 2x2 block transform")
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    return float(
        np.mean([_global_ssim(x, y, c1, c2) for x, y in zip(_block_subbands(a), _block_subbands(b))])
    )


# ---------------------------------------------------------------------------------------------- pyssim
def _ricker(points: int, a: float) -> np.ndarray:
    """The Ricker ("Mexican hat") wavelet exactly as ``scipy.signal.ricker`` defined it."""
    amplitude = 2 / (np.sqrt(3 * a) * np.pi**0.25)
    t = np.arange(points) - (points - 1.0) / 2
    return amplitude * (1 - t**2 / a**2) * np.exp(-(t**2) / (2 * a**2))


def _ricker_cwt(signal: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """``scipy.signal.cwt(signal, ricker, widths)`` as SciPy < 1.15 computed it, ``[len(widths), n]``."""
    out = np.empty((len(widths), len(signal)))
    for i, w in enumerate(widths):
        kernel = _ricker(int(min(10 * w, len(signal))), w)[::-1]
        out[i] = convolve(signal, kernel, mode="same")
    return out


def pyssim_cw_ssim(a_pil: Image.Image, b_pil: Image.Image, *, width: int = 30) -> float:
    """pyssim's (row-flattened 1-D Ricker CWT) CW-SSIM of PIL images, ``b`` resized to ``a`` (see module doc)."""
    if b_pil.size != a_pil.size:
        b_pil = b_pil.resize(a_pil.size, Image.LANCZOS)
    k = 0.01
    widths = np.arange(1, width + 1)
    sig1 = np.asarray(ImageOps.grayscale(a_pil), dtype=np.float64).ravel()
    sig2 = np.asarray(ImageOps.grayscale(b_pil), dtype=np.float64).ravel()
    c1, c2 = _ricker_cwt(sig1, widths), _ricker_cwt(sig2, widths)  # real coefficients
    magnitude = (2 * np.sum(np.abs(c1) * np.abs(c2), axis=0) + k) / (
        np.sum(c1**2, axis=0) + np.sum(c2**2, axis=0) + k
    )
    cross = c1 * np.conj(c2)
    phase = (2 * np.abs(np.sum(cross, axis=0)) + k) / (2 * np.sum(np.abs(cross), axis=0) + k)
    return float(np.mean(magnitude * phase))
