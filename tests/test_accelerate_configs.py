"""The shipped accelerate launch configs (recipes/accelerate/*.yaml) start real multi-process runs: each is launched
with accelerate's own ``accelerate launch`` on this CPU (2 processes over gloo instead of the 8 or 16 GPUs it
names; the 2-node configs as two launchers, one per "node", meeting at 127.0.0.1), trains 2 steps of the tiny
shapes run, and the run shows the parallelism the config asks for: DDP configs save one optimizer file (replicated
state), FSDP2 configs the sharded optimizer state of torch's distributed checkpoint, and every process's RNG."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from multiproc import shapes_run_config

from mmrl.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "recipes" / "accelerate").glob("*.yaml"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(config: Path, run_cfg: Path, out: Path, nodes: int, cwd: Path) -> None:
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    procs = []
    for rank in range(nodes):
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
        cmd += ["--num_processes", "2", "--main_process_port", port]
        if nodes > 1:
            cmd += ["--machine_rank", str(rank), "--main_process_ip", "127.0.0.1"]
        cmd += ["-m", "mmrl", "train", str(run_cfg), "--output-dir", str(out), "--max-steps", "2"]
        cmd += ["eval.every=0", "data.eval=null"]
        procs.append(
            subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    for p in procs:
        log, _ = p.communicate(timeout=600)
        assert p.returncode == 0, log[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_shipped_accelerate_config_launches_a_real_run(config, tmp_path):
    text = config.read_text()
    nodes = 2 if "num_machines: 2" in text else 1
    fsdp = "distributed_type: FSDP" in text
    run_cfg = shapes_run_config(tmp_path, micro_batch_size=8)
    out = tmp_path / "run"
    _launch(config, run_cfg, out, nodes, tmp_path)
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    ck = out / "checkpoints" / "step-2"
    assert (ck / "rng-1.pt").is_file()  # two processes took part
    if fsdp:
        assert (ck / "optimizer").is_dir() and not (ck / "optimizer.pt").exists()
    else:
        assert (ck / "optimizer.pt").is_file() and not (ck / "optimizer").exists()
