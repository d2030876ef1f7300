"""The GPU check (issues 17 §3 and 19): every CUDA-only test and the GPU benchmarks in one command, with a table at
the end and the numbers in ``benchmarks/results/gpu-<date>.json`` (``--out``). ``scripts/gpu-check.sh`` runs it; on a
lent GPU machine it is the first thing to run.

    python benchmarks/gpu_check.py [--budget-s 520] [--out $OUT/gpu-check.json]     # a CUDA machine
    OMP_NUM_THREADS=1 python benchmarks/gpu_check.py --device cpu --small   # the same code path on a CPU

Parts, in this order (the most needed first), each in its own subprocess with its own time limit; a part that fails
or runs out of time is reported as such and the others still run:
1. ``tests``: ``pytest -m gpu`` (tests/test_gpu.py): CUDA log-probs, a world-size-1 NCCL run through the distributed
   code path (DDP and FSDP2, resumed), the Dist collectives on NCCL, packed scoring equal to padded on CUDA, and the
   paths of tests/gpu_paths.py on CUDA (a multi-turn episode's per-turn log-probs, the HF judge against the CPU's and
   offloaded, the image check, pre-flight's memory probe without a CUDA context; with ``MMRL_GPU_TESTS_DEVICE=cpu``
   these run on a CPU instead of skipping: a rehearsal);
2. ``packing``: ``benchmarks/packing.py --device cuda --dtype bfloat16``: padded-token share and s/update, padded vs
   packed, on a wider random Qwen2.5-VL (about a minute);
3. ``step``: ``benchmarks/gpu_step.py --compare all``: s/step, tokens/s and peak memory of a
   Qwen2.5-VL-3B-architecture GRPO step, before (padded row micro-batches) and after (packed token-budget
   micro-batches) the throughput work, and after without activation checkpointing; each peak beside the memory
   planner's prediction for the same run;
4. ``logprobs``: ``benchmarks/logprob_memory.py --device cuda``: the chunked log-prob's peak against the naive one;
5. ``trl``: ``benchmarks/grpo_vs_trl.py --device cuda`` at the honest shape (64 new tokens, 112 px), where TRL is
   importable (a GPU machine without it gets it as wheels: ``scripts/gpu-wheels.sh``); else reported as skipped.

``--budget-s`` bounds the whole check: each part gets a shorter limit of its own (:func:`commands`), cut further to
the time left (less a margin), and a part that cannot start with a minute left is reported as skipped for the
budget; the step benchmark then times one step per setting after its warm-up step, not two. The JSON is rewritten
after every part (and gpu_step's ``results.json`` after every setting), so a check stopped from outside keeps what
it finished. Before the parts, a pre-flight lists mmrl's declared
dependencies that are not installed; ``import mmrl.train.trainer`` failing stops the check there (every part needs it).

The table printed last has one row per measured quantity; the JSON keeps each part's full output tail.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("tests", "packing", "step", "logprobs", "trl")
MARGIN_S = 15  # left between a part's limit and the budget's end, for the JSON and the table
MIN_START_S = 60  # a part is not started with less than this left


def run_part(name: str, cmd: list[str], timeout_s: float, env: dict[str, str]) -> dict:
    t0 = time.perf_counter()
    print(f"== {name} (limit {timeout_s:.0f} s): {' '.join(cmd)}", flush=True)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout_s)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        out = _text(e.stdout) + _text(e.stderr)
    wall = time.perf_counter() - t0
    print(out[-4000:], flush=True)
    print(f"== {name}: exit {rc} in {wall:.0f} s", flush=True)
    return {"cmd": cmd, "rc": rc, "wall_s": round(wall, 1), "tail": out[-6000:]}


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def pytest_counts(tail: str) -> dict[str, int]:
    """The counts of pytest's summary line: the last line that has them (stderr, printed after stdout, may end the
    output with a plugin's warning)."""
    pattern = r"(\d+) (passed|failed|skipped|errors?)"
    summary = next((line for line in reversed(tail.splitlines()) if re.search(pattern, line)), "")
    return {what: int(n) for n, what in re.findall(pattern, summary)}


def missing_dependencies() -> list[str]:
    """mmrl's declared (non-optional) dependencies that are not installed in this environment."""
    from packaging.requirements import Requirement

    missing = []
    try:
        requires = importlib.metadata.requires("mmrl") or []
    except importlib.metadata.PackageNotFoundError:
        return ["mmrl itself (not installed: pip install --no-deps -e .)"]
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(req.name)
    return missing


