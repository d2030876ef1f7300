"""Decayed Beta counts per training record: the one component that VADE's sampler (docs/algorithms.md#vade) and MSSR's /
SPO's value tracker (docs/algorithms.md#mssr) share.

Each record i keeps pseudo-counts ``alpha[i]`` (successes) and ``beta[i]`` (failures). Both methods forget old
evidence by multiplying the counts with a factor before adding new ones; they differ only in which factor applies to
which records, and in the prior they read the counts with:

- VADE: the posterior is Beta(alpha + 1, beta + 1) (``prior=1``); selected records decay with l1, all others with l2.
- MSSR/SPO: the value is v = alpha / (alpha + beta) (``prior=0``), unseen records read ``default`` (0.5);
  a record decays with rho (global or per record) when its new outcome is added.

Everything is vectorised over NumPy arrays; no Python loop over records.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class BetaTracker:
    def __init__(self, n: int, alpha0: float = 0.0, beta0: float = 0.0):
        if n <= 0:
            raise ValueError("BetaTracker needs at least one record")
        self.alpha = np.full(n, float(alpha0), dtype=np.float64)  # [n]
        self.beta = np.full(n, float(beta0), dtype=np.float64)  # [n]

    def __len__(self) -> int:
        return len(self.alpha)

    def mean(self, idx: Any = None, *, prior: float = 0.0, default: float = 0.5) -> np.ndarray:
        """Posterior mean (alpha + prior) / (alpha + beta + 2 prior) at ``idx`` (all records when None); records with
        no mass read ``default``."""
        a = self.alpha if idx is None else self.alpha[idx]
        b = self.beta if idx is None else self.beta[idx]
        tot = a + b + 2.0 * prior
        with np.errstate(invalid="ignore", divide="ignore"):
            m = (a + prior) / tot
        return np.where(tot > 0, m, default)

    def update(self, idx: Any, successes: Any, failures: Any, decay: Any = 1.0) -> None:
        """``alpha[idx] <- decay * alpha[idx] + successes``; ``beta[idx] <- decay * beta[idx] + failures``.

        ``decay`` is a scalar or one factor per index. Repeated indices are rejected (their updates would race)."""
        idx = np.asarray(idx, dtype=np.int64)
        if len(np.unique(idx)) != len(idx):
            raise ValueError("BetaTracker.update: indices must be distinct")
        self.alpha[idx] = np.asarray(decay) * self.alpha[idx] + np.asarray(successes, dtype=np.float64)
        self.beta[idx] = np.asarray(decay) * self.beta[idx] + np.asarray(failures, dtype=np.float64)

    def decay_all(self, factor: float, *, exclude: Any = None) -> None:
        """Multiply every record's counts by ``factor``, except the records in ``exclude``."""
        if factor == 1.0:
            return
        if exclude is None or len(exclude) == 0:
            self.alpha *= factor
            self.beta *= factor
            return
        keep_a, keep_b = self.alpha[exclude].copy(), self.beta[exclude].copy()
        self.alpha *= factor
        self.beta *= factor
        self.alpha[exclude], self.beta[exclude] = keep_a, keep_b

    def set(self, idx: Any, alpha: Any, beta: Any) -> None:
        self.alpha[idx] = alpha
        self.beta[idx] = beta

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha.tolist(), "beta": self.beta.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        a = np.asarray(state["alpha"], dtype=np.float64)
        b = np.asarray(state["beta"], dtype=np.float64)
        if a.shape != self.alpha.shape or b.shape != self.beta.shape:
            raise ValueError(
                f"checkpoint tracker has {len(a)} records but the dataset now has {len(self.alpha)}"
            )
        self.alpha, self.beta = a, b
