"""Every tiny recipe runs end to end on the bundled assets (2 steps). A recipe with a test file of its own
(``tests/test_recipe_<name>.py``) smoke-runs its tiny configs there on a small split (its full data can take minutes
to render); the others run here, building their data in a temp folder."""

from pathlib import Path

import pytest

from mmrl.cli import main
from mmrl.config import load_config
from mmrl.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPES = sorted(
    p
    for p in ROOT.glob("recipes/*/tiny.yaml")
    if not (ROOT / "tests" / f"test_recipe_{p.parent.name}.py").exists()
)


def test_every_recipe_with_tiny_configs_is_smoke_run():
    """Each recipe folder with a tiny config is run here or has its own test file, which runs it through the CLI."""
    for folder in sorted({p.parent for p in ROOT.glob("recipes/*/tiny*.yaml")}):
        own = ROOT / "tests" / f"test_recipe_{folder.name}.py"
        if own.exists():
            text = own.read_text()
            assert "main(" in text and "tiny" in text, f"{own} does not run a tiny config through the CLI"
        else:
            assert folder / "tiny.yaml" in TINY_RECIPES, folder


@pytest.mark.parametrize("recipe", TINY_RECIPES, ids=lambda p: p.parent.name)
def test_tiny_recipe_smoke(recipe, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(recipe)
    assert Path(cfg.model.path).exists() or (ROOT / cfg.model.path).exists(), (
        "the recipe's warm start is not shipped"
    )
    data = tmp_path / "data"
    args = [
        "train",
        str(recipe),
        "--output-dir",
        str(tmp_path / "run"),
        "--max-steps",
        "2",
        f"data.train={data / 'train.jsonl'}",
        f"data.eval={data / 'eval.jsonl'}",
        "eval.max_samples=8",
        "eval.every=1",
        "train.progress=false",
        "train.save_every=0",
    ]
    assert main(args) == 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("eval/accuracy" in r for r in rows)
    assert "held-out accuracy: start" in capsys.readouterr().out
    assert (tmp_path / "run" / "reward_curve.png").exists()
    assert (tmp_path / "run" / "checkpoints" / "step-2" / "model" / "config.json").exists()
