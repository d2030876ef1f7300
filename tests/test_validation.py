"""In-training validation with a benchmark's own scorer (the one mmrl eval uses): the logged eval/accuracy equals
what scoring the same responses with mmrl.eval gives, with its breakdowns."""

from pathlib import Path

from mmrl.cli import main
from mmrl.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"
MATHVISTA = ROOT / "tests" / "data" / "eval" / "mathvista" / "testmini.json"


def _config(tmp_path: Path, benchmark_data: Path, max_new_tokens: int) -> Path:
    """A 2-prompt shapes run validated on the MathVista items of ``benchmark_data``."""
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=8, n_eval=2, seed=1)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {TINY}, min_pixels: 3136, max_pixels: 12544}}
data: {{train: data/train.jsonl}}
rollout: {{n: 2, max_new_tokens: 4, batch_size: 8}}
rewards: [{{name: exact_match}}]
eval: {{benchmark: mathvista, benchmark_data: {benchmark_data}, max_samples: 6, max_new_tokens: {max_new_tokens}}}
train: {{prompts_per_step: 2, progress: false}}
"""
    )
    return cfg


def test_training_validates_with_the_benchmark_scorer(tmp_path):
    cfg = _config(tmp_path, MATHVISTA, max_new_tokens=8)
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "1"]) == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 1]
    first = rows[0]
    assert 0.0 <= first["eval/accuracy"] <= 1.0
    assert any(k.startswith("eval/accuracy/") and "=" in k for k in first)  # the benchmark's breakdowns
    assert "eval/reward_mean" not in first  # scored by the benchmark, not by the rewards

    # the same greedy responses scored by mmrl eval's scorer give the logged number
    from mmrl.config import load_config
    from mmrl.train.trainer import Trainer

    tr = Trainer(load_config(cfg, ["train.max_steps=1"]), tmp_path / "again")
    assert tr.evaluate()["eval/accuracy"] == first["eval/accuracy"]


def test_unknown_benchmark_is_a_one_line_error(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"data: {{train: {tmp_path}}}\nrewards: [{{name: exact_match}}]\neval: {{benchmark: mathvistaa}}\n"
    )
    assert main(["train", str(cfg), "--output-dir", str(tmp_path / "r")]) == 2
    assert "eval.benchmark: unknown benchmark 'mathvistaa'" in capsys.readouterr().err


def test_training_validation_screens_the_benchmark_items_as_mmrl_eval_does(tmp_path):
    """A benchmark item whose question holds the model's own vision token is left out with its reason (rank 0 lists it
    in eval_skipped.jsonl) and the run validates on the others; before, the processor raised mid-run."""
    import json
    import shutil

    bench = tmp_path / "mathvista"
    shutil.copytree(MATHVISTA.parent, bench)
    items = json.loads((bench / "testmini.json").read_text())
    bad = sorted(items)[1]
    items[bad]["question"] += " <|image_pad|>"
    (bench / "testmini.json").write_text(json.dumps(items))
    cfg = _config(tmp_path, bench / "testmini.json", max_new_tokens=4)
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "1"]) == 0
    listed = [json.loads(x) for x in (out / "eval_skipped.jsonl").read_text().splitlines()]
    assert len(listed) == 1 and "<|image_pad|>" in json.dumps(listed[0])
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 1]
