"""Off-policy losses for asynchronous RL (docs/async.md): decoupled PPO's proximal policy by log-linear
interpolation, and BAPO's adaptive clip bounds (the registered loss ``bapo``).

Decoupled PPO (docs/async.md#decoupled-ppo) keeps three policies apart: the behaviour policy mu that sampled each
token (the rollout engine's log-probs; with asynchronous rollouts, several weight versions within one response),
the proximal policy pi_prox (the weights before this update) and pi_theta (the weights being trained). Its token
loss is ``w_t * clipped(rho_t)`` with rho_t = pi_theta / pi_prox and w_t = pi_prox / mu truncated or masked. mmrl
already computes exactly this with ``algo.loss: clipped``, ``algo.old_logprobs: recompute`` (pi_prox scored by a
no-grad training forward when the batch is consumed, and kept as the loss's pi_old) and ``algo.rollout_correction``
``tis_token | mask_token | tis_seq | mask_seq`` (its w = pi_old / pi_rollout IS pi_prox / mu, truncated or masked
at ``algo.rollout_correction_cap``). So no decoupled loss of its own is needed: :func:`proximal_logprobs` is only
the cheaper way to get pi_prox, from mu and the training forward's own log pi_theta, without the recompute forward;
its result goes where the recomputed pi_old goes (the loss's ``old_logp`` and the rollout correction's first
argument).

BAPO (docs/async.md#bapo) clips the ratio rho = pi_theta / pi_old to explicit bounds [c_low, c_high] and widens them
per call until the tokens with positive advantage carry a target share of the policy gradient. As in the released
code the search runs inside the policy loss, once per call (here: per micro-batch), on sums all-reduced over the
data-parallel ranks (SUM over the default process group when one is initialised, :func:`mmrl.distributed.all_reduce_sum`;
every rank must then call the loss equally often). Where it departs from the released code: a token's contribution
is its gradient weight |A| rho where the clip lets its gradient through (docs/async.md#which-tokens-count); the
code sums clipped surrogate values, which makes raising c_low add to the negative side, so its first loop always
ran to the maximum. The search evaluates every candidate bound in one pass and all-reduces one vector.
"""

from __future__ import annotations

import math

import torch

from mmrl.algos.losses import ratio_stats, register_loss, token_adv
from mmrl.distributed import all_reduce_sum


def proximal_logprobs(
    behave_logp: torch.Tensor,
    logp: torch.Tensor,
    versions: torch.Tensor,
    v_prox: float,
    v_theta: float,
) -> torch.Tensor:
    """log pi_prox ``[N, T]`` by log-linear interpolation between the behaviour and current policies, per token:

        log pi_prox_t = log mu_t + alpha_t (log pi_theta_t - log mu_t),   alpha_t = (v_prox - v_t) / (v_theta - v_t)

    with ``behave_logp`` = log mu ``[N, T]`` (the engine's), ``logp`` = log pi_theta ``[N, T]`` (detached here),
    ``versions`` = v_t ``[N, T]`` (the policy version that sampled each token), ``v_prox`` the version of the weights
    before this update and ``v_theta`` the version the trained weights are labelled with. alpha is clamped to
    [0, 1] and the interpolation is ``torch.lerp``, which returns its ends exactly at alpha 0 and 1. Edge cases:

    - v_t = v_prox < v_theta: alpha 0, pi_prox = mu (the proximal weights sampled the token). With staleness 0
      every token is such a token: pi_prox = mu bit for bit, w = pi_prox / mu = 1, and the loss is plain PPO
      against mu. So an update labels its trained weights v_theta = v_prox + 1, the version they become.
    - v_t >= v_theta (sampled by the current weights; also v_t = v_prox = v_theta): alpha 1, pi_prox = pi_theta.
    - v_prox = v_theta > v_t (the trained weights labelled as the proximal ones): alpha 1 for every token, pi_prox
      = pi_theta, which is exact only while the weights have not moved (the update's first optimizer step).
    - v_prox < v_t < v_theta (a token newer than the proximal weights): alpha < 0, clamped to 0, pi_prox = mu.
    - padding: any version; the value there is unused (the loss masks it).
    """
    if v_prox > v_theta:
        raise ValueError(
            f"proximal_logprobs: the proximal version {v_prox} is newer than the trained weights' {v_theta}; "
            "v_prox is the version before this update and v_theta the one after it"
        )
    v = versions.to(torch.float64)
    on_policy = v >= v_theta
    alpha = (v_prox - v) / (v_theta - v).masked_fill(on_policy, 1.0)
    alpha = alpha.masked_fill(on_policy, 1.0).clamp(0.0, 1.0)  # [N, T]
    return torch.lerp(behave_logp, logp.detach(), alpha.to(behave_logp.dtype))


def _candidates(start: float, stop: float, step: float) -> list[float]:
    """``start, start + step, ...`` up to ``stop`` (the last one ``stop`` itself), rounded to 1e-9."""
    n = math.ceil((stop - start) / step - 1e-9) if stop > start else 0
    return [round(min(start + k * step, stop), 9) for k in range(n + 1)]


