"""Advantage estimators: group baselines (docs/algorithms.md#grpo-family) and the batch-whitened REINFORCE family.

Every estimator is a class in ``ADVANTAGES`` with one interface, so the trainer never tests a method's name:

    est = ADVANTAGES.get(name)(num_records, eps=..., **options)   # options checked against __init__'s signature
    adv, stats = est(AdvantageInput(...))                         # adv [B*G] or [B*G, T]; stats: floats to log
    est.state_dict() / est.load_state_dict(state)                 # JSON-serialisable, saved in state.json

Class (or instance) attributes the trainer reads: ``needs_entropy`` (pass the full-vocabulary entropy under pi_old),
``needs_init`` (run one pass of the initial policy over the training prompts and call ``initialise``),
``min_group_size`` (smallest ``rollout.n`` the method is defined for), and ``shift_invariant`` /
``scale_invariant`` (adding a constant to / multiplying every reward by a positive constant leaves the advantages
unchanged), which :func:`mmrl.algos.corrections.check_reward_correction` uses to refuse corrections that would do
nothing.

Stateless estimators are pure functions ``fn(rewards [B, G], eps) -> [B, G]`` wrapped by :func:`group_advantage`.
Departures from the papers:
- ``grpo``: unbiased std as the GRPO reference code; a group of one reads mean 0, std 1 (docs/algorithms.md#grpo-family), so
  A = r (TRL gives 0 there, tests/test_algos_trl.py).
- ``dr_grpo``: A = r - mean_G (no std), as Dr. GRPO; the 1/constant of its loss is the ``seq-mean-token-sum-norm``
  aggregation, not part of the advantage.
- ``rloo``: A_i = r_i - mean_{j != i} r_j (leave-one-out), needs G >= 2.
- ``reinforce``: A = r, no baseline: the estimator the noisy-verifier corrections (docs/rewards.md#domain-rewards) are derived for.
- ``reinforce_pp``: REINFORCE++ without a KL-in-reward term (add it with ``kl_penalised_rewards``):
  A = (r - mean) / sqrt(var + eps), mean and unbiased variance taken over every response token of the batch, as
  OpenRLHF's, verl's and the MSSR authors' code whiten, so a longer response weighs more; works with one response
  per prompt. verl adds 1e-8 inside the square root where this uses ``eps``.

Every estimator also logs ``advantage/mean|std|min|max`` (over responses for [B*G], over unmasked tokens for
token-level advantages; population std). The multi-turn estimators, which read ``AdvantageInput.turns``, are in
:mod:`mmrl.algos.multiturn`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mmrl.registry import Registry

ADVANTAGES: Registry[type[AdvantageEstimator]] = Registry("advantage estimator")


@dataclass(frozen=True)
class Turn:
    """One step of a multi-turn trajectory (docs/agents.md#step-level-credit): the action's tokens, the environment's reward for it,
    and the anchor-state key of the observation the action was taken in."""

    start: int  # first action token: an index into the row's response tokens
    end: int  # one past the last action token
    reward: float  # r_t, the environment's reward for this step
    state_key: str  # the env's key of the observation (without history); equal keys are the same state
    action_key: str = (
        ""  # the action's identity (a digest of its token ids; "" where unknown): equal keys, equal actions
    )


@dataclass
class AdvantageInput:
    """What an estimator sees for one rollout batch of B prompts with G responses each (rows prompt-major)."""

    rewards: torch.Tensor  # [B, G] float; a multi-turn row's episode return R(tau)
    indices: list[int]  # [B] dataset index of each prompt
    old_logp: torch.Tensor  # [B*G, T] log pi_old of the sampled tokens, 0 on padding
    mask: torch.Tensor  # [B*G, T] 1 on response tokens (0 on the environment's tokens between turns)
    entropy: torch.Tensor | None = None  # [B*G, T] full-vocabulary entropy under pi_old, when needs_entropy
    kl: float | None = None  # batch-mean KL(policy || ref) of the previous update; None without ref or step
    turns: list[list[Turn]] | None = None  # [B*G] each row's turns in order; None: single-turn rows
    # [B*G] per row, per turn: mean log-prob of the record's reference answer before the turn (answer_template)
    answer_logp: list[list[float]] | None = None


class AdvantageEstimator(ABC):
    """Base class: validates the input, calls :meth:`compute`, adds the generic advantage statistics."""

    needs_entropy: bool = False  # an instance may set these from its options (mssr: entropy, init)
    needs_init: bool = False
    # set: the trainer fills AdvantageInput.answer_logp, probing each turn's context with this text ("{answer}")
    answer_template: str | None = None
    min_group_size: ClassVar[int] = 2
    shift_invariant: ClassVar[bool] = True
    scale_invariant: ClassVar[bool] = False
    name: ClassVar[str] = ""

    def __init__(self, num_records: int, *, eps: float = 1e-6):
        if eps <= 0:
            raise ValueError(f"advantage {self.name!r}: eps must be > 0 (algo.adv_eps), got {eps}")
        self.num_records, self.eps = num_records, eps

    def __call__(self, inp: AdvantageInput) -> tuple[torch.Tensor, dict[str, float]]:
        self._check(inp)
        adv, stats = self.compute(inp)
        return adv, {**stats, **advantage_stats(adv, inp.mask)}

    @abstractmethod
    def compute(self, inp: AdvantageInput) -> tuple[torch.Tensor, dict[str, float]]: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(
                f"advantage {self.name!r} keeps no state, but the checkpoint holds {sorted(state)}"
            )

    def _check(self, inp: AdvantageInput) -> None:
        r = inp.rewards
        if r.dim() != 2:
            raise ValueError(f"advantage {self.name!r}: rewards must be [B, G], got shape {tuple(r.shape)}")
        B, G = r.shape
        if G < self.min_group_size:
            raise ValueError(
                f"advantage {self.name!r} needs at least {self.min_group_size} responses per prompt; "
                f"set rollout.n >= {self.min_group_size} (got {G})"
            )
        if len(inp.indices) != B:
            raise ValueError(f"advantage {self.name!r}: {len(inp.indices)} indices for {B} prompts")
        if inp.old_logp.shape[0] != B * G or inp.mask.shape != inp.old_logp.shape:
            raise ValueError(
                f"advantage {self.name!r}: old_logp {tuple(inp.old_logp.shape)} and mask {tuple(inp.mask.shape)} "
                f"must both be [B*G, T] = [{B * G}, T]"
            )
        if not torch.isfinite(r).all():
            bad = int(torch.nonzero(~torch.isfinite(r))[0, 0])
            raise ValueError(
                f"advantage {self.name!r}: non-finite reward for record {inp.indices[bad]}; "
                "check the reward function's output"
            )


def advantage_stats(adv: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean/std/min/max of ``adv`` over responses ([N]) or unmasked tokens ([N, T]); empty -> nothing."""
    vals = adv.detach().float()
    if vals.dim() == 2:
        vals = vals[mask.bool()]
    if vals.numel() == 0:
        return {}
    return {
        "advantage/mean": vals.mean().item(),
        "advantage/std": vals.std(unbiased=False).item(),
        "advantage/min": vals.min().item(),
        "advantage/max": vals.max().item(),
    }


GroupFn = Callable[[torch.Tensor, float], torch.Tensor]


def group_advantage(
    name: str, *, min_group_size: int = 2, shift_invariant: bool = True, scale_invariant: bool = False
) -> Callable[[GroupFn], GroupFn]:
    """Register a pure ``fn(rewards [B, G], eps) -> A [B, G]`` as a stateless estimator; returns ``fn`` unchanged."""

    def deco(fn: GroupFn) -> GroupFn:
        class GroupEstimator(AdvantageEstimator):
            __doc__ = fn.__doc__

            def compute(self, inp: AdvantageInput) -> tuple[torch.Tensor, dict[str, float]]:
                return fn(inp.rewards, self.eps).reshape(-1), {}

        GroupEstimator.__name__ = GroupEstimator.__qualname__ = f"{fn.__name__}_estimator"
        GroupEstimator.name, GroupEstimator.min_group_size = name, min_group_size
        GroupEstimator.shift_invariant, GroupEstimator.scale_invariant = shift_invariant, scale_invariant
        ADVANTAGES.register(name)(GroupEstimator)
        return fn

    return deco


@group_advantage("grpo", scale_invariant=True)
def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``A = (r - mean_G) / (std_G + eps)`` with the unbiased std, as the GRPO reference code; G = 1 gives A = r."""
    if rewards.shape[1] == 1:
        return rewards.clone()  # mean 0, std 1 for a group of one (docs/algorithms.md#grpo-family)
    mean = rewards.mean(dim=1, keepdim=True)  # [B, 1]
    std = rewards.std(dim=1, keepdim=True)  # [B, 1]
    return (rewards - mean) / (std + eps)


@group_advantage("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Dr. GRPO: ``A = r - mean_G`` (no division by the group std)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


@group_advantage("rloo")
def rloo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RLOO: ``A_i = r_i - mean_{j != i} r_j`` = G / (G - 1) * (r_i - mean_G)."""
    G = rewards.shape[1]
    if G < 2:
        raise ValueError("rloo needs at least 2 responses per prompt; set rollout.n >= 2")
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (G - 1)  # [B, G]
    return rewards - baseline


@group_advantage("reinforce", min_group_size=1, shift_invariant=False)
def reinforce_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Plain REINFORCE: ``A = r`` (no baseline). The score-function weight the §4 corrections are derived for."""
    return rewards.clone()


@ADVANTAGES.register("reinforce_pp")
class ReinforcePP(AdvantageEstimator):
    """REINFORCE++: rewards whitened over all response tokens of the batch (token-weighted, unbiased variance)."""

    name = "reinforce_pp"
    min_group_size = 1
    scale_invariant = True

    def compute(self, inp: AdvantageInput) -> tuple[torch.Tensor, dict[str, float]]:
        r = inp.rewards.reshape(-1)  # [N]
        n_tok = inp.mask.to(r.device, r.dtype).sum(-1)  # [N] tokens per response: its weight
        total = n_tok.sum()
        if total < 2:
            raise ValueError("reinforce_pp whitens over the batch's response tokens and needs at least 2")
        mean = (r * n_tok).sum() / total
        var = (n_tok * (r - mean) ** 2).sum() / (total - 1)
        return (r - mean) * torch.rsqrt(var + self.eps), {}


def groups_with_signal(rewards: torch.Tensor) -> torch.Tensor:
    """``rewards [B, G]`` -> bool ``[B]``: the group's rewards are not all equal (DAPO's dynamic-sampling filter).

    A group of one never has signal by this definition."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) > 0
