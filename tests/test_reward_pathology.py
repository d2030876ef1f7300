from pathlib import Path

import pytest

from mmrl.processors.geometry import smart_resize
from mmrl.processors.image import load_image, prepare_image
from mmrl.rewards.pathology import as_polygon, mask_iou, pathology, question_type, split_answer
from mmrl.types import RewardInput

DATA = Path(__file__).resolve().parent / "data"
IHC = DATA / "pathology_smoke" / "ihc.png"
SLIDE = DATA / "pathology_smoke" / "cmu_small_region.svs"


def _x(
    answer, reference, think="<think>Brown DAB staining marks the nuclei.</think>", images=None, **metadata
):
    return RewardInput(
        id="path-1",
        response=f"{think}<answer>{answer}</answer>",
        reference=reference,
        images=images or [],
        metadata=metadata,
    )


def _score(x, **options):
    r = pathology([x], **options)[0]
    return pytest.approx(r.score), r.parts


def test_question_type_inference():
    assert question_type(_x("yes", "Yes")) == "yes_no"
    assert question_type(_x("B", "necrosis", choices=["fibrosis", "necrosis"])) == "multiple_choice"
    assert question_type(_x("x", "tumour budding")) == "open"
    assert question_type(_x("x", "yes", question_type="open")) == "open"
    with pytest.raises(ValueError, match="sample 'path-1': metadata\\['question_type'\\] must be one of"):
        question_type(_x("x", "y", question_type="free"))


def test_yes_no_without_region_folds_the_region_weight_into_the_answer():
    assert _score(_x("Yes, the tumour invades the muscularis.", "yes")) == (
        1.0,
        {"answer": 1.0, "format": 1.0},
    )
    assert _score(_x("No.", "Yes")) == (0.1, {"answer": 0.0, "format": 1.0})
    assert _score(_x("It is hard to say, but no invasion is seen.", True)) == (
        0.1,
        {"answer": 0.0, "format": 1.0},
    )
    assert _score(_x("yes", "yes", think="")) == (0.9, {"answer": 1.0, "format": 0.0})


def test_multiple_choice_letter_or_option_text():
    choices = ["fibrosis", "necrosis", "haemorrhage"]
    assert _score(_x("(B)", "necrosis", choices=choices)) == (1.0, {"answer": 1.0, "format": 1.0})
    assert _score(_x("haemorrhage", "C", choices=choices)) == (1.0, {"answer": 1.0, "format": 1.0})
    assert _score(_x("A", "C", choices=choices)) == (0.1, {"answer": 0.0, "format": 1.0})


def test_open_answer_em_then_f1():
    assert _score(_x("Lymphocytic infiltration.", "lymphocytic infiltration")) == (
        1.0,
        {"answer_em": 1.0, "answer_f1": 1.0, "answer": 1.0, "format": 1.0},
    )
    # tokens: [dense, lymphocytic, infiltration] vs [lymphocytic, infiltration]: P = 2/3, R = 1, F1 = 0.8
    assert _score(_x("dense lymphocytic infiltration", "lymphocytic infiltration")) == (
        0.9 * 0.8 + 0.1,
        {"answer_em": 0.0, "answer_f1": pytest.approx(0.8), "answer": pytest.approx(0.8), "format": 1.0},
    )


def test_region_box_in_model_pixels_on_the_ihc_image():
    """ihc.png is 512x512; the model saw it at 504x504. The predicted box [63, 63, 252, 252] maps to
    [64, 64, 256, 256]; the annotated region is [128, 128, 320, 320]. Rasterised, each box covers 193 x 193 pixels
    (edges included) and they share 129 x 129: IoU = 129^2 / (2 * 193^2 - 129^2)."""
    h, w = smart_resize(512, 512)
    assert (w, h) == (504, 504)
    meta = {"region": [128, 128, 320, 320], "image_sizes": [[512, 512]], "model_image_sizes": [[w, h]]}
    x = _x("Yes <box>[63, 63, 252, 252]</box>", "yes", images=[str(IHC)], **meta)
    iou = 129**2 / (2 * 193**2 - 129**2)
    assert _score(x) == (0.7 + 0.2 * iou + 0.1, {"answer": 1.0, "format": 1.0, "region": pytest.approx(iou)})


