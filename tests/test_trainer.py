"""End-to-end trainer runs on the bundled tiny model: resume exactness, metrics, checkpoints, CLI contract."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from mmrl.cli import main
from mmrl.run.checkpoint import list_checkpoints
from mmrl.run.metrics import read_metrics

TINY = str(Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl")


@pytest.fixture
def recipe(tmp_path):
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=24, n_eval=8, seed=5)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl, eval: data/eval.jsonl}}
rollout: {{n: 4, max_new_tokens: 3, batch_size: 8}}
algo: {{epochs: 2, mini_batches: 2, kl_coef: 0.01, old_logprobs: recompute}}
optim: {{lr: 0.001, micro_batch_size: 5, scheduler: cosine, schedule_steps: 4}}
rewards: [{{name: exact_match}}]
eval: {{every: 2, max_samples: 8}}
train: {{prompts_per_step: 4, save_every: 2, keep_checkpoints: 0, progress: false, seed: 3}}
"""
    )
    return cfg


def _comparable(rows):
    # time/* and sys/* describe the process (timings, reward-cache counts), not the resumable training state
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "sys/"))} for r in rows]


def test_resume_is_exact_and_metrics_are_appended(recipe, tmp_path):
    full, split = tmp_path / "full", tmp_path / "split"
    assert main(["train", str(recipe), "--output-dir", str(full), "--max-steps", "4"]) == 0
    assert main(["train", str(recipe), "--output-dir", str(split), "--max-steps", "2"]) == 0
    lines_before = (split / "metrics.jsonl").read_text()
    assert main(["train", str(recipe), "--output-dir", str(split), "--max-steps", "4", "--resume"]) == 0
    assert (split / "metrics.jsonl").read_text().startswith(lines_before)  # appended, never truncated
    a, b = (
        _comparable(read_metrics(full / "metrics.jsonl")),
        _comparable(read_metrics(split / "metrics.jsonl")),
    )
    assert [r["step"] for r in a] == [0, 1, 2, 3, 4]
    assert a == b  # identical per-step metrics, eval included
    for key in (
        "reward/mean",
        "reward/std",
        "loss",
        "kl",
        "entropy",
        "response_length/mean",
        "grad_norm",
        "sys/reward_cache_hits",
        "time/rollout",
    ):
        assert all(key in r for r in read_metrics(full / "metrics.jsonl")[1:])
    assert [p.name for p in list_checkpoints(full / "checkpoints")] == ["step-2", "step-4"]
    assert (full / "report.md").exists() and (full / "reward_curve.png").stat().st_size > 1000


def test_checkpoint_model_loads_with_transformers(recipe, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "run"
    assert main(["train", str(recipe), "--output-dir", str(out), "--max-steps", "2", "eval.every=0"]) == 0
    ck = out / "checkpoints" / "step-2"
    assert {"model", "optimizer.pt", "scheduler.pt", "rng.pt", "state.json"} <= {p.name for p in ck.iterdir()}
    AutoModelForImageTextToText.from_pretrained(ck / "model")
    assert type(AutoProcessor.from_pretrained(ck / "model")).__name__ == "Qwen2_5_VLProcessor"
    rollout = json.loads((out / "rollouts.jsonl").read_text().splitlines()[0])
    assert rollout["step"] == 1 and len(rollout["responses"]) == 4
    first = rollout["responses"][0]
    assert first["reward"] in (0.0, 1.0) and first["parts"]["exact_match"] == first["reward"]
    state = json.loads((ck / "state.json").read_text())
    assert state["step"] == 2 and state["sampler"]["pos"] == 8
    # config.json is the config as given (device "auto" stays "auto"); what the run resolved is in resolved.json
    from mmrl.config import load_config, to_dict

    given = to_dict(load_config(str(recipe), ["eval.every=0", "train.max_steps=2"]))
    assert json.loads((out / "config.json").read_text()) == given and given["model"]["device"] == "auto"
    assert json.loads((out / "resolved.json").read_text()) == {
        "device": "cpu",
        "processes": 1,
        "sharded": False,
        "replicated": False,
        "reference": "separate",
    }


def test_resume_without_checkpoint_is_a_clear_error(recipe, tmp_path, capsys):
    assert main(["train", str(recipe), "--output-dir", str(tmp_path / "none"), "--resume"]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err


def test_unknown_override_is_a_clear_error(recipe, tmp_path, capsys):
    assert main(["train", str(recipe), "--output-dir", str(tmp_path / "x"), "rollout.temprature=0.5"]) == 2
    assert "did you mean 'rollout.temperature'" in capsys.readouterr().err


def test_skipped_records_are_listed(tmp_path):
    Image.new("RGB", (56, 56)).save(tmp_path / "a.png")
    rows = [{"id": f"r{i}", "prompt": "Q?", "images": ["a.png"], "answer": "red"} for i in range(4)]
    rows.append({"id": "broken", "prompt": "Q?", "images": ["missing.png"], "answer": "red"})
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"model: {{path: {TINY}, max_pixels: 3136}}\ndata: {{train: d.jsonl, on_bad_record: skip}}\n"
        "rollout: {n: 2, max_new_tokens: 2}\nrewards: [{name: exact_match}]\n"
        "train: {prompts_per_step: 2, progress: false}\n"
    )
    assert main(["train", str(cfg), "--output-dir", str(tmp_path / "o"), "--max-steps", "1"]) == 0
    skipped = [json.loads(x) for x in (tmp_path / "o" / "skipped.jsonl").read_text().splitlines()]
    assert [s["id"] for s in skipped] == ["broken"] and "image file not found" in skipped[0]["reason"]


def test_console_entry_point_info():
    out = subprocess.run(
        [sys.executable, "-m", "mmrl.cli", "info"], capture_output=True, text=True, check=True
    )
    assert "transformers" in out.stdout and "pdflatex" in out.stdout
