"""VADE: variance-aware dynamic sampling (docs/algorithms.md#vade). It picks the prompts whose groups are likely to carry a
learning signal, from what earlier steps saw, instead of generating groups and discarding the uninformative ones as
DAPO's dynamic sampling does. The loss is untouched; only the choice of records changes.

Per step, over a candidate pool (the whole dataset, or ``pool_size`` records drawn at random):

1. Thompson draw p_i ~ Beta(alpha_i + 1, beta_i + 1) per candidate (counts start at 0, so unseen records draw U(0, 1)).
2. Information gain I_i = p_i (1 - p_i)^2, which peaks at p = 1/3; the top-k records by I_i are the batch.
3. After the rollouts, with k_i successes out of G: selected records alpha <- l1 alpha + k, beta <- l1 beta + (G - k);
   every other record alpha <- l2 alpha, beta <- l2 beta.

Choices the paper leaves open, made here:

- l1 = 0.2 and l2 = 0.999 fit the authors' worked example (G = 8: (0.1, 8.4) with one success -> (1.02, 8.68)); their
  training defaults are unpublished, so both are options.
- Successes: k = the sum over the group of rewards clipped to [0, 1] (binary rewards give the success count; graded
  rewards in [0, 1] count fractionally). Rewards on another scale are clipped, with a warning; set
  ``success_threshold`` to count a rollout as a success when its reward is at or above the threshold instead.
- The l2 decay of every record is lazy: the tracker stores counts divided by a running ``scale`` (true = scale x
  stored), so a step multiplies one float instead of two 1M-entry arrays, and a selected record's update is rescaled.
  When the scale falls below 1e-30 it is folded into the counts (one pass over the arrays).
- Unseen records (no counts at all) draw U(0, 1) directly, which is Beta(1, 1) exactly, so early steps on a large
  dataset skip the Beta sampler's cost.
- The draws are prepared one step ahead, off the critical path. Between two selections only the k selected records'
  counts change (their update) and every other record's true counts change by the known factor l2 (the scale). So
  as soon as ``select`` has chosen its batch, a background thread draws the NEXT step's Thompson sample for the whole
  pool from the posteriors it will have (stored counts x the next scale), with a generator of its own, while the
  rollouts, rewards and policy update run (NumPy's samplers release the GIL). The next ``select`` then redraws only
  the k records that were updated, from their new posteriors, and takes the top-k: every record's draw is still one
  independent draw from its exact current posterior. If the state changed otherwise (no update, or two updates,
  ``set_counts``, a load), the prepared draws are discarded and the pool is drawn in place. Why: exact Beta draws
  cost ~40 ms per million records here (NumPy's gamma-ratio sampler; a vectorised Cheng BB was 3x slower), which a
  real step hides entirely. ``vade/select_ms`` is the time ``select`` took (the critical path),
  ``vade/draw_ms`` the time the draws it used took (in the background, or in place).

The generators' (NumPy PCG64) states (the background one's as it was before the draws in flight, which a load
repeats), the scale, the counts and the seen set are the sampler's ``state_dict``: ``--resume`` reproduces every later
draw. Under several processes each rank must call ``update`` with the whole batch's rewards
(gathered), so that every rank holds the same state and makes the same global choice.
"""

from __future__ import annotations

import math
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from mmrl.algos.beta import BetaTracker
from mmrl.samplers.base import SAMPLERS

_RENORMALISE_BELOW = 1e-30