def commands(a: argparse.Namespace, py: str) -> dict[str, tuple[list[str], int, int]]:
    """Each part's command, its own time limit and its limit under ``--budget-s`` (seconds; a 3B step takes about
    a minute to build and a minute per setting on one H100/H200, the tests' torchrun runs about two, the gpu_paths
    tests at most half a minute: 9 s on the 2-core CPU, imports included)."""
    step_out = a.work / "gpu-check-step"
    step = [py, "benchmarks/gpu_step.py", "--device", a.device, "--out", str(step_out), "--compare", "all"]
    step += ["--cache", str(a.work / "gpu-step-models")]
    packing = [py, "benchmarks/packing.py", "--device", a.device]
    logprobs = [py, "benchmarks/logprob_memory.py", "--device", a.device]
    trl = [
        py,
        "benchmarks/grpo_vs_trl.py",
        "--device",
        a.device,
        "--max-new-tokens",
        "64",
        "--image-size",
        "112",
    ]
    if a.small:
        step += ["--arch", "tiny", "--prompts", "2", "--group", "2", "--tokens", "8", "--image", "112x112"]
        step += ["--steps", "2"]
        packing += ["--width", "128", "--layers", "2", "--prompts", "4", "--group", "2", "--rounds", "1"]
        logprobs += ["--batch", "2", "--tokens", "64", "--chunk", "32"]
        trl = trl[:4] + ["--max-new-tokens", "8", "--image-size", "56", "--steps", "2", "--warmup", "1"]
        trl += ["--rounds", "1"]
    else:
        packing += [
            "--dtype",
            "bfloat16",
            "--width",
            "1024",
            "--layers",
            "8",
            "--budget",
            "8192",
            "--rounds",
            "3",
        ]
        trl += ["--steps", "5", "--warmup", "2", "--rounds", "2"]
        if a.budget_s:  # a lease: a 3B setting is about a minute to load and 20-30 s a step
            step += ["--steps", "2"]
    return {
        "tests": ([py, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py"], 900, 240),
        "packing": (packing, 600, 90),
        "step": (step, 1500, 330),
        "logprobs": (logprobs, 600, 45),
        "trl": (trl, 900, 150),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--small", action="store_true", help="tiny shapes: the code path on a CPU in a few minutes"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="JSON path (default benchmarks/results/gpu-<date>.json)"
    )
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="seconds for the whole check (0: each part's own limit only)",
    )
    p.add_argument(
        "--work", type=Path, default=ROOT / "runs", help="folder for the benchmarks' models and runs"
    )
    a = p.parse_args()
    t0 = time.perf_counter()
    unknown = set(a.parts.split(",")) - set(PARTS)
    if unknown:
        p.error(f"unknown --parts {sorted(unknown)}: choose from {', '.join(PARTS)}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    py = sys.executable
    res: dict = {"date": dt.date.today().isoformat(), "device": a.device, "env": environment(a.device)}
    out = a.out or ROOT / "benchmarks" / "results" / f"gpu-{res['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(res, indent=1, default=str) + "\n")

    res["missing_dependencies"] = missing = missing_dependencies()
    if missing:
        print(f"pre-flight: mmrl's dependencies not installed here: {', '.join(missing)}", flush=True)
    pre = subprocess.run(
        [py, "-c", "import mmrl.train.trainer"], capture_output=True, text=True, cwd=ROOT, env=env
    )
    if pre.returncode:
        res["preflight"] = {"rc": pre.returncode, "tail": pre.stderr[-3000:]}
        save()
        sys.exit(
            f"gpu-check: `import mmrl.train.trainer` fails, so every part would:\n{pre.stderr[-1500:]}\n"
            "Carry them: scripts/gpu-wheels.sh here, then carry .gpu-site (scripts/gpu-check.sh unpacks it)."
        )
    cmds = commands(a, py)
    for name in [x for x in PARTS if x in a.parts.split(",")]:
        cmd, limit, budgeted = cmds[name]
        if name == "trl" and importlib.util.find_spec("trl") is None:
            res[name] = {
                "cmd": cmd,
                "rc": "skipped",
                "wall_s": 0,
                "tail": "TRL is not installed (scripts/gpu-wheels.sh packs it)",
            }
            print(f"== trl: skipped, {res[name]['tail']}", flush=True)
            save()
            continue
        if a.budget_s:
            left = a.budget_s - (time.perf_counter() - t0) - MARGIN_S
            if left < MIN_START_S:
                res[name] = {"cmd": cmd, "rc": "skipped", "wall_s": 0, "tail": f"budget: {left:.0f} s left"}
                print(f"== {name}: skipped, {left:.0f} s of --budget-s left", flush=True)
                save()
                continue
            limit = min(budgeted, left)
        res[name] = run_part(name, cmd, limit, env)
        if name == "tests":
            res[name]["counts"] = pytest_counts(res[name]["tail"])
        if name == "step":
            summary = a.work / "gpu-check-step" / "results.json"
            if summary.is_file():
                res[name]["results"] = json.loads(summary.read_text())["results"]
        save()
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    save()
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


def last_line(part: dict, prefix: str) -> str | None:
    lines = [x for x in part.get("tail", "").splitlines() if x.startswith(prefix)]
    return lines[-1] if lines else None


def table(res: dict) -> str:
    rows = [("part", "measured", "value")]
    for name in PARTS:
        part = res.get(name)
        if part is None:
            continue
        if part["rc"] == "skipped":
            rows.append((name, "skipped", part["tail"][:70]))
            continue
        if name == "tests":
            c = part.get("counts") or {}
            rows.append(
                (
                    "pytest -m gpu",
                    "passed / failed / skipped",
                    f"{c.get('passed', 0)} / {c.get('failed', 0)} / {c.get('skipped', 0)} (exit {part['rc']})",
                )
            )
        elif name == "step":
            for setting, r in (part.get("results") or {}).items():
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
            summary = last_line(part, "s/step:")
            if summary:
                rows.append(("gpu_step", "last line", summary[8:]))
            if part["rc"] != 0 or not part.get("results"):
                rows.append(("gpu_step", "exit", str(part["rc"])))
        else:
            prefix = {"packing": "padding share", "logprobs": "peak MB", "trl": "s/step:"}[name]
            label = {
                "packing": "padding share; speed-up",
                "logprobs": "peak MB mmrl / naive",
                "trl": "s/step",
            }
            line = last_line(part, prefix)
            rows.append(
                (name, label[name], line.removeprefix(prefix).strip(" :") if line else f"exit {part['rc']}")
            )
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(" | ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows)


if __name__ == "__main__":
    main()
