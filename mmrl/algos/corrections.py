"""Noisy-verifier corrections (docs/rewards.md#domain-rewards; Cai et al., "Reinforcement Learning with Verifiable yet Noisy
Rewards under Imperfect Verifiers", arXiv 2510.00915).

The verifier is a channel with false-positive rate r0 = P(R~ = 1 | R = 0) (``fp_rate``) and false-negative rate
r1 = P(R~ = 0 | R = 1) (``fn_rate``). Each correction is ``fn(rewards [B, G], *, fp_rate, fn_rate) -> rewards'``,
applied to the rewards before the advantage estimator:

- ``none``: unchanged.
- ``backward``: R' = (R~ - r0) / (1 - r0 - r1). E[R' | R] = R, so the policy gradient built on R' is unbiased for
  the clean one. Needs r0 + r1 < 1.
- ``forward``: the paper weights each score-function term grad log pi(y) by w(R~): w = r1 for R~ = 1 and
  w = r1 - 1 for R~ = 0. Then E[w | R] = (1 - r0 - r1)(R - 1), so E[w grad log pi] = (1 - r0 - r1) grad J (E[grad
  log pi] = 0): the clean gradient's direction, knowing only r1. As a reward transform this is
  R' = R~ - (1 - r1) (linear in R~, so rewards in [0, 1] get the expected weight).

Why the seam is this small, and where it stops: forward's R' is R~ shifted by a constant, and backward's is an
affine map of R~. An estimator whose baseline subtracts a mean (grpo, dr_grpo, rloo, reinforce_pp, spo, mssr)
removes any constant shift, and a z-scoring one (grpo, reinforce_pp) also removes any positive scale; there a
correction changes nothing (or only the step size). The paper's derivation is for the score-function estimator
with the reward as its weight, which is ``advantage: reinforce``. Rather than let a configuration silently do
nothing, :func:`check_reward_correction` refuses ``forward`` with a shift-invariant estimator and ``backward`` with
one that is both shift- and scale-invariant (it reads the estimator's ``shift_invariant`` / ``scale_invariant``
attributes, never its name). With spo/mssr a shifted reward would also break the tracker's 0.5 outcome threshold.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mmrl.algos.advantages import ADVANTAGES
from mmrl.registry import Registry

CorrectionFn = Callable[..., torch.Tensor]
REWARD_CORRECTIONS: Registry[CorrectionFn] = Registry("reward correction")


def _correction(name: str, kind: str) -> Callable[[CorrectionFn], CorrectionFn]:
    def deco(fn: CorrectionFn) -> CorrectionFn:
        fn.kind = kind  # type: ignore[attr-defined]  # "identity", "affine" or "shift"
        return REWARD_CORRECTIONS.register(name)(fn)

    return deco


def _check_rates(fp_rate: float, fn_rate: float) -> None:
    if fp_rate < 0 or fn_rate < 0 or fp_rate + fn_rate >= 1:
        raise ValueError(
            f"noisy-verifier rates need 0 <= algo.fp_rate, algo.fn_rate and fp_rate + fn_rate < 1, "
            f"got fp_rate={fp_rate}, fn_rate={fn_rate}"
        )


@_correction("none", "identity")
def no_correction(rewards: torch.Tensor, *, fp_rate: float = 0.0, fn_rate: float = 0.0) -> torch.Tensor:
    return rewards


@_correction("backward", "affine")
def backward_correction(rewards: torch.Tensor, *, fp_rate: float = 0.0, fn_rate: float = 0.0) -> torch.Tensor:
    """``(R - fp_rate) / (1 - fp_rate - fn_rate)``: unbiased for the clean reward (it can leave [0, 1])."""
    _check_rates(fp_rate, fn_rate)
    return (rewards - fp_rate) / (1.0 - fp_rate - fn_rate)


@_correction("forward", "shift")
def forward_correction(rewards: torch.Tensor, *, fp_rate: float = 0.0, fn_rate: float = 0.0) -> torch.Tensor:
    """``R - (1 - fn_rate)``: the score-function weight fn_rate for R = 1, fn_rate - 1 for R = 0 (fp_rate unused)."""
    _check_rates(0.0, fn_rate)
    return rewards - (1.0 - fn_rate)


def check_reward_correction(correction: str, advantage: str) -> None:
    """Raise when ``correction`` cannot change what ``advantage`` computes (see the module docstring)."""
    kind = REWARD_CORRECTIONS.get(correction).kind  # type: ignore[attr-defined]
    est = ADVANTAGES.get(advantage)
    if kind == "shift" and est.shift_invariant:
        raise ValueError(
            f"algo.reward_correction {correction!r} shifts every reward by one constant, which advantage "
            f"{advantage!r} removes with its baseline; use advantage: reinforce (the estimator the forward "
            "correction is derived for) or reward_correction: backward"
        )
    if kind == "affine" and est.shift_invariant and est.scale_invariant:
        raise ValueError(
            f"algo.reward_correction {correction!r} is an affine map of the reward, which advantage "
            f"{advantage!r} normalises away; use an estimator without std normalisation (dr_grpo, rloo, "
            "reinforce, spo, mssr)"
        )
