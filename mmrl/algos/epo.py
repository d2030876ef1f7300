"""EPO's entropy regulariser for multi-turn agents, registered as the loss ``epo`` (docs/credit.md#epo): the clipped
surrogate plus a per-token entropy term whose band follows a per-turn entropy history kept across steps.

For a token t of turn index k_t (its turn's position in the trajectory, from the turn spans) with token entropy H_t
under the policy being trained (with its gradient):

    H_bar[k]  the historical mean entropy at turn index k: the mean, over past steps, of each step's mean token
              entropy at turn k (one value per step, however many tokens it had)
    P_t       = relu(kappa_l H_bar[k_t] - H_t) + relu(H_t - kappa_r H_bar[k_t])    0 inside the band, linear outside
    term_t    = -lambda (H_t - beta P_t)
    L_t       = L_clipped_t + term_t                                              (``clipped``'s surrogate)

aggregated as the config says (under ``token-mean``: mean L_clipped - lambda (mean H - beta mean P), the paper's
L_PG - lambda [H_traj - beta L_smooth]). Inside the band the gradient is the plain entropy bonus; below it, the bonus is
(1 + beta) times as strong; above it, (1 - beta) times: with beta = 1 the bonus stops there, beta > 1 pushes the
entropy back down.

How it runs: :class:`EPOLoss` is a stateful loss (:class:`mmrl.algos.losses.StatefulLoss`), made once per run. The
update passes it the token entropy with its gradient and each token's turn index (:func:`turn_index`); each call
returns, besides its logged stats, the micro-batch's per-turn entropy sums; once per step, after the update, the
update hands it those sums over every rank's micro-batches and it folds the step into :class:`EntropyHistory`, which the
checkpoint saves (``state.json``, key ``loss``). A step's band comes from the past steps only.

Where this departs from the released code (the smoothing term in its ``dp_actor.py``):
- The code's penalty is a mask (0.1 outside the band, 0 inside) with no gradient, so its smoothing term does not
  change the update. P_t above is the differentiable reading of the same band; it is ours, not published.
- beta is a constant (``smooth_coeff``); the paper's phase schedule beta_k was not retrieved and the code's epoch
  weight is off by default.
- The band applies from turn ``from_turn`` on (default 0: every turn); the code applies it from ``max_step // 2``
  (set ``from_turn`` to ``rollout.episode.max_turns // 2`` for that: a loss's options do not see the rollout config).
- Token mode only (the code's default); a turn index no past step has reached has no band (P = 0), so neither has
  the first step. A step's entropy at turn k is the mean over every token of turn k the update's forwards scored
  (each row once per ``algo.epochs``), under the weights of the moment.

Defaults from the released script: lambda (``entropy_coeff``) 0.001, kappa_l 0.5, kappa_r 1.5, beta
(``smooth_coeff``) 1.0. Without the band, EPO is the entropy bonus ``algo.entropy_coef: 0.001`` on ``clipped``,
which the update already has (the script runs with the smoothing flags off).
"""

from __future__ import annotations

from typing import Any

import torch

from mmrl.algos.advantages import Turn
from mmrl.algos.losses import StatefulLoss, check_clip, clipped_surrogate, register_loss


def turn_index(turns: list[list[Turn]], T: int) -> torch.Tensor:
    """``[N, T]`` long: the index of the turn each response token belongs to, -1 outside every turn's span."""
    index = torch.full((len(turns), T), -1, dtype=torch.long)
    for i, row in enumerate(turns):
        for k, turn in enumerate(row):
            index[i, turn.start : turn.end] = k
    return index


def smoothing_penalty(
    entropy: torch.Tensor, reference: torch.Tensor, kappa_l: float = 0.5, kappa_r: float = 1.5
) -> torch.Tensor:
    """``[B, T]``: relu(kappa_l H_bar - H) + relu(H - kappa_r H_bar), differentiable in ``entropy`` (H); ``reference``
    (H_bar) is read detached."""
    ref = reference.detach()
    return torch.relu(kappa_l * ref - entropy) + torch.relu(entropy - kappa_r * ref)


