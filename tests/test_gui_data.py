import io
import json
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mmrl.data import load_dataset
from mmrl.processors.geometry import smart_resize
from mmrl.recipes.gui.convert import ConvertError, screenspot_records, step_records, write_jsonl
from mmrl.recipes.gui.data import ACTIONS, SCREENS, ScreenRenderer, build, make_layout, target_response
from mmrl.rewards.gui import gui_action
from mmrl.types import RewardInput

SCREENSPOT = Path(__file__).parent / "data" / "eval" / "screenspot"
_HIT_JS = """([x, y]) => { const e = document.elementFromPoint(x, y); const m = e && e.closest('[data-gui]');
  return m ? m.dataset.gui : null; }"""


@pytest.fixture(scope="module")
def renderer():
    with ScreenRenderer() as r:
        yield r


@pytest.fixture(scope="module")
def built(tmp_path_factory, renderer):
    folder = tmp_path_factory.mktemp("gui")
    uniform = dict.fromkeys(ACTIONS, 1.0)
    return folder, build(
        folder,
        n_train=40,
        n_eval=6,
        seed=3,
        screens=tuple(SCREENS),
        action_weights=uniform,
        renderer=renderer,
    )


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _score(response, answer, image_size, model_size, scheme="gui_r1"):
    meta = {"image_sizes": [list(image_size)], "model_image_sizes": [list(model_size)]}
    x = RewardInput(id="gui-t", response=response, reference=answer, metadata=meta)
    return gui_action([x], scheme=scheme)[0].score


def _model_size(image_size):
    h, w = smart_resize(image_size[1], image_size[0], max_pixels=256 * 28 * 28)
    return w, h


@pytest.mark.parametrize("screen", ["phone", "phone_hidpi", "desktop", "desktop_wide"])
@pytest.mark.parametrize("bottom", [False, True])
def test_click_at_each_box_centre_hits_its_element(renderer, screen, bottom):
    spec, rng = SCREENS[screen], random.Random(11)
    checked = 0
    for _ in range(3):
        layout = make_layout(rng, spec)
        shot = renderer.shoot(layout.html, spec, scrolled_to_bottom=bottom)
        assert Image.open(io.BytesIO(shot.png)).size == spec.pixel_size
        page = renderer.page(spec)  # still showing the shot page, scrolled as it was
        for el in layout.elements:
            box = shot.boxes[el.id]
            if not box["visible"]:
                continue
            x1, y1, x2, y2 = box["bbox"]
            assert 0 <= x1 < x2 <= spec.pixel_size[0] and 0 <= y1 < y2 <= spec.pixel_size[1]
            centre = [(x1 + x2) / 2 / spec.scale, (y1 + y2) / 2 / spec.scale]  # screenshot px -> CSS px
            assert page.evaluate(_HIT_JS, centre) == el.id, (screen, el)
            checked += 1
    assert checked >= 15


@pytest.mark.parametrize("screen", ["phone_hidpi", "desktop"])
def test_hiding_an_element_changes_pixels_only_inside_its_box(renderer, screen):
    spec = SCREENS[screen]
    layout = make_layout(random.Random(5), spec)
    shot = renderer.shoot(layout.html, spec)
    base = np.asarray(Image.open(io.BytesIO(shot.png)).convert("RGB"), dtype=np.int16)
    visible = [e for e in layout.elements if shot.boxes[e.id]["visible"]]
    kinds = {e.kind: e for e in visible}  # one element of each kind on the screen
    for el in kinds.values():
        hidden = layout.html.replace("</style>", f'[data-gui="{el.id}"]{{visibility:hidden}}</style>')
        img = np.asarray(
            Image.open(io.BytesIO(renderer.shoot(hidden, spec).png)).convert("RGB"), dtype=np.int16
        )
        ys, xs = np.nonzero(np.abs(img - base).max(axis=2) > 0)
        assert xs.size > 0, el
        x1, y1, x2, y2 = shot.boxes[el.id]["bbox"]
        assert xs.min() >= np.floor(x1) - 1 and xs.max() <= np.ceil(x2) + 1, (el, xs.min(), xs.max(), x1, x2)
        assert ys.min() >= np.floor(y1) - 1 and ys.max() <= np.ceil(y2) + 1, (el, ys.min(), ys.max(), y1, y2)
    assert len(kinds) >= 3


