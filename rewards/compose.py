"""The composite reward the trainer calls: several weighted rewards, a result cache, a worker pool for heavy ones.

Score of one sample: the weighted mean over the rewards that apply,
``sum_k w_k * s_k / sum_k w_k`` where rewards returning ``score=None`` ("does not apply") are left out of both sums;
when none applies the score is 0.0 and ``ComposedResult.applied`` is False. ``parts`` is flat and ready to log as
``reward/<key>``: ``{"<name>": score, "<name>/<part>": value}`` for every reward that applied (a reward that raised
counts as applied with score 0 and no parts).

Failures never stop training. A reward that raises scores 0 for the samples it raised on (the batch call is retried
one item at a time to find them, see :func:`mmrl.rewards.base.call_reward`); each failure is logged with the sample
id (logger ``mmrl.rewards``), counted in :meth:`CompositeReward.stats`, and returned in ``ComposedResult.errors`` as
``{"id", "reward", "error"}`` for the trainer to append to its error file.

Light rewards run inline. Heavy rewards (``register_reward(..., heavy=True)``) run in a ``ProcessPoolExecutor``
(``forkserver`` context where the platform has it, else ``spawn``; never ``fork``, which is unsafe once torch or CUDA
threads exist). The batch is cut into chunks of at most ``chunk_size`` items spread over ``num_workers`` workers, and
at most ``num_workers`` chunks are in flight, so each chunk starts when it is submitted and its deadline is exact:
``timeout_s`` is a per-item budget, a chunk of k items gets ``k * timeout_s``. A chunk past its deadline means a
worker hangs: the pool is killed and rebuilt, unfinished chunks are re-queued, and the late chunk is split into
single items; a single item past ``timeout_s`` scores 0 with error ``"timeout"``. A worker that dies (segfault) is
treated the same way. The standard library has no public way to kill a hung worker before Python 3.14
(``ProcessPoolExecutor.kill_workers``), hence the guarded use of ``_processes`` in :meth:`CompositeReward._kill_pool`.

The LRU cache is keyed by (reward name, sorted options, response, repr of reference, images and metadata); the
images and metadata are part of the key because rewards read them. GRPO groups often repeat a response, and a
duplicate inside one batch is computed once and counted as a hit. Results with an error are not cached.

Group rewards (``register_reward(..., group=True)``: the label-free rewards of docs/labelfree.md, whose score of a
response depends on the other responses to its prompt) bypass the cache (neither read nor written, nor counted: the
same response text scores differently in another group) and run inline on the whole batch, whose groups are runs of
consecutive items with the same sample id (the trainer lays each prompt's responses side by side); a raising call is
retried one group at a time, never one item at a time, and a group that raises alone scores 0 for all its items
(:func:`mmrl.rewards.base.call_reward`). They cannot be heavy (:class:`mmrl.rewards.base.RewardSpec` refuses it), so
the pool's chunks never cut a group. Only group rewards see ``metadata["response_logprobs"]`` (the sampled tokens'
log-probs, which the trainer adds for SCOPE's confidence): the per-response rewards get the metadata without it, so
their cache keys stay those of the text (copies of one response keep their cache hit and the remote reward does
not ship the log-probs) and no per-response verdict can depend on a value its key leaves out.
"""

from __future__ import annotations

import hashlib
import logging
import math
import multiprocessing
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from typing import Any

from mmrl.rewards.base import (
    LOGPROBS_KEY,
    RewardSpec,
    call_reward,
    describe_exception,
    load_reward,
    resolve_worker_ref,
    validate_options,
    worker_ref,
)
from mmrl.rewards.sandbox import sweep_orphans
from mmrl.types import RewardInput, RewardResult

logger = logging.getLogger("mmrl.rewards")


