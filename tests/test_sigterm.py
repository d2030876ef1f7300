"""A training run stopped with SIGTERM (a scheduler's kill) exits through the trainer's cleanup: its heavy-reward
worker processes end with it, its logs are complete lines, and it resumes from its last checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]

REWARD = """
import time
from mmrl.rewards.base import register_reward
from mmrl.types import RewardResult


@register_reward("slow_exact", heavy=True)
def slow_exact(batch):
    time.sleep(0.05)  # a rendering reward's pace: it runs in the worker pool
    return [RewardResult(score=float(x.response.strip() == str(x.reference))) for x in batch]
"""


def test_sigterm_stops_the_run_with_its_reward_workers_and_it_resumes(tmp_path):
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=32, n_eval=8, seed=4)
    (tmp_path / "slow.py").write_text(REWARD)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {ROOT / "assets" / "shapes-sft" / "model"}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl}}
rollout: {{n: 4, max_new_tokens: 4, batch_size: 16}}
rewards: [{{name: {tmp_path / "slow.py"}:slow_exact}}]
train: {{prompts_per_step: 4, max_steps: 500, save_every: 1, progress: false, reward_workers: 2}}
"""
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "mmrl", "train", str(cfg), "--output-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.5)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the heavy reward's worker pool should be running"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]  # every line whole
    done = max(r["step"] for r in rows)
    resumed = subprocess.run(
        [*cmd, "--resume", "--max-steps", str(done + 1)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps[-1] == done + 1
