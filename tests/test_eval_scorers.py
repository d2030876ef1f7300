"""Scorers of the benchmark families other than MathVista, the shared extraction rules, pass@k, prediction files and
the paired bootstrap, on hand-computed cases and the PubTabNet reference TEDS (tests/data/pubtabnet)."""

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from mmrl.config import ModelConfig
from mmrl.eval import EvalError, get_benchmark, load_benchmark, score_predictions
from mmrl.eval.base import FAMILIES, EvalItem
from mmrl.eval.compare import paired_bootstrap
from mmrl.eval.extract import last_boxed, screen_point
from mmrl.eval.runner import Generation, split_overrides
from mmrl.eval.scoring import expected_max, pass_ks, read_predictions
from mmrl.eval.table import pubtabnet_html
from mmrl.processors.geometry import smart_resize
from mmrl.processors.image import load_image, prepare_image
from mmrl.rewards.latex_table_html import latex_to_html
from mmrl.types import Sample

DATA = Path(__file__).parent / "data"
EVAL = DATA / "eval"


def _item(fields: dict, rid: str = "x") -> EvalItem:
    return EvalItem(rid, Sample(rid, [{"role": "user", "content": "q"}]), fields)


# ------------------------------------------------------------------ shared rules and metrics
def test_last_boxed_keeps_nested_braces():
    assert last_boxed("first \\boxed{1} then \\boxed{\\frac{3}{4}} done") == "\\frac{3}{4}"
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{\\sqrt{2") == "\\sqrt{2"  # cut off by the token limit: what is there


@pytest.mark.parametrize(
    "response, point",
    [
        ('[{"bbox_2d": [10, 20, 30, 60], "label": "OK"}]', (20.0, 40.0)),
        ('{"point_2d": [12, 34]}', (12.0, 34.0)),
        ("<answer>[{'action': 'click', 'coordinate': [5, 7]}]</answer>", (5.0, 7.0)),
        ("<|box_start|>(100,200),(300,400)<|box_end|>", (200.0, 300.0)),
        ("Click at (41.5, 12).", (41.5, 12.0)),
        ("the element is at [1, 2, 3, 4]", (2.0, 3.0)),
        ("x=8, y=9", (8.0, 9.0)),
        ("I cannot find it.", None),
    ],
)
def test_screen_point_formats(response, point):
    assert screen_point(response) == point


def test_pass_at_k_is_the_expected_best_of_k_subsets():
    scores = [0.0, 1.0, 0.0, 0.25, 1.0]
    for k in range(1, 6):
        brute = np.mean([max(c) for c in itertools.combinations(scores, k)])
        assert expected_max(scores, k) == pytest.approx(brute)
    # 0/1 scores: Chen et al.'s 1 - C(n - c, k) / C(n, k)
    assert expected_max([1, 0, 0, 0], 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))
    assert pass_ks(8) == [1, 2, 4, 8] and pass_ks(6) == [1, 2, 4, 6] and pass_ks(1) == [1]


def test_score_predictions_with_k_samples():
    items = load_benchmark("pathvqa", EVAL / "pathvqa" / "test.parquet")
    responses = [["yes", "no", "Yes."], ["no", "no", "maybe"], ["hematoxylin", "eosin", "the hematoxylin"],
                 ["IHC", "immunohistochemistry", "stain"]]  # fmt: skip
    rows, metrics = score_predictions("pathvqa", items, responses)
    # SQuAD normalisation drops articles: "the hematoxylin" is an exact match
    assert [r["correct"] for r in rows] == [[True, False, True], [True, True, False], [True, False, True],
                                           [False, True, False]]  # fmt: skip
    assert metrics["samples"] == 3
    assert metrics["accuracy"] == pytest.approx(np.mean([2 / 3, 2 / 3, 2 / 3, 1 / 3]))
    assert metrics["mean@3"] == metrics["accuracy"]
    assert metrics["pass@k"]["pass@1"] == pytest.approx(metrics["accuracy"])
    assert metrics["pass@k"]["pass@3"] == 1.0
    assert metrics["breakdowns"]["answer_type"]["yes_no"] == {"accuracy": pytest.approx(2 / 3), "n": 2}


# ------------------------------------------------------------------ pathvqa
def test_pathvqa_yes_no_and_open_answers():
    bench = get_benchmark("pathvqa")
    yn = _item({"answer": "yes", "answer_type": "yes_no"})
    for response, ok in [("Yes, it is.", True), ("<answer>yes</answer>", True), ("No.", False),
                         ("It may be, I am not sure", False), ("Either yes or no.", False), ("", False)]:  # fmt: skip
        assert bench.judge(yn, bench.extract(yn, response)).correct is ok, response
    op = _item({"answer": "squamous cell carcinoma", "answer_type": "open"})
    s = bench.judge(op, bench.extract(op, "A squamous cell carcinoma."))
    assert s.correct and s.parts == {"exact_match": 1.0, "recall": 1.0, "f1": 1.0}
    s = bench.judge(op, bench.extract(op, "carcinoma of squamous type"))
    # tokens: pred {carcinoma, of, squamous, type}, ref {squamous, cell, carcinoma}: 2 in common
    assert not s.correct
    assert s.parts["recall"] == pytest.approx(2 / 3)
    assert s.parts["f1"] == pytest.approx(2 * (2 / 4) * (2 / 3) / (2 / 4 + 2 / 3))


def test_pathvqa_embedded_images_load():
    items = load_benchmark("pathvqa", EVAL / "pathvqa" / "test.parquet")
    assert [it.fields["answer_type"] for it in items] == ["yes_no", "yes_no", "open", "open"]
    assert load_image(items[0].sample.images[0]).size == (192, 192)


# ------------------------------------------------------------------ mathv
def test_mathv_extraction_and_equivalence():
    bench = get_benchmark("mathv")
    free = _item({"answer": "0.5", "options": []})
    assert bench.judge(free, bench.extract(free, "so the total is \\boxed{\\frac{1}{2}}")).correct
    assert bench.judge(free, bench.extract(free, "Therefore, the answer is 1/2.")).correct
    assert not bench.judge(free, bench.extract(free, "\\boxed{2}")).correct
    mc = _item({"answer": "B", "options": ["$3$", "$\\frac{1}{2}$", "$7$"]})
    assert bench.judge(mc, bench.extract(mc, "\\boxed{B}")).correct
    assert bench.judge(mc, bench.extract(mc, "\\boxed{(b)}")).correct
    assert bench.judge(mc, bench.extract(mc, "\\boxed{0.5}")).correct  # the gold option's value
    assert not bench.judge(mc, bench.extract(mc, "\\boxed{C}")).correct


def test_mathv_prediction_file_uses_model_answer(tmp_path):
    bench = get_benchmark("mathv")
    items = bench.load(EVAL / "mathv" / "testmini.jsonl").items
    preds = tmp_path / "out.jsonl"
    lines = [{"id": "1", "response": "I see \\boxed{3}"}, {"id": "2", "response": "...", "model_answer": "A"},
             {"id": "3", "response": "\\boxed{2}"}, {"id": "4", "response": "\\boxed{3}", "model_answer": "4"}]  # fmt: skip
    preds.write_text("".join(json.dumps(x) + "\n" for x in lines))
    responses, given = read_predictions(preds, bench, items)
    rows, metrics = score_predictions(bench, items, [r[0] for r in responses])
    assert [r["correct"] for r in rows] == [True, False, True, True]  # item 2 judged from its response "..."
    from mmrl.eval.scoring import score_rows

    rows = score_rows(bench, items, responses, given)
    assert [r["correct"] for r in rows] == [True, True, True, False]  # model_answer judged as given
    assert {"subject", "level"} <= set(metrics["breakdowns"])


# ------------------------------------------------------------------ screenspot
def test_screenspot_maps_model_pixels_back_and_includes_edges():
    model = ModelConfig(min_pixels=3136, max_pixels=100_000)
    bench = get_benchmark("screenspot", {"coords": "absolute"}, model)
    item = _item({"image_size": [1000, 500], "bbox": [100.0, 50.0, 200.0, 100.0]})
    mh, mw = smart_resize(500, 1000, min_pixels=3136, max_pixels=100_000)
    sx, sy = mw / 1000, mh / 500
    # the box's corners, in model pixels, are inside (edges count); a pixel beyond is outside
    assert bench.judge(item, [100 * sx, 50 * sy]).correct
    assert bench.judge(item, [300 * sx, 150 * sy]).correct
    assert not bench.judge(item, [301 * sx, 150 * sy]).correct
    assert not bench.judge(item, None).correct
    norm = get_benchmark("screenspot", {"coords": "normalized_1000"}, model)
    assert norm.judge(item, [200, 200]).correct and not norm.judge(item, [50, 200]).correct
    frac = get_benchmark("screenspot", {"coords": "normalized"}, model)
    assert frac.judge(item, [0.3, 0.3]).normalized == pytest.approx([300.0, 150.0])


def test_screenspot_model_size_matches_the_policy_resize():
    """Scoring recomputes the model-input size; it must be the size prepare_image (used by the policy) gives."""
    model = ModelConfig(min_pixels=3136, max_pixels=50_176)
    bench = get_benchmark("screenspot", {}, model)
    loaded = bench.load(EVAL / "screenspot")
    assert [it.fields["group"] for it in loaded.items] == [
        "desktop/text", "desktop/icon", "mobile/text", "mobile/icon", "web/text", "web/icon"
    ]  # fmt: skip
    for it in loaded.items:
        _, geom = prepare_image(load_image(it.sample.images[0]), min_pixels=3136, max_pixels=50_176)
        w, h = it.fields["image_size"]
        assert geom.original_size == (w, h)
        x, y, bw, bh = it.fields["bbox"]
        cx, cy = (x + bw / 2) * geom.model_size[0] / w, (y + bh / 2) * geom.model_size[1] / h
        assert bench.judge(it, bench.extract(it, f"({cx:.1f}, {cy:.1f})")).correct


def test_screenspot_bad_record_names_it(tmp_path):
    (tmp_path / "screenspot_web.json").write_text(json.dumps([{"img_filename": "a.png", "instruction": "x",
                                                               "bbox": [1, 2, 3]}]))  # fmt: skip
    with pytest.raises(EvalError, match=r"screenspot_web.json item 0: bbox must be \[x, y, w, h\]"):
        get_benchmark("screenspot").load(tmp_path)


# ------------------------------------------------------------------ videoqa
def test_videoqa_layouts_and_letters():
    bench = get_benchmark("videoqa")
    items = {it.id: it for it in bench.load(EVAL / "videoqa").items}
    assert set(items) == {"clip1-1", "clip2-1", "clip1-2", "object_colour-0"}
    mvbench = items["object_colour-0"]
    assert mvbench.fields["answer"] == "B" and mvbench.fields["task_type"] == "object_colour"
    assert mvbench.sample.videos[0].endswith("videos/clip2.mp4")
    assert "B. red" in mvbench.sample.prompt_text
    mme = items["clip2-1"]
    assert mme.fields["options"][2] == "From top to bottom." and mme.fields["answer"] == "C"
    for response, ok in [("C", True), ("The best answer is: C", True), ("(C) From top to bottom.", True),
                         ("c", True), ("B", False), ("From top to bottom.", True), ("I don't know", False)]:  # fmt: skip
        assert bench.judge(mme, bench.extract(mme, response)).correct is ok, response


# ------------------------------------------------------------------ table
def test_pubtabnet_annotation_becomes_html():
    ann = {
        "structure": {
            "tokens": [
                "<thead>",
                "<tr>",
                "<td>",
                "</td>",
                "<td",
                ' colspan="2"',
                ">",
                "</td>",
                "</tr>",
                "</thead>",
            ]
        },  # fmt: skip
        "cells": [{"tokens": ["<b>", "A", "</b>"]}, {"tokens": ["x", "&", "y"]}],
    }
    assert pubtabnet_html(ann) == (
        '<html><body><table><thead><tr><td><b>A</b></td><td colspan="2">x&amp;y</td></tr></thead></table>'
        "</body></html>"
    )


def test_table_teds_reproduces_pubtabnet_reference(tmp_path):
    """``--predictions`` on PubTabNet's own files: per-table TEDS and TEDS-S equal IBM's metric (expected_teds)."""
    bench = get_benchmark("table", {"visual": "none"})
    bench.check_media = False  # only one of the 20 images is in the repository; scoring does not need them
    items = bench.load(DATA / "pubtabnet" / "sample_gt.json").items
    responses, given = read_predictions(DATA / "pubtabnet" / "sample_pred.json", bench, items)
    rows, metrics = score_predictions(bench, items, [r[0] for r in responses])
    expected = json.loads((DATA / "pubtabnet" / "expected_teds.json").read_text())
    for r in rows:
        assert r["correct"] == pytest.approx(expected[r["id"]]["teds"], abs=1e-6)
        assert r["parts"]["teds_s"] == pytest.approx(expected[r["id"]]["teds_structure"], abs=1e-6)
    assert metrics["accuracy"] == pytest.approx(0.89968, abs=1e-5)
    assert metrics["parts"]["teds_s"] == pytest.approx(0.93610, abs=1e-5)


def test_table_latex_records_and_latex_predictions(tmp_path):
    latex = "\\begin{tabular}{cc}\\hline a & b \\\\ \\multicolumn{2}{c}{c} \\\\ \\hline\\end{tabular}"
    (tmp_path / "img.png").write_bytes(
        (DATA / "pubtabnet" / "mini_val" / "PMC5755158_010_01.png").read_bytes()
    )
    (tmp_path / "t.jsonl").write_text(json.dumps({"id": "t1", "image": "img.png", "latex": latex,
                                                  "category": "complex"}) + "\n")  # fmt: skip
    bench = get_benchmark("table", {"visual": "none"})
    items = bench.load(tmp_path / "t.jsonl").items
    swapped = "\\begin{tabular}{cc} a & b \\\\ c & d \\\\ \\end{tabular}"
    rows, metrics = score_predictions(bench, items, [f"```latex\n{latex}\n```"])
    assert rows[0]["correct"] == 1.0 and rows[0]["parts"]["teds_s"] == 1.0
    rows, _ = score_predictions(bench, items, [swapped])
    assert 0 < rows[0]["parts"]["teds_s"] < 1
    rows, _ = score_predictions(bench, items, [f"<answer>{latex_to_html(latex)}</answer>"])
    assert rows[0]["correct"] == 1.0  # an HTML answer is read as HTML
    rows, _ = score_predictions(bench, items, ["no table here"])
    assert rows[0]["correct"] == 0.0 and rows[0]["parts"]["teds_s"] == 0.0
    assert metrics["breakdowns"]["category"]["complex"]["n"] == 1


@pytest.mark.tex
def test_table_compile_and_visual_parts(tmp_path):
    (tmp_path / "img.png").write_bytes(
        (DATA / "pubtabnet" / "mini_val" / "PMC5755158_010_01.png").read_bytes()
    )
    latex = "\\begin{tabular}{cc} Week & Mean \\\\ 15 & 0.17 \\\\ \\end{tabular}"
    (tmp_path / "t.json").write_text(json.dumps([{"id": "t1", "image": "img.png", "latex": latex}]))
    items = load_benchmark("table", tmp_path / "t.json")
    responses = [
        latex,
        "\\begin{tabular}{cc} Week & Mean \\\\ 16 & 0.18 \\\\ \\end{tabular}",
        "\\begin{tabular}{",
    ]
    rows, metrics = score_predictions("table", items * 3, responses, options={"visual": "cw_ssim"})
    exact, close, broken = (r["parts"] for r in rows)
    assert exact["compile"] == 1.0 and exact["cw_ssim"] == 1.0
    assert close["compile"] == 1.0 and 0.3 < close["cw_ssim"] < 1.0
    assert broken["compile"] == 0.0 and broken["cw_ssim"] == 0.0
    assert metrics["parts"]["compile"] == pytest.approx(2 / 3)


# ------------------------------------------------------------------ settings, prediction files and bootstrap
def test_settings_are_routed_by_name():
    pathvqa = type(get_benchmark("pathvqa"))
    gen, model, options = split_overrides(
        ["temperature=0.7", "max_new_tokens=12", "system_prompt=null", "max_pixels=1000", "dtype=bfloat16",
         "prompt={question} Short answer: yes: no"], pathvqa)  # fmt: skip
    assert gen == {"temperature": 0.7, "max_new_tokens": 12, "system_prompt": None}
    assert model == {"max_pixels": 1000, "dtype": "bfloat16"}
    assert options == {"prompt": "{question} Short answer: yes: no"}  # kept as text, not read as YAML
    with pytest.raises(EvalError, match="unknown setting 'max_pixel'; did you mean 'max_pixels'"):
        split_overrides(["max_pixel=5"], pathvqa)
    with pytest.raises(EvalError, match="must look like key=value"):
        split_overrides(["temperature"], pathvqa)


@pytest.mark.parametrize("name", FAMILIES)
def test_setting_names_never_collide(name):
    """Settings are routed by name alone, so generation, model and benchmark option names must be disjoint."""
    groups = [Generation, ModelConfig, type(get_benchmark(name)).Options]
    names = [{f.name for f in dataclasses.fields(g)} for g in groups]
    assert not (names[0] & names[1]) and not (names[0] & names[2]) and not (names[1] & names[2])


def test_prediction_file_must_cover_the_items(tmp_path):
    bench = get_benchmark("pathvqa")
    items = bench.load(EVAL / "pathvqa" / "test.parquet").items
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "0", "response": "yes"}) + "\n")
    with pytest.raises(EvalError, match=r"no prediction for 3 of 4 items \(first: '1'\)"):
        read_predictions(tmp_path / "p.jsonl", bench, items)


def test_paired_bootstrap_interval():
    rng = np.random.default_rng(1)
    difficulty = rng.random(400)
    a = (difficulty > 0.5).astype(float)  # the same items are hard for both systems
    b = a.copy()
    b[rng.choice(np.flatnonzero(a == 0), 40, replace=False)] = 1.0  # B fixes 40 items
    delta, lo, hi = paired_bootstrap(a, b, resamples=5000, seed=0)
    assert delta == pytest.approx(0.1)
    assert 0 < lo < 0.1 < hi < 0.2
    same = paired_bootstrap(a, a, resamples=1000)
    assert same == (0.0, 0.0, 0.0)
