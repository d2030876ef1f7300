"""The pathology recipe: generated tiles and questions, PathVQA/PathMMU converters, whole-slide tiles with their
annotations, the gallery overlay, and a 2-step smoke run of the tiny recipe through the CLI."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from mmrl.data import load_dataset
from mmrl.recipes.pathology import convert, data, wsi
from mmrl.rewards import pathology_view as view
from mmrl.rewards.pathology import mask_iou, pathology
from mmrl.types import RewardInput

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "tests" / "data" / "pathology"
SLIDE = ROOT / "tests" / "data" / "pathology_smoke" / "cmu_small_region.svs"
TINY_PIXELS = (3136, 3136)  # tiny.yaml's model.min_pixels / max_pixels


def _build(folder: Path, **kw) -> dict[str, Path]:
    opts = dict(n_train=24, n_eval=12, n_sft=16, size=112, kind_weights=data.UNIFORM)
    return data.build(folder, **(opts | kw))


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _score(rec: dict, response: str, base: Path, sizes=None) -> tuple[float, dict]:
    meta = dict(rec["metadata"])
    if sizes is not None:
        meta |= {"image_sizes": [sizes[0]], "model_image_sizes": [sizes[1]]}
    images = [str(base / p) for p in rec["images"]]
    x = RewardInput(rec["id"], response, rec["answer"], rec["prompt"], images, meta)
    r = pathology([x])[0]
    return r.score, r.parts


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("patho")
    _build(folder)
    return folder


def test_builder_is_deterministic_with_disjoint_valid_splits(built, tmp_path):
    _build(tmp_path)
    for split in ("train", "eval", "sft"):
        assert (built / f"{split}.jsonl").read_text() == (tmp_path / f"{split}.jsonl").read_text()
    first = _rows(built / "train.jsonl")[0]["images"][0]
    assert (built / first).read_bytes() == (tmp_path / first).read_bytes()
    digests = {}
    for split in ("train", "eval", "sft"):
        loaded = load_dataset(built / f"{split}.jsonl").samples  # mmrl's own validation, images opened
        digests[split] = {hashlib.sha1(Path(s.images[0]).read_bytes()).hexdigest() for s in loaded}
        assert all(Image.open(s.images[0]).size == (112, 112) for s in loaded[:3])
    assert not digests["train"] & digests["eval"] and not digests["train"] & digests["sft"]
    assert not digests["eval"] & digests["sft"]


def test_every_kind_has_its_question_type_and_reference():
    rng = __import__("random").Random(3)
    for i in range(60):
        rec, _ = data.make_record(rng, i, "x", data.UNIFORM)
        meta = rec["metadata"]
        assert meta["question_type"] == data.QUESTION_TYPES[meta["kind"]]
        if meta["kind"] == "presence":
            assert rec["answer"] == ("no" if meta["lesion"] == "none" else "yes")
        elif meta["kind"] == "tissue_mc":
            assert meta["choices"][ord(rec["answer"]) - ord("A")] == meta["tissue"]
        elif meta["kind"] in ("lesion_open", "box", "polygon"):
            assert rec["answer"] == meta["lesion"] in data.LESIONS
        assert ("<box>" in rec["prompt"]) == (meta["kind"] == "box")


def test_lesion_is_painted_where_its_region_says():
    """Tumour nests are haematoxylin-dark: inside the annotated outline the tile is darker than outside."""
    rng = np.random.default_rng(0)
    for tissue in ("adipose", "stroma", "epithelium"):
        image, outline = data.make_tile(rng, 112, tissue, "tumour", "irregular")
        mask = Image.new("L", image.size, 0)
        ImageDraw.Draw(mask).polygon(outline, fill=1)
        inside = np.asarray(mask, dtype=bool)
        grey = np.asarray(image.convert("L"), dtype=float)
        assert grey[inside].mean() < grey[~inside].mean() - 20, tissue


def test_demonstration_marks_score_full_region_through_the_model_pixel_mapping(built):
    """The sft split's box/polygon, in 56x56 model-input pixels, maps back onto the 112x112 annotation."""
    rows = [r for r in _rows(built / "sft.jsonl") if r["metadata"]["kind"] in ("box", "polygon")]
    assert {r["metadata"]["kind"] for r in rows} == {"box", "polygon"}
    for rec in rows:
        scoring = rec | {"answer": rec["metadata"]["reference"]}
        target = data.target_response(scoring, (112, 112), TINY_PIXELS)
        assert rec["answer"] == target and target.startswith("<think>")
        score, parts = _score(scoring, target, built, sizes=([112, 112], [56, 56]))
        assert parts["answer"] == 1.0 and parts["format"] == 1.0
        assert parts["region"] > 0.85  # rounding to whole model pixels (2 image pixels) costs a little IoU
        wrong, wparts = _score(
            scoring, target.replace("<box>", "<box>[0,0,1,1]</box><x>"), built, ([112, 112], [56, 56])
        )
        if rec["metadata"]["kind"] == "box":
            assert wparts["region"] < 0.05 and wrong < score


