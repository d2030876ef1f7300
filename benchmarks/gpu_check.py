"""The GPU check (issue 17 §3): every CUDA-only test and the GPU benchmarks in one command, with a table at the end
and the numbers in ``benchmarks/results/gpu-<date>.json``. ``scripts/gpu-check.sh`` runs it; on a lent GPU
machine it is the first thing to run.

    python benchmarks/gpu_check.py                 # a CUDA machine (torch, transformers, accelerate, peft)
    OMP_NUM_THREADS=1 python benchmarks/gpu_check.py --device cpu --small   # the same code path on a CPU

Parts, each in its own subprocess with its own time limit (a part that fails or runs out of time is reported as
such and the others still run):
1. ``pytest -m gpu`` (tests/test_gpu.py): CUDA log-probs, a world-size-1 NCCL run through the distributed code path
   (DDP and FSDP2, resumed), the Dist collectives on NCCL;
2. ``benchmarks/gpu_step.py``: s/step, tokens/s and peak memory of a Qwen2.5-VL-3B-architecture GRPO step with and
   without activation checkpointing, each peak beside the memory planner's prediction for the same run;
3. ``benchmarks/logprob_memory.py --device cuda``: the chunked log-prob's peak against the naive one.

The table printed last has one row per measured quantity; the JSON keeps each part's full output tail.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_part(name: str, cmd: list[str], timeout_s: int, env: dict[str, str]) -> dict:
    t0 = time.perf_counter()
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout_s)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    wall = time.perf_counter() - t0
    print(out[-4000:], flush=True)
    print(f"== {name}: exit {rc} in {wall:.0f} s", flush=True)
    return {"cmd": cmd, "rc": rc, "wall_s": round(wall, 1), "tail": out[-6000:]}


def pytest_counts(tail: str) -> dict[str, int]:
    counts = {}
    for n, what in re.findall(
        r"(\d+) (passed|failed|skipped|errors?)", tail.splitlines()[-1] if tail else ""
    ):
        counts[what] = int(n)
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--small", action="store_true", help="tiny shapes: the code path on a CPU in a few minutes"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="JSON path (default benchmarks/results/gpu-<date>.json)"
    )
    p.add_argument("--parts", default="tests,step,logprobs")
    p.add_argument(
        "--work", type=Path, default=ROOT / "runs", help="folder for the benchmarks' models and runs"
    )
    a = p.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    py = sys.executable
    parts = set(a.parts.split(","))
    res: dict = {"date": dt.date.today().isoformat(), "device": a.device, "env": environment(a.device)}
    if "tests" in parts:
        res["tests"] = run_part(
            "tests", [py, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py"], 900, env
        )
        res["tests"]["counts"] = pytest_counts(res["tests"]["tail"])
    if "step" in parts:
        step_out = a.work / "gpu-check-step"
        cmd = [py, "benchmarks/gpu_step.py", "--device", a.device, "--out", str(step_out)]
        cmd += ["--cache", str(a.work / "gpu-step-models")]
        if a.small:
            cmd += ["--arch", "tiny", "--prompts", "2", "--group", "2", "--tokens", "8", "--image", "112x112"]
            cmd += ["--steps", "2"]
        res["step"] = run_part("gpu_step", cmd, 1500, env)
        summary = step_out / "results.json"
        if summary.is_file():
            res["step"]["results"] = json.loads(summary.read_text())["results"]
    if "logprobs" in parts:
        cmd = [py, "benchmarks/logprob_memory.py", "--device", a.device]
        if a.small:
            cmd += ["--batch", "2", "--tokens", "64", "--chunk", "32"]
        res["logprobs"] = run_part("logprob_memory", cmd, 600, env)
    out = a.out or ROOT / "benchmarks" / "results" / f"gpu-{res['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(table(res))
    print(f"written {out}")


def environment(device: str) -> dict:
    import torch

    env = {"torch": torch.__version__, "python": sys.version.split()[0]}
    for mod in ("transformers", "accelerate", "peft", "vllm", "flash_attn"):
        try:
            env[mod] = __import__(mod).__version__
        except ImportError:
            env[mod] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        env |= {"gpu": torch.cuda.get_device_name(), "gpu_total_gib": round(total / 2**30, 1)}
    return env


def table(res: dict) -> str:
    rows = [("part", "measured", "value")]
    if "tests" in res:
        c = res["tests"].get("counts") or {}
        rows.append(
            (
                "pytest -m gpu",
                "passed / failed / skipped",
                f"{c.get('passed', 0)} / {c.get('failed', 0)}"
                f" / {c.get('skipped', 0)} (exit {res['tests']['rc']})",
            )
        )
    for setting, r in (res.get("step", {}).get("results") or {}).items():
        rows.append((f"gpu_step {setting}", "s/step", f"{r['s_per_step']:.2f}"))
        rows.append(
            (
                f"gpu_step {setting}",
                "rollout / training tokens/s",
                f"{r['rollout_tokens_per_s']:.0f} / {r['train_tokens_per_s']:.0f}",
            )
        )
        planned = r.get("planned_peak_gib")
        rows.append(
            (
                f"gpu_step {setting}",
                "peak GiB measured (planned)",
                f"{r['peak_gib']:.2f}"
                + (f" ({planned:.2f}, ratio {r['peak_gib'] / planned:.2f})" if planned else ""),
            )
        )
        if "oom" in r:
            rows.append((f"gpu_step {setting}", "OUT OF MEMORY", r["oom"][:60]))
    if "step" in res and not res["step"].get("results"):
        rows.append(("gpu_step", "failed", f"exit {res['step']['rc']}"))
    if "logprobs" in res:
        last = [x for x in res["logprobs"]["tail"].splitlines() if x.startswith("peak MB")]
        rows.append(
            (
                "logprob_memory",
                "peak MB mmrl / naive",
                last[-1][8:] if last else f"exit {res['logprobs']['rc']}",
            )
        )
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(" | ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows)


if __name__ == "__main__":
    main()
