"""mmrl sft: the warm start lowers the answer loss, saves a loadable model and writes a card saying how."""

import json
from pathlib import Path

from mmrl.cli import main

TINY = str(Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl")


def test_sft_learns_answers_and_writes_card(tmp_path):
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=8, n_eval=4, n_sft=16, seed=1)
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(
        f"model: {{path: {TINY}, max_pixels: 3136}}\ndata: {{train: data/sft.jsonl}}\n"
        "sft: {lr: 0.003, steps: 30, batch_size: 8, label_smoothing: 0.1}\n"
    )
    assert main(["sft", str(cfg), "--output-dir", str(tmp_path / "out")]) == 0
    losses = [
        json.loads(x)["loss"] for x in (tmp_path / "out" / "sft_metrics.jsonl").read_text().splitlines()
    ]
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    card = (tmp_path / "out" / "README.md").read_text()
    assert "lr 0.003, 30 steps x 8 records" in card and "label smoothing 0.1" in card
    from transformers import AutoModelForImageTextToText

    AutoModelForImageTextToText.from_pretrained(tmp_path / "out" / "model")


def test_shapes_builder_is_reproducible_and_skews_only_the_sft_split(tmp_path):
    from mmrl.recipes.shapes.data import MAJORITY, build

    a = build(tmp_path / "a", n_train=200, n_eval=10, n_sft=200, seed=4)
    b = build(tmp_path / "b", n_train=200, n_eval=10, n_sft=200, seed=4)
    assert a["train"].read_text() == b["train"].read_text()
    assert (tmp_path / "a/images/shapes-train-00007.png").read_bytes() == (
        tmp_path / "b/images/shapes-train-00007.png"
    ).read_bytes()

    def majority_share(path):
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        return sum(r["answer"] == MAJORITY[r["metadata"]["kind"]] for r in rows) / len(rows)

    assert majority_share(a["train"]) < 0.45 < 0.55 < majority_share(a["sft"])
