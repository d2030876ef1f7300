"""EPO's entropy regulariser for multi-turn agents: pure functions and the per-turn entropy history
(docs/credit.md#epo). Not registered: the loss seam does not give a loss what it needs (docs/credit.md#what-epo-needs).

For a token t of turn index k_t (its turn's position in the trajectory, from the turn spans) with token entropy H_t
under the policy being trained (with its gradient):

    H_bar[k]  the historical mean entropy at turn index k: the mean, over past steps, of each step's mean token
              entropy at turn k (one value per step, however many tokens it had)
    P_t       = relu(kappa_l H_bar[k_t] - H_t) + relu(H_t - kappa_r H_bar[k_t])    0 inside the band, linear outside
    term_t    = -lambda (H_t - beta P_t)

added to the policy loss and aggregated as it is (under ``token-mean``: -lambda (mean H - beta mean P), the paper's
-lambda [H_traj - beta L_smooth]). Inside the band the gradient is the plain entropy bonus; below it, the bonus is
(1 + beta) times as strong; above it, (1 - beta) times: with beta = 1 the bonus stops there, beta > 1 pushes the
entropy back down.

Where this departs from the released code (the smoothing term in its ``dp_actor.py``):
- The code's penalty is a mask (0.1 outside the band, 0 inside) with no gradient, so its smoothing term does not
  change the update. P_t above is the differentiable reading of the same band; it is ours, not published.
- beta is a constant (``smooth_coeff``); the paper's phase schedule beta_k was not retrieved and the code's epoch
  weight is off by default.
- The band applies from turn ``from_turn`` on (default 0: every turn); the code applies it from ``max_step // 2``.
- Token mode only (the code's default); a turn index no past step has reached has no band (P = 0), so neither has
  the first step.

Defaults from the released script: lambda (``entropy_coeff``) 0.001, kappa_l 0.5, kappa_r 1.5, beta
(``smooth_coeff``) 1.0. Without the band, EPO is the entropy bonus ``algo.entropy_coef: 0.001``, which the update
already has (the script runs with the smoothing flags off).
"""

from __future__ import annotations

from typing import Any

import torch

from mmrl.algos.advantages import Turn


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

    @torch.no_grad()
    def update(self, entropy: torch.Tensor, mask: torch.Tensor, index: torch.Tensor) -> None:
        """Fold in one step: the mean entropy of its unmasked tokens at each turn index counts once."""
        m = mask.bool() & (index >= 0)
        h, k = entropy.detach().double()[m].cpu(), index[m].cpu()
        if k.numel() == 0:
            return
        K = int(k.max()) + 1
        sums = torch.zeros(K, dtype=torch.float64).index_add_(0, k, h)
        counts = torch.zeros(K, dtype=torch.float64).index_add_(0, k, torch.ones_like(h))
        grow = K - len(self.mean)
        self.mean += [0.0] * max(grow, 0)
        self.count += [0] * max(grow, 0)
        for j in range(K):
            if counts[j] > 0:
                self.count[j] += 1
                self.mean[j] += (float(sums[j] / counts[j]) - self.mean[j]) / self.count[j]

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

    Stats over the unmasked tokens: ``epo_below_band`` / ``epo_above_band`` (share outside the band),
    ``epo_penalty`` (mean P)."""
    if not 0.0 <= kappa_l <= kappa_r or entropy_coeff < 0.0 or smooth_coeff < 0.0:
        raise ValueError(
            "EPO: need 0 <= kappa_l <= kappa_r and entropy_coeff, smooth_coeff >= 0, got "
            f"kappa_l {kappa_l}, kappa_r {kappa_r}, entropy_coeff {entropy_coeff}, smooth_coeff {smooth_coeff}"
        )
    h_bar, known = history.reference(index)
    h_bar = h_bar.to(entropy.dtype)
    m = mask.bool()
    active = (known & (index >= from_turn) & m).to(entropy.dtype)  # [B, T] tokens with a band
    penalty = smoothing_penalty(entropy, h_bar, kappa_l, kappa_r) * active  # [B, T]
    term = -entropy_coeff * (entropy - smooth_coeff * penalty)
    with torch.no_grad():
        h, n = entropy.detach(), m.sum().clamp(min=1)
        stats = {
            "epo_below_band": ((h < kappa_l * h_bar) * active).sum() / n,
            "epo_above_band": ((h > kappa_r * h_bar) * active).sum() / n,
            "epo_penalty": (penalty.detach() * m).sum() / n,
        }
    return term, stats