def test_sft_split_is_skewed_towards_the_majority_answers(tmp_path):
    data.build(tmp_path, n_train=300, n_eval=10, n_sft=300, size=32, kind_weights=data.TINY_KIND_WEIGHTS)

    def majority_share(split: str) -> float:
        rows = _rows(tmp_path / f"{split}.jsonl")
        key = "reference" if split == "sft" else None
        hits = []
        for r in rows:
            ref = r["metadata"][key] if key else r["answer"]
            word = (
                r["metadata"]["choices"]["ABCD".index(ref)] if r["metadata"]["kind"] == "tissue_mc" else ref
            )
            hits.append(word == data.MAJORITY[r["metadata"]["kind"]])
        return sum(hits) / len(hits)

    assert majority_share("sft") > majority_share("train") + 0.25


def test_pathvqa_hf_parquet_and_jsonl_layouts(tmp_path):
    out = convert.convert_pathvqa(
        ROOT / "tests/data/eval/pathvqa/test.parquet", tmp_path / "hf" / "pathvqa.jsonl"
    )
    rows = _rows(out)
    assert [r["metadata"]["question_type"] for r in rows] == ["yes_no", "yes_no", "open", "open"]
    assert all((out.parent / r["images"][0]).is_file() for r in rows)  # embedded JPEG bytes written out
    assert Image.open(out.parent / rows[0]["images"][0]).format == "JPEG"
    samples = load_dataset(out).samples
    assert samples[0].answer == "yes" and "<think>" in samples[0].prompt_text

    out = convert.convert_pathvqa(EXAMPLES / "pathvqa" / "test.jsonl", tmp_path / "js" / "pathvqa.jsonl")
    rows = _rows(out)
    assert [r["answer"] for r in rows] == ["yes", "hematoxylin", "yes"]
    assert (
        load_dataset(out).samples[0].images[0].endswith("test_0001.jpg")
    )  # a bare stem found with its suffix
    base = out.parent
    assert _score(rows[0], "<think>brown DAB</think><answer>Yes, it is.</answer>", base)[0] == pytest.approx(
        1.0
    )
    assert _score(rows[1], "<think>blue</think><answer>hematoxylin</answer>", base)[0] == pytest.approx(1.0)
    assert _score(rows[1], "<think>blue</think><answer>eosin</answer>", base)[0] == pytest.approx(0.1)


