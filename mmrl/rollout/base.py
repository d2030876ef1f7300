"""The rollout-engine interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from mmrl.registry import Registry


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64


@dataclass
class Completion:
    token_ids: list[int]  # sampled tokens, the stop token included when finish_reason == "stop"
    text: str  # decoded without special tokens
    logprobs: list[float]  # log pi_old(token) under logits / temperature (logits themselves when greedy)
    finish_reason: Literal["stop", "length"]


class RolloutEngine(Protocol):
    def generate(self, prompts: list, params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, in prompt order."""
        ...

    def sync_weights(self) -> None:
        """Make the engine sample from the policy's current weights (a no-op when they share memory)."""
        ...


ENGINES: Registry[type] = Registry("rollout engine")
