"""DHPO: the token ratio and the sequence ratio, each clipped in its own trust region, then mixed (docs/credit.md#dhpo).

Per token t of response i with advantage A (the loss ``dhpo``, beside ``clipped`` and ``gspo``):

    r_t   = pi(y_t) / pi_old(y_t)                                    the token ratio (``clipped``'s)
    s_i   = exp(mean_t (log pi - log pi_old))                         the sequence ratio (``gspo``'s, in its token form)
    L_tok = max(-A r_t, -A clip(r_t, 1 - e_low, 1 + e_high))         PPO's clip, token branch
    L_seq = max(-A s_i, -A clip(s_i, 1 - E_low, 1 + E_high))         PPO's clip, sequence branch
    L_t   = w_t L_tok + (1 - w_t) L_seq

The clipped surrogate is linear in the ratio, so L_t = -A (w_t r~_t + (1 - w_t) s~_i), with r~ and s~ the ratios each
branch's clip lets through: the mixed ratio of the paper, made of ratios already clipped per branch, so an outlier in
one branch cannot pull the other out of its trust region. An outer clip of the mixed ratio would change nothing more
and is left out (the paper's outer form was not retrieved).

- ``mix: mean`` (default): w_t = 1/2, the paper's averaged variant.
- ``mix: entropy``: w_t = H_t / max_{t'} H_t', the stop-gradient token entropy over the largest of the response's
  tokens (1/2 for a response whose tokens all have entropy 0): uncertain tokens lean on their own ratio, confident
  ones on the sequence's. The map is our choice; the paper's was not retrieved. The update passes the training
  forward's token entropy (detached) to a loss that declares ``entropy``.

Defaults: the token branch reads ``algo.clip_low`` / ``algo.clip_high`` (the function's 0.2 / 0.28 are DAPO's; set
them in the recipe); the sequence branch ``algo.loss_options.seq_clip_low`` / ``seq_clip_high``, 3e-4 / 4e-4 as GSPO's
published clip. No dual clip. Stats: the token branch's ``clip_frac_low`` / ``clip_frac_high`` / ``ratio_*`` as
``clipped``; ``dhpo_seq_clip_frac_low`` / ``dhpo_seq_clip_frac_high`` / ``dhpo_seq_ratio_mean`` for the sequence
branch; ``dhpo_token_weight``: the mean of w_t over the unmasked tokens.
"""

from __future__ import annotations

import torch

from mmrl.algos.losses import clip_objective, ratio_stats, register_loss, sequence_log_ratio, token_adv

MIXES = ("mean", "entropy")


def entropy_weights(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``entropy [B, T]`` -> w ``[B, T]`` in [0, 1]: each token's entropy over the largest of its response's unmasked
    tokens, detached; 1/2 for a response whose largest is 0 (no signal: the averaged mix). 0 on masked tokens."""
    h = entropy.detach() * mask.to(entropy.dtype)  # [B, T]
    top = h.amax(dim=-1, keepdim=True)  # [B, 1]
    return torch.where(top > 0, h / top.clamp(min=torch.finfo(h.dtype).tiny), torch.full_like(h, 0.5))


def dhpo_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    weight: torch.Tensor | float,
    *,
    clip_low: float,
    clip_high: float,
    seq_clip_low: float,
    seq_clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(token_loss [B, T], r [B, T], s [B, T])``: each branch's clipped loss mixed by ``weight`` (w_t, ``[B, T]`` or
    a number); ``adv [B, 1]`` or ``[B, T]``."""
    r = torch.exp((logp - old_logp).clamp(-20.0, 20.0))  # [B, T]
    seq = sequence_log_ratio(logp, old_logp, mask).detach()  # [B] sg[log s_i]
    # [B, T] GSPO's token form: the value s_i on every token, the gradient s_i d log pi_t
    s = torch.exp((seq[:, None] + logp - logp.detach()).clamp(-20.0, 20.0))
    l_tok = clip_objective(r, adv, clip_low, clip_high, None)
    l_seq = clip_objective(s, adv, seq_clip_low, seq_clip_high, None)
    return weight * l_tok + (1.0 - weight) * l_seq, r, s


def _check(clip_low: float, clip_high: float, seq_clip_low: float, seq_clip_high: float, mix: str) -> None:
    for low, high, where in (
        (clip_low, clip_high, "algo.clip_low/clip_high"),
        (seq_clip_low, seq_clip_high, "algo.loss_options.seq_clip_low/seq_clip_high"),
    ):
        if not 0.0 <= low < 1.0 or high < 0.0:
            raise ValueError(f"loss 'dhpo': need 0 <= low < 1 and high >= 0 ({where}), got {low}, {high}")
    if mix not in MIXES:
        raise ValueError(f"loss 'dhpo': mix must be 'mean' or 'entropy' (algo.loss_options.mix), got {mix!r}")


@register_loss("dhpo")
def dhpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    seq_clip_low: float = 3e-4,
    seq_clip_high: float = 4e-4,
    mix: str = "mean",
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DHPO: token and sequence ratios, each PPO-clipped in its own trust region, mixed per token. ``entropy [B, T]``
    (the training forward's token entropy) is read by ``mix: entropy`` only."""
    _check(clip_low, clip_high, seq_clip_low, seq_clip_high, mix)
    a = token_adv(adv, logp)
    if mix == "entropy":
        if not isinstance(entropy, torch.Tensor) or entropy.shape != logp.shape:
            raise ValueError(
                "loss 'dhpo': mix 'entropy' needs the token entropy [B, T] of the training forward (the update "
                "passes it as entropy=); a direct call must give it, or use mix: mean"
            )
        w: torch.Tensor | float = entropy_weights(entropy, mask)
    else:
        w = 0.5
    clips = {
        "clip_low": clip_low,
        "clip_high": clip_high,
        "seq_clip_low": seq_clip_low,
        "seq_clip_high": seq_clip_high,
    }
    loss, r, s = dhpo_token_loss(logp, old_logp, a, mask, w, **clips)
    stats = ratio_stats(r, a, mask, clip_low, clip_high, None)
    seq = ratio_stats(s, a, mask, seq_clip_low, seq_clip_high, None)
    m = mask.to(logp.dtype)
    w_mean = (torch.as_tensor(w, dtype=logp.dtype) * m).sum() / m.sum().clamp(min=1.0)
    return loss, stats | {
        "dhpo_seq_clip_frac_low": seq["clip_frac_low"],
        "dhpo_seq_clip_frac_high": seq["clip_frac_high"],
        "dhpo_seq_ratio_mean": seq["ratio_mean"],
        "dhpo_token_weight": w_mean.detach(),
    }
