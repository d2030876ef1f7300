"""The GPU check (benchmarks/gpu_check.py, run by scripts/gpu-check.sh) runs its whole code path on this CPU: the
CUDA-only tests (skipped here, with their reason), benchmarks/gpu_step.py with the tiny architecture (before / after
the throughput work and after without checkpointing, each in its own process), the packing, log-prob memory and
mmrl-vs-TRL benchmarks; then the table and the JSON. A session that is lent a GPU can run it at once. The
dependencies that do not travel to a bare GPU machine (scripts/gpu-wheels.sh's LEFT_OUT) are unimportable throughout.
Its time budget skips what cannot start in time and says so."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _left_out_stubs(folder: Path) -> str:
    """A folder of packages that fail on import, one per import name of the dependencies scripts/gpu-wheels.sh leaves
    out of a GPU machine's archive: first on PYTHONPATH, they make any import of them on the check's path fail here
    as it would there."""
    from test_gpu_image import LEFT_OUT_MODULES

    for name in LEFT_OUT_MODULES:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(
            f"raise ImportError('{name}: left out of the GPU archive')\n"
        )
    return str(folder)


def _check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "gpu-check.json"
    # through the script a GPU machine runs (its CUDA requirement waived for --device cpu)
    cmd = ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--device", "cpu", "--small"]
    cmd += ["--work", str(tmp_path), "--out", str(out), *args]
    stubs = _left_out_stubs(tmp_path / "left-out")
    # this Python's own packages, not a GPU archive that scripts/gpu-wheels.sh may have left in the checkout
    env = {**ENV, "PYTHON": sys.executable, "PYTHONPATH": stubs, "GPU_SITE": str(tmp_path / "no-archive")}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads(out.read_text())


@pytest.mark.slow
def test_gpu_check_runs_every_part_on_cpu(tmp_path):
    r, res = _check(tmp_path)
    assert res["missing_dependencies"] == []
    counts = res["tests"]["counts"]
    assert counts.get("skipped", 0) >= 1 and not counts.get("failed"), res["tests"].get("tail", "")[-3000:]
    results = res["step"]["results"]
    assert list(results) == ["before", "after", "after-plain"]
    assert [(s["packing"], s["checkpointing"]) for s in results.values()] == [
        (False, True),
        (True, True),
        (True, False),
    ]
    for s in results.values():
        # a random model does not stop early: every response has the requested length
        assert s["response_tokens"] == 8 and s["steps_timed"] == 1 and "oom" not in s
        assert s["s_per_step"] > 0 and s["rollout_tokens_per_s"] > 0 and s["peak_gib"] > 0
    for setting in results:
        rows = (tmp_path / "gpu-check-step" / setting / "metrics.jsonl").read_text().splitlines()
        # the update did work
        assert all(
            json.loads(x)["rollout/groups_with_signal"] > 0 and json.loads(x)["grad_norm"] > 0 for x in rows
        )
    assert "peak MB: mmrl" in res["logprobs"]["tail"] and res["logprobs"]["rc"] == 0
    assert res["packing"]["rc"] == 0 and "after 0.0%; update speed-up" in res["packing"]["tail"]
    assert res["trl"]["rc"] == 0 and "s/step: mmrl" in res["trl"]["tail"]
    table = r.stdout[r.stdout.index("part ") :]
    for row in (
        "pytest -m gpu",
        "gpu_step after-plain",
        "gpu_step             | last line",
        "packing",
        "trl",
    ):
        assert row in table, row
    assert "ratio" in table.split("last line")[1].splitlines()[0]  # before / after


def test_gpu_check_budget_skips_what_cannot_start(tmp_path):
    """--budget-s 30: no part can start with a minute left; each is reported as skipped for the budget, in the JSON
    and the table, and the check still ends cleanly."""
    r, res = _check(tmp_path, "--parts", "logprobs,packing", "--budget-s", "30")
    for part in ("logprobs", "packing"):
        assert res[part]["rc"] == "skipped" and res[part]["tail"].startswith("budget:"), res[part]
    table = r.stdout[r.stdout.index("part ") :]
    rows = {line.split("|")[0].strip(): line for line in table.splitlines()[1:] if "|" in line}
    assert set(rows) == {"logprobs", "packing"} and all("| skipped" in x for x in rows.values())


def test_the_planner_fits_each_setting_to_the_card(tmp_path):
    """On CUDA each setting runs as ``mmrl plan`` fits it to the card: at the 3B shapes on a 139 GiB H200 the
    checkpointed settings run as configured, and ``after-plain`` (no checkpointing, 12 rows of 1,332 tokens a
    micro-batch: 271 GiB planned) gets the plan's cheapest change, a smaller token budget, reported in its result."""
    import importlib.util

    from mmrl.config import load_config
    from mmrl.plan.planner import plan_run

    spec = importlib.util.spec_from_file_location("gpu_step", ROOT / "benchmarks" / "gpu_step.py")
    gpu_step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_step)
    a = gpu_step.parser().parse_args(["--compare", "all"])
    data = gpu_step.write_data(tmp_path, 2, 32, 32)
    config = ROOT / "mmrl" / "plan" / "configs" / "Qwen2.5-VL-3B-Instruct"
    runs = {}
    for setting in ("before", "after", "after-plain"):
        overrides = gpu_step.setting_config(a, setting, config, data)
        cfg, changes = gpu_step.fitted(load_config(None, overrides), overrides, 139.0)
        runs[setting] = changes
        assert plan_run(cfg, gpu_step._plan_options(cfg, 139.0), advise=False).fits, setting
    assert runs["before"] == runs["after"] == []
    assert len(runs["after-plain"]) == 1 and runs["after-plain"][0].startswith("optim.micro_batch_tokens=")
    assert int(runs["after-plain"][0].split("=")[1]) < a.micro_batch_tokens


def test_pytest_counts_reads_the_summary_line_even_when_a_warning_follows_it():
    """stderr comes after stdout in a part's output: a plugin's warning there (pytest-benchmark under xdist's
    environment) must not hide the summary."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import pytest_counts

    tail = "..\n1 passed, 1 skipped in 8.07s\nlogger.py:44: PytestBenchmarkWarning: disabled\n  warner(x)\n"
    assert pytest_counts(tail) == {"passed": 1, "skipped": 1}
    assert pytest_counts("") == {}