def test_records_load_and_cover_every_action(built):
    folder, paths = built
    train = load_dataset(paths["train"]).samples
    assert len(train) == 40 and len(load_dataset(paths["eval"]).samples) == 6
    rows = _rows(paths["train"])
    assert {r["answer"]["action"] for r in rows} == set(ACTIONS)
    assert {r["metadata"]["screen"] for r in rows} == set(SCREENS)
    for r in rows:
        with Image.open(folder / r["images"][0]) as im:
            assert list(im.size) == r["metadata"]["image_size"]
        assert r["metadata"]["instruction"] in r["prompt"]
        if r["answer"]["action"] == "click":
            assert r["answer"]["bbox"] in [e["bbox"] for e in r["metadata"]["elements"]]
        if r["answer"]["action"] == "input_text":
            assert f"'{r['answer']['text']}'" in r["metadata"]["instruction"]


def test_reference_scores_full_marks_and_wrong_answers_less(built):
    _, paths = built
    for r in _rows(paths["train"]):
        ans, size = r["answer"], r["metadata"]["image_size"]
        model = _model_size(size)
        good = target_response(ans, image_size=size, model_size=model, think="looking")
        assert _score(good, ans, size, model) == 1.0, r["id"]
        assert _score(good, ans, size, model, scheme="ui_r1") == 3.0, r["id"]
        if ans["action"] == "click":
            x1, y1, x2, y2 = ans["bbox"]
            far = [x2 + 30, y1] if x2 + 30 < size[0] else [x1 - 30, y1]  # beside the box, in original pixels
            miss = {**ans, "bbox": [far[0], far[1], far[0], far[1]]}
            wrong = target_response(miss, image_size=size, model_size=model, think="looking")
        elif ans["action"] in ("input_text", "scroll", "open_app"):
            wrong = target_response({**ans, "text": "zzz qqq"}, think="looking")
        else:
            wrong = target_response({"action": "scroll", "text": "down"}, think="looking")
        assert _score(wrong, ans, size, model) < 1.0, r["id"]


def test_build_is_deterministic_under_a_seed(tmp_path, renderer):
    a, c = (
        build(tmp_path / n, n_train=4, n_eval=1, seed=s, renderer=renderer) for n, s in (("a", 7), ("c", 8))
    )
    with ThreadPoolExecutor(
        1
    ) as pool:  # a fresh browser (one sync Playwright per thread) renders the same bytes
        b = pool.submit(build, tmp_path / "b", n_train=4, n_eval=1, seed=7).result()
    assert a["train"].read_text() == b["train"].read_text() != c["train"].read_text()
    for r in _rows(a["train"]):
        img = r["images"][0]
        assert (tmp_path / "a" / img).read_bytes() == (tmp_path / "b" / img).read_bytes()


def test_build_rejects_unknown_names(tmp_path, renderer):
    with pytest.raises(ValueError, match="'watch'"):
        build(tmp_path, n_train=1, n_eval=1, screens=("watch",), renderer=renderer)


def test_screenspot_fixtures_become_click_records(tmp_path):
    out = tmp_path / "out"
    records = [r for p in sorted(SCREENSPOT.glob("screenspot_*.json")) for r in screenspot_records(p, out)]
    path = write_jsonl(records, out / "screenspot.jsonl")
    samples = load_dataset(path).samples
    assert len(samples) == 6
    first = json.loads((SCREENSPOT / "screenspot_desktop.json").read_text())[0]
    rec = records[0]
    x, y, w, h = first["bbox"]
    assert rec["id"] == "screenspot-desktop-0" and rec["answer"] == {
        "action": "click",
        "bbox": [x, y, x + w, y + h],
    }
    assert first["instruction"] in rec["prompt"] and rec["metadata"]["data_type"] == first["data_type"]
    for r in records:
        size = r["metadata"]["image_size"]
        good = target_response(r["answer"], think="t")
        assert _score(good, r["answer"], size, size) == 1.0
        assert (
            _score(target_response({"action": "click", "bbox": [0, 0, 0, 0]}), r["answer"], size, size) < 1.0
        )


def _shot(path, size=(200, 400)):
    Image.new("RGB", size, (240, 240, 240)).save(path)


