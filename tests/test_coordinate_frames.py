"""Coordinate frames of grounding rewards, per family (:mod:`mmrl.model.geometry`): a point or a box the model writes in its
family's frame (Qwen2-VL: 0-1000; Qwen2.5-VL: pixels of the resized image; Qwen3-VL and Qwen3.5: 0-1000; Gemma 3: model pixels, an
assumption) maps back onto the original screenshot, for the GUI reward, the pathology region IoU and the ScreenSpot
scorer alike, on screenshot-like sizes of several aspect ratios; ``model.coordinate_frame`` overrides the family's.

No training: the tiny checkpoints are built into a temporary folder (as in tests/test_families.py) and only their
processors are read, except one encode per family that checks the collector hands the frame to the rewards.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.config import ConfigError, ModelConfig, from_dict
from mmrl.eval import get_benchmark
from mmrl.eval.base import EvalItem
from mmrl.model.checkpoint_files import ModelView
from mmrl.model.policy import Policy
from mmrl.processors.geometry import COORDINATE_FRAMES, coordinate_frame, frame_to_original
from mmrl.rewards.gui import gui_action
from mmrl.rewards.pathology import pathology
from mmrl.train.collect import reward_inputs
from mmrl.types import RewardInput, Sample

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {  # family -> the frame its release answers in
    "qwen2_vl": "relative_1000",  # <|box_start|>(x1,y1),(x2,y2)<|box_end|> in [0, 1000)
    "qwen2_5_vl": "model_pixels",
    "qwen3_vl": "relative_1000",
    "qwen3_vl_moe": "relative_1000",
    "qwen3_5": "relative_1000",
    "qwen3_5_moe": "relative_1000",
    "gemma3": "model_pixels",  # no documented grounding format: the default, an assumption
    "gemma4": "model_pixels",  # (an assumption, as every model_pixels row below but Qwen2.5-VL's)
    "glm4v": "relative_1000",
    "glm4v_moe": "relative_1000",
    "internvl": "relative_1000",
    "llava_onevision": "relative_1",
    "idefics3": "model_pixels",
    "smolvlm": "model_pixels",
    "mistral3": "model_pixels",
    "llama4": "model_pixels",
}
# decimals a response writes in each frame (LLaVA's 0-1 boxes carry 3)
DIGITS = {"relative_1": 3}
SCREENS = [(1080, 2400), (1920, 1080), (800, 800)]  # (w, h): phone, desktop, square
BUDGET = (3136, 1280 * 28 * 28)  # a real run's pixel budget (mapping only; nothing is encoded at this size)
TARGETS = [(0.37, 0.61), (0.05, 0.93), (0.9, 0.02)]  # fractions of the width and height


def _view(tiny_family, family: str, frame: str | None = None) -> ModelView:
    return ModelView.of_model(
        {
            "path": str(tiny_family(family)),
            "min_pixels": BUDGET[0],
            "max_pixels": BUDGET[1],
            "coordinate_frame": frame,
        }
    )


def _click(x: float, y: float) -> str:
    return f"<think>t</think><answer>[{{'action': 'click', 'coordinate': [{x}, {y}]}}]</answer>"


def test_the_family_frame_is_read_from_the_checkpoint(tiny_family):
    from mmrl.tiny.build import FAMILIES as BUILT

    assert set(FAMILIES) == set(BUILT)  # every family build-tiny makes is tested here
    for family, frame in FAMILIES.items():
        model_type = json.loads((tiny_family(family) / "config.json").read_text())["model_type"]
        assert coordinate_frame(model_type) == frame == _view(tiny_family, family).frame
    assert COORDINATE_FRAMES["qwen3_vl_moe"] == COORDINATE_FRAMES["qwen3_5_moe"] == "relative_1000"
    assert coordinate_frame("some_new_vlm") == "model_pixels"
    with pytest.raises(ValueError, match="coordinate frame must be one of"):
        coordinate_frame("qwen3_vl", "pixels")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("size", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_click_in_the_family_frame_maps_back_and_hits(tiny_family, family, size):
    view, (w, h) = _view(tiny_family, family), size
    model = view.model_size(w, h)
    meta = view.metadata(w, h)
    assert meta["coordinate_frame"] == FAMILIES[family] and meta["model_image_sizes"] == [list(model)]
    # one frame unit in original pixels: what writing whole numbers in the frame may cost, half of it at most
    d = DIGITS.get(view.frame, 0)
    unit = (w / model[0], h / model[1]) if view.frame == "model_pixels" else (w / 1000, h / 1000)
    for fx, fy in TARGETS:
        ox, oy = fx * w, fy * h
        x, y = view.to_frame(ox, oy, w, h)
        assert frame_to_original(x, y, view.frame, (w, h), model) == pytest.approx((ox, oy), abs=1e-6)
        back = frame_to_original(round(x, d + 1), round(y, d + 1), view.frame, (w, h), model)
        assert abs(back[0] - ox) <= 1 and abs(back[1] - oy) <= 1
        back = frame_to_original(round(x, d), round(y, d), view.frame, (w, h), model)
        assert abs(back[0] - ox) <= unit[0] / 2 + 1e-9 and abs(back[1] - oy) <= unit[1] / 2 + 1e-9
        box = [ox - 20, oy - 20, ox + 20, oy + 20]  # a 40 px button around the target
        far = view.to_frame(ox + 100 if ox + 100 < w else ox - 100, oy, w, h)  # 80 px beside the box
        hit_xy, far_xy = (round(x, d), round(y, d)), (round(far[0], d), round(far[1], d))
        batch = [
            RewardInput("hit", _click(*hit_xy), {"action": "click", "bbox": box}, metadata=meta),
            RewardInput("miss", _click(*far_xy), {"action": "click", "bbox": box}, metadata=meta),
        ]
        hit, miss = gui_action(batch)
        assert hit.parts["coord"] == 1.0 and hit.score == 3.0
        assert miss.parts["coord"] == 0.0


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("size", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_box_in_the_family_frame_is_the_annotated_region(tiny_family, family, size):
    view, (w, h) = _view(tiny_family, family), size
    region = [0.2 * w, 0.3 * h, 0.55 * w, 0.5 * h]
    x1, y1 = view.to_frame(region[0], region[1], w, h)
    x2, y2 = view.to_frame(region[2], region[3], w, h)
    mark = [round(v, DIGITS.get(view.frame, 0) + 1) for v in (x1, y1, x2, y2)]
    response = f"<think>t</think><answer>tumour <box>{mark}</box></answer>"
    meta = {**view.metadata(w, h), "region": region, "question_type": "open"}
    (res,) = pathology([RewardInput("p", response, "tumour", metadata=meta)])
    assert res.parts["region"] > 0.99 and res.parts["answer"] == 1.0
    # read in the other family's frame, the same numbers land elsewhere
    other = "model_pixels" if view.frame == "relative_1000" else "relative_1000"
    (wrong,) = pathology([RewardInput("p", response, "tumour", metadata={**meta, "coordinate_frame": other})])
    assert wrong.parts["region"] < 0.5


@pytest.mark.parametrize("family", FAMILIES)
def test_the_screenspot_scorer_agrees_with_the_reward(tiny_family, family):
    model = ModelConfig(path=str(tiny_family(family)), min_pixels=BUDGET[0], max_pixels=BUDGET[1])
    bench = get_benchmark("screenspot", {}, model)
    assert bench.frame == FAMILIES[family]
    view = _view(tiny_family, family)
    for w, h in SCREENS:
        bbox = [0.3 * w, 0.4 * h, 60.0, 30.0]  # [x, y, w, h]
        item = EvalItem(
            "s", Sample("s", [{"role": "user", "content": "q"}]), {"image_size": [w, h], "bbox": bbox}
        )
        ox, oy = bbox[0] + 30, bbox[1] + 15
        x, y = view.to_frame(ox, oy, w, h)
        x, y = round(x, DIGITS.get(view.frame, 0)), round(y, DIGITS.get(view.frame, 0))
        score = bench.judge(item, bench.extract(item, f"({x}, {y})"))
        assert score.correct
        meta = view.metadata(w, h)
        (reward,) = gui_action(
            [
                RewardInput(
                    "s",
                    _click(x, y),
                    {"action": "click", "bbox": bbox[:2] + [bbox[0] + 60, bbox[1] + 30]},
                    metadata=meta,
                )
            ]
        )
        assert reward.parts["coord"] == 1.0
        mapped = frame_to_original(x, y, FAMILIES[family], (w, h), tuple(meta["model_image_sizes"][0]))
        assert score.normalized == pytest.approx(list(mapped), abs=1e-9)


def test_the_override_changes_the_frame(tiny_family):
    assert (
        from_dict(ModelConfig, {"coordinate_frame": "original_pixels"}).coordinate_frame == "original_pixels"
    )
    with pytest.raises(ConfigError):
        from_dict(ModelConfig, {"coordinate_frame": "pixels"})
    w, h = 1920, 1080
    for family, frame in FAMILIES.items():
        for override in ("model_pixels", "relative_1000", "original_pixels"):
            view = _view(tiny_family, family, override)
            assert view.frame == override
            model = ModelConfig(
                path=str(tiny_family(family)),
                min_pixels=BUDGET[0],
                max_pixels=BUDGET[1],
                coordinate_frame=override,
            )
            bench = get_benchmark("screenspot", {}, model)
            assert bench.frame == override
            item = EvalItem("s", Sample("s", []), {"image_size": [w, h], "bbox": [500.0, 500.0, 40.0, 40.0]})
            x, y = view.to_frame(520, 520, w, h)
            assert bench.judge(item, [x, y]).normalized == pytest.approx([520, 520])
        assert _view(tiny_family, family).frame == frame
    # Qwen2.5-VL told it writes 0-1000: (500, 500) is the screen's centre, not a point near its top-left
    meta = _view(tiny_family, "qwen2_5_vl", "relative_1000").metadata(w, h)
    (r,) = gui_action(
        [RewardInput("c", _click(500, 500), {"action": "click", "point": [960, 540]}, metadata=meta)]
    )
    assert r.parts["coord"] == 1.0


@pytest.mark.parametrize("family", FAMILIES)
def test_the_collector_gives_rewards_the_policy_frame(tiny_family, family, tmp_path):
    """One encode per family: the prompt's model size is the view's, and reward_inputs carries the frame."""
    path = tmp_path / "phone.png"
    a = np.full((2400, 1080, 3), 245, np.uint8)
    a[1400:1500, 300:700] = (30, 120, 220)
    Image.fromarray(a).save(path)
    lo, hi = (4 * 32 * 32, 16 * 32 * 32) if family in ("qwen3_vl", "qwen3_5") else (4 * 28 * 28, 16 * 28 * 28)
    for override in (None, "original_pixels"):
        cfg = ModelConfig(
            path=str(tiny_family(family)), min_pixels=lo, max_pixels=hi, coordinate_frame=override
        )
        policy = Policy.from_pretrained(cfg)
        content = [{"type": "image"}, {"type": "text", "text": "Tap the blue button."}]
        sample = Sample("s", [{"role": "user", "content": content}], images=[str(path)])
        prompt = policy.encode(sample)
        (ri,) = reward_inputs(sample, prompt, ["x"], [1])
        assert ri.metadata["coordinate_frame"] == (override or FAMILIES[family]) == policy.coordinate_frame
        view = ModelView.of_model(cfg)
        assert ri.metadata["model_image_sizes"] == [view.model_size(1080, 2400)]
        assert ri.metadata["image_sizes"] == [(1080, 2400)]


def test_a_hub_id_is_read_from_the_local_cache(tiny_family, tmp_path, monkeypatch):
    """A run naming a hub id gets its family's frame and geometry from the HF cache (no network); an id in neither
    a folder nor the cache knows no model: the 28 px grid in model pixels."""
    import shutil

    from huggingface_hub import constants

    snap = tmp_path / "models--org--tiny-qwen3-vl" / "snapshots" / "abc"
    shutil.copytree(tiny_family("qwen3_vl"), snap)
    (tmp_path / "models--org--tiny-qwen3-vl" / "refs").mkdir()
    (tmp_path / "models--org--tiny-qwen3-vl" / "refs" / "main").write_text("abc")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    view = ModelView.of_model({"path": "org/tiny-qwen3-vl"})
    assert view.frame == "relative_1000" and view.geometry.factor == 32
    unknown = ModelView.of_model({"path": "org/not-downloaded", "min_pixels": 3136, "max_pixels": 3136})
    assert unknown.geometry is None and unknown.frame == "model_pixels"
    assert unknown.model_size(300, 200) == (56, 28)
