"""The table2latex recipe's data: the synthetic generator (renders through the sandbox, structure that
round-trips through the ``latex_table`` reward) and the converters from PubTabNet annotations and
Table2LaTeX-RL-style pairs, run on the real PubTabNet examples in tests/data/pubtabnet/examples
(CDLA-Permissive-1.0, see LICENSE.md there)."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.data import load_dataset
from mmrl.recipes.table2latex.convert import (
    ConversionError,
    convert_pairs,
    convert_pubtabnet,
    pubtabnet_record,
    table_shape,
)
from mmrl.recipes.table2latex.data import LEVELS, PROMPT, build, make_table
from mmrl.rewards.latex_table import latex_table
from mmrl.rewards.latex_table_html import latex_to_html
from mmrl.rewards.sandbox import render_latex
from mmrl.rewards.teds import teds
from mmrl.types import RewardInput

pytestmark = pytest.mark.tex
EXAMPLES = Path(__file__).resolve().parent / "data" / "pubtabnet" / "examples"
ANNOTATIONS = EXAMPLES / "PubTabNet_Examples.jsonl"


def _annotations() -> list[dict]:
    return [json.loads(line) for line in ANNOTATIONS.read_text().splitlines() if line.strip()]


def _with_images(tmp_path: Path) -> Path:
    """The annotation lines whose images are in the repository (4 of the 20), as a JSONL beside them."""
    lines = [a for a in _annotations() if (EXAMPLES / a["filename"]).is_file()]
    assert len(lines) == 4
    path = tmp_path / "ptn.jsonl"
    path.write_text("".join(json.dumps(a) + "\n" for a in lines))
    return path


# ------------------------------------------------------------------ generator
def test_generated_latex_round_trips_to_the_generators_own_html():
    """latex_to_html of every generated reference has the structure (and the text) of the HTML the generator
    wrote from the same grid, at every level; metadata spans match the HTML's."""
    rng = random.Random(7)
    for level in LEVELS:
        for _ in range(60):
            table = make_table(rng, level)
            parsed = latex_to_html(table.latex())
            assert teds(parsed, table.html(), structure_only=True) == 1.0, table.latex()
            assert teds(parsed, table.html()) == 1.0, table.latex()
            assert table_shape(table.html()) == (len(table.rows), table.n_cols, table.spans)


def test_difficulty_knob_grows_tables_and_spans():
    rng = random.Random(11)
    stats = {}
    for level in LEVELS:
        tables = [make_table(rng, level) for _ in range(80)]
        cells = [len(t.rows) * t.n_cols for t in tables]
        stats[level] = (np.mean(cells), np.mean([t.spans > 0 for t in tables]))
    level0 = [make_table(rng, 0) for _ in range(20)]
    assert all(len(t.rows) == 2 and t.n_cols == 2 and t.spans == 0 for t in level0)
    assert all(stats[k][0] < stats[k + 1][0] for k in range(len(LEVELS) - 1))
    assert stats[0][1] == stats[1][1] == 0.0 and stats[3][1] > 0.5 and stats[4][1] > 0.5
    latex = "".join(make_table(rng, 4).latex() for _ in range(30))
    for command in (
        r"\multirow",
        r"\multicolumn",
        r"\cmidrule",
        r"\toprule",
        r"\midrule",
        r"\pm",
        r"\textbf",
    ):
        assert command in latex
    with pytest.raises(ValueError, match="difficulty 9"):
        make_table(rng, 9)


def test_build_writes_valid_records_whose_images_are_the_references_rendered(tmp_path):
    paths = build(tmp_path, n_train=16, n_eval=8, seed=3, difficulty=(0, 4))
    train, held_out = load_dataset(paths["train"]).samples, load_dataset(paths["eval"]).samples
    assert (len(train), len(held_out)) == (16, 8)
    records = [json.loads(line) for p in paths.values() for line in p.read_text().splitlines()]
    assert {r["prompt"] for r in records} == {PROMPT}
    assert not {r["answer"] for r in records[:16]} & {r["answer"] for r in records[16:]}
    assert {r["metadata"]["difficulty"] for r in records} <= set(LEVELS)
    renders = render_latex([r["answer"] for r in records])
    for rec, res in zip(records, renders):
        assert res.ok, (rec["id"], res.error)
        stored = np.asarray(Image.open(tmp_path / rec["images"][0]), dtype=np.float32) / 255
        assert stored.shape == res.image.shape and np.abs(stored - res.image).max() <= 0.5 / 255 + 1e-6
        rows, cols, spans = table_shape(latex_to_html(rec["answer"]))
        assert (rows, cols, spans) == tuple(rec["metadata"][k] for k in ("rows", "cols", "spans"))