def test_region_is_clipped_to_the_real_image_grid():
    """Without metadata sizes the grid comes from the image file: a box running past the 512x512 image is clipped,
    so it matches a region that ends at the border; without any image it would not (112^2 / 301^2)."""
    answer = '{"answer": "yes", "box": [400, 400, 700, 700]}'
    on_image = _x(answer, "yes", images=[str(IHC)], region=[400, 400, 511, 511])
    no_image = _x(answer, "yes", region=[400, 400, 511, 511])
    assert _score(on_image)[1]["region"] == 1.0
    assert _score(no_image)[1]["region"] == pytest.approx(112**2 / 301**2)


def test_whole_slide_region_loads_at_base_level_and_clips_the_region():
    """An Aperio SVS (a tiled TIFF whose first page is the base level, then thumbnail, label and macro images)
    loads at its base level, 2220 x 2967, through the same loader as any image; the model sees it at 2212 x 2968
    (79 x 106 patches of 28). A box past the slide's bottom-right corner is clipped to the base level read from the
    file: [2100, 2900] to [2219, 2966] is the same 120 x 67 pixels as the annotated region; unclipped it covers
    301 x 201."""
    img = load_image(SLIDE, record_id="slide-1")
    assert (img.mode, img.size) == ("RGB", (2220, 2967))
    assert prepare_image(img, record_id="slide-1")[1].model_size == (2212, 2968)
    answer = "Yes <box>[2100, 2900, 2400, 3100]</box>"
    on_slide = _x(answer, "yes", images=[str(SLIDE)], region=[2100, 2900, 2219, 2966])
    no_image = _x(answer, "yes", region=[2100, 2900, 2219, 2966])
    assert _score(on_slide)[1]["region"] == 1.0
    assert _score(no_image)[1]["region"] == pytest.approx(120 * 67 / (301 * 201))


def test_polygon_marks_and_missing_or_malformed_marks():
    triangle = "[[0, 0], [100, 0], [0, 100]]"
    x = _x(f"Yes <polygon>{triangle}</polygon>", "yes", region=[0, 0, 100, 100], image_sizes=[[512, 512]])
    # the filled triangle has sum_{y=0..100} (101 - y) = 5151 pixels, the box 101^2 = 10201
    assert _score(x)[1]["region"] == pytest.approx(5151 / 10201)
    assert mask_iou(
        as_polygon([[0, 0], [100, 0], [0, 100]]), as_polygon([0, 0, 100, 100]), None
    ) == pytest.approx(5151 / 10201)
    unmarked = _x("Yes", "yes", region=[0, 0, 100, 100])
    assert _score(unmarked) == (0.8, {"answer": 1.0, "format": 1.0, "region": 0.0})
    malformed = _x("Yes <box>[0, 0, 100]</box>", "yes", region=[0, 0, 100, 100])
    assert _score(malformed) == (0.8, {"answer": 1.0, "format": 1.0, "region": 0.0})
    assert split_answer("<answer>Yes <box>[1, 2, 3, 4]</box> here</answer>") == ("Yes here", [1, 2, 3, 4])


def test_no_reference_means_does_not_apply():
    assert pathology([_x("Yes", None)])[0].score is None


def test_weights_are_options():
    x = _x("Yes", "yes", region=[0, 0, 10, 10])
    assert _score(x, answer_weight=0.5, region_weight=0.3, format_weight=0.2) == (
        0.7,
        {"answer": 1.0, "format": 1.0, "region": 0.0},
    )
    with pytest.raises(ValueError, match="sample 'path-1': metadata\\['region'\\] must be"):
        pathology([_x("Yes", "yes", region=[1, 2])])