@torch.no_grad()
def turn_sums(
    entropy: torch.Tensor, mask: torch.Tensor, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sums [K], tokens [K])`` float64 on the CPU: the entropy summed over the unmasked tokens of each turn index,
    and their number; K one past the largest index met (0 when none)."""
    m = mask.bool() & (index >= 0)
    h, k = entropy.detach().double()[m].cpu(), index[m].cpu()
    K = int(k.max()) + 1 if k.numel() else 0
    sums = torch.zeros(K, dtype=torch.float64).index_add_(0, k, h)
    return sums, torch.zeros(K, dtype=torch.float64).index_add_(0, k, torch.ones_like(h))


class EntropyHistory:
    """H_bar: a running mean per turn index of each step's mean token entropy; JSON-serialisable state."""

    def __init__(self) -> None:
        self.mean: list[float] = []  # [K] H_bar per turn index
        self.count: list[int] = []  # [K] steps that reached each turn index

    def reference(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``index [B, T]`` (turn index, -1 outside) -> ``(H_bar [B, T] float, known [B, T] bool)``: the history at
        each token's turn index, and whether any past step reached it."""
        table = torch.tensor([*self.mean, 0.0], dtype=torch.float32)  # [K + 1]; index K: no history
        k = torch.where((index >= 0) & (index < len(self.mean)), index, len(self.mean)).cpu()
        return table[k].to(index.device), (k < len(self.mean)).to(index.device)

    def update(self, entropy: torch.Tensor, mask: torch.Tensor, index: torch.Tensor) -> None:
        """Fold in one step: the mean entropy of its unmasked tokens at each turn index counts once."""
        self.fold(*turn_sums(entropy, mask, index))

    def fold(self, sums: torch.Tensor, tokens: torch.Tensor) -> None:
        """Fold in one step from its per-turn entropy ``sums [K]`` over ``tokens [K]``; a turn with no token is
        left as it was."""
        grow = len(sums) - len(self.mean)
        self.mean += [0.0] * max(grow, 0)
        self.count += [0] * max(grow, 0)
        for j in range(len(sums)):
            if tokens[j] > 0:
                self.count[j] += 1
                self.mean[j] += (float(sums[j] / tokens[j]) - self.mean[j]) / self.count[j]

    def state_dict(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "count": list(self.count)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mean, count = list(state.get("mean", [])), list(state.get("count", []))
        if len(mean) != len(count) or set(state) - {"mean", "count"}:
            raise ValueError(
                f"EPO entropy history: expected 'mean' and 'count' lists of one length, got {sorted(state)} "
                f"({len(mean)} and {len(count)} values)"
            )
        self.mean, self.count = [float(x) for x in mean], [int(x) for x in count]


def check_options(
    entropy_coeff: float, smooth_coeff: float, kappa_l: float, kappa_r: float, from_turn: int
) -> None:
    if not 0.0 <= kappa_l <= kappa_r or entropy_coeff < 0.0 or smooth_coeff < 0.0 or from_turn < 0:
        raise ValueError(
            "EPO: need 0 <= kappa_l <= kappa_r, entropy_coeff and smooth_coeff >= 0 and from_turn >= 0 "
            f"(algo.loss_options), got kappa_l {kappa_l}, kappa_r {kappa_r}, entropy_coeff {entropy_coeff}, "
            f"smooth_coeff {smooth_coeff}, from_turn {from_turn}"
        )


def epo_regulariser(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    index: torch.Tensor,
    history: EntropyHistory,
    *,
    entropy_coeff: float = 0.001,
    smooth_coeff: float = 1.0,
    kappa_l: float = 0.5,
    kappa_r: float = 1.5,
    from_turn: int = 0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(term [B, T], stats)``: -lambda (H_t - beta P_t) per token, to add to the token losses before aggregation;
    ``entropy [B, T]`` with its gradient, ``index [B, T]`` from :func:`turn_index`, ``history`` as of the past steps.

    Stats over the unmasked tokens: ``epo/entropy`` (mean H), ``epo/penalty`` (mean P), ``epo/banded`` (share with a
    band), ``epo/below_band`` / ``epo/above_band`` / ``epo/out_of_band`` (share outside it)."""
    check_options(entropy_coeff, smooth_coeff, kappa_l, kappa_r, from_turn)
    h_bar, known = history.reference(index)
    h_bar = h_bar.to(entropy.dtype)
    m = mask.bool()
    active = (known & (index >= from_turn) & m).to(entropy.dtype)  # [B, T] tokens with a band
    penalty = smoothing_penalty(entropy, h_bar, kappa_l, kappa_r) * active  # [B, T]
    term = -entropy_coeff * (entropy - smooth_coeff * penalty)
    with torch.no_grad():
        h, n = entropy.detach(), m.sum().clamp(min=1)
        below = ((h < kappa_l * h_bar) * active).sum() / n
        above = ((h > kappa_r * h_bar) * active).sum() / n
        stats = {
            "epo/entropy": (h * m).sum() / n,
            "epo/penalty": (penalty.detach() * m).sum() / n,
            "epo/banded": active.sum() / n,
            "epo/below_band": below,
            "epo/above_band": above,
            "epo/out_of_band": below + above,
        }
    return term, stats


@register_loss("epo", needs_entropy_grad=True, needs_turns=True)
class EPOLoss(StatefulLoss):
    """``clipped``'s surrogate plus :func:`epo_regulariser`, with the per-turn history across steps. Options: the
    clip fields (``algo.clip_low`` / ``clip_high`` / ``dual_clip``) and ``algo.loss_options`` ``entropy_coeff``,
    ``smooth_coeff``, ``kappa_l``, ``kappa_r``, ``from_turn``."""

    def __init__(
        self,
        *,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = 3.0,
        entropy_coeff: float = 0.001,
        smooth_coeff: float = 1.0,
        kappa_l: float = 0.5,
        kappa_r: float = 1.5,
        from_turn: int = 0,
    ):
        check_clip("epo", clip_low, clip_high, dual_clip)
        check_options(entropy_coeff, smooth_coeff, kappa_l, kappa_r, from_turn)
        self.clip = {"clip_low": clip_low, "clip_high": clip_high, "dual_clip": dual_clip}
        self.band = {
            "entropy_coeff": entropy_coeff,
            "smooth_coeff": smooth_coeff,
            "kappa_l": kappa_l,
            "kappa_r": kappa_r,
            "from_turn": from_turn,
        }
        self.history = EntropyHistory()

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        adv: torch.Tensor,
        mask: torch.Tensor,
        *,
        group_ids: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        turn_index: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if entropy is None or turn_index is None:
            raise ValueError(
                "loss 'epo' needs the token entropy (with its gradient) and each token's turn index: the update "
                "passes both; a direct call must give entropy= and turn_index="
            )
        loss, stats = clipped_surrogate(logp, old_logp, adv, mask, **self.clip)
        term, reg = epo_regulariser(entropy, mask, turn_index, self.history, **self.band)
        sums, tokens = turn_sums(entropy, mask, turn_index)  # [K] step sums, folded in by end_step
        return loss + term, stats | reg | {"epo_turn_entropy": sums, "epo_turn_tokens": tokens}

    def end_step(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """Fold the step's per-turn mean entropy into the history (the next step's band)."""
        if "epo_turn_entropy" in sums:
            self.history.fold(sums["epo_turn_entropy"], sums["epo_turn_tokens"])
        h_bar = self.history.mean
        return {"epo/history_turns": float(len(h_bar)), "epo/h_bar": sum(h_bar) / max(len(h_bar), 1)}

    def state_dict(self) -> dict[str, Any]:
        return self.history.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.load_state_dict(state)
