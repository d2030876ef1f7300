"""Shared by the multi-process tests (test_distributed.py, test_fsdp.py): the real torchrun launcher on gloo, the
2-process shapes run config they both train, and the metric keys that are wall-clock rather than training state."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WALL_CLOCK = ("vade/select_ms", "vade/draw_ms")
# the environment as the test session started: an in-process vLLM engine (another test) exports its own settings
# (LD_PRELOAD, LOCAL_WORLD_SIZE, VLLM_DIST_IDENT, ...), which must not reach the processes launched here
BASE_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def torchrun(nproc: int, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=BASE_ENV, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]  # a rank that aborts, also after its work, fails the test
    return r


def launch(
    nproc: int, cfg: Path, out: Path, *args: str, fault: str | None = None
) -> subprocess.CompletedProcess:
    """``mmrl train cfg`` under torchrun (``fault``: through tests/fault_launch.py); the caller checks the exit."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    cmd += [str(ROOT / "tests" / "fault_launch.py"), fault, "--"] if fault else ["-m", "mmrl"]
    cmd += ["train", str(cfg), "--output-dir", str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cfg.parent, env=BASE_ENV, timeout=600)


def launch_separate(
    nproc: int, cfg: Path, out: Path, *args: str, fault: str | None = None
) -> subprocess.CompletedProcess:
    """:func:`launch` in a separate placement."""
    return launch(nproc, cfg, out, "rollout.placement=separate", *args, fault=fault)


def ahead_then_killed_and_resumed(launcher, nproc: int, cfg: Path, tmp: Path, args: list[str]) -> list[dict]:
    """A 6-step run of ``args`` (``rollout.max_staleness=1``) launched by ``launcher`` (:func:`launch` or
    :func:`launch_separate`) into ``tmp/full``: every step within one version of its batch, some batch one version
    old (the rollout side ran ahead). Then the same run SIGKILLed in training rank 0's step-5 update into
    ``tmp/split`` (its checkpoint is step 4; batches 5 and 6 were generated) and resumed: every step's prompts are
    the uninterrupted run's, none lost or used twice. Returns the uninterrupted run's metric rows."""
    from mmrl.run.metrics import read_metrics

    full = launcher(nproc, cfg, tmp / "full", *args)
    assert full.returncode == 0, full.stderr[-3000:]
    rows = read_metrics(tmp / "full" / "metrics.jsonl")
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    for r in steps:
        assert 0 <= r["async/staleness_mean"] <= r["async/staleness_max"] <= 1
        assert "time/train_idle" in r and "time/rollout_idle" in r
    assert max(r["async/staleness_max"] for r in steps) == 1
    killed = launcher(nproc, cfg, tmp / "split", *args, fault="kill:0:5")
    assert killed.returncode != 0
    assert (tmp / "split" / "checkpoints" / "step-4").is_dir()
    resumed = launcher(nproc, cfg, tmp / "split", *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert rollout_ids(tmp / "split") == rollout_ids(tmp / "full")
    return rows


def shapes_run_config(tmp_path: Path, micro_batch_size: int) -> Path:
    """A 4-prompt shapes run with VADE, KL, 2 mini-batches, evaluation and a checkpoint every 2 steps."""
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=32, n_eval=8, seed=6)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {ROOT / "assets" / "shapes-sft" / "model"}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl, eval: data/eval.jsonl}}
rollout: {{n: 4, max_new_tokens: 4, batch_size: 8}}
algo: {{kl_coef: 0.01, mini_batches: 2}}
optim: {{lr: 0.001, micro_batch_size: {micro_batch_size}, schedule_steps: 4, scheduler: cosine}}
rewards: [{{name: exact_match}}]
eval: {{every: 2, max_samples: 8}}
sampler: {{name: vade}}
train: {{prompts_per_step: 4, save_every: 2, keep_checkpoints: 0, progress: false, seed: 3}}
"""
    )
    return cfg


def rollout_ids(out: Path) -> dict[int, list[str]]:
    """Each step's record ids in a run's rollouts.jsonl, in order: what a resumed run is compared on."""
    import json

    ids: dict[int, list[str]] = {}
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        ids.setdefault(row["step"], []).append(row["id"])
    return ids
