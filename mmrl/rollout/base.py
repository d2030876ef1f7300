"""The rollout-engine contract: what the trainer, the episode driver, pre-flight checks and ``mmrl eval`` may ask of an
engine. Every engine subclasses :class:`RolloutEngine`; callers use these members and nothing else."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from mmrl.registry import Registry, validate_kwargs


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    # > 0: each completion also records, per generated token, the ``top_logprobs`` most likely tokens of the T = 1
    # distribution (after the engine's vision-placeholder mask) with their log-probs (LATR's branching test)
    top_logprobs: int = 0


@dataclass
class Completion:
    token_ids: list[int]  # sampled tokens, the stop token included when finish_reason == "stop"
    text: str  # decoded without special tokens
    logprobs: list[float]  # log pi_old(token) under logits / temperature (logits themselves when greedy)
    finish_reason: Literal["stop", "length"]
    # the policy version whose weights sampled each token (an engine with weights of its own that an update may
    # replace while it generates: docs/async.md#asynchronous-rollouts); None where the engine does not record it
    versions: list[int] | None = None
    # per token, [(token id, log-prob at T = 1)] most likely first, when SamplingParams.top_logprobs > 0
    top: list[list[tuple[int, float]]] | None = None


class RolloutEngine(ABC):
    """Built as ``ENGINES.get(name)(policy, batch_size=..., **rollout.engine_options)``."""

    # True: the engine keeps its own copy of the weights, synced by :meth:`sync_weights` (generation needs no FSDP
    # gather, and the whole batch goes to it at once: it schedules requests itself); False: it generates with the
    # policy's own modules, ``batch_size`` prompts at a time
    owns_weights: ClassVar[bool] = False
    # whether a completion's log-probs are the policy's at the run's temperature (the sampling distribution); an
    # engine that records some at another one (LATR: its tree prefix at T = 1) needs pi_old recomputed
    logprobs_at_run_temperature: ClassVar[bool] = True
    batch_size: int
    version: int = (
        0  # the policy version the engine's weights hold (the syncs so far): each sampled token's label
    )

    @classmethod
    def check(cls) -> None:
        """Pre-flight, before any model loads: raise ImportError with the install command when the engine's package is
        missing or outside its tested range."""
        return None

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Pre-flight: raise ValueError naming the first of ``rollout.engine_options`` the engine would refuse. By
        default the options are the constructor's keywords."""
        validate_kwargs(cls, options, "engine options", skip=("policy", "batch_size"))

    @abstractmethod
    def generate(self, prompts: list, params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, in prompt order."""

    def generate_streaming(
        self, prompts: list, params: SamplingParams, on_group: Callable[[int, list[Completion]], None]
    ) -> list[list[Completion]]:
        """:meth:`generate`, calling ``on_group(i, completions)`` once prompt ``i``'s completions are done, so their
        rewards can start while the others generate. By default after the whole call, in prompt order; an engine that
        finishes requests one by one (vLLM) calls it as each finishes."""
        groups = self.generate(prompts, params)
        for i, group in enumerate(groups):
            on_group(i, group)
        return groups

    @abstractmethod
    def sync_weights(self) -> None:
        """Make the engine sample from the policy's current weights (a no-op when they share memory)."""

    def take_pushed(self, load: Callable[[], None], version: int) -> None:
        """A generating process of a separate placement (:mod:`mmrl.train.placement`): ``load`` writes the pushed
        weights into the policy's parameters; from the next decoding step on, the engine samples with them, labelled
        ``version``, while the requests running keep their KV cache."""
        raise NotImplementedError(f"{type(self).__name__} cannot take pushed weights while it generates")

    def close(self) -> None:
        """Release what the engine holds (processes, process groups); idempotent. Called on every rank at the end."""
        return None

    def take_stats(self) -> dict[str, float]:
        """What the engine counted since the last call, to log with the step (LATR's tree sizes); then reset."""
        return {}

    def score(self, contexts: list, tails: list[int]) -> list[list[float]] | None:
        """The engine's own log-probs of the last ``tails[i]`` tokens of each context (a whole trajectory), for the
        image check (:mod:`mmrl.train.image_check`); None where the engine's scoring is the policy's (HF: it samples
        with the policy itself, so the policy's check covers it)."""
        return None


ENGINES: Registry[type[RolloutEngine]] = Registry("rollout engine")