@SAMPLERS.register("vade")
class VadeSampler:
    """Thompson-sampling prompt selection by information gain p (1 - p)^2 over decayed Beta counts."""

    def __init__(
        self,
        num_records: int,
        seed: int = 0,
        l1: float = 0.2,
        l2: float = 0.999,
        pool_size: int | None = None,
        success_threshold: float | None = None,
    ):
        if isinstance(num_records, bool) or not isinstance(num_records, int) or num_records <= 0:
            raise ValueError(
                f"vade: the dataset must hold at least one record, got num_records={num_records!r}"
            )
        if not _is_real(l1) or not 0.0 <= l1 <= 1.0:
            raise ValueError(f"vade: l1 (decay of the selected records) must be in [0, 1], got {l1!r}")
        if not _is_real(l2) or not 0.0 < l2 <= 1.0:
            raise ValueError(f"vade: l2 (decay of all other records) must be in (0, 1], got {l2!r}")
        if pool_size is not None and (
            isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size <= 0
        ):
            raise ValueError(
                f"vade: pool_size must be a positive integer (or null for the whole dataset), got {pool_size!r}"
            )
        if success_threshold is not None and (
            not _is_real(success_threshold) or not math.isfinite(success_threshold)
        ):
            raise ValueError(
                f"vade: success_threshold must be a finite number or null, got {success_threshold!r}"
            )
        self.n, self.l1, self.l2 = num_records, float(l1), float(l2)
        self.pool_size = None if pool_size is None or pool_size >= num_records else pool_size
        self.success_threshold = None if success_threshold is None else float(success_threshold)
        self.rng = np.random.default_rng(seed)
        self.ahead_rng = np.random.default_rng([seed, 1])  # the background draws' own stream
        self.tracker = BetaTracker(num_records)  # stored counts; true counts = self.scale * stored
        self.scale = 1.0
        self.seen = np.zeros(num_records, dtype=bool)  # [n] records that have received feedback
        self._num_seen = 0
        self._warned_clip = False
        self._stats: dict[str, float] = {}
        self._updates = 0  # number of update() calls: the prepared draws are valid for one value of it
        self._ahead: _Ahead | None = None
        self._executor: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ selection
    def select(self, k: int) -> list[int]:
        """The ``k`` candidates with the highest information gain under one Thompson draw each."""
        t0 = time.perf_counter()
        pool_n = self.pool_size or self.n
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ValueError(f"vade: select needs a positive number of records, got {k!r}")
        if k > pool_n:
            what = f"pool_size={self.pool_size}" if self.pool_size else f"the dataset's {self.n} records"
            raise ValueError(
                f"vade: cannot pick {k} distinct records from {what}; raise pool_size or lower train.prompts_per_step"
            )
        pool, _, gain, cand, draw_ms = self._prepared(k)
        if cand is None:  # every pool record is a candidate
            cand = np.argpartition(gain, pool_n - k)[pool_n - k :]
        top = cand[np.argsort(-gain[cand], kind="stable")[:k]]
        chosen = top if pool is None else pool[top]
        self._stats = {"vade/p_mean": float(self.posterior_mean(chosen).mean()), "vade/draw_ms": draw_ms}
        self._prepare(chosen, k, expected_updates=self._updates + 1)
        self._stats["vade/select_ms"] = (time.perf_counter() - t0) * 1e3
        return chosen.tolist()

    def _prepared(self, k: int) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray | None, float]:
        """This step's pool, every pool record's draw and gain, the positions that can make the top k (None: all) and the
        draws' time: from the background, with the updated records redrawn, or drawn in place."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.expected_updates == self._updates:
            pool, p, gain, top, pinned, draw_ms = ahead.future.result()
            if len(pinned):
                which = ahead.redraw if pool is None else pool[pinned]
                p[pinned] = _draw(self.rng, self.scale, self.tracker, self.seen, which)
                gain[pinned] = _gain(p[pinned])
            # only the redrawn records changed: the top k is among them and the others' top k
            return pool, p, gain, np.concatenate([top, pinned]) if len(top) == k else None, draw_ms
        if ahead is not None:
            ahead.future.result()  # stale: the state changed in a way the draws did not foresee
        t0 = time.perf_counter()
        pool = None if self.pool_size is None else self.rng.choice(self.n, self.pool_size, replace=False)
        p = _draw(self.rng, self.scale, self.tracker, self.seen, pool)
        return pool, p, _gain(p), None, (time.perf_counter() - t0) * 1e3

    def _prepare(self, redraw: np.ndarray, k: int, expected_updates: int) -> None:
        """Start drawing the next selection's pool in the background, as the state will be after one update of
        ``redraw`` (those records are redrawn at selection time; every other record's true counts will be the
        stored ones times the next scale), and find the top ``k`` of the records not redrawn."""
        scale = self.scale * self.l2 if expected_updates == self._updates + 1 else self.scale
        state = self.ahead_rng.bit_generator.state  # what a load must restore to draw the same numbers again
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vade-draws")
        gen, n, pool_size, tracker, seen = self.ahead_rng, self.n, self.pool_size, self.tracker, self.seen
        redraw = np.asarray(redraw, dtype=np.int64)

        def work() -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
            t0 = time.perf_counter()
            pool = None if pool_size is None else gen.choice(n, pool_size, replace=False)
            pinned = redraw if pool is None else np.flatnonzero(np.isin(pool, redraw))
            p = _draw(gen, scale, tracker, seen, pool, pinned)
            gain = _gain(p)
            gain[pinned] = -1.0  # below every real gain: never among the others' top k
            m = len(gain)
            kk = min(k, m - len(pinned))
            top = np.argpartition(gain, m - kk)[m - kk :] if kk > 0 else np.zeros(0, dtype=np.int64)
            return pool, p, gain, top, pinned, (time.perf_counter() - t0) * 1e3

        self._ahead = _Ahead(self._executor.submit(work), k, expected_updates, redraw, state)

    def _settle(self) -> None:
        """Wait for the background draws (before anything rewrites every record's counts)."""
        if self._ahead is not None:
            self._ahead.future.result()

    def _thompson(self, pool: np.ndarray | None) -> np.ndarray:
        """One Thompson draw per pool record from the current posteriors (in place, with the main generator)."""
        return _draw(self.rng, self.scale, self.tracker, self.seen, pool)

    # ------------------------------------------------------------------ feedback
    def update(self, indices: list[int], rewards: torch.Tensor | np.ndarray) -> None:
        """Add each selected record's successes (decayed by l1); decay every other record by l2."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        r = torch.as_tensor(rewards, dtype=torch.float64).cpu().numpy()
        if r.ndim != 2 or r.shape[0] != len(idx) or r.shape[1] == 0:
            raise ValueError(
                f"vade: rewards must have shape [k, G] for the k={len(idx)} selected records, got {tuple(r.shape)}"
            )
        if len(idx) and (idx.min() < 0 or idx.max() >= self.n):
            bad = int(idx[(idx < 0) | (idx >= self.n)][0])
            raise IndexError(f"vade: record index {bad} is outside the dataset's {self.n} records")
        uniq, counts = np.unique(idx, return_counts=True)
        if (counts > 1).any():
            raise ValueError(
                f"vade: record {int(uniq[counts > 1][0])} appears twice in one update; pass each once"
            )
        finite = np.isfinite(r).all(axis=1)
        if not finite.all():
            row = int(np.flatnonzero(~finite)[0])
            raise ValueError(
                f"vade: record {int(idx[row])} has a non-finite reward {r[row].tolist()}; fix the reward function"
            )
        successes = self._successes(r)  # [k]
        new_scale = self.scale * self.l2
        self.tracker.update(
            idx, successes / new_scale, (r.shape[1] - successes) / new_scale, decay=self.l1 / self.l2
        )
        self.scale = new_scale
        if self.scale < _RENORMALISE_BELOW:
            self._settle()  # the background draws read every record's stored counts
            self.tracker.decay_all(self.scale)
            self.scale = 1.0
        self._num_seen += int(np.count_nonzero(~self.seen[idx]))
        self.seen[idx] = True
        self._updates += 1

    def _successes(self, r: np.ndarray) -> np.ndarray:
        if self.success_threshold is not None:
            return (r >= self.success_threshold).sum(axis=1).astype(np.float64)
        if not self._warned_clip and ((r < 0.0) | (r > 1.0)).any():
            self._warned_clip = True
            warnings.warn(
                "vade: rewards outside [0, 1] are clipped to [0, 1] before they count as successes; "
                "set sampler.options.success_threshold to count rewards at or above a threshold instead",
                stacklevel=3,
            )
        return np.clip(r, 0.0, 1.0).sum(axis=1)

    # ------------------------------------------------------------------ reading and seeding counts
    def counts(self, indices: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """True (alpha, beta) counts at ``indices`` (all records when None), with the lazy decay applied."""
        a = self.tracker.alpha if indices is None else self.tracker.alpha[indices]
        b = self.tracker.beta if indices is None else self.tracker.beta[indices]
        return self.scale * a, self.scale * b

    def set_counts(self, indices: Any, alpha: Any, beta: Any) -> None:
        """Seed records' counts, e.g. from an offline pass of the initial policy; they count as seen."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        a = np.broadcast_to(np.asarray(alpha, dtype=np.float64), idx.shape)
        b = np.broadcast_to(np.asarray(beta, dtype=np.float64), idx.shape)
        if (a < 0).any() or (b < 0).any() or not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise ValueError("vade: counts must be finite and non-negative")
        self._settle()
        self.tracker.set(idx, a / self.scale, b / self.scale)
        self._num_seen += int(np.count_nonzero(~self.seen[idx]))
        self.seen[idx] = True
        self._updates += 1  # the prepared draws did not foresee these counts

    def posterior_mean(self, indices: Any = None) -> np.ndarray:
        """Mean of Beta(alpha + 1, beta + 1): (s A + 1) / (s (A + B) + 2) = (A + 1/s) / (A + B + 2/s)."""
        return self.tracker.mean(indices, prior=1.0 / self.scale)

    def stats(self) -> dict[str, float]:
        """Per-step metrics: the chosen batch's mean posterior mean (read before its update), the number of distinct
        records that have received feedback, and the last selection's wall time."""
        return {**self._stats, "vade/seen": float(self._num_seen)}

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        ahead = self._ahead
        return {
            "n": self.n,
            "scale": self.scale,
            "rng": self.rng.bit_generator.state,
            "ahead_rng": ahead.rng_state if ahead is not None else self.ahead_rng.bit_generator.state,
            # the draws in flight: redone on load from the same generator state, for the same records
            "ahead": None
            if ahead is None
            else {
                "updates_pending": ahead.expected_updates - self._updates,
                "redraw": ahead.redraw.tolist(),
                "k": ahead.k,
            },
            "tracker": self.tracker.state_dict(),
            "seen": np.flatnonzero(self.seen).tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["n"] != self.n:
            raise ValueError(
                f"vade: the checkpoint's sampler saw {state['n']} records but the dataset now has {self.n}; "
                "resume with the same training data"
            )
        self._settle()
        self._ahead = None
        self.tracker.load_state_dict(state["tracker"])
        self.scale = float(state["scale"])
        self.rng.bit_generator.state = state["rng"]
        self.seen[:] = False
        self.seen[np.asarray(state["seen"], dtype=np.int64)] = True
        self._num_seen = int(np.count_nonzero(self.seen))
        self._stats = {}
        if "ahead_rng" in state:  # checkpoints written before the draws were prepared ahead lack it
            self.ahead_rng.bit_generator.state = state["ahead_rng"]
        ahead = state.get("ahead")
        if ahead is not None:
            pending = int(ahead["updates_pending"])
            if pending not in (0, 1):
                raise ValueError(f"vade: corrupt sampler state: {pending} updates pending (expected 0 or 1)")
            self._prepare(
                np.asarray(ahead["redraw"], dtype=np.int64), int(ahead["k"]), self._updates + pending
            )


class _Ahead:
    """Draws in flight for the next selection, and what they assume."""

    def __init__(
        self, future: Future, k: int, expected_updates: int, redraw: np.ndarray, rng_state: dict[str, Any]
    ):
        self.future = future
        self.k = k  # the batch size the next select is expected to ask for
        self.expected_updates = expected_updates  # valid when select finds this many update() calls made
        self.redraw = redraw  # [k] records whose counts the next update changes: drawn again at selection
        self.rng_state = rng_state  # the background generator before these draws


def _draw(
    rng: np.random.Generator,
    scale: float,
    tracker: BetaTracker,
    seen: np.ndarray,
    idx: np.ndarray | None,
    pinned: np.ndarray | None = None,
) -> np.ndarray:
    """p ~ Beta(scale alpha + 1, scale beta + 1) for each record of ``idx`` (all when None); unseen records draw
    U(0, 1), which is Beta(1, 1) exactly and far cheaper.

    ``pinned`` (positions in the result) are records whose counts another thread may be updating: they draw
    U(0, 1) whatever their counts, so how many numbers the generator consumes never depends on that race (their
    draws are replaced afterwards)."""
    alpha = tracker.alpha if idx is None else tracker.alpha[idx]
    beta = tracker.beta if idx is None else tracker.beta[idx]
    mask = seen if idx is None else seen[idx]
    if pinned is not None and len(pinned):
        mask = mask.copy() if idx is None else mask
        mask[pinned] = False
    # integer positions: gathering and scattering with them is faster than with a boolean mask
    where = np.flatnonzero(mask)
    if len(where) == len(alpha):
        return rng.beta(scale * alpha + 1.0, scale * beta + 1.0)
    p = rng.random(len(alpha))
    if len(where):
        p[where] = rng.beta(scale * alpha[where] + 1.0, scale * beta[where] + 1.0)
    return p


def _gain(p: np.ndarray) -> np.ndarray:
    """Information gain p (1 - p)^2, in place over a fresh array (this runs over the whole pool each step)."""
    gain = np.subtract(1.0, p)
    gain *= gain
    gain *= p
    return gain


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