def test_androidcontrol_steps_become_records(tmp_path):
    _shot(tmp_path / "s0.png")
    steps = [
        {"episode_id": 17, "step_id": 0, "screenshot": "s0.png", "step_instruction": "Open the Clock app",
         "action_type": "open_app", "app_name": "Clock"},
        {"episode_id": 17, "step_id": 1, "screenshot": "s0.png", "step_instruction": "Tap the alarm tab",
         "action_type": "click", "x": 50, "y": 380},
        {"episode_id": 17, "step_id": 2, "screenshot": "s0.png", "step_instruction": "Type 7 am",
         "action_type": "input_text", "text": "7 am"},
        {"episode_id": 17, "step_id": 3, "screenshot": "s0.png", "step_instruction": "Scroll down",
         "action_type": "scroll", "direction": "down"},
        {"episode_id": 17, "step_id": 4, "screenshot": "s0.png", "goal": "Set an alarm",
         "action_type": "navigate_back"},
    ]  # fmt: skip
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    records = step_records(tmp_path / "steps.jsonl", tmp_path)
    assert [r["id"] for r in records] == [f"17-{i}" for i in range(5)]
    assert [r["answer"] for r in records] == [
        {"action": "open_app", "text": "Clock"},
        {"action": "click", "point": [50.0, 380.0]},
        {"action": "input_text", "text": "7 am"},
        {"action": "scroll", "text": "down"},
        {"action": "navigate_back"},
    ]
    assert load_dataset(write_jsonl(records, tmp_path / "ac.jsonl")).samples[1].images == [
        str(tmp_path / "s0.png")
    ]
    click = records[1]["answer"]
    near = '<think>t</think><answer>[{"action": "click", "coordinate": [60, 370]}]</answer>'
    far = '<think>t</think><answer>[{"action": "click", "coordinate": [190, 10]}]</answer>'
    assert _score(near, click, (200, 400), (200, 400)) == 1.0  # GUI-R1: within 140 px of the point
    assert _score(far, click, (200, 400), (200, 400)) < 1.0


def test_gui_r1_parquet_with_embedded_images_and_normalized_boxes(tmp_path):
    buf = io.BytesIO()
    Image.new("RGB", (300, 600), "white").save(buf, format="PNG")
    rows = [
        {"id": "g1", "image": {"bytes": buf.getvalue(), "path": None}, "instruction": "tap Search",
         "gt_action": "tap", "gt_bbox": [0.1, 0.1, 0.5, 0.2],
         "gt_input_text": "no input text", "history": "None"},
        {"id": "g2", "image": {"bytes": buf.getvalue(), "path": None}, "instruction": "type cats",
         "gt_action": "type", "gt_bbox": [-100, -100],
         "gt_input_text": "cats", "history": "step 1: tap Search"},
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "gui_r1.parquet")
    out = tmp_path / "out"
    records = step_records(tmp_path / "gui_r1.parquet", out, coords="normalized")
    assert records[0]["answer"] == {"action": "click", "bbox": pytest.approx([30.0, 60.0, 150.0, 120.0])}
    assert records[1]["answer"] == {"action": "input_text", "text": "cats"}
    assert "Previous actions: step 1: tap Search" in records[1]["prompt"]
    assert (out / records[0]["images"][0]).is_file()
    assert len(load_dataset(write_jsonl(records, out / "d.jsonl")).samples) == 2


@pytest.mark.parametrize(
    "step, message",
    [
        (
            {"screenshot": "s.png", "instruction": "x", "action_type": "fly"},
            r"record 0 \(bad-1\): unknown action 'fly'",
        ),
        (
            {"screenshot": "s.png", "instruction": "x", "action_type": "click"},
            r"\(bad-1\): a click needs a point",
        ),
        (
            {"screenshot": "s.png", "instruction": "x", "action_type": "click", "x": 900, "y": 5},
            "outside the 200x400",
        ),
        (
            {"screenshot": "s.png", "instruction": "x", "action_type": "input_text"},
            r"\(bad-1\): a input_text needs",
        ),
        (
            {"screenshot": "gone.png", "instruction": "x", "action_type": "navigate_back"},
            "screenshot not found",
        ),
        ({"screenshot": "s.png", "action_type": "navigate_back"}, r"\(bad-1\): no instruction"),
    ],
)
def test_bad_step_records_name_the_record(tmp_path, step, message):
    _shot(tmp_path / "s.png")
    (tmp_path / "steps.jsonl").write_text(json.dumps({"id": "bad-1", **step}) + "\n")
    with pytest.raises(ConvertError, match=message):
        step_records(tmp_path / "steps.jsonl", tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"bbox": [20, 60, 110]}, r"item 0 \(screenspot-mobile-0\): bbox must be \[x, y, w, h\]"),
        ({"bbox": [200, 60, 500, 32]}, "outside the"),
        ({"bbox": None}, r"missing field\(s\) \['bbox'\]"),
        ({"img_filename": "nope.png"}, "screenshot not found"),
    ],
)
def test_bad_screenspot_items_name_the_item(tmp_path, change, message):
    shutil.copytree(SCREENSPOT, tmp_path / "ss")
    src = tmp_path / "ss" / "screenspot_mobile.json"
    items = json.loads(src.read_text())
    items[0].update(change)
    src.write_text(json.dumps(items))
    with pytest.raises(ConvertError, match=message):
        screenspot_records(src, tmp_path)