def test_build_is_deterministic_under_a_seed(tmp_path):
    a = build(tmp_path / "a", n_train=6, n_eval=3, seed=5, difficulty=2)
    b = build(tmp_path / "b", n_train=6, n_eval=3, seed=5, difficulty=2)
    c = build(tmp_path / "c", n_train=6, n_eval=3, seed=6, difficulty=2)
    assert a["train"].read_text() == b["train"].read_text() != c["train"].read_text()
    assert a["eval"].read_text() == b["eval"].read_text()
    for name in sorted(p.name for p in (tmp_path / "a" / "images").iterdir()):
        assert (tmp_path / "a" / "images" / name).read_bytes() == (
            tmp_path / "b" / "images" / name
        ).read_bytes()


def test_generated_references_score_full_marks_in_the_reward(tmp_path):
    paths = build(tmp_path, n_train=6, n_eval=0, seed=1, difficulty=(2, 4))
    records = [json.loads(line) for line in paths["train"].read_text().splitlines()]
    batch = [
        RewardInput(id=r["id"], response=r["answer"], reference=r["answer"], metadata={}) for r in records
    ]
    for result in latex_table(batch):
        assert result.error is None and result.score == 2.0
        assert (result.parts["compile"], result.parts["teds_s"], result.parts["visual"]) == (1.0, 1.0, 1.0)


# ------------------------------------------------------------------ PubTabNet
def test_every_pubtabnet_example_round_trips_through_the_structure_reward():
    """All 20 real annotations: the LaTeX answer, scored by latex_table against the source HTML
    (PubTabNet-style reference), compiles and has TEDS-S 1.0."""
    items = []
    for n, ann in enumerate(_annotations(), 1):
        html, latex = pubtabnet_record(ann, f"line {n}")
        assert teds(latex_to_html(latex), html, structure_only=True) == 1.0, ann["filename"]
        items.append(RewardInput(id=ann["filename"], response=latex, reference=html,
                                 metadata={"reference_format": "html"}))  # fmt: skip
    assert len(items) == 20
    for item, result in zip(items, latex_table(items, visual="haar_ssim")):
        assert result.error is None, item.id
        assert result.parts["compile"] == 1.0 and result.parts["teds_s"] == 1.0, item.id


def test_convert_pubtabnet_writes_records_with_latex_answers(tmp_path):
    source = _with_images(tmp_path)
    paths = convert_pubtabnet(source, tmp_path / "out", image_dir=EXAMPLES)
    assert list(paths) == ["train"]
    samples = load_dataset(paths["train"]).samples
    assert len(samples) == 4
    by_id = {f"ptn-{Path(a['filename']).stem}": a for a in _annotations()}
    for rec in (json.loads(line) for line in paths["train"].read_text().splitlines()):
        ann = by_id[rec["id"]]
        html, _ = pubtabnet_record(ann, rec["id"])
        assert teds(latex_to_html(rec["answer"]), html, structure_only=True) == 1.0
        copied = tmp_path / "out" / rec["images"][0]
        assert copied.read_bytes() == (EXAMPLES / ann["filename"]).read_bytes()
        rows, cols, spans = table_shape(html)
        meta = rec["metadata"]
        assert (meta["rows"], meta["cols"], meta["spans"], meta["source"]) == (rows, cols, spans, "pubtabnet")
        assert meta["difficulty"] == ("complex" if spans else "simple")
    assert {json.loads(x)["metadata"]["difficulty"] for x in paths["train"].read_text().splitlines()} == {
        "simple",
        "complex",
    }


# ------------------------------------------------------------------ Table2LaTeX-RL pairs
PAIR = r"""\begin{tabular}{lcc}
\toprule
Model & \multicolumn{2}{c}{Score} \\
\midrule
A & 1.0 & 2.0 \\
B & 3.0 & 4.0 \\
\bottomrule
\end{tabular}"""


