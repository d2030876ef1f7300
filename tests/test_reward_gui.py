import json

import pytest

from mmrl.processors.geometry import model_to_original, smart_resize
from mmrl.rewards.gui import gui_action, parse_action
from mmrl.types import RewardInput

# A 1920x1080 screenshot seen by the model at max_pixels = 1280 * 28 * 28: smart_resize gives 1316x728.
ORIGINAL = [1920, 1080]
MODEL_H, MODEL_W = smart_resize(1080, 1920, max_pixels=1280 * 28 * 28)
SIZES = {"image_sizes": [ORIGINAL], "model_image_sizes": [[MODEL_W, MODEL_H]]}
THINK = "<think>The settings icon is at the top right.</think>"


def _x(answer, reference, metadata=None, think=THINK):
    return RewardInput(
        id="ui-1", response=f"{think}<answer>{answer}</answer>", reference=reference, metadata=metadata or {}
    )


def _score(x, **options):
    r = gui_action([x], **options)[0]
    return r.score, r.parts


def test_model_size_is_a_real_resize():
    assert (MODEL_W, MODEL_H) == (1316, 728)
    assert model_to_original(446, 236, ORIGINAL, (MODEL_W, MODEL_H)) == pytest.approx(
        (650.70, 350.11), abs=0.01
    )


def test_ui_r1_correct_click_after_mapping():
    ref = {"action": "click", "bbox": [600, 300, 700, 400]}
    x = _x("[{'action': 'click', 'coordinate': [446, 236]}]", ref, SIZES)
    assert _score(x) == (3.0, {"type": 1.0, "coord": 1.0, "text": 1.0, "format": 1.0})


def test_click_inside_box_in_model_pixels_maps_outside():
    # (650, 350) lies inside [600, 300, 700, 400] if read as original pixels, but the model saw a 1316x728 image:
    # it maps to (948.3, 519.2), outside the box.
    ref = {"action": "click", "bbox": [600, 300, 700, 400]}
    x = _x("[{'action': 'click', 'coordinate': [650, 350]}]", ref, SIZES)
    assert _score(x) == (2.0, {"type": 1.0, "coord": 0.0, "text": 1.0, "format": 1.0})
    assert _score(_x("[{'action': 'click', 'coordinate': [650, 350]}]", ref))[1]["coord"] == 1.0  # identity


def test_near_miss_just_outside_the_box():
    ref = {"action": "click", "bbox": [100, 200, 300, 260]}
    assert _score(_x("[{'action': 'click', 'coordinate': [301, 230]}]", ref))[1]["coord"] == 0.0
    assert (
        _score(_x("[{'action': 'click', 'coordinate': [300, 230]}]", ref))[1]["coord"] == 1.0
    )  # edge counts
    near = _x("[{'action': 'click', 'coordinate': [301, 230]}]", ref)
    assert _score(near, scheme="gui_r1") == (
        pytest.approx(0.2),
        {"type": 1.0, "coord": 0.0, "text": 1.0, "format": 1.0, "accuracy": 0.0},
    )


def test_wrong_type():
    ref = {"action": "click", "bbox": [600, 300, 700, 400]}
    x = _x("[{'action': 'scroll', 'coordinate': [446, 236]}]", ref, SIZES)
    assert _score(x) == (1.0, {"type": 0.0, "coord": 0.0, "text": 1.0, "format": 1.0})
    assert _score(x, scheme="gui_r1")[0] == pytest.approx(0.2)


def test_malformed_json():
    ref = {"action": "click", "bbox": [600, 300, 700, 400]}
    x = _x("[{'action': 'click', 'coordinate': [446, 236]}", ref, SIZES)
    assert _score(x) == (0.0, {"type": 0.0, "coord": 0.0, "text": 0.0, "format": 0.0})
    assert _score(x, scheme="gui_r1") == (
        0.0,
        {"type": 0.0, "coord": 0.0, "text": 0.0, "format": 0.0, "accuracy": 0.0},
    )


def test_missing_think_costs_format_only():
    ref = {"action": "click", "bbox": [600, 300, 700, 400]}
    x = _x('{"action": "click", "coordinate": [446, 236]}', ref, SIZES, think="")
    assert _score(x) == (2.0, {"type": 1.0, "coord": 1.0, "text": 1.0, "format": 0.0})


def test_gui_r1_point_radius_and_schema():
    ref = {"action": "click", "point": [500, 500]}
    hit = _x("[{'action': 'click', 'point': [639, 500], 'input_text': 'no input text'}]", ref)
    miss = _x("[{'action': 'click', 'point': [641, 500], 'input_text': 'no input text'}]", ref)
    assert _score(hit, scheme="gui_r1") == (
        pytest.approx(1.0),
        {"type": 1.0, "coord": 1.0, "text": 1.0, "format": 1.0, "accuracy": 1.0},
    )
    assert _score(miss, scheme="gui_r1")[0] == pytest.approx(0.2)
    assert _score(miss, scheme="gui_r1", point_radius=150.0)[0] == pytest.approx(1.0)


def test_gui_r1_text_f1_and_their_reference_keys():
    ref = json.dumps({"action": "type", "gt_bbox": [120.0, 80.0], "input_text": "weather in Paris tomorrow"})
    good = _x("[{'action': 'type', 'point': [0, 0], 'input_text': 'weather Paris'}]", ref)  # F1 = 2/3
    bad = _x("[{'action': 'type', 'point': [0, 0], 'input_text': 'hello world'}]", ref)
    assert _score(good, scheme="gui_r1") == (
        pytest.approx(1.0),
        {"type": 1.0, "coord": 1.0, "text": 1.0, "format": 1.0, "accuracy": 1.0},
    )
    assert _score(bad, scheme="gui_r1") == (
        pytest.approx(0.2),
        {"type": 1.0, "coord": 1.0, "text": 0.0, "format": 1.0, "accuracy": 0.0},
    )
    assert _score(good, scheme="gui_r1", text_f1_threshold=0.7)[1]["text"] == 0.0


def test_non_pointing_action_and_parse_forms():
    assert (
        _score(_x("[{'action': 'navigate_back', 'coordinate': [0, 0]}]", {"action": "navigate_back"}))[0]
        == 3.0
    )
    parsed = parse_action(
        '<answer>[{"action": "Click", "coordinate": [1.5, 2]}, {"action": "scroll"}]</answer>'
    )
    assert (parsed.action, parsed.point, parsed.text) == ("click", (1.5, 2.0), None)
    assert parse_action("<answer>click at (3, 4)</answer>") is None
    assert gui_action([_x("[{'action': 'click', 'coordinate': [1, 2]}]", None)])[0].score is None
    with pytest.raises(ValueError, match="sample 'ui-1': GUI reference must be a dict"):
        gui_action([_x("[{'action': 'click', 'coordinate': [1, 2]}]", [1, 2, 3, 4])])
