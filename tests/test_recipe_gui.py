"""The gui recipe's tiny variant end to end: its data split, its configs, the shipped warm start, and a 2-step
training run through the CLI whose report.html is opened in headless Chromium (clicks drawn on screenshots).

The full generator and the ScreenSpot / AndroidControl converters are tested in ``test_gui_data.py``.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.cli import main
from mmrl.config import load_config
from mmrl.data import load_dataset
from mmrl.processors.geometry import smart_resize
from mmrl.recipes.gui.data import ScreenRenderer
from mmrl.recipes.gui.tiny import TINY_PIXELS, TINY_SCREEN, build, model_size
from mmrl.rewards.gui import gui_action
from mmrl.run.metrics import read_metrics
from mmrl.types import RewardInput

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "gui"

pytestmark = pytest.mark.chromium


@pytest.fixture
def renderer():
    """Closed at the end of its test: Playwright's sync API allows one running instance per thread, and the
    browser test below starts its own."""
    with ScreenRenderer() as r:
        yield r


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_tiny_split_is_deterministic_disjoint_and_its_sft_answers_earn_full_marks(tmp_path, renderer):
    a = build(tmp_path / "a", n_train=8, n_eval=4, n_sft=6, seed=2, renderer=renderer)
    build(tmp_path / "b", n_train=8, n_eval=4, n_sft=6, seed=2, renderer=renderer)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    images = {split: {hashlib.sha256((tmp_path / "a" / r["images"][0]).read_bytes()).digest()
                      for r in _rows(p)} for split, p in a.items()}  # fmt: skip
    assert not (images["train"] & images["eval"]) and not (images["sft"] & (images["train"] | images["eval"]))
    assert len(load_dataset(a["train"]).samples) == 8
    size, model = TINY_SCREEN.pixel_size, model_size()
    assert model == (140, 252) and model[0] * model[1] // 784 == 45  # image tokens per screenshot
    for r in _rows(a["sft"]):
        with Image.open(tmp_path / "a" / r["images"][0]) as im:
            assert im.size == size
        ref = r["metadata"]["reference"]
        meta = {"image_sizes": [list(size)], "model_image_sizes": [list(model)]}
        x = RewardInput(id=r["id"], response=r["answer"], reference=ref, metadata=meta)
        assert gui_action([x], scheme="ui_r1")[0].parts == {
            "type": 1.0,
            "coord": 1.0,
            "text": 1.0,
            "format": 1.0,
        }
    actions = {r["answer"]["action"] for r in _rows(a["train"]) + _rows(a["eval"])}
    assert "click" in actions and actions <= {"click", "input_text", "navigate_back"}


def test_tiny_configs_match_the_split_and_ship_their_warm_start(monkeypatch):
    monkeypatch.chdir(ROOT)  # the recipe names the warm start relative to the repository root
    tiny, sft = load_config(RECIPE / "tiny.yaml"), load_config(RECIPE / "sft.yaml")
    for cfg in (tiny, sft):
        assert (cfg.model.min_pixels, cfg.model.max_pixels) == TINY_PIXELS
    w, h = TINY_SCREEN.pixel_size
    assert smart_resize(h, w, min_pixels=TINY_PIXELS[0], max_pixels=TINY_PIXELS[1])[::-1] == model_size()
    assert Path(tiny.model.path).resolve() == ROOT / "assets" / "gui-sft" / "model"
    assert (Path(tiny.model.path) / "model.safetensors").stat().st_size < 5_000_000
    card = (ROOT / "assets" / "gui-sft" / "README.md").read_text()
    assert "mmrl sft recipes/gui/sft.yaml" in card
    assert [r.name for r in tiny.rewards] == ["gui_action"] and tiny.eval.success_threshold == 3.0


def _open_in_chromium(html: Path, shot: Path) -> dict:
    """Load the report page (no network), list each image's alt text and whether it decoded, screenshot it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(html.as_uri(), wait_until="load")
        imgs = page.eval_on_selector_all(
            "img", "els => els.map(e => [e.getAttribute('alt'), e.complete && e.naturalWidth > 0])"
        )
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    return {"imgs": imgs}


def test_tiny_recipe_trains_two_steps_and_its_report_shows_clicks_in_a_browser(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    data = build(tmp_path / "data", n_train=8, n_eval=4, n_sft=0, seed=5)
    run = tmp_path / "run"
    args = ["train", str(RECIPE / "tiny.yaml"), "--output-dir", str(run), "--max-steps", "2"]
    args += [f"data.train={data['train']}", f"data.eval={data['eval']}", "eval.max_samples=4", "eval.every=1"]
    args += ["train.prompts_per_step=4", "train.progress=false", "train.save_every=0"]
    assert main(args) == 0
    assert "held-out accuracy: start" in capsys.readouterr().out
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("eval/reward_mean" in r for r in rows)
    assert all(f"reward/gui_action/{p}" in rows[-1] for p in ("type", "coord", "format"))
    # the held-out mean of each part (the click's coordinate curve), from the same rewards
    assert all(
        0.0 <= r[f"eval/part/gui_action/{p}"] <= 1.0 for r in rows for p in ("type", "coord", "format")
    )
    logged = _rows(run / "rollouts.jsonl")
    assert {r["step"] for r in logged} == {1, 2} and all(len(r["responses"]) == 8 for r in logged)

    got = _open_in_chromium(run / "report.html", tmp_path / "report.png")
    assert got["imgs"] and all(ok for _, ok in got["imgs"]), got["imgs"]
    alts = [alt for alt, _ in got["imgs"]]
    overlays = alts.count("prediction and target drawn on the input")
    assert overlays == 8 * len(logged)  # one predicted click drawn per logged response
    assert alts.count("input image") == len(logged)
    page = np.asarray(Image.open(tmp_path / "report.png").convert("RGB"))
    assert page.shape[0] > 900 and page.std() > 20  # a long page with content, not a blank canvas
    assert len(np.unique(page.reshape(-1, 3), axis=0)) > 200  # screenshots and plots, not only text
