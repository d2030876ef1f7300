"""GRPO-family advantages and losses (ALGORITHMS.md §1).

Departures from textbook GRPO, all config fields:
- log-probs are those of ``logits / temperature`` both at rollout and in training, so the ratio is 1 on-policy;
- the KL term is the k3 ("low_var_kl") estimator, clamped to [-10, 10], and is off by default (``kl_coef: 0``);
- loss aggregation defaults to token-mean over the whole batch (DAPO), not the GRPO paper's seq-mean-token-mean;
- dual clip (c = 3) bounds the loss of negative-advantage tokens whose ratio has grown large.

The loss in one place (per token, A the sequence's advantage, rho the ratio):
    pg1 = -A * rho
    pg2 = -A * clip(rho, 1 - eps_low, 1 + eps_high)
    L   = max(pg1, pg2);   L = min(L, -A * c) where A < 0
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mmrl.registry import Registry

AdvantageFn = Callable[..., torch.Tensor]
LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

ADVANTAGES: Registry[AdvantageFn] = Registry("advantage function")
LOSSES: Registry[LossFn] = Registry("policy loss")


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``rewards [N, G]`` -> ``A [N, G]`` = (r - mean_G) / (std_G + eps); a group of one gets A = r - 0 over 1."""
    if rewards.shape[1] == 1:
        return rewards.clone()  # mean 0, std 1 for a group of size 1 (ALGORITHMS.md §1)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)  # unbiased, as in the GRPO reference code
    return (rewards - mean) / (std + eps)


@ADVANTAGES.register("drgrpo")
def drgrpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Dr. GRPO: ``A = r - mean_G`` (no division by the group std)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


def aggregate(
    loss: torch.Tensor, mask: torch.Tensor, mode: str, constant: float | None = None
) -> torch.Tensor:
    """``loss, mask [B, T]`` -> scalar.

    token-mean: sum over all tokens / number of tokens (DAPO); seq-mean-token-mean: mean over sequences of each
    sequence's token mean (GRPO paper); seq-mean-token-sum: mean over sequences of token sums / ``constant``
    (Dr. GRPO, constant = max generation length).
    """
    mask = mask.to(loss.dtype)
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.mean()
    if mode == "seq-mean-token-sum":
        if constant is None:
            raise ValueError("seq-mean-token-sum needs a constant (algo.loss_agg_constant or max_new_tokens)")
        return ((loss * mask).sum(-1) / constant).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}")


@LOSSES.register("clipped")
def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate. ``logp, old_logp, mask [B, T]``; ``advantages [B]`` or ``[B, T]``.

    Returns the token losses ``[B, T]`` and diagnostics (clip fraction, ratio mean) over unmasked tokens.
    """
    adv = advantages if advantages.dim() == 2 else advantages[:, None]  # [B, T] or [B, 1]
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(pg1, pg2)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
    m = mask.bool()
    with torch.no_grad():
        n = m.sum().clamp(min=1)
        stats = {
            "clip_frac": ((pg2 > pg1) & m).sum() / n,
            "ratio_mean": (ratio * m).sum() / n,
        }
    return loss, stats