def test_convert_pairs_reads_paths_alternate_keys_and_embedded_images(tmp_path):
    (tmp_path / "imgs").mkdir()
    png = EXAMPLES / "PMC3907710_006_00.png"
    (tmp_path / "imgs" / "t1.png").write_bytes(png.read_bytes())
    pairs = [
        {"image": "t1.png", "latex": PAIR},
        {"image_path": "t1.png", "latex_code": PAIR.replace("A &", "C &"), "id": "second"},
        {"images": [{"bytes": png.read_bytes()}], "answer": PAIR.replace("B &", "D &"), "id": "embedded"},
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs[:2]))
    out = convert_pairs(data, tmp_path / "out", image_dir=tmp_path / "imgs", split="eval")
    assert out.name == "eval.jsonl"
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["t2l-t1", "second"]
    assert records[0]["answer"] == PAIR
    assert records[0]["metadata"] == {"rows": 3, "cols": 3, "difficulty": "complex", "spans": 1,
                                      "source": "table2latex"}  # fmt: skip
    assert (tmp_path / "out" / records[0]["images"][0]).read_bytes() == png.read_bytes()
    assert len(load_dataset(out).samples) == 2

    embedded = tmp_path / "embedded.json"
    embedded.write_text(json.dumps([{**pairs[2], "images": [pairs[2]["images"][0]["bytes"].hex()]}]))
    with pytest.raises(ConversionError, match=r"embedded.json item 0"):  # hex is no image: named, not guessed
        convert_pairs(embedded, tmp_path / "out2")
    embedded.write_text(json.dumps([{**pairs[2], "images": [base64.b64encode(png.read_bytes()).decode()]}]))
    out = convert_pairs(embedded, tmp_path / "out2")
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    with Image.open(tmp_path / "out2" / rec["images"][0]) as im, Image.open(png) as orig:
        assert im.size == orig.size


# ------------------------------------------------------------------ bad input
def test_bad_pubtabnet_records_raise_naming_the_record(tmp_path):
    good = _annotations()[0]
    truncated = json.loads(json.dumps(good))
    truncated["html"]["cells"].pop()
    cases = [
        ({"filename": "x.png", "split": "train"}, r"bad.jsonl:1: a PubTabNet record needs 'filename'"),
        (
            truncated,
            r"bad.jsonl:1 \(PMC4840965_004_00.png\): the structure has 112 cells but html.cells has 111",
        ),
        (good, r"bad.jsonl:1 \(PMC4840965_004_00.png\): image 'PMC4840965_004_00.png' not found"),
    ]
    for record, message in cases:
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps(record) + "\n")
        with pytest.raises(ConversionError, match=message):
            convert_pubtabnet(path, tmp_path / "out", image_dir=tmp_path)
        assert not (tmp_path / "out" / "train.jsonl").exists()


def test_bad_pairs_raise_naming_the_record_or_are_skipped(tmp_path):
    png = EXAMPLES / "PMC3907710_006_00.png"
    (tmp_path / "ok.png").write_bytes(png.read_bytes())
    broken = r"\begin{tabular}{cc} a & \undefinedmacro \\ \end{tabular}"
    cases = [
        ({"image": "ok.png"}, r"pairs.jsonl:2: missing the LaTeX table"),
        ({"latex": PAIR}, r"pairs.jsonl:2: missing the image"),
        ({"image": "gone.png", "latex": PAIR}, r"pairs.jsonl:2: image file not found"),
        ({"image": "ok.png", "latex": "no table here"}, r"pairs.jsonl:2: the LaTeX holds no readable table"),
        (
            {"image": "ok.png", "latex": broken, "id": "b"},
            r"pairs.jsonl:2: the LaTeX answer does not compile",
        ),
    ]
    for record, message in cases:
        path = tmp_path / "pairs.jsonl"
        path.write_text(
            json.dumps({"image": "ok.png", "latex": PAIR, "id": "a"}) + "\n" + json.dumps(record) + "\n"
        )
        with pytest.raises(ConversionError, match=message):
            convert_pairs(path, tmp_path / "out")
    out = convert_pairs(path, tmp_path / "out", on_bad_record="skip")
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a"]
    (skipped,) = [json.loads(line) for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert skipped["id"] == "b" and "does not compile" in skipped["error"]
