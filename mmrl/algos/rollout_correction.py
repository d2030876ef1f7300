"""Rollout/training mismatch correction (docs/algorithms.md#grpo-family, last bullets): truncated or masked importance sampling
between the rollout engine's log-probs and pi_old's, as TRL's and verl's rollout corrections do.

The engine (vLLM's bf16 kernels, another attention or sampler implementation) draws y from pi_rollout, while the
loss's ratio pi / pi_old is taken against pi_old scored by the training forward (``algo.old_logprobs: recompute``).
The two differ a little per token, so the update is off-policy by pi_old / pi_rollout, which nothing else in the
loss accounts for. The trainer keeps both log-probs and, once per step, weights each token's policy loss by a
detached w. With d_t = log pi_old(y_t) - log pi_rollout(y_t) over a response's real tokens:

- token ratio rho_t = exp(clamp(d_t, -20, 20));
- sequence ratio rho = exp(clamp(sum_t d_t, -20, 20)), the product of the token ratios, carried by every token;

and C = ``algo.rollout_correction_cap`` (about 2-3):

- ``none``: no weights (w = 1); the mismatch is still logged;
- ``tis_token``: w_t = min(rho_t, C)  (truncated importance sampling);
- ``tis_seq``: w_t = min(rho, C);
- ``mask_token``: w_t = rho_t 1[1/C <= rho_t <= C]  (masked importance sampling: a token whose ratio leaves the band
  is dropped, the others keep their importance weight);
- ``mask_seq``: w_t = rho 1[1/C <= rho <= C]  (a whole response dropped or kept).

Each function is ``fn(old_logp [N, T], rollout_logp [N, T], mask [N, T], *, cap) -> (w [N, T], clipped)`` (``none``:
None), ``clipped`` marking what was capped or dropped: ``[N, T]`` per token, ``[N]`` per response.
:func:`rollout_correction` zeroes w on padding and returns the step's numbers: ``rollout/logprob_diff_mean`` and
``rollout/logprob_diff_max`` (|d_t| over real tokens), ``rollout/correction_clip_frac`` (the share of tokens, or of
responses for ``*_seq``, capped or dropped) and ``rollout/correction_weight_mean`` (mean w over real tokens).

Choices where TRL and verl differ: the mask forms drop ratios outside [1/C, C] on both sides, as verl's rejection
sampling (lower bound 1/C by default) and docs/algorithms.md do; TRL's drops only rho > C. A dropped token stays in the
aggregation's denominator (weight 0, as TRL multiplies the token loss; verl removes it from the loss mask), so a
dropped token shrinks the step like a token with zero advantage. The sequence ratio's log is clamped like the
policy ratio's (TRL does not clamp). Only the policy loss is weighted, not the KL or entropy terms (as in both).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mmrl.registry import Registry

RolloutCorrectionFn = Callable[..., tuple[torch.Tensor, torch.Tensor] | None]
ROLLOUT_CORRECTIONS: Registry[RolloutCorrectionFn] = Registry("rollout correction")


def _correction(name: str, level: str | None) -> Callable[[RolloutCorrectionFn], RolloutCorrectionFn]:
    def deco(fn: RolloutCorrectionFn) -> RolloutCorrectionFn:
        fn.level = level  # type: ignore[attr-defined]  # "token", "sequence", or None (no weights)
        return ROLLOUT_CORRECTIONS.register(name)(fn)

    return deco


def _token_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor) -> torch.Tensor:
    return torch.exp((old_logp - rollout_logp).clamp(-20.0, 20.0))  # [N, T]


def _seq_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.exp(((old_logp - rollout_logp) * mask).sum(-1).clamp(-20.0, 20.0))  # [N]


def _in_band(rho: torch.Tensor, cap: float) -> torch.Tensor:
    return (rho >= 1.0 / cap) & (rho <= cap)


@_correction("none", None)
def no_correction(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0
) -> None:
    return None


@_correction("tis_token", "token")
def tis_token(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """w_t = min(rho_t, C)."""
    rho = _token_ratio(old_logp, rollout_logp)
    return rho.clamp(max=cap), rho > cap


@_correction("tis_seq", "sequence")
def tis_seq(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """w_t = min(rho, C), rho the response's ratio."""
    rho = _seq_ratio(old_logp, rollout_logp, mask)
    return rho.clamp(max=cap)[:, None].expand_as(old_logp), rho > cap


@_correction("mask_token", "token")
def mask_token(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """w_t = rho_t inside [1/C, C], 0 outside."""
    rho = _token_ratio(old_logp, rollout_logp)
    keep = _in_band(rho, cap)
    return rho * keep, ~keep


@_correction("mask_seq", "sequence")
def mask_seq(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """w_t = rho inside [1/C, C], 0 outside, rho the response's ratio."""
    rho = _seq_ratio(old_logp, rollout_logp, mask)
    keep = _in_band(rho, cap)
    return (rho * keep)[:, None].expand_as(old_logp), ~keep


def check_rollout_correction(name: str, old_logprobs: str, cap: float) -> None:
    """Raise ValueError when the correction cannot run: it needs pi_old from the training forward, and C >= 1."""
    if ROLLOUT_CORRECTIONS.get(name).level is None:  # type: ignore[attr-defined]
        return
    if old_logprobs not in ("recompute", "interpolate"):
        raise ValueError(
            f"algo.rollout_correction {name!r} weighs the rollout engine's log-probs against pi_old recomputed by "
            f"the training forward (or interpolated), but algo.old_logprobs is {old_logprobs!r}: set "
            "algo.old_logprobs=recompute or interpolate (or algo.rollout_correction=none)"
        )
    if not cap >= 1.0:
        raise ValueError(f"algo.rollout_correction_cap must be >= 1 (the band is [1/C, C]), got {cap}")


def rollout_correction(
    name: str, old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *, cap: float
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The detached weights ``[N, T]`` (0 on padding; None for ``none``) and the step's mismatch numbers."""
    real = mask.bool()
    mask = real.to(old_logp.dtype)
    diff = (old_logp - rollout_logp).abs()[real]
    stats = {
        "rollout/logprob_diff_mean": diff.mean().item() if diff.numel() else 0.0,
        "rollout/logprob_diff_max": diff.max().item() if diff.numel() else 0.0,
    }
    out = ROLLOUT_CORRECTIONS.get(name)(old_logp, rollout_logp, mask, cap=cap)
    if out is None:
        return None, stats
    weights, clipped = out
    weights = (weights * mask).detach()
    units = real if clipped.dim() == 2 else real.any(-1)  # counted per token, or per non-empty response
    stats["rollout/correction_clip_frac"] = clipped[units].float().mean().item() if units.any() else 0.0
    stats["rollout/correction_weight_mean"] = weights[real].mean().item() if real.any() else 0.0
    return weights, stats
