"""Group-free advantages for one response per prompt: SPO's per-prompt value tracker and MSSR (docs/algorithms.md#mssr).

How this departs from GRPO: the baseline is not the group mean but v = alpha / (alpha + beta), the decayed Beta
counts of the prompt's past outcomes (:class:`mmrl.algos.beta.BetaTracker`, shared with VADE), read BEFORE this step's
update. Per step, with s a response's reward:

    A_raw = s - v;   A = (A_raw - mean) / sqrt(max(var, eps))        (over the whole batch, population var)
    alpha <- rho * alpha + o;   beta <- rho * beta + (1 - o),   o = 1[s > 0.5]  (``outcome: score`` uses s in [0,1])
    MSSR only:  psi_t = min(0.4 * H_t, |A| / 2);   A_t = A + psi_t     (psi >= 0 and <= |A|/2: A's sign never flips)

``spo`` is the tracker alone (the authors' "MVSR" baseline); ``mssr`` adds the entropy shaping. Both share every
other option, so the pair is the paper's shaping ablation. H_t is -p log p of the SAMPLED token (p from pi_old's
log-probs, as the authors' code) or, with ``entropy: full``, the full-vocabulary entropy the trainer passes.

Forgetting factor rho, clipped to [rho_min, rho_max] = [0.875, 0.96]:
- ``rho: global`` (the paper's configuration): a window of the last ``window`` (10) batch-mean KL(policy || ref)
  values, m its mean, tau = ``target_kl`` (0.01). m > tau -> rho_min. Otherwise ``rho_rule: paper``:
  rho = rho_max - (m / tau)(rho_max - rho_min) (lower KL, slower forgetting: the rule the authors' code comments
  describe); ``rho_rule: code``: rho = rho_min + (m / tau)(rho_max - rho_min) (what ``_get_adaptive_rho``
  in ruiiu/MSSR computes: it rises with KL up to tau, then drops to rho_min). Empty window -> the midpoint.
- ``rho: per_prompt`` (SPO): rho = clip(2^(-D / d_half)), d_half = 0.06; a prompt seen for the first time gets
  rho_max.

Initialisation (``needs_init``): the trainer runs the initial policy once over the training prompts (one response
each) and calls ``initialise``: alpha0 = N0 v0, beta0 = N0 (1 - v0), N0 = 1 / (1 - rho_min) = 8, v0 the mean
outcome of the prompt's responses. Prompts never seen read v = ``v_init`` (0.5) with the same N0 pseudo-counts.
On ``--resume`` the state comes from the checkpoint instead; do not initialise again.

Departures from the authors' code (ruiiu/MSSR, ``verl/trainer/core_algos.py``):
- The KL fed to the global window is the batch-mean KL the trainer measured in the previous update
  (``AdvantageInput.kl``), one step older than theirs (KL of this batch's old log-probs to the reference).
- ``initialise`` converts rewards to outcomes exactly as the updates do; theirs averages raw scores (the same for
  0/1 rewards).
- Per-prompt D: their code sums (stored old log-probs of the prompt's previous response - this response's old
  log-probs) position by position, two different token sequences. Neither that nor a true KL is available without a
  forward pass of the current policy over the previous response, so here D = |mean_t log pi_old(this response) -
  mean_t log pi_old(previous response)|, the change of the prompt's mean sampled-token log-likelihood between
  visits: a proxy for docs/algorithms.md's token-mean |log pi_prev - log pi_now| (which scores one response under both
  policies) that needs one stored float per prompt.
- Several responses to one prompt in a batch (rollout.n > 1, or a prompt drawn twice) update the tracker in order,
  each an independent Bernoulli observation, as theirs does; all read v before any update.
- The window length is the ``window`` option (their window is hard-coded to 10; a config field of 20 is unused).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch

from mmrl.algos.advantages import ADVANTAGES, AdvantageEstimator, AdvantageInput
from mmrl.algos.beta import BetaTracker


def global_rho(
    mean_kl: float | None,
    *,
    rule: Literal["paper", "code"] = "paper",
    rho_min: float = 0.875,
    rho_max: float = 0.96,
    target_kl: float = 0.01,
) -> float:
    """Forgetting factor from the mean of the recent KL window (None: empty window -> the midpoint)."""
    if mean_kl is None:
        return (rho_min + rho_max) / 2
    if mean_kl > target_kl:
        return rho_min
    frac = max(mean_kl, 0.0) / target_kl  # a negative (k1) estimate counts as no change
    if rule == "paper":
        return rho_max - frac * (rho_max - rho_min)
    return rho_min + frac * (rho_max - rho_min)


def entropy_shaping(adv: torch.Tensor, entropy: torch.Tensor, alpha: float, kappa: float) -> torch.Tensor:
    """``psi [N, T] = min(alpha * H, |A| / kappa)`` (H detached); 0 where ``entropy`` is 0 (padding)."""
    return torch.minimum(alpha * entropy.detach(), adv.abs() / kappa)


@ADVANTAGES.register("spo")
class SPO(AdvantageEstimator):
    """Per-prompt Beta value tracker as the baseline, batch-normalised advantage, no shaping (docs/algorithms.md#mssr)."""

    name = "spo"
    min_group_size = 1
    needs_init = True
    shift_invariant = True  # the batch normalisation removes a constant; the 0.5 outcome threshold would not

    def __init__(
        self,
        num_records: int,
        *,
        eps: float = 1e-6,
        rho: Literal["global", "per_prompt"] = "global",
        rho_rule: Literal["paper", "code"] = "paper",
        rho_min: float = 0.875,
        rho_max: float = 0.96,
        target_kl: float = 0.01,
        window: int = 10,
        d_half: float = 0.06,
        v_init: float = 0.5,
        outcome: Literal["binary", "score"] = "binary",
        init: bool = True,
    ):
        super().__init__(num_records, eps=eps)
        if rho not in ("global", "per_prompt"):
            raise ValueError(f"{self.name}: rho must be 'global' or 'per_prompt', got {rho!r}")
        if rho_rule not in ("paper", "code"):
            raise ValueError(f"{self.name}: rho_rule must be 'paper' or 'code', got {rho_rule!r}")
        if not 0.0 < rho_min <= rho_max < 1.0:
            raise ValueError(f"{self.name}: need 0 < rho_min <= rho_max < 1, got {rho_min}, {rho_max}")
        if target_kl <= 0 or window < 1 or d_half <= 0:
            raise ValueError(f"{self.name}: target_kl and d_half must be > 0 and window >= 1")
        if not 0.0 <= v_init <= 1.0:
            raise ValueError(f"{self.name}: v_init must be in [0, 1], got {v_init}")
        if outcome not in ("binary", "score"):
            raise ValueError(f"{self.name}: outcome must be 'binary' or 'score', got {outcome!r}")
        self.rho, self.rho_rule, self.rho_min, self.rho_max = rho, rho_rule, rho_min, rho_max
        self.target_kl, self.window, self.d_half, self.outcome = target_kl, window, d_half, outcome
        self.needs_init = init
        self.n0 = 1.0 / (1.0 - rho_min)  # effective window of the initial pseudo-counts
        self.tracker = BetaTracker(num_records, self.n0 * v_init, self.n0 * (1.0 - v_init))
        self.kl_window: list[float] = []
        self.last_logp = np.full(num_records, np.nan)  # [n] mean sampled-token log-prob at the last visit

    # ------------------------------------------------------------------ tracker
    def initialise(self, indices: list[int], rewards: torch.Tensor) -> None:
        """Set alpha0 = N0 v0, beta0 = N0 (1 - v0) from one (or more) responses of the initial policy per prompt."""
        idx = self._indices(indices)
        if len(idx) != rewards.numel():
            raise ValueError(f"{self.name}.initialise: {len(idx)} indices for {rewards.numel()} rewards")
        o = self._outcomes(rewards.reshape(-1), idx)
        counts = np.bincount(idx, minlength=self.num_records)  # [n]
        seen = np.nonzero(counts)[0]
        v0 = np.bincount(idx, weights=o, minlength=self.num_records)[seen] / counts[seen]
        self.tracker.set(seen, self.n0 * v0, self.n0 * (1.0 - v0))

    def _indices(self, indices: list[int]) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        bad = idx[(idx < 0) | (idx >= self.num_records)]
        if len(bad):
            raise ValueError(
                f"{self.name}: record index {int(bad[0])} is outside the tracker's {self.num_records} records; "
                "the training set changed since the tracker was built (start a new run)"
            )
        return idx

    def _outcomes(self, s: torch.Tensor, idx: np.ndarray) -> np.ndarray:
        s = s.detach().double().cpu().numpy()
        if self.outcome == "binary":
            return (s > 0.5).astype(np.float64)
        bad = np.nonzero((s < 0) | (s > 1))[0]
        if len(bad):
            raise ValueError(
                f"{self.name}: record {int(idx[bad[0]])} has reward {s[bad[0]]:.4g} outside [0, 1], which "
                "'outcome: score' cannot count; use 'outcome: binary' (1[s > 0.5])"
            )
        return s

    def _update(self, idx: np.ndarray, o: np.ndarray, rho: np.ndarray) -> None:
        """Apply the updates in order; repeated prompts in one batch are separate observations."""
        rank = np.zeros(len(idx), dtype=np.int64)
        seen: dict[int, int] = {}
        for k, i in enumerate(idx.tolist()):
            rank[k] = seen.get(i, 0)
            seen[i] = rank[k] + 1
        for r in range(int(rank.max()) + 1 if len(rank) else 0):
            sel = rank == r
            self.tracker.update(idx[sel], o[sel], 1.0 - o[sel], decay=rho[sel])

    def _rhos(self, inp: AdvantageInput, idx: np.ndarray) -> np.ndarray:
        """One forgetting factor per response ``[N]``."""
        if self.rho == "global":
            if inp.kl is not None:
                self.kl_window = (self.kl_window + [float(inp.kl)])[-self.window :]
            mean_kl = float(np.mean(self.kl_window)) if self.kl_window else None
            rho = global_rho(
                mean_kl,
                rule=self.rho_rule,
                rho_min=self.rho_min,
                rho_max=self.rho_max,
                target_kl=self.target_kl,
            )
            return np.full(len(idx), rho)
        mask = inp.mask.detach().double().cpu()
        n_tok = mask.sum(-1)
        mean_lp = ((inp.old_logp.detach().double().cpu() * mask).sum(-1) / n_tok).numpy()  # [N]; NaN if empty
        d = np.abs(mean_lp - self.last_logp[idx])
        rho = np.where(
            np.isfinite(d), np.clip(2.0 ** (-d / self.d_half), self.rho_min, self.rho_max), self.rho_max
        )
        for i, lp in zip(idx.tolist(), mean_lp.tolist()):
            if math.isfinite(lp):
                self.last_logp[i] = lp  # the last response of the prompt wins
        return rho

    # ------------------------------------------------------------------ advantages
    def compute(self, inp: AdvantageInput) -> tuple[torch.Tensor, dict[str, float]]:
        B, G = inp.rewards.shape
        idx = np.repeat(self._indices(inp.indices), G)  # [N] prompt of each response
        s = inp.rewards.reshape(-1).float()  # [N]
        v = self.tracker.mean(idx)  # [N] read before the update
        raw = s - torch.as_tensor(v, dtype=s.dtype, device=s.device)
        if raw.numel() > 1:
            adv = (raw - raw.mean()) * torch.rsqrt(raw.var(unbiased=False).clamp(min=self.eps))
        else:
            adv = raw
        o = self._outcomes(s, idx)
        rho = self._rhos(inp, idx)
        self._update(idx, o, rho)
        stats = {f"{self.name}/rho": float(rho.mean()), f"{self.name}/value_mean": float(v.mean())}
        return self.shape(adv, inp, stats)

    def shape(
        self, adv: torch.Tensor, inp: AdvantageInput, stats: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return adv, stats

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {
            "tracker": self.tracker.state_dict(),
            "kl_window": list(self.kl_window),
            "last_logp": [None if math.isnan(x) else x for x in self.last_logp.tolist()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state["tracker"])
        self.kl_window = [float(x) for x in state["kl_window"]][-self.window :]
        last = np.array([np.nan if x is None else x for x in state["last_logp"]], dtype=np.float64)
        if last.shape != self.last_logp.shape:
            raise ValueError(
                f"{self.name}: checkpoint holds {len(last)} records but the dataset now has {self.num_records}"
            )
        self.last_logp = last


@ADVANTAGES.register("mssr")
class MSSR(SPO):
    """SPO plus entropy advantage shaping: token-level advantages ``[N, T]`` (docs/algorithms.md#mssr)."""

    name = "mssr"

    def __init__(
        self,
        num_records: int,
        *,
        eps: float = 1e-6,
        rho: Literal["global", "per_prompt"] = "global",
        rho_rule: Literal["paper", "code"] = "paper",
        rho_min: float = 0.875,
        rho_max: float = 0.96,
        target_kl: float = 0.01,
        window: int = 10,
        d_half: float = 0.06,
        v_init: float = 0.5,
        outcome: Literal["binary", "score"] = "binary",
        init: bool = True,
        entropy: Literal["sampled", "full"] = "sampled",
        entropy_alpha: float = 0.4,
        entropy_kappa: float = 2.0,
    ):
        super().__init__(
            num_records,
            eps=eps,
            rho=rho,
            rho_rule=rho_rule,
            rho_min=rho_min,
            rho_max=rho_max,
            target_kl=target_kl,
            window=window,
            d_half=d_half,
            v_init=v_init,
            outcome=outcome,
            init=init,
        )
        if entropy not in ("sampled", "full"):
            raise ValueError(f"mssr: entropy must be 'sampled' or 'full', got {entropy!r}")
        if entropy_alpha < 0 or entropy_kappa <= 1:
            raise ValueError(
                "mssr: need entropy_alpha >= 0 and entropy_kappa > 1 (at kappa <= 1 the shaping can cancel or "
                f"flip a negative advantage), got {entropy_alpha}, {entropy_kappa}"
            )
        self.entropy, self.alpha_h, self.kappa = entropy, entropy_alpha, entropy_kappa
        self.needs_entropy = entropy == "full"

    def shape(
        self, adv: torch.Tensor, inp: AdvantageInput, stats: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = inp.mask.to(adv.device, adv.dtype)  # [N, T]
        if self.entropy == "full":
            if inp.entropy is None:
                raise ValueError(
                    "mssr with 'entropy: full' needs the full-vocabulary entropy under pi_old "
                    "(AdvantageInput.entropy); the trainer passes it when needs_entropy is True"
                )
            h = inp.entropy.to(adv.device, adv.dtype) * mask
        else:
            lp = inp.old_logp.to(adv.device, adv.dtype)
            h = -torch.exp(lp) * lp * mask  # -p log p of the sampled token
        a_tok = adv[:, None] * mask  # [N, T]
        psi = entropy_shaping(a_tok, h, self.alpha_h, self.kappa) * mask
        n = mask.sum().clamp(min=1.0)
        stats |= {"mssr/shaping_mean": (psi.sum() / n).item(), "mssr/entropy_mean": (h.sum() / n).item()}
        return a_tok + psi, stats
