"""KL(pi || pi_ref) estimators per token (Schulman's k1/k2/k3; docs/algorithms.md#grpo-family), as a loss term or a reward
penalty.

With d = log pi_ref - log pi on tokens sampled from pi (pi = the policy being trained):
- ``k1`` = -d (log-ratio; unbiased, high variance, can be negative);
- ``k2`` = d^2 / 2 (biased, low variance);
- ``k3`` = exp(d) - d - 1 (unbiased, low variance, >= 0; verl's "low_var_kl"), d clamped to [-20, 20] and the
  result to [-10, 10] as verl does. This is the GRPO default; TRL computes the same without the clamps.

As a loss term the trainer aggregates ``fn(logp, ref_logp)`` with the policy loss's aggregation and adds
``kl_coef`` times it. As a reward penalty (``kl_in: reward``) :func:`kl_penalised_rewards` subtracts
``kl_coef * sum_t KL_t`` (the sequence's KL, i.e. PPO's per-token KL reward summed with gamma = 1) from each
response's reward before the advantages; the per-token KL is then computed without gradient from the old
log-probs, so the reference forward must run before the advantage stage.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mmrl.registry import Registry

KlFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KlFn] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_ref`` per token."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``(log pi - log pi_ref)^2 / 2`` per token."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``exp(d) - d - 1`` with ``d = log pi_ref - log pi`` clamped to [-20, 20], result clamped to [-10, 10]."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


def kl_penalised_rewards(
    rewards: torch.Tensor, kl_tok: torch.Tensor, mask: torch.Tensor, coef: float
) -> torch.Tensor:
    """``rewards [B, G]`` - ``coef`` * per-response sum of ``kl_tok [B*G, T]`` over ``mask`` -> ``[B, G]``."""
    B, G = rewards.shape
    if kl_tok.shape[0] != B * G or kl_tok.shape != mask.shape:
        raise ValueError(
            f"kl_penalised_rewards: kl {tuple(kl_tok.shape)} and mask {tuple(mask.shape)} must be [B*G, T] = "
            f"[{B * G}, T]"
        )
    seq_kl = (kl_tok.detach() * mask.to(kl_tok.dtype)).sum(-1)  # [B*G]
    return rewards - coef * seq_kl.to(rewards.device, rewards.dtype).view(B, G)
