"""Policy losses and loss aggregation (docs/algorithms.md#grpo-family), each registered by name.

A loss is ``fn(logp [B, T], old_logp [B, T], adv [B] or [B, T], mask [B, T], *, group_ids=None, **options)
-> (token_loss [B, T], stats)``; its options are its keyword arguments. ``stats`` are detached 0-dim tensors over
the unmasked tokens: ``clip_frac_low`` (A < 0 and rho < 1 - eps_low: the lower clip binds), ``clip_frac_high``
(A > 0 and rho > 1 + eps_high), ``clip_frac_dual`` (A < 0 and rho > c, when dual clip is on), ``ratio_mean``,
``ratio_min``, ``ratio_max``. :func:`reduce_stats` merges them across micro-batches (min/max for ``*_min/*_max``,
token-weighted mean otherwise). A loss with ``needs_whole_groups = True`` (``reg_grpo``) must see every response of
a prompt in one micro-batch; ``group_ids [B]`` then says which rows belong together.

What else a loss may ask of the update, as flags of :func:`register_loss` the update reads (never the loss's name):
``needs_entropy_grad`` (the keyword ``entropy [B, T]``: the training forward's token entropy with its gradient; a loss
that only declares ``entropy`` gets it detached), ``needs_turns`` (``turn_index [B, T]``: the index of each token's
turn in its trajectory, -1 outside every turn; a single-turn row is turn 0), ``collective`` (below).
A loss that keeps state across steps is a :class:`StatefulLoss`, registered as its class: the update makes one per
run with the options (checked against ``__init__``) and calls it without them. Its 1-D stats are not logged but are
*step sums*: the update adds them up (zero-padded to the longest) over the step's micro-batches and every rank, and
hands them to ``end_step(sums)`` once per step, after the update, on every rank alike; its ``state_dict`` is saved in
checkpoints (``state.json``, key ``loss``). ``epo`` (:mod:`mmrl.algos.epo`) is one.

The losses, per token (A the advantage, rho the ratio pi / pi_old):
- ``clipped``: L = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high)); dual clip for A < 0: L = min(L, -A c).
  rho = exp(clamp(log pi - log pi_old, -20, 20)).
- ``gspo``: the same clip on the sequence ratio s = exp(mean_t(log pi - log pi_old)), in GSPO's token form
  log s_t = sg[log s] + log pi_t - sg[log pi_t]: every token carries s's value and s * grad log pi_t, so under
  ``seq-mean-token-mean`` the gradient is exactly the sequence objective's. Dual clip off by default.
- ``reg_grpo`` (DeepVideo-R1's Regressive GRPO; docs/algorithms.md has it from a summary, unverified): the group
  z-score z_i of the sequence log-ratio l_i = mean_t(log pi - log pi_old) is regressed onto A_i,
  L_i = (A_i - z_i)^2, written on every token of the sequence (use ``seq-mean-token-mean`` for mean_i L_i). No
  clipping. Choices the summary leaves open: l_i is the token mean (length-normalised, as GSPO's), the std is the
  unbiased one as in GRPO's advantages, taken as sqrt(var + eps) so an unmoved policy (var = 0 at the first
  update) has a finite gradient; a group of one has z = 0. Consequence: at the first mini-batch of an update
  (pi = pi_old) the std is sqrt(eps) = 1e-3, so the gradient is ~1/sqrt(eps) times the centred log-prob gradient
  and ``grad_norm`` logs in the thousands; ``optim.grad_clip`` then sets the step size (the video recipe saw this).

Aggregations turn token losses into the mini-batch loss. Each is an object with ``numerator(loss, mask, constant)``
and ``units(mask)``; the mini-batch loss is (sum of numerators over its micro-batches) / (sum of units), which is
exactly the whole mini-batch's aggregate however it is split:
- ``token-mean``: sum of token losses / number of tokens (DAPO);
- ``seq-mean-token-mean``: sum over sequences of each one's token mean / number of sequences (GRPO paper, GSPO);
- ``seq-mean-token-sum-norm``: sum of token sums / ``constant`` / number of sequences (Dr. GRPO, constant = the
  maximum generation length).
A fully masked row adds 0 to the numerator and, for the two sequence modes, 1 to the units (as TRL does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

import torch

from mmrl.registry import Registry

LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
LOSSES: Registry[LossFn] = Registry("policy loss")


def register_loss(
    name: str,
    *,
    needs_whole_groups: bool = False,
    collective: bool = False,
    needs_entropy_grad: bool = False,
    needs_turns: bool = False,
    needs_off_policy: bool = False,
) -> Callable[[LossFn], LossFn]:
    """Register a loss function, or a :class:`StatefulLoss` class, with what it asks of the update.
    ``collective``: the loss runs a collective over the data-parallel ranks in each call (BAPO's sums), so every
    rank must call it equally often: the update pads the ranks' micro-batches to the same count.
    ``needs_entropy_grad``: it gets ``entropy [B, T]`` with its gradient; ``needs_turns``: ``turn_index [B, T]``;
    ``needs_off_policy``: ``off_policy [B, T]``, 1 on the tokens of rows a batch augmenter marked as generated from
    another context (Critique-GRPO's refinements)."""

    def deco(fn: LossFn) -> LossFn:
        fn.needs_whole_groups = needs_whole_groups  # type: ignore[attr-defined]
        fn.collective = collective  # type: ignore[attr-defined]
        fn.needs_entropy_grad = needs_entropy_grad  # type: ignore[attr-defined]
        fn.needs_turns = needs_turns  # type: ignore[attr-defined]
        fn.needs_off_policy = needs_off_policy  # type: ignore[attr-defined]
        return LOSSES.register(name)(fn)

    return deco


class StatefulLoss(ABC):
    """A loss that keeps state across steps: registered as its class, made once per run as ``cls(**options)``, then
    called as a loss function is, without the options. ``end_step(sums)`` runs once per step after the update, with
    the step sums of its 1-D stats (the same on every rank), and returns stats to log; ``state_dict`` /
    ``load_state_dict`` carry its state through checkpoints (JSON-serialisable)."""

    @abstractmethod
    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        adv: torch.Tensor,
        mask: torch.Tensor,
        *,
        group_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...

    def end_step(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(
                f"loss {type(self).__name__} keeps no state, but the checkpoint holds {sorted(state)}"
            )


def add_padded(total: torch.Tensor | None, part: torch.Tensor) -> torch.Tensor:
    """``total + part`` for 1-D step sums of possibly different lengths (the shorter zero-padded); float64 on the
    CPU."""
    part = part.detach().double().cpu()
    if total is None:
        return part
    n, pad = max(len(total), len(part)), torch.nn.functional.pad
    return pad(total, (0, n - len(total))) + pad(part, (0, n - len(part)))


def check_clip(loss: str, clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(
            f"loss {loss!r}: need 0 <= clip_low < 1 and clip_high >= 0 (algo.clip_low/clip_high), "
            f"got {clip_low}, {clip_high}"
        )
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"loss {loss!r}: dual_clip must be > 1 or None (algo.dual_clip), got {dual_clip}")


def token_adv(adv: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``[B]`` -> ``[B, 1]`` (broadcast over tokens); ``[B, T]`` as is."""
    if adv.dim() == 1:
        return adv[:, None]
    if adv.shape != logp.shape:
        raise ValueError(
            f"token-level advantages {tuple(adv.shape)} do not match log-probs {tuple(logp.shape)}"
        )
    return adv


def clip_objective(
    ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float, dual_clip: float | None
) -> torch.Tensor:
    """The PPO/DAPO clipped token loss with optional dual clip; ``ratio [B, T]``, ``adv [B, T]`` or ``[B, 1]``."""
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(pg1, pg2)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
    return loss


@torch.no_grad()
def ratio_stats(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float | None,
    clip_high: float | None,
    dual_clip: float | None,
) -> dict[str, torch.Tensor]:
    """Clip fractions and ratio mean/min/max over unmasked tokens (min/max are +inf/-inf when none)."""
    m = mask.bool()
    r = ratio.detach().expand_as(m)
    a = adv.detach().expand_as(m)
    n = m.sum().clamp(min=1)
    zero = torch.zeros((), device=r.device)
    stats = {
        "clip_frac_low": ((a < 0) & (r < 1 - clip_low) & m).sum() / n if clip_low is not None else zero,
        "clip_frac_high": ((a > 0) & (r > 1 + clip_high) & m).sum() / n if clip_high is not None else zero,
        "ratio_mean": (r * m).sum() / n,
        "ratio_min": r.masked_fill(~m, float("inf")).min(),
        "ratio_max": r.masked_fill(~m, float("-inf")).max(),
    }
    if dual_clip is not None:
        stats["clip_frac_dual"] = ((a < 0) & (r > dual_clip) & m).sum() / n
    return stats


@register_loss("clipped")
def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate with separate low/high clip (DAPO's clip-higher) and dual clip."""
    check_clip("clipped", clip_low, clip_high, dual_clip)
    a = token_adv(adv, logp)
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))  # [B, T]
    loss = clip_objective(ratio, a, clip_low, clip_high, dual_clip)
    return loss, ratio_stats(ratio, a, mask, clip_low, clip_high, dual_clip)


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` token-mean of log pi - log pi_old over each response (0 for an empty one)."""
    m = mask.to(logp.dtype)
    return ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1.0)


@register_loss("gspo")
def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: the clipped objective on the length-normalised sequence ratio, in its token form."""
    check_clip("gspo", clip_low, clip_high, dual_clip)
    a = token_adv(adv, logp)
    seq = sequence_log_ratio(logp, old_logp, mask).detach()  # [B] sg[log s_i]
    log_ratio = (seq[:, None] + logp - logp.detach()).clamp(-20.0, 20.0)  # [B, T], value log s_i
    ratio = torch.exp(log_ratio)
    loss = clip_objective(ratio, a, clip_low, clip_high, dual_clip)
    return loss, ratio_stats(ratio, a, mask, clip_low, clip_high, dual_clip)


@register_loss("reg_grpo", needs_whole_groups=True)
def reg_grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Regressive GRPO: ``(A_i - z_i)^2`` with z the group z-score of the sequence log-ratio, on every token."""
    if group_ids is None:
        raise ValueError(
            "loss 'reg_grpo' needs group_ids: the trainer must keep each prompt's responses together"
        )
    if adv.dim() != 1:
        raise ValueError(
            "loss 'reg_grpo' regresses one advantage per response; use a sequence-level estimator"
        )
    if group_ids.shape != adv.shape:
        raise ValueError(
            f"reg_grpo: group_ids {tuple(group_ids.shape)} must match advantages {tuple(adv.shape)}"
        )
    lr = sequence_log_ratio(logp, old_logp, mask)  # [B]
    _, inv = torch.unique(group_ids, return_inverse=True)  # [B] group of each row
    k = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(k, dtype=lr.dtype, device=lr.device).index_add_(0, inv, torch.ones_like(lr))
    mean = torch.zeros_like(count).index_add_(0, inv, lr) / count  # [k]
    sq = torch.zeros_like(count).index_add_(0, inv, (lr - mean[inv]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1.0) + eps)  # [k] unbiased; a group of one has sq = 0
    z = (lr - mean[inv]) / std[inv]  # [B]
    seq_loss = (adv.to(lr.dtype) - z) ** 2  # [B]
    token_loss = seq_loss[:, None].expand_as(logp)
    ratio = torch.exp(lr.detach().clamp(-20.0, 20.0))[:, None]
    return token_loss, ratio_stats(ratio, adv[:, None], mask, None, None, None)


def reduce_stats(parts: Iterable[tuple[dict[str, Any], float]]) -> dict[str, float]:
    """Merge per-micro-batch loss stats ``[(stats, n_tokens), ...]``: ``*_min``/``*_max`` by min/max, the rest
    token-weighted. Parts with no tokens are skipped; a key no part has a value for is left out."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for stats, w in parts:
        if w <= 0:
            continue
        for key, value in stats.items():
            v = float(value)
            if key.endswith("_min"):
                sums[key] = min(sums.get(key, v), v)
            elif key.endswith("_max"):
                sums[key] = max(sums.get(key, v), v)
            else:
                sums[key] = sums.get(key, 0.0) + v * w
                weights[key] = weights.get(key, 0.0) + w
    return {k: v / weights[k] if k in weights else v for k, v in sums.items()}


class Aggregation(ABC):
    """``numerator(loss, mask, constant)`` / ``units(mask)``, additive over micro-batches."""

    name = ""

    @abstractmethod
    def numerator(self, loss: torch.Tensor, mask: torch.Tensor, constant: float) -> torch.Tensor: ...

    @abstractmethod
    def units(self, mask: torch.Tensor) -> float: ...


AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")


class TokenMean(Aggregation):
    name = "token-mean"

    def numerator(self, loss: torch.Tensor, mask: torch.Tensor, constant: float) -> torch.Tensor:
        return (loss * mask.to(loss.dtype)).sum()

    def units(self, mask: torch.Tensor) -> float:
        return float(mask.sum())


class SeqMeanTokenMean(Aggregation):
    name = "seq-mean-token-mean"

    def numerator(self, loss: torch.Tensor, mask: torch.Tensor, constant: float) -> torch.Tensor:
        m = mask.to(loss.dtype)
        return ((loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)).sum()

    def units(self, mask: torch.Tensor) -> float:
        return float(mask.shape[0])


class SeqMeanTokenSumNorm(Aggregation):
    name = "seq-mean-token-sum-norm"

    def numerator(self, loss: torch.Tensor, mask: torch.Tensor, constant: float) -> torch.Tensor:
        if not constant or constant <= 0:
            raise ValueError(
                "seq-mean-token-sum-norm divides by a positive constant (algo.loss_agg_constant, "
                f"default rollout.max_new_tokens), got {constant!r}"
            )
        return (loss * mask.to(loss.dtype)).sum() / constant

    def units(self, mask: torch.Tensor) -> float:
        return float(mask.shape[0])


for _agg in (TokenMean(), SeqMeanTokenMean(), SeqMeanTokenSumNorm()):
    AGGREGATIONS.register(_agg.name)(_agg)