def test_pathvqa_errors_name_the_record(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps({"image": "x.jpg", "question": "q?"}) + "\n")
    with pytest.raises(convert.ConvertError, match=r"bad.jsonl:1: missing field\(s\) \['answer'\]"):
        convert.convert_pathvqa(src, tmp_path / "o.jsonl")
    src.write_text(json.dumps({"image": "x.jpg", "question": "q?", "answer": "a"}) + "\n")
    with pytest.raises(convert.ConvertError, match="bad.jsonl:1: image file not found.*image_dir"):
        convert.convert_pathvqa(src, tmp_path / "o.jsonl")
    src.write_text(
        json.dumps({"image": "x", "question": "q?", "answer": "fibrin", "answer_type": "yes/no"}) + "\n"
    )
    with pytest.raises(convert.ConvertError, match="answer 'fibrin' is not yes or no"):
        convert.convert_pathvqa(src, tmp_path / "o.jsonl", image_dir=EXAMPLES / "pathvqa" / "images")


def test_pathmmu_data_json(tmp_path):
    out = convert.convert_pathmmu(EXAMPLES / "pathmmu" / "data.json", tmp_path / "pathmmu.jsonl")
    rows = _rows(out)
    assert [r["id"] for r in rows] == [
        "pathmmu-PubMed_test_tiny-1",
        "pathmmu-Atlas_test_tiny-1",
        "pathmmu-Atlas_val-2",
    ]
    assert [r["answer"] for r in rows] == ["B", "C", "B"]
    assert rows[0]["metadata"]["choices"][1] == "Haematoxylin and eosin"
    assert "B. Haematoxylin and eosin" in rows[0]["prompt"] and rows[0]["metadata"]["explanation"]
    load_dataset(out)
    base = out.parent
    assert _score(rows[0], "<think>pink and purple</think><answer>B</answer>", base)[0] == pytest.approx(1.0)
    assert _score(rows[1], "<think>brown</think><answer>DAB chromogen marking an antigen</answer>", base)[
        0
    ] == (pytest.approx(1.0))
    assert _score(rows[2], "<think>x</think><answer>A</answer>", base)[0] == pytest.approx(0.1)


def test_pathmmu_bad_answer_letter(tmp_path):
    bad = {
        "S": {
            "test": [
                {"No": 7, "img": "a.jpg", "question": "q", "options": ["A) x", "B) y"], "answer": "C) z"}
            ]
        }
    }
    (tmp_path / "data.json").write_text(json.dumps(bad))
    with pytest.raises(
        convert.ConvertError, match=r"S/test item 0: answer 'C\) z' does not start with one of .*AB"
    ):
        convert.convert_pathmmu(tmp_path / "data.json", tmp_path / "o.jsonl")