@dataclass
class RewardConfig:
    """One reward in a composite. The trainer's ``RewardEntry`` config has the same three fields and works too."""

    name: str
    weight: float = 1.0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ComposedResult:
    """One sample's composite verdict; ``applied`` is False when no reward applied (``score`` is then 0.0)."""

    score: float
    parts: dict[str, float] = field(default_factory=dict)
    errors: list[dict[str, str]] = field(default_factory=list)
    applied: bool = True


@dataclass
class _Term:
    spec: RewardSpec
    weight: float
    options: dict[str, Any]
    ref: tuple[str, str, str] | None  # how a pool worker finds the function; None for light rewards


def _pool_call(
    ref: tuple[str, str, str], name: str, items: list[RewardInput], options: dict[str, Any]
) -> list[RewardResult]:
    """Runs inside a worker process."""
    return call_reward(resolve_worker_ref(ref), name, items, options)


@dataclass
class _PoolRun:
    """Book-keeping of one heavy reward's batch in the pool: queued chunks (lists of item indices), chunks in
    flight with their deadlines, and the items that must run alone because they were in flight when a worker died
    (so the one that kills its worker is found). An item fails ("worker process died") only when its worker died
    with it in flight alone a second time: once could be a kill from outside, which costs the item nothing."""

    items: list[RewardInput]
    queue: deque[list[int]]
    inflight: dict[Future, tuple[list[int], float]] = field(default_factory=dict)
    solo: set[int] = field(default_factory=set)
    deaths: Counter[int] = field(default_factory=Counter)  # worker deaths while a single item was in flight
    results: list[RewardResult | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.items)

    def can_submit(self, num_workers: int) -> bool:
        if not self.queue or len(self.inflight) >= num_workers:
            return False
        if any(idx[0] in self.solo for idx, _ in self.inflight.values()):
            return False
        return not (self.queue[0][0] in self.solo and self.inflight)

    def split(self, idx: list[int]) -> None:
        self.queue.extendleft([i] for i in reversed(idx))

    def collect(self, fut: Future, alone: bool) -> bool:
        """Store a finished chunk's results; returns True when the pool broke (a worker died)."""
        idx, _ = self.inflight.pop(fut)
        try:
            for i, r in zip(idx, fut.result()):
                self.results[i] = r
            return False
        except BrokenProcessPool as exc:
            if len(idx) > 1:
                self.split(idx)
                return True
            self.deaths[idx[0]] += 1
            if alone and self.deaths[idx[0]] > 1:  # it ran alone and its worker died again: the item kills it
                self.results[idx[0]] = RewardResult(
                    score=0.0, error=f"worker process died: {describe_exception(exc)}"
                )
            else:  # once more, alone: a worker killed from outside (the OOM killer, an operator) spares the item
                self.solo.add(idx[0])
                self.queue.appendleft(idx)
            return True
        except Exception as exc:  # e.g. an input that cannot be pickled; call_reward itself never raises
            for i in idx:
                self.results[i] = RewardResult(score=0.0, error=describe_exception(exc))
            return False

    def expire(self, fut: Future) -> bool:
        """A chunk past its deadline: split it, or time out its single item (returns True then)."""
        idx, _ = self.inflight.pop(fut)
        if len(idx) > 1:
            self.split(idx)
            return False
        self.results[idx[0]] = RewardResult(score=0.0, error="timeout")
        return True

    def requeue_inflight(self) -> None:
        self.queue.extendleft(idx for idx, _ in reversed(list(self.inflight.values())))
        self.inflight.clear()


def _without_logprobs(batch: Sequence[RewardInput]) -> Sequence[RewardInput]:
    """``batch`` as the per-response rewards see it: without ``metadata["response_logprobs"]`` (module docstring)."""
    if not any(LOGPROBS_KEY in x.metadata for x in batch):
        return batch
    return [replace(x, metadata={k: v for k, v in x.metadata.items() if k != LOGPROBS_KEY}) for x in batch]


