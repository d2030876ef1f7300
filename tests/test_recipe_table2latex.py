"""The table2latex recipe's tiny variant end to end: its data split, its configs and shipped warm start, and a 2-step
training run through the CLI whose report.html is opened in headless Chromium (each response's render beside the
target's).

The full generator and the PubTabNet / Table2LaTeX-RL-pair converters are tested in ``test_table2latex_data.py``.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from transformers import AutoTokenizer

from mmrl.cli import main
from mmrl.config import load_config
from mmrl.processors.geometry import smart_resize
from mmrl.recipes.table2latex.data import PROMPT, TINY_SHAPES, build_tiny
from mmrl.rewards.latex_table import latex_table
from mmrl.run.metrics import read_metrics
from mmrl.types import RewardInput

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "table2latex"

pytestmark = pytest.mark.tex


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_tiny_split_is_deterministic_disjoint_skewed_and_its_references_earn_full_marks(tmp_path):
    a = build_tiny(tmp_path / "a", n_train=40, n_eval=8, n_sft=40, seed=4)
    build_tiny(tmp_path / "b", n_train=40, n_eval=8, n_sft=40, seed=4)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    rows = {split: _rows(p) for split, p in a.items()}
    answers = {split: {r["answer"] for r in rs} for split, rs in rows.items()}
    assert all(len(answers[s]) == len(rows[s]) for s in rows)
    assert not (answers["train"] & answers["eval"]) and not (
        answers["sft"] & (answers["train"] | answers["eval"])
    )
    shapes = {split: [r["metadata"]["shape"] for r in rs] for split, rs in rows.items()}
    assert set(shapes["train"]) == {f"{r}x{c}" for r, c in TINY_SHAPES}
    share = {split: s.count("2x2") / len(s) for split, s in shapes.items()}
    assert share["sft"] > 0.45 > share["train"]  # 57% vs 25% expected: the warm start's prior to correct
    assert {r["prompt"] for rs in rows.values() for r in rs} == {PROMPT}
    batch = [RewardInput(id=r["id"], response=r["answer"], reference=r["answer"]) for r in rows["eval"]]
    for res in latex_table(batch, scheme="continuous", visual="haar_ssim"):
        assert res.score == pytest.approx(1.0) and res.parts["compile"] == res.parts["teds_s"] == 1.0


def test_tiny_configs_fit_the_data_and_ship_their_warm_start(tmp_path):
    tiny, sft = load_config(RECIPE / "tiny.yaml"), load_config(RECIPE / "sft.yaml")
    assert (tiny.model.min_pixels, tiny.model.max_pixels) == (sft.model.min_pixels, sft.model.max_pixels)
    assert tiny.data.builder == sft.data.builder == "mmrl.recipes.table2latex.data:build_tiny"
    model = ROOT / tiny.model.path  # relative to the repository root, where the recipe runs
    assert model == ROOT / "assets" / "table2latex-sft" / "model"
    assert (model / "model.safetensors").stat().st_size < 5_000_000
    card = (ROOT / "assets" / "table2latex-sft" / "README.md").read_text()
    assert "mmrl sft recipes/table2latex/sft.yaml" in card
    assert [r.name for r in tiny.rewards] == ["latex_table"] and tiny.train.keep_renders

    paths = build_tiny(tmp_path, n_train=120, n_eval=0, n_sft=0, seed=9)
    tok = AutoTokenizer.from_pretrained(model)
    rows = _rows(paths["train"])
    lengths = [len(tok(r["answer"], add_special_tokens=False)["input_ids"]) + 1 for r in rows]  # + <|im_end|>
    assert max(lengths) <= tiny.rollout.max_new_tokens  # every reference fits in a response
    tokens = []
    for r in rows:
        with Image.open(tmp_path / r["images"][0]) as im:
            w, h = im.size
        rh, rw = smart_resize(h, w, min_pixels=tiny.model.min_pixels, max_pixels=tiny.model.max_pixels)
        assert abs(rh - h) <= 14 and abs(rw - w) <= 14  # images keep their size: it tells the shape apart
        tokens.append(rh * rw // 784)
    assert 8 <= min(tokens) and max(tokens) <= 32  # a few dozen image tokens at most


@pytest.mark.chromium
def test_tiny_recipe_trains_two_steps_and_its_report_shows_renders_in_a_browser(
    tmp_path, capsys, monkeypatch
):
    from playwright.sync_api import sync_playwright

    monkeypatch.chdir(ROOT)
    data = build_tiny(tmp_path / "data", n_train=8, n_eval=4, n_sft=0, seed=5)
    run = tmp_path / "run"
    args = ["train", str(RECIPE / "tiny.yaml"), "--output-dir", str(run), "--max-steps", "2"]
    args += [f"data.train={data['train']}", f"data.eval={data['eval']}", "eval.max_samples=4", "eval.every=1"]
    args += ["train.prompts_per_step=4", "train.progress=false"]
    assert main(args) == 0
    assert "held-out accuracy: start" in capsys.readouterr().out
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2] and all("eval/reward_mean" in r for r in rows)
    assert all(f"reward/latex_table/{p}" in rows[-1] for p in ("compile", "teds_s", "visual"))
    logged = _rows(run / "rollouts.jsonl")
    assert {r["step"] for r in logged} == {1, 2} and all(len(r["responses"]) == 8 for r in logged)
    assert (run / "checkpoints" / "step-2" / "model" / "model.safetensors").exists()

    shot = tmp_path / "report.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto((run / "report.html").as_uri(), wait_until="load")
        imgs = page.eval_on_selector_all(
            "img", "els => els.map(e => [e.getAttribute('alt'), e.complete && e.naturalWidth > 0])"
        )
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert imgs and all(ok for _, ok in imgs), imgs  # every image (plots, inputs, renders) decoded
    alts = [alt for alt, _ in imgs]
    assert alts.count("input image") == len(logged)
    assert alts.count("target render") == 8 * len(logged)  # the target beside every response
    assert alts.count("response render") >= 1  # the warm start writes tables that compile
    page = np.asarray(Image.open(shot).convert("RGB"))
    assert page.shape[0] > 900 and page.std() > 20  # a long page with content, not a blank canvas
    assert len(np.unique(page.reshape(-1, 3), axis=0)) > 200  # plots and renders, not only text
