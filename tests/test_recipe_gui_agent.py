"""The gui_agent recipe's tiny config runs end to end through the CLI on a small panel split (its full split renders
500 apps in Chromium, minutes): episodes in the browser env, GiGPO, in-training validation by episodes, the report's
trajectory strips."""

import json
from pathlib import Path

import pytest

from mmrl.cli import main
from mmrl.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.chromium
def test_tiny_gui_agent_recipe_smoke(tmp_path, monkeypatch):
    from mmrl.envs.browser import close_shared_browser
    from mmrl.recipes.gui_agent.data import build_tiny_panel

    data = tmp_path / "data"
    build_tiny_panel(data, n_train=6, n_eval=3, n_sft=0, seed=4)
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    args = [
        "train",
        str(ROOT / "recipes" / "gui_agent" / "tiny.yaml"),
        "--output-dir",
        str(out),
        "--max-steps",
        "2",
        f"data.train={data / 'train.jsonl'}",
        f"data.eval={data / 'eval.jsonl'}",
        "eval.max_samples=3",
        "eval.every=1",
        "rollout.n=2",
        "train.prompts_per_step=2",
        "train.progress=false",
        "train.save_every=0",
    ]
    try:
        assert main(args) == 0
    finally:
        close_shared_browser()
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("eval/accuracy" in r and "eval/step_accuracy" in r for r in rows)
    for r in rows[1:]:
        assert 1.0 <= r["episode/turns_mean"] <= 5.0 and r["episode/errors"] == 0
    logged = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    turns = [t for row in logged for resp in row["responses"] for t in resp["turns"]]
    assert turns and all((out / img).is_file() for t in turns for img in t["images"])
    html = (out / "report.html").read_text()
    assert html.count('class="strip"') >= 1  # the logged episodes drawn as strips