class CompositeReward:
    def __init__(
        self,
        configs: Sequence[Any],
        *,
        num_workers: int = 2,
        timeout_s: float = 30.0,
        cache_size: int = 4096,
        chunk_size: int = 8,
    ):
        if num_workers < 1 or chunk_size < 1 or cache_size < 0 or not timeout_s > 0:
            raise ValueError(
                f"CompositeReward needs num_workers >= 1, chunk_size >= 1, cache_size >= 0 and timeout_s > 0; got "
                f"num_workers={num_workers}, chunk_size={chunk_size}, cache_size={cache_size}, timeout_s={timeout_s}"
            )
        if not configs:
            raise ValueError(
                "CompositeReward needs at least one reward (list them under `rewards:` in the recipe)"
            )
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self.cache_size, self.chunk_size = cache_size, chunk_size
        self._terms = [self._build_term(c) for c in configs]
        names = [t.spec.name for t in self._terms]
        dup = sorted(n for n, k in Counter(names).items() if k > 1)
        if dup:
            raise ValueError(f"reward {dup[0]!r} appears twice in the composite; list each reward once")
        self._cache: OrderedDict[bytes, RewardResult] = OrderedDict()
        self._pool: ProcessPoolExecutor | None = None
        self._counts: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._lock = threading.RLock()

    @staticmethod
    def _build_term(cfg: Any) -> _Term:
        spec = load_reward(cfg.name)
        weight = float(cfg.weight)
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"reward {spec.name!r}: weight must be a positive number, got {cfg.weight!r}")
        options = validate_options(spec, dict(cfg.options or {}))
        return _Term(spec=spec, weight=weight, options=options, ref=worker_ref(spec) if spec.heavy else None)

    @property
    def names(self) -> list[str]:
        return [t.spec.name for t in self._terms]

    def stats(self) -> dict[str, Any]:
        """Counters since construction: cache hits/misses/size, errors per reward, timeouts, pool restarts."""
        return {
            "cache_hits": self._counts["cache_hits"],
            "cache_misses": self._counts["cache_misses"],
            "cache_size": len(self._cache),
            "timeouts": self._counts["timeouts"],
            "pool_restarts": self._counts["pool_restarts"],
            "errors": dict(self._errors),
        }

    def __call__(self, batch: Sequence[RewardInput]) -> list[ComposedResult]:
        # one call at a time: an asynchronous run's producer scores its batches in a thread while the trainer's
        # thread scores the held-out evaluation, and the cache, the pool and its restarts are not made for two
        with self._lock:
            plain = _without_logprobs(batch)
            per_term = [self._score(term, batch if term.spec.group else plain) for term in self._terms]
            return [self._compose(item, [res[i] for res in per_term]) for i, item in enumerate(batch)]

    def _compose(self, item: RewardInput, results: list[RewardResult]) -> ComposedResult:
        total = wsum = 0.0
        parts: dict[str, float] = {}
        errors: list[dict[str, str]] = []
        for term, r in zip(self._terms, results):
            name = term.spec.name
            if r.error is not None:
                errors.append({"id": item.id, "reward": name, "error": r.error})
                self._errors[name] += 1
                logger.warning("reward %r failed on sample %r (scored 0): %s", name, item.id, r.error)
            if r.score is None:
                continue
            parts[name] = float(r.score)
            parts.update({f"{name}/{k}": float(v) for k, v in r.parts.items()})
            total += term.weight * r.score
            wsum += term.weight
        if wsum == 0:
            return ComposedResult(score=0.0, parts=parts, errors=errors, applied=False)
        return ComposedResult(score=total / wsum, parts=parts, errors=errors)

    # -- cache ---------------------------------------------------------------------------------------------------

    def _key(self, term: _Term, x: RewardInput) -> bytes:
        fields = [term.spec.name, repr(sorted(term.options.items())), x.response, repr(x.reference)]
        text = "\x1f".join([*fields, repr(x.images), repr(x.metadata)])
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def _score(self, term: _Term, batch: Sequence[RewardInput]) -> list[RewardResult]:
        if term.spec.group:  # a group-dependent score: no per-response cache (module docstring)
            return self._run_inline(term, list(batch))
        results: list[RewardResult | None] = [None] * len(batch)
        todo: dict[bytes, list[int]] = {}
        for i, x in enumerate(batch):
            key = self._key(term, x)
            if key in self._cache:
                self._cache.move_to_end(key)
                results[i] = self._cache[key]
                self._counts["cache_hits"] += 1
            elif key in todo:
                todo[key].append(i)
                self._counts["cache_hits"] += 1
            else:
                todo[key] = [i]
                self._counts["cache_misses"] += 1
        unique = [batch[idx[0]] for idx in todo.values()]
        if unique:
            computed = self._run_pool(term, unique) if term.spec.heavy else self._run_inline(term, unique)
            for (key, idx), r in zip(todo.items(), computed):
                self._remember(key, r)
                for i in idx:
                    results[i] = r
        return results  # type: ignore[return-value]

    def _remember(self, key: bytes, r: RewardResult) -> None:
        if r.error is not None or self.cache_size == 0:
            return
        self._cache[key] = r
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    # -- execution -----------------------------------------------------------------------------------------------

    def _run_inline(self, term: _Term, items: list[RewardInput]) -> list[RewardResult]:
        return call_reward(term.spec.fn, term.spec.name, items, term.options, group=term.spec.group)

    def _run_pool(self, term: _Term, items: list[RewardInput]) -> list[RewardResult]:
        size = min(self.chunk_size, -(-len(items) // self.num_workers))
        run = _PoolRun(
            items, deque(list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size))
        )
        broken_at_submit = 0
        while run.queue or run.inflight:
            pool = self._ensure_pool()
            while run.can_submit(self.num_workers):
                idx = run.queue.popleft()
                try:
                    fut = pool.submit(
                        _pool_call, term.ref, term.spec.name, [items[i] for i in idx], term.options
                    )
                except (
                    BrokenProcessPool
                ) as exc:  # a worker died while idle (killed from outside): no item's doing
                    broken_at_submit += 1
                    if broken_at_submit > 3:  # a pool that cannot take work at all: not a worker's bad luck
                        raise RuntimeError(
                            f"reward {term.spec.name!r}: its worker pool broke {broken_at_submit} times in a row "
                            f"before any work reached it: {describe_exception(exc)}"
                        ) from exc
                    run.queue.appendleft(idx)
                    run.requeue_inflight()
                    self._kill_pool()
                    break
                broken_at_submit = 0
                run.inflight[fut] = (idx, time.monotonic() + self.timeout_s * len(idx))
            if not run.inflight:
                continue
            first_deadline = min(d for _, d in run.inflight.values())
            timeout = max(0.0, first_deadline - time.monotonic())
            done, _ = wait(list(run.inflight), timeout=timeout, return_when=FIRST_COMPLETED)
            alone = len(run.inflight) == 1
            broken = any([run.collect(fut, alone) for fut in done])
            now = time.monotonic()
            late = [f for f, (_, d) in run.inflight.items() if d <= now]
            self._counts["timeouts"] += sum(run.expire(f) for f in late)
            if late or broken:
                run.requeue_inflight()
                self._kill_pool()
        return run.results  # type: ignore[return-value]

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
            if ctx.get_start_method() == "forkserver":
                # Workers fork from a server that has already imported the rewards, so a rebuilt pool starts fast.
                ctx.set_forkserver_preload(["__main__", "mmrl.rewards"])
            self._pool = ProcessPoolExecutor(max_workers=self.num_workers, mp_context=ctx)
        return self._pool

    def _kill_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        self._counts["pool_restarts"] += 1
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for p in procs:
            p.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.join(timeout=5)
        sweep_orphans()  # run directories the killed workers left behind (their TeX runs died with them)

    def close(self) -> None:
        """Shut the worker pool down (idempotent)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> CompositeReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
