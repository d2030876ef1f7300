"""smart_resize and the coordinate maps: values checked by hand, invariants, round trips, and agreement with
qwen-vl-utils' own smart_resize."""

import itertools

import pytest
from qwen_vl_utils import vision_process as vp

from mmrl.processors.geometry import (
    GeometryError,
    model_to_original,
    original_to_model,
    smart_resize,
)


@pytest.mark.parametrize(
    "h, w, kwargs, expected",
    [
        # 500/28 = 17.9 -> 18*28 = 504; 1000/28 = 35.7 -> 36*28 = 1008; 504*1008 is inside the default budget.
        (500, 1000, {}, (504, 1008)),
        # beta = sqrt(500000 / 200704) = 1.578; 500/1.578/28 = 11.3 -> 308; 1000/1.578/28 = 22.6 -> 616.
        (500, 1000, {"max_pixels": 256 * 28 * 28}, (308, 616)),
        # 1x1 rounds to 28x28 = 784 < 3136; beta = sqrt(3136) = 56 -> ceil(56/28)*28 = 56 per side.
        (1, 1, {}, (56, 56)),
        (1, 1, {"min_pixels": 28 * 28}, (28, 28)),
        # Already on the grid and inside the budget: unchanged.
        (280, 560, {}, (280, 560)),
        # 48x64 rounds to 56x56 = 3136 < 25088; beta = sqrt(25088/3072) = 2.858 -> ceil(4.90)=5, ceil(6.53)=7.
        (48, 64, {"min_pixels": 25088, "max_pixels": 151200}, (140, 196)),
    ],
)
def test_smart_resize_hand_checked(h, w, kwargs, expected):
    assert smart_resize(h, w, **kwargs) == expected


def test_smart_resize_invariants_over_a_grid():
    for h, w in itertools.product([1, 27, 29, 100, 333, 1080, 4000], [1, 50, 640, 1920, 7000]):
        if max(h, w) / min(h, w) > 200:
            continue
        nh, nw = smart_resize(h, w, min_pixels=3136, max_pixels=1_003_520)
        assert nh % 28 == 0 and nw % 28 == 0, (h, w)
        assert 3136 <= nh * nw <= 1_003_520, (h, w, nh, nw)
        # The aspect ratio is kept to within one grid step on each side (sides under one step are raised to it).
        if min(h, w) >= 28:
            assert abs(nw / nh - w / h) <= (w / h) * (28 / nh + 28 / nw), (h, w, nh, nw)


def test_extreme_aspect_ratio_raises():
    with pytest.raises(GeometryError, match="aspect ratio 300:1"):
        smart_resize(1, 300)
    with pytest.raises(GeometryError, match="aspect ratio"):
        smart_resize(3000, 10)


def test_bad_sizes_raise():
    with pytest.raises(GeometryError, match="positive"):
        smart_resize(0, 10)
    with pytest.raises(GeometryError, match="min_pixels"):
        smart_resize(100, 100, min_pixels=10_000, max_pixels=5_000)


def test_coordinate_maps_hand_checked_and_round_trip():
    orig, model = (1000, 500), (616, 308)
    assert original_to_model(500, 250, orig, model) == (308, 154)
    assert model_to_original(616, 308, orig, model) == (1000, 500)
    assert model_to_original(0, 0, orig, model) == (0, 0)
    for x, y in [(0.0, 0.0), (1.0, 499.0), (123.0, 77.0), (999.5, 0.25), (333.3, 444.4)]:
        mx, my = original_to_model(x, y, orig, model)
        assert model_to_original(mx, my, orig, model) == pytest.approx((x, y), abs=1e-9)


def test_agrees_with_qwen_vl_utils():
    budgets = [(4 * 784, 16384 * 784), (256 * 784, 1280 * 784), (25088, 151200)]
    sizes = [1, 13, 28, 55, 224, 500, 719, 1080, 1920, 3000, 5000]
    for (lo, hi), h, w in itertools.product(budgets, sizes, sizes):
        if max(h, w) / min(h, w) > 200:
            continue
        ref = vp.smart_resize(h, w, factor=28, min_pixels=lo, max_pixels=hi)
        if min(ref) < 28:  # qwen-vl-utils can return a zero side at extreme ratios; ours keeps one grid step
            continue
        assert smart_resize(h, w, factor=28, min_pixels=lo, max_pixels=hi) == ref, (h, w, lo, hi)
