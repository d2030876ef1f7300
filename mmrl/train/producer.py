"""The rollout side of the trainer: each step's batch, generated in step (``rollout.max_staleness: 0``) or ahead of
training within a staleness bound (docs/async.md#asynchronous-rollouts).

With k = ``rollout.max_staleness`` > 0 a thread produces the batches of steps s + 1, s + 2, ... (sample -> episodes
-> rewards: :meth:`mmrl.train.collect.Collector.collect`, rewards resolved in the thread) while the trainer trains,
and the trainer takes them in order. Batch t may start once the engine holds policy version t - 1 - k (v: the weight
syncs so far; the trainer trains step t with version t - 1): the capacity rule of bounded staleness, at most k + 1
batches accepted or in flight beyond what the trainer holds, so no token is more than k versions old when its batch
is trained (k counts whole updates; a response that spans an in-flight weight copy has tokens of two versions, each
recorded). With k = 0 :meth:`Producer.take` is the collector's own call, in the caller's thread: the synchronous
trainer, the same code.

The engine must own its weights (``HFEngine(own_weights=True)``, ``VLLMEngine(in_flight=True)``:
:func:`engine_options`), so an update never changes the weights a forward is using; it copies the trained ones in
between two decoding steps (``sync_weights``).

Resume: every produced batch keeps the sampler's state from before its draw; a checkpoint saves the state from before
the oldest batch not yet trained (:meth:`Producer.sampler_state`), so a resumed run draws exactly the prompts whose
batches were produced but never trained: none lost, none used twice. Their rollouts are regenerated (with the resumed
weights), not saved.

Metrics per step: ``async/staleness_mean|max`` (over the batch's sampled tokens: t - 1 - the token's version),
``async/staleness_tokens/lag<L>`` (how many of them are L versions old, L = 0 .. the batch's max: the report's
histogram), ``rollout/logprob_diff_mean/lag<L>`` (the rollout/proximal mismatch of those tokens,
:func:`mmrl.train.no_grad.correction`),
``async/version_span`` (the mean over responses of the newest minus the oldest version among its tokens: an in-flight
update within a response), ``async/ahead`` (batches ready when the trainer asked), ``time/train_idle`` (the trainer
waiting for a batch) and ``time/rollout_idle`` (the producer waiting for the staleness bound).
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections import Counter
from typing import Any

from mmrl.config import Config
from mmrl.train.collect import Collected, Collector


def engine_options(cfg: Config) -> dict[str, Any]:
    """What the rollout engine needs beyond its own options when it runs ahead: weights of its own that the trainer
    copies in between two decoding steps (hf: a copy of the policy's; vllm has its own copy, and its steps pause
    for the reload)."""
    if cfg.rollout.max_staleness == 0 or cfg.rollout.placement != "colocated":
        return {}
    return {"in_flight": True} if cfg.rollout.engine == "vllm" else {"own_weights": True}


class Producer:
    def __init__(self, collector: Collector, engine: Any, sampler: Any, max_staleness: int, last_step: int):
        self.collector, self.engine, self.sampler = collector, engine, sampler
        self.k, self.last_step = max_staleness, last_step
        self._ready: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._next = 0  # the step whose batch the thread produces next
        self._pending: list[
            tuple[int, dict[str, Any]]
        ] = []  # (step, sampler state before its batch), untrained
        self._rollout_idle = 0.0
        if (
            max_staleness > 0
        ):  # episodes across batches (rollout.episode.next_batch_at) start the next one early
            collector.gate = self._gate

    def take(self, step: int) -> Collected:
        """Step ``step``'s batch."""
        if self.k == 0:
            return self.collector.collect(step)
        if self._thread is None:
            self._next = step
            self.engine.version = (
                step - 1
            )  # the weights it holds: the trainer's after step - 1 (resumed or not)
            self._thread = threading.Thread(target=self._run, name="mmrl-producer", daemon=True)
            self._thread.start()
        ahead = self._ready.qsize()
        t0 = time.perf_counter()
        while True:
            try:
                item = self._ready.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError(f"the rollout producer ended without step {step}'s batch") from None
        idle = time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise item
        got_step, got = item
        assert got_step == step, (got_step, step)
        with self._cond:
            self._pending = [(t, st) for t, st in self._pending if t != step]
            rollout_idle, self._rollout_idle = self._rollout_idle, 0.0
        got.stats |= staleness_stats(got, step) | {
            "async/ahead": float(ahead),
            "time/train_idle": idle,
            "time/rollout_idle": rollout_idle,
        }
        return got

    def synced(self) -> None:
        """After the engine took the trained weights: the bound may let the next batch start."""
        with self._cond:
            self._cond.notify_all()

    def sampler_state(self) -> dict[str, Any]:
        """The sampler's state to checkpoint: from before the oldest batch produced and not yet trained."""
        with self._cond:
            return self._pending[0][1] if self._pending else self.sampler.state_dict()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=600)

    def _gate(self, t: int) -> bool:
        """Whether batch t may start now, without waiting (the collector asks while it drives batch t - 1's last
        episodes); if so its sampler state is kept as :meth:`_run` keeps it."""
        with self._cond:
            if self._stop or t > self.last_step or self.engine.version < t - 1 - self.k:
                return False
            self._pending.append((t, copy.deepcopy(self.sampler.state_dict())))
            return True

    def _run(self) -> None:
        try:
            while self._next <= self.last_step:
                t = self._next
                t0 = time.perf_counter()
                with (
                    self._cond
                ):  # batch t needs version t - 1 - k (unless it started early, within the bound)
                    need = t - 1 - self.k
                    self._cond.wait_for(
                        lambda: self._stop or self.engine.version >= need or self.collector.started(t)  # noqa: B023
                    )
                    if self._stop:
                        return
                    self._rollout_idle += time.perf_counter() - t0
                    if not self.collector.started(t):
                        self._pending.append((t, copy.deepcopy(self.sampler.state_dict())))
                got = self.collector.collect(t).resolve()
                self._ready.put((t, got))
                self._next = t + 1
        except BaseException as e:  # the trainer raises it at its next take
            self._ready.put(e)


def staleness_stats(got: Collected, step: int) -> dict[str, float]:
    """``async/staleness_mean|max``, ``async/version_span`` and ``async/staleness_tokens/lag<L>`` (the sampled tokens
    L versions old: the report's histogram) of a batch trained at ``step`` (version step - 1)."""
    lags: list[int] = []
    spans: list[int] = []
    for row in got.trajectories:
        for traj in row:
            versions = [v for c in traj.completions for v in (c.versions or [])]
            if versions:
                lags += [step - 1 - v for v in versions]
                spans.append(max(versions) - min(versions))
    if not lags:
        return {}
    counts = Counter(lags)
    return {
        "async/staleness_mean": sum(lags) / len(lags),
        "async/staleness_max": float(max(lags)),
        "async/version_span": sum(spans) / len(spans),
    } | {f"async/staleness_tokens/lag{lag}": float(counts[lag]) for lag in range(max(lags) + 1)}
