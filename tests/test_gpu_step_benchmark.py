"""The GPU check (benchmarks/gpu_check.py, run by scripts/gpu-check.sh) runs its whole code path on this CPU: the
CUDA-only tests (skipped here, with their reason), benchmarks/gpu_step.py with the tiny architecture (both settings
in their own processes) and the log-prob memory benchmark; then the table and the JSON. A session that is lent a
GPU can run it at once."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_runs_every_part_on_cpu(tmp_path):
    out = tmp_path / "gpu-check.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--small"]
    cmd += ["--work", str(tmp_path), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["tests"]["counts"].get("skipped", 0) >= 1 and not res["tests"]["counts"].get("failed")
    results = res["step"]["results"]
    assert set(results) == {"checkpointing", "plain"}
    for s in results.values():
        # a random model does not stop early: every response has the requested length
        assert s["response_tokens"] == 8 and s["steps_timed"] == 1 and "oom" not in s
        assert s["s_per_step"] > 0 and s["rollout_tokens_per_s"] > 0 and s["peak_gib"] > 0
    rows = [
        json.loads(x)
        for x in (tmp_path / "gpu-check-step" / "plain" / "metrics.jsonl").read_text().splitlines()
    ]
    assert all(
        x["rollout/groups_with_signal"] > 0 and x["grad_norm"] > 0 for x in rows
    )  # the update did work
    assert "peak MB: mmrl" in res["logprobs"]["tail"] and res["logprobs"]["rc"] == 0
    table = r.stdout[r.stdout.index("part ") :]
    assert "gpu_step plain" in table and "logprob_memory" in table and "pytest -m gpu" in table
