"""Rollout engines: turn encoded prompts into sampled completions with per-token log-probs.

An engine is registered by name in ``ENGINES`` and built as ``ENGINES.get(name)(policy, batch_size=..., **options)``.
The HF engine runs everywhere (``model.generate``); the vLLM engine (:mod:`mmrl.rollout.vllm`) is registered always
but imports vLLM only when built, so environments without vLLM still work and ``rollout.engine: vllm`` there fails
with the install command (``VLLMEngine.check()`` tells before any model is loaded).
"""

from mmrl.rollout.base import ENGINES, Completion, RolloutEngine, SamplingParams
from mmrl.rollout.hf import HFEngine
from mmrl.rollout.latr import LATREngine
from mmrl.rollout.vllm import VLLMEngine

__all__ = ["ENGINES", "Completion", "HFEngine", "LATREngine", "RolloutEngine", "SamplingParams", "VLLMEngine"]
