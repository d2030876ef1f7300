"""Rollout engines: turn encoded prompts into sampled completions with per-token log-probs.

An engine is registered by name in ``ENGINES`` and built as ``ENGINES.get(name)(policy, cfg)``. The HF engine runs
everywhere (``model.generate``); a vLLM engine plugs in behind the same :class:`RolloutEngine` interface.
"""

from mmrl.rollout.base import ENGINES, Completion, RolloutEngine, SamplingParams
from mmrl.rollout.hf import HFEngine

__all__ = ["ENGINES", "Completion", "HFEngine", "RolloutEngine", "SamplingParams"]
