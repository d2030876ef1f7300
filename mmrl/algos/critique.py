"""Critique-GRPO's loss (docs/cliff.md#critique-grpo): the on-policy tokens' surrogate, and policy shaping on the
tokens of refinements (rows generated from a critique prompt and placed under the original question), which have no
old-policy ratio:

    on-policy token t:   L_t = -A ratio_t                     (``clip: false``, the released code's loss_remove_clip)
                         L_t = clipped's surrogate            (``clip: true``)
    refinement token t:  L_t = -A f(p_t),  f(p) = p / (p + gamma),  p_t = pi_theta(token t)   (gamma 0.1)

The shaping's gradient is -A gamma / (p + gamma)^2 grad p: a low-probability ("unfamiliar") token of a right
refinement is pushed up hardest. ``off_policy [B, T]`` comes from the update (the batch's ``off_policy_rows``).
"""

from __future__ import annotations

import torch

from mmrl.algos.losses import check_clip, clip_objective, ratio_stats, register_loss, token_adv


def shaping(logp: torch.Tensor, gamma: float) -> torch.Tensor:
    """f(p) = p / (p + gamma) of the token probabilities, with its gradient."""
    p = torch.exp(logp)
    return p / (p + gamma)


@register_loss("critique", needs_off_policy=True)
def critique_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    off_policy: torch.Tensor | None = None,
    clip: bool = False,
    gamma: float = 0.1,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token Critique-GRPO loss: the surrogate on on-policy tokens, -A f(p) on refinement tokens."""
    if gamma <= 0:
        raise ValueError(f"loss 'critique': gamma must be > 0 (algo.loss_options.gamma), got {gamma}")
    check_clip("critique", clip_low, clip_high, dual_clip)
    a = token_adv(adv, logp)
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    on = clip_objective(ratio, a, clip_low, clip_high, dual_clip) if clip else -a * ratio
    off = -a * shaping(logp, gamma)
    flag = torch.zeros_like(mask) if off_policy is None else off_policy.to(mask.dtype)
    loss = torch.where(flag.bool(), off, on)
    on_mask = mask * (1 - flag)
    stats = ratio_stats(ratio, a, on_mask, clip_low if clip else None, clip_high if clip else None, dual_clip)
    n_off = (mask * flag).sum()
    stats["critique/off_policy_tokens"] = n_off / mask.sum().clamp(min=1)
    stats["critique/refinement_prob"] = (torch.exp(logp).detach() * mask * flag).sum() / n_off.clamp(min=1)
    return loss, stats