class CountingSlide:
    """The real slide, counting what is read; ``pyramid`` adds a level 1 at downsample 2 made from level 0."""

    def __init__(self, slide, pyramid: bool = False):
        self.slide, self.pyramid, self.reads = slide, pyramid, []
        w, h = slide.level_dimensions[0]
        self.level_count = 2 if pyramid else 1
        self.level_dimensions = [(w, h), (w // 2, h // 2)][: self.level_count]
        self.level_downsamples = [1.0, 2.0][: self.level_count]

    def read_region(self, location, level, size):
        self.reads.append((location, level, size))
        if level == 1:
            return self.slide.read_region(location, 0, (2 * size[0], 2 * size[1])).resize(size, Image.BOX)
        return self.slide.read_region(location, level, size)

    def get_best_level_for_downsample(self, downsample):
        return 1 if self.pyramid and downsample >= 2 else 0


LESION = wsi.Annotation("tumour", [(700.0, 650.0), (1150.0, 700.0), (1100.0, 1180.0), (760.0, 1050.0)])


def _level0_mask(poly, x, y, span):
    mask = Image.new("L", (span, span), 0)
    ImageDraw.Draw(mask).polygon([(px - x, py - y) for px, py in poly], fill=255)
    return mask


@pytest.mark.parametrize(
    "how", [{"level": 0}, {"downsample": 2.0}, {"level": 1}], ids=["level0", "ds2", "level1"]
)
def test_slide_tiles_stream_and_carry_their_regions(how):
    slide = CountingSlide(wsi.open_slide(SLIDE), pyramid="level" in how and how["level"] == 1)
    size = 256
    got = list(wsi.tiles(slide, size=size, annotations=[LESION], **how))
    ds = 1.0 if how == {"level": 0} else 2.0
    w, h = slide.level_dimensions[0]
    assert len(got) == int((w - size * ds) // (size * ds) + 1) * int((h - size * ds) // (size * ds) + 1)
    level = how.get("level", 0)
    side = size if level == 1 or ds == 1 else 2 * size
    assert {r[1:] for r in slide.reads} == {
        (level, (side, side))
    }  # one tile-sized read per tile, never the slide
    hit = [t for t in got if t.regions]
    assert 2 <= len(hit) <= 9 and all(t.image.size == (size, size) and t.downsample == ds for t in hit)
    for t in hit:
        span = round(size * ds)
        truth = _level0_mask(LESION.polygon, t.x, t.y, span).resize((size, size), Image.BOX)
        truth_poly_iou = np.asarray(truth) > 127
        mapped = Image.new("L", (size, size), 0)
        ImageDraw.Draw(mapped).polygon(t.regions[0].polygon, fill=255)
        mapped = np.asarray(mapped) > 127
        if truth_poly_iou.sum() > 200:
            iou = (mapped & truth_poly_iou).sum() / (mapped | truth_poly_iou).sum()
            assert iou > 0.95
        xs = [p[0] for p in t.regions[0].polygon]
        assert 0 <= min(xs) and max(xs) <= size
    first = hit[0]
    direct = wsi.read_tile(wsi.open_slide(SLIDE), first.x, first.y, size, 0, ds)
    assert np.abs(np.asarray(direct, float) - np.asarray(first.image, float)).mean() < (
        0.01 if ds == 1 else 3.0
    )


def test_slide_errors_and_cut_region(tmp_path):
    slide = wsi.open_slide(SLIDE)
    with pytest.raises(wsi.SlideError, match=r"level 2 does not exist: the slide has levels 0..0"):
        next(wsi.tiles(slide, level=2))
    with pytest.raises(wsi.SlideError, match="exactly one of level= .* or downsample="):
        next(wsi.tiles(slide))
    with pytest.raises(wsi.SlideError, match="slide not found"):
        wsi.open_slide(tmp_path / "none.svs")
    tile = wsi.cut_region(slide, LESION, downsample=2.0, margin=0.1)
    assert tile.regions and wsi.polygon_area(tile.regions[0].polygon) == pytest.approx(
        wsi.polygon_area(LESION.polygon) / 4, rel=1e-6
    )  # the whole region, unclipped, a quarter of its level-0 area at downsample 2
    with pytest.raises(wsi.SlideError, match="max_side"):
        wsi.cut_region(slide, LESION, level=0, max_side=256)


def test_annotation_formats_and_clipping(tmp_path):
    geo = {
        "type": "FeatureCollection",
        "features": [
            {
                "type": "Feature",
                "geometry": {
                    "type": "Polygon",
                    "coordinates": [[[0, 0], [10, 0], [10, 10], [0, 10], [0, 0]]],
                },
                "properties": {"classification": {"name": "Tumor"}},
            }
        ],
    }
    (tmp_path / "a.geojson").write_text(json.dumps(geo))
    (a,) = wsi.load_annotations(tmp_path / "a.geojson")
    assert a.label == "Tumor" and len(a.polygon) == 4
    (b,) = wsi.load_annotations([{"label": "necrosis", "box": [30, 40, 10, 20]}])
    assert b.polygon[0] == (10.0, 20.0) and wsi.polygon_area(b.polygon) == 400
    with pytest.raises(wsi.SlideError, match="item 0: give 'box'"):
        wsi.load_annotations([{"label": "x", "polygon": [[1, 2]]}])
    assert wsi.polygon_area(wsi.clip_polygon(a.polygon, 5, 5, 20, 20)) == 25
    assert wsi.clip_polygon(a.polygon, 50, 50, 60, 60) == []


def test_write_records_from_a_slide(tmp_path):
    out = wsi.write_records(
        SLIDE, [LESION], tmp_path / "slide.jsonl", size=256, downsample=2.0, min_tissue=0.2
    )
    rows = _rows(out)
    samples = load_dataset(out).samples
    assert len(samples) == len(rows)
    boxes = [r for r in rows if r["metadata"]["kind"] == "box"]
    assert boxes and all(r["answer"] == "tumour" for r in boxes)
    assert {r["answer"] for r in rows if r["metadata"]["kind"] == "presence"} == {"yes", "no"}
    rec = boxes[0]
    x1, y1, x2, y2 = rec["metadata"]["region"]
    response = f"<think>dark nuclei</think><answer>tumour <box>[{x1}, {y1}, {x2}, {y2}]</box></answer>"
    score, parts = _score(rec, response, tmp_path, sizes=([256, 256], [256, 256]))
    assert parts["region"] == pytest.approx(1.0) and score == pytest.approx(1.0)


def test_overlay_draws_target_and_prediction_with_the_rewards_iou():
    image = Image.new("RGB", (112, 112), (240, 200, 230))
    before = image.tobytes()
    meta = {"answer": "tumour", "region": [60, 10, 100, 50]}
    response = "<think>stroma tumour</think><answer>tumour <box>[35,5,55,25]</box></answer>"
    drawn, caption = view.overlay(image, meta, "patho-eval-00001", response, TINY_PIXELS)
    assert image.tobytes() == before and drawn.size == image.size
    px = np.asarray(drawn)
    assert (
        tuple(px[30, 60]) == view.TARGET and tuple(px[10, 65]) == view.TARGET
    )  # left and top edges of the target
    assert tuple(px[30, 110]) == view.PREDICTED  # the model's x = 55 -> 110 in the 112 px image
    assert tuple(px[50, 105]) == view.PREDICTED and tuple(px[30, 80]) == (240, 200, 230)
    iou = mask_iou(
        [(70, 10), (110, 10), (110, 50), (70, 50)], [(60, 10), (100, 10), (100, 50), (60, 50)], (112, 112)
    )
    assert 0.5 < iou < 0.7 and f"region IoU {iou:.2f}" in caption and "56x56 model input" in caption
    meta_far = meta | {"region": [0, 60, 40, 100]}
    assert "region IoU 0.00" in view.overlay(image, meta_far, "s", response, TINY_PIXELS)[1]
    assert "no region marked" in view.overlay(image, meta, "s", "<answer>tumour</answer>", TINY_PIXELS)[1]
    assert view.overlay(image, "tumour", "s", response, TINY_PIXELS) is None
    assert view.overlay(image, {"answer": "no"}, "s", response, TINY_PIXELS) is None


def test_tiny_recipe_two_steps_through_the_cli(tmp_path, capsys, monkeypatch):
    from mmrl.cli import main

    monkeypatch.chdir(ROOT)
    folder = tmp_path / "data"
    data.build(folder, n_train=16, n_eval=8, size=112, kind_weights=data.TINY_KIND_WEIGHTS)
    out = tmp_path / "run"
    args = [
        "train", "recipes/pathology/tiny.yaml", "--output-dir", str(out), "--max-steps", "2",
        f"data.train={folder / 'train.jsonl'}", f"data.eval={folder / 'eval.jsonl'}",
        "eval.max_samples=8", "eval.every=1", "train.progress=false", "train.save_every=0",
        "train.prompts_per_step=4", "rollout.n=4",
    ]  # fmt: skip
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("eval/reward_mean" in r for r in rows)
    assert any(k.startswith("reward/pathology/") for k in rows[1])
    logged = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert logged and all(len(r["responses"]) == 4 for r in logged)
    assert (out / "report.html").is_file() and "held-out accuracy: start" in capsys.readouterr().out
