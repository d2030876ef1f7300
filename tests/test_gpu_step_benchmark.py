"""benchmarks/gpu_step.py, the GPU measurement script, runs its whole code path on this CPU (the tiny architecture,
both settings in their own processes), so a session that is lent a GPU can run it at once."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_step_benchmark_runs_both_settings_on_cpu(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_step.py"), "--arch", "tiny", "--device", "cpu"]
    cmd += ["--prompts", "2", "--group", "2", "--tokens", "6", "--image", "112x84", "--steps", "2"]
    cmd += ["--cache", str(tmp_path / "models"), "--out", str(tmp_path / "out")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1].startswith("s/step: checkpointing ")
    results = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    assert set(results) == {"checkpointing", "plain"}
    for res in results.values():
        # a random model does not stop early: every response has the requested length
        assert res["response_tokens"] == 6 and res["steps_timed"] == 1 and "oom" not in res
        assert res["s_per_step"] > 0 and res["rollout_tokens_per_s"] > 0 and res["peak_gib"] > 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "plain" / "metrics.jsonl").read_text().splitlines()]
    assert all(
        r["rollout/groups_with_signal"] > 0 and r["grad_norm"] > 0 for r in rows
    )  # the update did work
    saved = json.loads((tmp_path / "models" / "qwen2.5-vl-tiny-random" / "config.json").read_text())
    assert saved["model_type"] == "qwen2_5_vl"


def test_gpu_step_3b_architecture_has_the_3b_parameter_count():
    """The 3B shapes (built on the meta device: no memory) give 3,754,622,976 parameters (the published checkpoint's 3.75 B),
    668,684,288 of them in the vision tower."""
    import importlib.util

    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    spec = importlib.util.spec_from_file_location("gpu_step", ROOT / "benchmarks" / "gpu_step.py")
    gpu_step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_step)
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(gpu_step.make_config("3b"))
    assert sum(p.numel() for p in model.parameters()) == 3_754_622_976
    assert sum(p.numel() for p in model.model.visual.parameters()) == 668_684_288