def _check_bapo(
    c_low: float,
    c_high: float,
    c_low_max: float,
    c_high_max: float,
    steps: tuple[float, float],
    target: float,
    dual_clip: float | None,
) -> None:
    if not 0.0 < c_low <= c_low_max <= 1.0 <= c_high <= c_high_max:
        raise ValueError(
            "loss 'bapo': need 0 < c_low <= c_low_max <= 1 <= c_high <= c_high_max (algo.loss_options), got "
            f"c_low {c_low}, c_low_max {c_low_max}, c_high {c_high}, c_high_max {c_high_max}"
        )
    if not min(steps) > 0.0 or not target > 0.0:
        raise ValueError(
            f"loss 'bapo': step_low, step_high and target must be > 0 (algo.loss_options), got {steps}, {target}"
        )
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"loss 'bapo': dual_clip must be > 1 or None (algo.dual_clip), got {dual_clip}")


@torch.no_grad()
def bapo_bounds(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    c_low: float,
    c_high: float,
    c_low_max: float,
    c_high_max: float,
    step_low: float,
    step_high: float,
    target: float,
    dual_clip: float | None,
) -> tuple[float, float, float]:
    """BAPO's bounds search: ``(c_low, c_high, pos_share)``. A token's contribution is |A| rho where it carries a
    gradient: A > 0 and rho <= c_high (pos), or A < 0 and c_low <= rho <= dual_clip (neg). While pos < target *
    neg, c_low rises by ``step_low`` up to ``c_low_max`` (dropping negative tokens), then c_high by ``step_high``
    up to ``c_high_max`` (admitting positive ones). The sums of every candidate are all-reduced over the default process group, so
    every rank finds the bounds of the whole data-parallel micro-batch."""
    lows, highs = _candidates(c_low, c_low_max, step_low), _candidates(c_high, c_high_max, step_high)
    r = ratio.detach().to(torch.float64).expand_as(mask)  # [B, T]
    a = adv.detach().to(torch.float64).expand_as(mask)
    m = mask.bool()
    weight = a.abs() * r  # the token's gradient weight in -A rho
    pos_tok = (m & (a > 0)).flatten()
    neg_tok = (m & (a < 0) & (r <= (dual_clip if dual_clip is not None else math.inf))).flatten()
    w, rf = weight.flatten(), r.flatten()
    hi = torch.tensor(highs, dtype=torch.float64, device=r.device)[:, None]  # [J, 1]
    lo = torch.tensor(lows, dtype=torch.float64, device=r.device)[:, None]  # [K, 1]
    pos = (w * (pos_tok & (rf <= hi))).sum(-1)  # [J] pos at each c_high
    neg = (w * (neg_tok & (rf >= lo))).sum(-1)  # [K] neg at each c_low
    sums = all_reduce_sum(torch.cat([pos, neg])).tolist()
    pos_at, neg_at = sums[: len(highs)], sums[len(highs) :]
    i = j = 0
    while pos_at[j] < target * neg_at[i] and i < len(lows) - 1:
        i += 1
    while pos_at[j] < target * neg_at[i] and j < len(highs) - 1:
        j += 1
    total = pos_at[j] + neg_at[i]
    return lows[i], highs[j], pos_at[j] / total if total > 0 else 0.5


@register_loss("bapo", collective=True)
def bapo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    c_low: float = 0.6,
    c_high: float = 1.2,
    c_low_max: float = 0.8,
    c_high_max: float = 2.0,
    step_low: float = 0.05,
    step_high: float = 0.05,
    target: float = 1.0,
    dual_clip: float | None = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """BAPO: the clipped surrogate on rho clamped to [c_low, c_high], the bounds searched per call
    (:func:`bapo_bounds`), with dual clip for A < 0. ``target`` is pos / neg (1.0: a positive share of 0.5)."""
    _check_bapo(c_low, c_high, c_low_max, c_high_max, (step_low, step_high), target, dual_clip)
    a = token_adv(adv, logp)
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))  # [B, T]
    lo, hi, share = bapo_bounds(
        ratio,
        a,
        mask,
        c_low=c_low,
        c_high=c_high,
        c_low_max=c_low_max,
        c_high_max=c_high_max,
        step_low=step_low,
        step_high=step_high,
        target=target,
        dual_clip=dual_clip,
    )
    loss = torch.maximum(-a * ratio, -a * ratio.clamp(lo, hi))
    if dual_clip is not None:
        loss = torch.where(a < 0, torch.minimum(loss, -a * dual_clip), loss)
    stats = ratio_stats(ratio, a, mask, 1.0 - lo, hi - 1.0, dual_clip)
    bapo = {"bapo_c_low": lo, "bapo_c_high": hi, "bapo_pos_share": share}
    return loss, stats | {k: torch.tensor(v, dtype=torch.float64) for k, v in bapo.items()}
