"""Image similarity for the visual part of the table reward (docs/rewards.md#domain-rewards): three named variants.

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

How ``cw_ssim`` is computed fast (it is the table reward's hot spot); each step leaves the metric as defined above,
only rounding changes (float32: at most 5e-7 on the benchmark's renders, 1e-5 asserted against the plain float64
port in the tests). Measured on ``benchmarks/latex_reward.py``'s visual workload (48 non-identical 100-dpi render
pairs, 73x130 to 702x650 pixels, 26 references; shared 2-core machine, OMP_NUM_THREADS=1): 101 ms a pair before,
33 ms after (3.0x). In brackets, ms a pair with that one step reverted:

- float32 / complex64 throughout, ``scipy.fft`` (pocketfft) with ``workers=1`` [62 with float64 / complex128]. The
  mean is removed first, in float64: the pyramid has no DC band, so no subband changes, and the float32 FFT's
  rounding no longer scales with a large DC term (an image and the image + a constant stay bit-identical).
- Fourier masks built once per image size (LRU cache of 4 sizes), directly in FFT order, so no ``fftshift`` at
  run time; each level's masks are centre crops of the level above; the angular masks in closed form instead of
  matlabPyrTools' 1024-point table (they differ by < 1e-5; 7.6 vs 11.2 ms to build them for 237x384)
  [43 with the masks rebuilt for every pyramid].
- Window sums by OpenCV's separable filter with an all-ones kernel (float32, no cancellation against a running
  total) [55 with the float64 summed-area table].
- Orientations filtered in groups of about 1 MiB of complex64 (one core's L2 cache) [38 with all 8 per FFT call,
  36 with one].
- :class:`CwSsimReference` keeps one image's side (conjugate subbands and their energies), so a group of responses
  to one reference costs one pyramid each plus one for the reference [35 without: this workload is mostly groups
  of one; with 8 responses per reference, as in a GRPO group, reuse is 1.4-1.6x]. Identical images (after mean
  removal) score 1 without a pyramid.

Not done: the inverse FFTs cannot be real (the oriented subbands are analytic, their spectra one-sided); padding
to FFT-friendly sizes (``scipy.fft.next_fast_len``) would be 1.4x faster on these renders but moves the scores by
up to 0.013 (white windows added, a different circular boundary), so it would be a different metric.

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

import functools
import math
from collections.abc import Iterator
from typing import NamedTuple

import cv2
import numpy as np
from PIL import Image, ImageOps
from scipy import fft
from scipy.signal import convolve

__all__ = ["CwSsimReference", "cw_ssim", "haar_ssim", "pyssim_cw_ssim", "steerable_pyramid"]


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


def _fft_grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frequency coordinates ``[1, W]``, ``[H, 1]`` (radius 1 = Nyquist) of an ``H`` x ``W`` spectrum in FFT
    order, and the radius ``[H, W]`` with the DC bin set to its left neighbour's on the centred grid
    (``buildSCFpyr``'s guard against log(0))."""
    fx = fft.ifftshift((np.arange(w) - w // 2) / (w / 2))[None, :]
    fy = fft.ifftshift((np.arange(h) - h // 2) / (h / 2))[:, None]
    rad = np.hypot(fx, fy)
    rad[0, 0] = rad[0, -1]
    return fx, fy, rad


def _crop_centre(x: np.ndarray) -> np.ndarray:
    """The centred half-size block of a centred spectrum (one octave down), as ``buildSCFpyrLevs`` crops it."""
    dims = np.array(x.shape[-2:])
    ctr = np.ceil((dims + 0.5) / 2).astype(int)
    lodims = np.ceil((dims - 0.5) / 2).astype(int)
    loctr = np.ceil((lodims + 0.5) / 2).astype(int)
    start = ctr - loctr
    return x[..., start[0] : start[0] + lodims[0], start[1] : start[1] + lodims[1]]


def _crop_index(n: int) -> np.ndarray:
    """FFT-order indices of the centre crop: ``ifftshift(crop(fftshift(x)))`` equals ``x[_crop_index(n)]``."""
    return fft.ifftshift(_crop_centre(fft.fftshift(np.arange(n))[None, :])[0])


def _int_power(x: np.ndarray, n: int) -> np.ndarray:
    """``x ** n`` for a non-negative integer ``n`` by repeated squaring (numpy calls ``powf`` per element)."""
    out, base = np.ones_like(x), x
    while n:
        if n & 1:
            out = out * base
        n >>= 1
        if n:
            base = base * base
    return out


def _angular_masks(fx: np.ndarray, fy: np.ndarray, rad: np.ndarray, orientations: int) -> np.ndarray:
    """``[O, H, W]`` one-sided angular masks ``2 sqrt(c) max(cos(angle - pi k / O), 0) ** (O - 1)``, in closed
    form (``buildSCFpyr`` interpolates a 1024-point table of the same function; they differ by < 1e-5)."""
    cos_a, sin_a = (fx / rad).astype(np.float32), (fy / rad).astype(np.float32)
    cos_a[0, 0], sin_a[0, 0] = 1.0, 0.0  # DC: angle 0, as arctan2(0, 0)
    order = orientations - 1
    const = (2 ** (2 * order)) * math.factorial(order) ** 2 / (orientations * math.factorial(2 * order))
    masks = np.empty((orientations, *rad.shape), np.float32)
    for k in range(orientations):
        theta = np.pi * k / orientations
        c = np.maximum(cos_a * np.float32(np.cos(theta)) + sin_a * np.float32(np.sin(theta)), 0)
        masks[k] = np.float32(2 * np.sqrt(const)) * _int_power(c, order)
    return masks


class _Level(NamedTuple):
    bands: np.ndarray  # [O, h, w] float32: radial band x one-sided angular mask, FFT order
    group: int  # orientations filtered together: a group's subbands stay within _GROUP_ELEMENTS
    rows: np.ndarray  # [h'] rows of this level's spectrum (FFT order) that form the next, half-size level
    cols: np.ndarray  # [w'] columns, likewise
    lowpass: np.ndarray  # [h', w'] float32 low-pass applied after that crop, FFT order


_GROUP_ELEMENTS = 1 << 17  # complex64 elements processed at once (1 MiB: about the L2 cache of one core)


@functools.lru_cache(maxsize=4)
def _fourier_filters(
    shape: tuple[int, int], levels: int, orientations: int
) -> tuple[np.ndarray, tuple[_Level, ...]]:
    """The pyramid's Fourier-domain masks for one image size, all in FFT order (no fftshift at run time): the
    initial low-pass (dropping the high-pass residual) and, per level, the oriented band masks and the crop +
    low-pass to the next level. A level's grid is the centre crop of the one above, so its masks are too."""
    fx, fy, rad = _fft_grid(*shape)
    log_rad = np.log2(rad)
    angular = _angular_masks(fx, fy, rad, orientations)
    xrcos, yrcos = _raised_cosine()
    yrcos = np.sqrt(yrcos)
    yircos = np.sqrt(1.0 - yrcos**2)
    lo0 = np.interp(log_rad, xrcos, yircos).astype(np.float32)
    out = []
    for _ in range(levels):
        xrcos = xrcos - 1.0  # one octave down
        bands = angular * np.interp(log_rad, xrcos, yrcos).astype(np.float32)
        group = max(1, min(orientations, _GROUP_ELEMENTS // log_rad.size))
        rows, cols = _crop_index(log_rad.shape[0]), _crop_index(log_rad.shape[1])
        log_rad = log_rad.take(rows, axis=0).take(cols, axis=1)
        angular = angular.take(rows, axis=1).take(cols, axis=2)
        lowpass = np.interp(log_rad, xrcos, yircos).astype(np.float32)
        out.append(_Level(bands=bands, group=group, rows=rows, cols=cols, lowpass=lowpass))
    return lo0, tuple(out)


def _subbands(images: np.ndarray, levels: int, orientations: int) -> Iterator[np.ndarray]:
    """Oriented subbands of float32 images ``[..., H, W]``, finest level first, in groups of orientations
    ``[..., g, h_l, w_l]`` complex64 small enough to stay in cache, without ``buildSCFpyr``'s constant
    ``(-1j) ** (O - 1)`` factor (a unit phase, which cancels in CW-SSIM)."""
    lo0, filters = _fourier_filters(images.shape[-2:], levels, orientations)
    lodft = fft.fft2(images, workers=1) * lo0
    for level in filters:
        for k in range(0, orientations, level.group):
            masks = level.bands[k : k + level.group]
            yield fft.ifft2(lodft[..., None, :, :] * masks, workers=1, overwrite_x=True)
        lodft = lodft.take(level.rows, axis=-2).take(level.cols, axis=-1) * level.lowpass


def steerable_pyramid(images: np.ndarray, levels: int, orientations: int) -> list[np.ndarray]:
    """Complex oriented subbands of a complex steerable pyramid, finest level first.

    ``images`` is ``[..., H, W]``; each returned band is ``[..., h_l, w_l]`` complex64 with ``h_l ~ H / 2**l``.
    """
    phase = np.complex64((-1j) ** (orientations - 1))
    groups = _subbands(np.asarray(images, dtype=np.float32), levels, orientations)
    return [phase * band for group in groups for band in np.moveaxis(group, -3, 0)]


_ONES = np.ones(15, np.float32)


def _box_sum(x: np.ndarray, n: int) -> np.ndarray:
    """Sums of a float32 or complex64 ``[g, h, w]`` array over every ``n`` x ``n`` window inside each ``h`` x
    ``w`` image ('valid': ``[g, h - n + 1, w - n + 1]``).

    OpenCV's separable filter with an all-ones kernel on the ``g`` images stacked into rows (windows straddling
    two images fall outside the valid crop), real and imaginary parts as two channels: 2-5x faster than numpy
    cumulative sums, and each sum is accurate to float32 rounding, with no cancellation against a large running
    total as in a float32 summed-area table."""
    g, h, w = x.shape
    flat = x.reshape(g * h, w)
    planes = flat.view(np.float32).reshape(g * h, w, 2) if np.iscomplexobj(x) else flat
    ones = _ONES[:n] if n <= len(_ONES) else np.ones(n, np.float32)
    sums = cv2.sepFilter2D(planes, cv2.CV_32F, ones, ones).reshape(g, h, -1)
    if np.iscomplexobj(x):
        sums = sums.view(np.complex64)
    a = n // 2  # OpenCV's default anchor: the window centre
    return sums[:, a : h - n + a + 1, a : w - n + a + 1]


def _energy(x: np.ndarray) -> np.ndarray:
    """``|x|^2`` of a complex64 array, float32."""
    return np.square(x.real) + np.square(x.imag)


def _as_image(x: np.ndarray) -> np.ndarray:
    """float32 copy of a grayscale image with its mean removed (in float64 first): the pyramid has no DC band, so
    this changes no band, and it keeps a large DC term out of the float32 FFT's rounding error."""
    x = np.asarray(x, dtype=np.float64)
    return (x - x.mean()).astype(np.float32)


class CwSsimReference:
    """The reference side of :func:`cw_ssim` computed once (the conjugate of every subband and its energy, the
    Fourier masks), so that many images of the reference's shape are scored against it at the cost of one
    pyramid each. ``CwSsimReference(b).score(a) == cw_ssim(a, b)``."""

    def __init__(
        self, ref: np.ndarray, *, K: float = 0.01, window: int = 7, levels: int = 4, orientations: int = 8
    ) -> None:
        ref = np.asarray(ref)
        if ref.ndim != 2:
            raise ValueError(f"expected a grayscale image, got shape {ref.shape}; convert to grayscale first")
        max_levels = int(math.floor(math.log2(min(ref.shape)))) - 2
        if max_levels < 1:
            raise ValueError(
                f"image of shape {ref.shape} is too small for a steerable pyramid (needs at least 8x8)"
            )
        self.shape, self.K, self.window = ref.shape, K, window
        self.levels, self.orientations = min(levels, max_levels), orientations
        coarsest = _fourier_filters(ref.shape, self.levels, orientations)[1][-1].bands.shape[-2:]
        if min(coarsest) < window:
            raise ValueError(f"subband {coarsest} is smaller than the {window}x{window} window")
        self.image = _as_image(ref)
        self.conj, self.energy = [], []  # per group of subbands [g, h, w]: c2* complex64, |c2|^2 float32
        for group in _subbands(self.image, self.levels, orientations):
            self.energy.append(_energy(group))
            self.conj.append(np.conj(group, out=group))

    def score(self, image: np.ndarray) -> float:
        """CW-SSIM of ``image`` (same shape as the reference, intensities in [0, 1]) against the reference."""
        image = np.asarray(image)
        if image.shape != self.shape:
            raise ValueError(
                f"expected two grayscale images of the same shape, got {image.shape} and {self.shape}; "
                "convert to grayscale and resize the prediction to the reference's size first"
            )
        image = _as_image(image)
        if np.array_equal(image, self.image):
            return 1.0  # identical subbands: every window scores (2 e + K) / (2 e + K) = 1
        scores = []  # mean over positions, per subband
        groups = _subbands(image, self.levels, self.orientations)
        for band, conj2, energy2 in zip(groups, self.conj, self.energy):  # [g, h, w]
            energy = _energy(band)
            energy += energy2
            energy = _box_sum(energy, self.window)  # sum |c1|^2 + sum |c2|^2
            energy += self.K
            corr = np.abs(_box_sum(np.multiply(band, conj2, out=band), self.window))  # |sum c1 c2*|
            corr *= 2
            corr += self.K
            scores.extend(np.mean(corr / energy, axis=(-2, -1), dtype=np.float64))
        return float(np.mean(scores))


def cw_ssim(
    a: np.ndarray, b: np.ndarray, *, K: float = 0.01, window: int = 7, levels: int = 4, orientations: int = 8
) -> float:
    """Complex-wavelet SSIM of two same-shape grayscale images in [0, 1] (steerable pyramid; see module doc)."""
    a, b = _check_pair(a, b)
    ref = CwSsimReference(b, K=K, window=window, levels=levels, orientations=orientations)
    return ref.score(a)


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
