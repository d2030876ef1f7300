"""The zoom env (mmrl/envs/zoom.py) and its data (recipes/zoom/data.py): action parsing, exact coordinate mapping per
frame, clamping, crop pixels, scoring, the call budget, state keys, a run in a pool worker, the builder's
determinism, and the legibility the tiny split is built for."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from mmrl.envs import EnvPool
from mmrl.envs.zoom import Invalid, ZoomEnv, parse_action
from mmrl.recipes.zoom.data import PAD, TARGET_FILL, TINY, _font, build, build_tiny, make_image
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[1]
W, H = 300, 200  # a non-square original image


@pytest.fixture(scope="module")
def image_path(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("zoom") / "noise.png"
    Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8)).save(path)
    return path


def _env(tmp_path: Path, image: Path, frame: str = "original_pixels", model=(W, H), answer="A7", **options):
    env = ZoomEnv(workdir=tmp_path / "ep", **options)
    meta = {"coordinate_frame": frame, "image_sizes": [[W, H]], "model_image_sizes": [list(model)]}
    meta["target_box"] = [100, 50, 120, 60]
    first = env.reset(Sample(id="z1", messages=[], images=[str(image)], answer=answer, metadata=meta))
    return env, first


TOOL = '<tool_call>{{"name": "zoom", "arguments": {{"bbox": {}}}}}</tool_call>'


@pytest.mark.parametrize(
    "text, expected",
    [
        (TOOL.format("[1, 2, 3, 4]"), ("zoom", (1, 2, 3, 4))),
        (
            '<tool_call>\n{"name": "zoom", "arguments": "{\\"bbox_2d\\": [1.5, 2, 3, 4]}"}\n',
            ("zoom", (1.5, 2, 3, 4)),
        ),
        (
            "<tool_call>{'name': 'zoom', 'arguments': {'bbox': [1, 2, 3, 4]}}</tool_call>",
            ("zoom", (1, 2, 3, 4)),
        ),
        ("zoom(10, 20, 30.5, 40)", ("zoom", (10, 20, 30.5, 40))),
        ("Let me look closer: zoom([10,20,30,40]).", ("zoom", (10, 20, 30, 40))),
        ("zoom(bbox=[10, 20, 30, 40])", ("zoom", (10, 20, 30, 40))),
        ("zoom((10, 20), (30, 40))", ("zoom", (10, 20, 30, 40))),
        ("ZOOM(-5, 2e1, 3, 4)", ("zoom", (-5, 20, 3, 4))),
        ("<answer> 42 </answer>", ("answer", "42")),
        ("The code is <answer>42", ("answer", "42")),
        # the first action wins; thoughts are not actions
        ("zoom(1, 2, 3, 4) then <answer>5</answer>", ("zoom", (1, 2, 3, 4))),
        ("<answer>5</answer> zoom(1, 2, 3, 4)", ("answer", "5")),
        (TOOL.format("[1, 2, 3, 4]") + TOOL.format("[5, 6, 7, 8]"), ("zoom", (1, 2, 3, 4))),
        ("<think>maybe zoom(1, 2, 3, 4)</think><answer>7</answer>", ("answer", "7")),
        ("I should zoom(1, 2, 3, 4)</think>zoom(5, 6, 7, 8)", ("zoom", (5, 6, 7, 8))),
    ],
)
def test_parse_action(text, expected):
    kind, value = parse_action(text)
    assert (kind, tuple(value) if kind == "zoom" else value) == expected


@pytest.mark.parametrize(
    "text, why",
    [
        ("I cannot tell", "no action found"),
        ("zoomed(1, 2, 3, 4)", "no action found"),
        ("<think>zoom(1, 2, 3, 4)</think>", "no action found"),
        ("zoom(1, 2, 3)", "zoom takes 4 numbers"),
        ("zoom(a, b, c, d)", "zoom takes 4 numbers"),
        ("zoom(1, 2, 3, 4", "no closing parenthesis"),
        ("<tool_call>not json</tool_call>", "not a JSON object"),
        (
            '<tool_call>{"name": "crop", "arguments": {"bbox": [1, 2, 3, 4]}}</tool_call>',
            "unknown tool 'crop'",
        ),
        ('<tool_call>{"name": "zoom", "arguments": 5}</tool_call>', 'needs "arguments"'),
        (TOOL.format("[1, 2]"), "list of 4 numbers"),
        (TOOL.format('["1", "2", "3", "4"]'), "list of 4 numbers"),
        (TOOL.format("[true, 2, 3, 4]"), "list of 4 numbers"),
    ],
)
def test_parse_action_rejects(text, why):
    with pytest.raises(Invalid, match=why):
        parse_action(text)


@pytest.mark.parametrize(
    "frame, model, box",
    [
        ("original_pixels", (W, H), [75, 40, 150, 120]),
        ("model_pixels", (224, 140), [56, 28, 112, 84]),  # x * 300 / 224, y * 200 / 140: a non-uniform scale
        ("relative_1000", (224, 140), [250, 200, 500, 600]),
        ("relative_1", (224, 140), [0.25, 0.2, 0.5, 0.6]),
    ],
)
def test_boxes_map_exactly_from_each_frame_and_the_crop_is_the_original_region(
    tmp_path, image_path, frame, model, box
):
    env, first = _env(tmp_path, image_path, frame, model)
    assert first.text == "" and first.images == []
    r = env.step(TOOL.format(json.dumps(box)))
    assert not r.done and r.reward == 0.0 and r.info["box"] == [75, 40, 150, 120]
    shown = json.loads(r.observation.text.split(" of ", 1)[1].split(" (", 1)[0])
    assert shown == pytest.approx(box)  # the box is echoed in the model's own frame
    crop = Image.open(r.observation.images[0])
    assert crop.format == "PNG" and Path(r.observation.images[0]).parent == tmp_path / "ep"
    assert np.array_equal(np.asarray(crop), np.asarray(Image.open(image_path).crop((75, 40, 150, 120))))


@pytest.mark.parametrize(
    "box, expected",
    [
        ([-50, -20, 40, 30], [0, 0, 40, 30]),  # clamped to the image
        ([150, 120, 75, 40], [75, 40, 150, 120]),  # corners in any order
        ([280, 190, 400, 260], [280, 184, 300, 200]),  # clamped, then grown to 16 px inside the image
        ([100, 100, 100, 100], [92, 92, 108, 108]),  # a point: 16 x 16 about it
        ([10.2, 10.7, 30.1, 40.0], [10, 10, 31, 40]),  # floor of left/top, ceiling of right/bottom
    ],
)
def test_crop_boxes_are_clamped_and_at_least_min_crop_side(tmp_path, image_path, box, expected):
    env, _ = _env(tmp_path, image_path)
    assert env.step(f"zoom({', '.join(map(str, box))})").info["box"] == expected


def test_large_crops_are_downscaled_to_max_crop_pixels(tmp_path, image_path):
    env, _ = _env(tmp_path, image_path, max_crop_pixels=1000)
    r = env.step("zoom(0, 0, 100, 50)")
    assert Image.open(r.observation.images[0]).size == (44, 22)  # sqrt(1000 / 5000) of 100 x 50


@pytest.mark.parametrize(
    "action",
    [
        "",
        "zoom(1e400, 0, 1, 1)",
        TOOL.format("[NaN, 0, 1, 1]"),
        "zoom(400, 10, 500, 50)",  # wholly outside the image
        "zoom(" * 500,
        "<tool_call>" + "[" * 5000,
        "\x00\ud800 zoom(₁,₂,₃,₄)",
    ],
)
def test_garbage_is_an_invalid_action_not_an_exception(tmp_path, image_path, action):
    env, first = _env(tmp_path, image_path)
    r = env.step(action)
    assert not r.done and r.reward == 0.0 and r.info["invalid"] and r.info["calls"] == 1
    assert r.observation.text.startswith("invalid action: ") and "expected <tool_call>" in r.observation.text
    assert r.observation.images == [] and r.observation.state_key == first.state_key


def test_invalid_end_stops_the_episode_at_a_malformed_call(tmp_path, image_path):
    env, _ = _env(tmp_path, image_path, invalid="end")
    r = env.step("zoom(33 Dot Being How")
    assert r.done and r.reward == 0.0 and r.observation is None
    assert (
        r.info["invalid"] and r.info["reason"] == "invalid" and r.info["calls"] == 0 and not r.info["success"]
    )
    assert env.oracle() is None
    env, _ = _env(tmp_path, image_path, invalid="end")  # well-formed calls and answers are unaffected
    assert not env.step("zoom(0, 0, 100, 50)").done
    with pytest.raises(ValueError, match="'invalid' must be 'retry' or 'end'"):
        _env(tmp_path, image_path, invalid="skip")


def test_answer_scoring_penalty_and_floor(tmp_path, image_path):
    for options, zooms, answer, correct, reward in [
        ({}, 0, " a7. ", True, 1.0),  # SQuAD normalisation: case, punctuation, spaces
        ({}, 0, "A1", False, 0.0),
        ({"call_penalty": 0.25}, 2, "A7", True, 0.5),
        ({"call_penalty": 0.6}, 2, "A7", True, 0.0),  # floored at 0
        ({"call_penalty": 0.25}, 2, "B9", False, 0.0),
    ]:
        env, _ = _env(tmp_path, image_path, **options)
        for _ in range(zooms):
            env.step("zoom(0, 0, 50, 50)")
        r = env.step(f"<answer>{answer}</answer>")
        assert r.done and r.observation is None and r.reward == reward
        assert r.info == {
            "action": "answer",
            "correct": correct,
            "success": correct,  # the episode's verdict, also when the penalty floors the reward at 0
            "target_hit": correct,
            "calls": zooms,
            "reason": "answer",
        }


def test_max_calls_then_the_model_must_answer(tmp_path, image_path):
    env, _ = _env(tmp_path, image_path, max_calls=2)
    assert env.step("zoom(0, 0, 50, 50)").observation.text.endswith("(1 zoom left):")
    assert (
        "no zooms left: answer now" in env.step("nonsense").observation.text
    )  # invalid actions use calls too
    over = env.step("zoom(0, 0, 50, 50)")
    assert over.done and over.reward == 0.0 and over.info["reason"] == "max_calls" and over.info["calls"] == 2
    env, _ = _env(tmp_path, image_path, max_calls=2)
    env.step("zoom(0, 0, 50, 50)")
    env.step("zoom(0, 0, 50, 50)")
    assert env.step("<answer>A7</answer>").reward == 1.0


def test_state_keys_follow_the_view(tmp_path, image_path):
    env, first = _env(tmp_path, image_path)
    other, again = _env(tmp_path, image_path)
    assert first.state_key == again.state_key  # the same sample, the same start
    a = env.step("zoom(10, 10, 90, 90)").observation.state_key
    b = other.step("zoom(11, 11, 89, 90)").observation.state_key  # the same box on the 8 px grid
    c = env.step("zoom(40, 10, 120, 90)").observation.state_key
    assert a == b and len({first.state_key, a, c}) == 3
    assert env.step("garbage").observation.state_key == c


def test_zoom_hit_says_whether_the_crop_holds_the_target(tmp_path, image_path):
    env, _ = _env(tmp_path, image_path)  # target_box [100, 50, 120, 60]
    assert env.step("zoom(90, 40, 130, 70)").info["zoom_hit"] is True
    assert env.step("zoom(105, 40, 130, 70)").info["zoom_hit"] is False


@pytest.mark.parametrize(
    "frame, model",
    [
        ("original_pixels", (W, H)),
        ("model_pixels", (224, 140)),  # a non-uniform scale
        ("model_pixels", (50, 34)),  # 6 original px per model px: rounding alone would cut the target
        ("relative_1000", (224, 140)),
        ("relative_1", (224, 140)),
    ],
)
def test_the_oracle_zooms_on_the_target_through_the_envs_parsing_then_answers(
    tmp_path, image_path, frame, model
):
    env, _ = _env(tmp_path, image_path, frame, model, max_calls=2)  # target_box [100, 50, 120, 60]
    zoom = env.oracle()
    kind, box = parse_action(zoom)
    assert kind == "zoom" and zoom.startswith('<tool_call>{"name": "zoom", "arguments": {"bbox": [')
    digits = 3 if frame == "relative_1" else 0
    assert all(round(v, digits) == v for v in box)  # written at the precision the env writes boxes
    r = env.step(zoom)
    assert r.info["zoom_hit"] is True and r.info["target_hit"] is True
    left, top, right, bottom = r.info["box"]  # the target and a small margin, not the whole image
    assert right - left <= 20 + 2 * 4 + 2 * 6 + 1 and bottom - top <= 10 + 2 * 4 + 2 * 6 + 1
    assert env.oracle() == "<answer>A7</answer>"
    done = env.step(env.oracle())
    assert done.done and done.reward == 1.0 and done.info["target_hit"] is True
    assert env.oracle() is None


def test_target_hit_is_each_steps_correctness(tmp_path, image_path):
    env, _ = _env(tmp_path, image_path, max_calls=3)
    assert env.step("zoom(0, 0, 50, 50)").info["target_hit"] is False  # a zoom that misses
    assert env.step("garbage").info["target_hit"] is False
    assert env.oracle().startswith("<tool_call>")  # no zoom has held the target yet
    assert env.step("<answer>B8</answer>").info["target_hit"] is False
    env, _ = _env(tmp_path, image_path, max_calls=0)
    assert env.oracle() == "<answer>A7</answer>"  # no zoom left: the oracle answers at once
    env = ZoomEnv(workdir=tmp_path / "no-target")
    env.reset(Sample(id="z2", messages=[], images=[str(image_path)], answer="A7"))
    assert env.step("zoom(0, 0, 50, 50)").info["target_hit"] is False
    with pytest.raises(ValueError, match="sample 'z2': the zoom env's oracle needs metadata target_box"):
        env.oracle()


def test_reset_refuses_inconsistent_samples(tmp_path, image_path):
    env = ZoomEnv(workdir=tmp_path)
    with pytest.raises(ValueError, match="image_sizes\\[0\\] is \\[10, 10\\] but the image is 300x200"):
        env.reset(
            Sample(
                id="x",
                messages=[],
                images=[str(image_path)],
                answer="1",
                metadata={"image_sizes": [[10, 10]]},
            )
        )
    with pytest.raises(ValueError, match="needs an image"):
        env.reset(Sample(id="x", messages=[], answer="1"))


# -- the data ----------------------------------------------------------------------------------------------------


def test_builders_are_deterministic_and_record_the_target(tmp_path):
    a = build_tiny(tmp_path / "a", n_train=3, n_eval=2)
    b = build_tiny(tmp_path / "b", n_train=3, n_eval=2)
    assert a["train"].read_text() == b["train"].read_text() and a["eval"].read_text() == b["eval"].read_text()
    records = [json.loads(line) for line in a["train"].read_text().splitlines()]
    assert [r["id"] for r in records] == [
        "zoom-tiny-train-00000",
        "zoom-tiny-train-00001",
        "zoom-tiny-train-00002",
    ]
    for r in records:
        assert (tmp_path / "a" / r["images"][0]).read_bytes() == (
            tmp_path / "b" / r["images"][0]
        ).read_bytes()
        img = np.asarray(Image.open(tmp_path / "a" / r["images"][0]))
        x1, y1, x2, y2 = r["metadata"]["target_box"]
        assert img.shape == (336, 336, 3) and len(r["answer"]) == 2 and r["answer"].isdigit()
        assert tuple(img[y1 + 1, x1 + 1]) == TARGET_FILL  # the red box's corner
    full = build(tmp_path / "full", n_train=1, n_eval=1, size=(640, 480))
    rec = json.loads(full["train"].read_text())
    assert Image.open(tmp_path / "full" / rec["images"][0]).size == (640, 480) and len(rec["answer"]) == 4
    assert "up to 4 times" in rec["prompt"]


def test_zoom_episode_in_a_pool_worker(tmp_path):
    paths = build_tiny(tmp_path / "data", n_train=1, n_eval=1)
    rec = json.loads(paths["train"].read_text())
    x1, y1, x2, y2 = rec["metadata"]["target_box"]
    meta = {**rec["metadata"], "coordinate_frame": "model_pixels", "image_sizes": [[336, 336]]}
    meta["model_image_sizes"] = [[56, 56]]  # min_pixels = max_pixels = 3136
    sample = Sample(
        rec["id"], [], [str(tmp_path / "data" / rec["images"][0])], answer=rec["answer"], metadata=meta
    )
    box = [round(v / 6, 2) for v in (x1 - 8, y1 - 8, x2 + 8, y2 + 8)]  # 336 -> 56: a factor of 6
    with EnvPool(tmp_path / "episodes", workers=1, timeout_s=30) as pool:
        pool.reset([("ep", "zoom", {"max_calls": 2}, sample)])
        r = pool.step({"ep": f"zoom({', '.join(map(str, box))})"})["ep"]
        left, top, right, bottom = r.info["box"]  # the target with about 8 px around it
        assert r.info["zoom_hit"] and abs(left - (x1 - 8)) <= 1 and abs(bottom - (y2 + 8)) <= 1
        assert Image.open(r.observation.images[0]).size == (right - left, bottom - top)
        done = pool.step({"ep": f"<answer>{rec['answer']}</answer>"})["ep"]
        assert done.done and done.reward == 1.0


def _read(img: Image.Image, box: list[int], length: int, jitter: tuple[int, int], budget: int) -> str:
    """A nearest-template reader that knows the font, the code's length and the box's place to a few pixels but
    not its sub-pixel phase: templates drawn ``jitter`` px off, matched at the best shift of up to 2 model px."""
    from mmrl.model.checkpoint_files import checkpoint_geometry

    geometry = checkpoint_geometry(str(ROOT / "assets" / "tiny-qwen2.5-vl"))

    def seen(im: Image.Image) -> np.ndarray:
        out, _ = geometry.prepare_image(im, min_pixels=budget, max_pixels=budget)
        return np.pad(np.asarray(out, dtype=np.float32), ((12, 12), (12, 12), (0, 0)), mode="edge")

    target = seen(img)
    scale = target.shape[1] - 24, target.shape[0] - 24
    sx, sy = scale[0] / img.width, scale[1] / img.height
    x0, y0 = int(box[0] * sx) + 11, int(box[1] * sy) + 11
    w, h = int(np.ceil(box[2] * sx)) - int(box[0] * sx) + 2, int(np.ceil(box[3] * sy)) - int(box[1] * sy) + 2
    region = target[y0 : y0 + h, x0 : x0 + w]
    background = tuple(int(v) for v in np.median(np.asarray(img).reshape(-1, 3), axis=0))
    best, code = np.inf, ""
    for digits in itertools.product("0123456789", repeat=length):
        text = "".join(digits)
        canvas = Image.new("RGB", img.size, background)
        draw = ImageDraw.Draw(canvas)
        bx, by = box[0] + jitter[0], box[1] + jitter[1]
        x1, y1, x2, y2 = _font(TINY.font_size).getbbox(text)
        draw.rectangle([bx, by, bx + x2 - x1 + 2 * PAD - 1, by + y2 - y1 + 2 * PAD - 1], fill=TARGET_FILL)
        draw.text((bx + PAD - x1, by + PAD - y1), text, fill=(255, 255, 255), font=_font(TINY.font_size))
        tmpl = seen(canvas)
        tx, ty = x0 + round(jitter[0] * sx), y0 + round(jitter[1] * sy)
        for dx, dy in itertools.product(range(-2, 3), repeat=2):
            d = float(((tmpl[ty + dy : ty + dy + h, tx + dx : tx + dx + w] - region) ** 2).mean())
            if d < best:
                best, code = d, text
    return code


def test_tiny_codes_are_unreadable_at_the_model_budget_and_readable_in_a_crop():
    """At 56 x 56 (min_pixels = max_pixels = 3136) a reader far stronger than the tiny model is near chance (1 %
    for two digits); in a 48 px crop of the box under the same budget it reads every code."""
    full = crop = 0
    n = 20
    for i in range(n):
        rng = random.Random(1000 + i)
        img, code, box = make_image(rng, TINY)
        jitter = (rng.randint(-3, 3), rng.randint(-3, 3))
        full += _read(img, box, 2, jitter, 3136) == code
        cx, cy = (box[0] + box[2]) // 2, (box[1] + box[3]) // 2
        left, top = min(max(0, cx - 24), 336 - 48), min(max(0, cy - 24), 336 - 48)
        local = [box[0] - left, box[1] - top, box[2] - left, box[3] - top]
        crop += _read(img.crop((left, top, left + 48, top + 48)), local, 2, jitter, 3136) == code
    assert full <= 0.2 * n and crop >= 0.95 * n, (full, crop)


def _mark_records(build, tmp_path: Path, n: int, seed: int):
    """The records a marks builder writes under ``tmp_path / "data"`` (each answer one of the dot colours), with their
    target boxes."""
    import json

    from mmrl.recipes.zoom.data import MARK_COLOURS

    paths = build(tmp_path / "data", n_train=n, n_eval=0, seed=seed)
    for line in paths["train"].read_text().splitlines():
        rec = json.loads(line)
        assert rec["answer"] in MARK_COLOURS
        yield rec, rec["metadata"]["target_box"]


def test_the_grid_oracle_zooms_on_the_quadrant_of_the_marks_target(tmp_path):
    """The tiny recipe's data keeps every red box inside one quadrant, and ``oracle_grid: 2`` zooms on exactly that
    quadrant (in the model's frame of a 336 px image seen at 56 px: [0, 0, 28, 28] and its three siblings), so the
    crop holds the target; then it answers the dot's colour."""
    from mmrl.recipes.zoom.data import build_marks

    quadrants = set()
    for rec, (x1, y1, x2, y2) in _mark_records(build_marks, tmp_path, 12, seed=3):
        q = (x1 >= 168, y1 >= 168)
        assert (x2 <= 168) != q[0] and (y2 <= 168) != q[1]  # wholly inside one quadrant
        quadrants.add(q)
        meta = {**rec["metadata"], "image_sizes": [[336, 336]], "model_image_sizes": [[56, 56]]}
        sample = Sample(
            id=rec["id"], messages=[], images=[str(tmp_path / "data" / rec["images"][0])], answer=rec["answer"],
            metadata=meta,
        )  # fmt: skip
        env = ZoomEnv(workdir=tmp_path / rec["id"], max_calls=1, oracle_grid=2, oracle_format="plain")
        env.reset(sample)
        zoom = env.oracle()
        x, y = 28 * q[0], 28 * q[1]
        assert (
            zoom == f"zoom({x}, {y}, {x + 28}, {y + 28})"
        )  # the plain form, whole numbers in the 56 px frame
        assert parse_action(zoom) == ("zoom", (x, y, x + 28, y + 28))
        r = env.step(zoom)
        assert r.info["zoom_hit"] and r.info["box"] == [
            168 * q[0],
            168 * q[1],
            168 * q[0] + 168,
            168 * q[1] + 168,
        ]
        assert env.oracle() == f"<answer>{rec['answer']}</answer>"
        assert env.step(env.oracle()).reward == 1.0
    assert len(quadrants) >= 3


def test_the_mark_scenes_hold_one_red_box_in_one_cell_and_the_oracle_zooms_on_it(tmp_path):
    """The tiny recipe's data since the tiny Qwen3-VL (``build_mark``): one red box, wholly inside one cell of a 3x3
    split, and no other box of the target's fill; ``oracle_grid: 3`` in Qwen3-VL's 0-1000 frame (the scene seen at
    64 px) zooms on exactly that 112 px cell, whose crop holds the box; then it answers the dot's colour."""
    import numpy as np

    from mmrl.recipes.zoom.data import MARK, TARGET_FILL, build_mark

    cells = set()
    for rec, (x1, y1, x2, y2) in _mark_records(build_mark, tmp_path, 10, seed=4):
        assert x2 - x1 == y2 - y1 == MARK.mark_box
        cx, cy = x1 // 112, y1 // 112
        assert (x2 - 1) // 112 == cx and (y2 - 1) // 112 == cy  # one cell of the 3 x 3 split
        cells.add((cx, cy))
        path = tmp_path / "data" / rec["images"][0]
        red = np.all(np.asarray(Image.open(path).convert("RGB")) == TARGET_FILL, axis=-1)
        dot = MARK.mark_dot
        assert red.sum() == MARK.mark_box**2 - dot * dot  # the target's fill nowhere else
        meta = {**rec["metadata"], "image_sizes": [[336, 336]], "model_image_sizes": [[64, 64]]}
        meta["coordinate_frame"] = "relative_1000"
        sample = Sample(id=rec["id"], messages=[], images=[str(path)], answer=rec["answer"], metadata=meta)
        env = ZoomEnv(
            workdir=tmp_path / rec["id"], max_calls=1, oracle_grid=3, oracle_format="plain", invalid="end"
        )
        env.reset(sample)
        zoom = env.oracle()
        r = env.step(zoom)
        cell = [112 * cx, 112 * cy, 112 * cx + 112, 112 * cy + 112]
        box = r.info[
            "box"
        ]  # the cell, rounded outward through the 0-1000 frame (at most a pixel on each side)
        assert r.info["zoom_hit"] and all(abs(a - b) <= 1 for a, b in zip(box, cell)), (zoom, box)
        assert box[0] <= cell[0] and box[1] <= cell[1] and box[2] >= cell[2] and box[3] >= cell[3]
        assert env.step(env.oracle()).reward == 1.0
    assert len(cells) >= 5


def test_the_grid_oracle_zooms_twice_down_to_its_view(tmp_path):
    """``oracle_view: 84``: the quadrant, then the quarter of it that holds the red box (4 x 4 grid cells of a 336 px
    image, 14 model px a side at 56 px), then the answer."""
    import json

    from mmrl.recipes.zoom.data import build_marks

    paths = build_marks(tmp_path / "data", n_train=8, n_eval=0, seed=5)
    for line in paths["train"].read_text().splitlines():
        rec = json.loads(line)
        x1, y1, x2, y2 = rec["metadata"]["target_box"]
        cx, cy = x1 // 84, y1 // 84
        assert (x2 - 1) // 84 == cx and (y2 - 1) // 84 == cy  # one cell of the 4 x 4 grid
        meta = {**rec["metadata"], "image_sizes": [[336, 336]], "model_image_sizes": [[56, 56]]}
        sample = Sample(
            id=rec["id"], messages=[], images=[str(tmp_path / "data" / rec["images"][0])], answer=rec["answer"],
            metadata=meta,
        )  # fmt: skip
        env = ZoomEnv(
            workdir=tmp_path / rec["id"], max_calls=2, oracle_grid=2, oracle_view=84, oracle_format="plain"
        )
        env.reset(sample)
        qx, qy = cx // 2 * 28, cy // 2 * 28
        assert env.oracle() == f"zoom({qx}, {qy}, {qx + 28}, {qy + 28})"
        assert env.step(env.oracle()).info["zoom_hit"]
        assert env.oracle() == f"zoom({cx * 14}, {cy * 14}, {cx * 14 + 14}, {cy * 14 + 14})"
        r = env.step(env.oracle())
        assert r.info["zoom_hit"] and r.info["box"] == [cx * 84, cy * 84, cx * 84 + 84, cy * 84 + 84]
        assert env.step(env.oracle()).reward == 1.0
