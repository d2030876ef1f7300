"""Separate placement (docs/async.md#separate-placement): in one launched job, the last
``rollout.rollout_processes`` processes only generate and the others only train.

The generating processes run the rollout side of the trainer on their own: sampler -> episodes -> rewards
(:meth:`mmrl.train.collect.Collector.collect`, with a :meth:`~mmrl.distributed.Dist.rollouts` view of the generating
processes: each draws the same prompts, generates and rewards its share of the batch's groups, and the outcomes are
gathered over their own gloo group, as the training processes of a colocated run do; one generating process is a
single-process run), each with its own copy of the policy in an :class:`~mmrl.rollout.hf.HFEngine` whose forwards
may be paused between two decoding steps. The first generating process sends each resolved batch to every training
process over a gloo group (``Dist.batch_group``, pickled); batch ``t`` starts once the engine holds version
``t - 1 - k`` (k = ``rollout.max_staleness``; with k = 0 it waits for the weights trained on batch ``t - 1``:
generation and training take turns, as in the colocated synchronous trainer, but in separate processes).

After each update the training processes push the weights (:func:`push_weights`): training rank 0 broadcasts a
header (the new version) and then the parameters in buckets of at most ``BUCKET_BYTES``, each in the parameter's own
dtype (the engine loads the same checkpoint with the same settings), over ``Dist.weights_group`` (rank 0 and every
generating process: gloo on CPU, NCCL on GPUs). Under FSDP2 each parameter is gathered (``full_tensor``, a
collective of the training processes) just before it is packed: no full state dict is ever held. The generating
process's receiver thread waits for the header outside the engine's lock, then loads every bucket with the engine
paused (:meth:`HFEngine.take_pushed`), so a forward never sees half-loaded weights and a response that spans the load
continues with its KV cache, its later tokens recorded with the new version.

Resume: each batch carries the sampler's state after its draw and its rewards' feedback; the trainer's checkpoint
stores the state after the last batch it trained (:meth:`Receiver.sampler_state`), and a resumed generating process
loads it with the checkpoint's weights: the prompts of batches generated but not trained are drawn again.
"""

from __future__ import annotations

import copy
import queue
import random
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.config import Config
from mmrl.distributed import Dist
from mmrl.train.collect import ROLLOUTS_LOGGED, Collected

BUCKET_BYTES = 64 * 2**20
STOP = -1  # the header that ends a generating process's receiver


def _params(policy: Any) -> list[torch.nn.Parameter]:
    """The parameters both sides exchange, in the same order: the trained ones (LoRA: the adapters)."""
    return [p for p in policy.model.parameters() if p.requires_grad]


def buckets(params: list[Any], limit: int = BUCKET_BYTES) -> list[list[Any]]:
    """Consecutive parameters of one dtype, at most ``limit`` bytes a bucket (a bigger parameter alone)."""
    out: list[list[Any]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if out and out[-1][0].dtype == p.dtype and size + nbytes <= limit:
            out[-1].append(p)
            size += nbytes
        else:
            out.append([p])
            size = nbytes
    return out


def push_weights(policy: Any, dist: Dist, version: int) -> None:
    """Every training process: the trained weights to the generating processes as ``version`` (module docstring)."""
    from mmrl.model.fsdp import full_tensor

    main = dist.rank == 0  # the other training processes only take part in FSDP2's gathers
    device = dist.weights_device() if main else dist.device
    if main:
        dist.weights_broadcast(torch.tensor([version], device=device))
    with torch.no_grad():
        for bucket in buckets(_params(policy)):
            full = [full_tensor(p.detach()) for p in bucket]
            if main:
                dist.weights_broadcast(torch.cat([t.reshape(-1) for t in full]).to(device))
            del full


def stop_generators(dist: Dist) -> None:
    """Training rank 0, at the end: the generating processes' receivers end."""
    if dist.rank == 0 and dist.weights_group is not None:
        dist.weights_broadcast(torch.tensor([STOP], device=dist.weights_device()))


def receive_weights(engine: Any, params: list[torch.nn.Parameter], dist: Dist) -> int | None:
    """A generating process: the next pushed version loaded into ``params`` (the engine's weights, paused; the
    trained ones, in the trainers' order); None at the end."""
    device = dist.weights_device()
    header = torch.zeros(1, dtype=torch.int64, device=device)
    dist.weights_broadcast(header)  # waits for an update, generation running
    version = int(header.item())
    if version == STOP:
        return None

    @torch.no_grad()
    def load() -> None:
        for bucket in buckets(params):
            flat = torch.empty(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=device)
            dist.weights_broadcast(flat)
            offset = 0
            for p in bucket:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    engine.take_pushed(load, version)
    return version


def announce_start(dist: Dist, start: int, ckpt: Path | None) -> tuple[int, Path | None]:
    """Training rank 0 tells the generating processes where the run starts (its step and checkpoint)."""
    start, path = dist.data_broadcast((start, None if ckpt is None else str(ckpt)), src=0)
    return start, None if path is None else Path(path)


class Receiver:
    """The training side's batches under a separate placement: :class:`mmrl.train.producer.Producer`'s interface
    (``take``, ``synced``, ``sampler_state``, ``close``) over the data and weight groups."""

    def __init__(self, policy: Any, sampler: Any, dist: Dist):
        self.policy, self.sampler, self.dist = policy, sampler, dist
        self.src = dist.generators[0]  # the first generating process sends every batch
        self._after: dict[str, Any] | None = None  # the sampler's state after the last batch taken
        self._version = 0

    def take(self, step: int) -> Collected:
        from mmrl.train.producer import staleness_stats

        t0 = time.perf_counter()
        got_step, got = self.dist.batch_broadcast(None)
        if isinstance(got, BaseException):
            raise RuntimeError(f"the generating process (rank {self.src}) failed: {got!r}") from got
        assert got_step == step, (got_step, step)
        self._after = got.sampler_after
        self._version = step - 1
        got.stats |= staleness_stats(got, step) | {"time/train_idle": time.perf_counter() - t0}
        return got

    def synced(self) -> None:
        self._version += 1
        push_weights(self.policy, self.dist, self._version)

    def sampler_state(self) -> dict[str, Any]:
        return self._after if self._after is not None else self.sampler.state_dict()

    def close(self) -> None:
        stop_generators(self.dist)


def serve(cfg: Config, out: Path, dist: Dist) -> None:
    """A generating process: every batch of the run, produced within the staleness bound, sent to the trainers."""
    from mmrl.data import load_split
    from mmrl.model.checkpoint_files import resolve_model_path
    from mmrl.model.policy import Policy
    from mmrl.rewards.compose import CompositeReward, RewardConfig
    from mmrl.rollout import ENGINES
    from mmrl.samplers import SAMPLERS
    from mmrl.train.collect import Collector

    start, ckpt = announce_start(dist, 0, None)
    seed = cfg.train.seed + 1000 * dist.global_rank + start  # generation differs per process and per resume
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    train = load_split(cfg.data, cfg.data.train, None, resolve_model_path(cfg.model.path))
    vllm = cfg.rollout.engine == "vllm"
    # the vLLM engine generates with weights of its own: the policy here only encodes and takes the pushed weights
    # before they go to vLLM, so it stays in host memory
    device = "cpu" if vllm else str(dist.device)
    model_cfg = replace(cfg.model, device=device) if cfg.model.device == "auto" or vllm else cfg.model
    policy = Policy.from_pretrained(model_cfg, path=str(ckpt / "model") if ckpt else None)
    params = _params(
        policy
    )  # the trained ones, as the trainers push them; then nothing here needs gradients:
    # autocast caches its low-precision copy of a parameter that requires grad for a whole generate call, and a
    # weight loaded in between two decoding steps would reach the forwards only at the next call
    policy.model.requires_grad_(False)
    own = {"own_process": True} if vllm else {}  # vLLM's engine core outside the launcher's process group
    engine = ENGINES.get(cfg.rollout.engine)(
        policy, batch_size=cfg.rollout.batch_size, in_flight=True, **own, **cfg.rollout.engine_options
    )
    engine.version = start
    sampler = SAMPLERS.get(cfg.sampler.name)(len(train), seed=cfg.train.seed, **cfg.sampler.options)
    if ckpt is not None:
        import json

        sampler.load_state_dict(json.loads((ckpt / "state.json").read_text())["sampler"])
    reward = (
        CompositeReward(
            [RewardConfig(r.name, r.weight, dict(r.options)) for r in cfg.rewards],
            num_workers=cfg.train.reward_workers,
            timeout_s=cfg.train.reward_timeout_s,
        )
        if cfg.rewards
        else None
    )
    timings: dict[str, float] = {}

    @contextmanager
    def stage(name: str):
        t0 = time.perf_counter()
        yield
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0

    collector = Collector(
        cfg,
        train,
        policy,
        engine,
        sampler,
        reward,
        stage,
        dist.rollouts(),
        render_root=out / "renders",
        episode_root=out / "episodes",
    )
    cond = threading.Condition()
    outbox: queue.Queue = queue.Queue()
    errors: list[BaseException] = []  # a thread's failure, raised by the main loop

    def guarded(fn):  # noqa: ANN001, ANN202
        def run() -> None:
            try:
                fn()
            except BaseException as e:
                errors.append(e)
            with cond:
                cond.notify_all()

        return run

    def receive() -> None:
        while receive_weights(engine, params, dist) is not None:
            with cond:
                cond.notify_all()

    def send() -> None:
        while (item := outbox.get()) is not None:
            dist.batch_broadcast(item)

    lead = dist.global_rank == dist.generators[0]  # the others' batches are the same, gathered: only it sends
    receiver = threading.Thread(target=guarded(receive), name="mmrl-weights", daemon=True)
    sender = threading.Thread(target=guarded(send), name="mmrl-batches", daemon=True)
    receiver.start()
    if lead:
        sender.start()

    def deliver(item: Any) -> None:
        if lead:
            outbox.put(item)

    k = cfg.rollout.max_staleness
    before: dict[int, dict[str, Any]] = {}  # the sampler's state before each batch drawn early

    def gate(
        t: int,
    ) -> bool:  # episodes across batches (rollout.episode.next_batch_at): may batch t start now?
        if errors or t > cfg.train.max_steps or engine.version < t - 1 - k:
            return False
        before[t] = copy.deepcopy(sampler.state_dict())
        return True

    collector.gate = gate if k > 0 else None
    try:
        for t in range(start + 1, cfg.train.max_steps + 1):
            t0 = time.perf_counter()
            with cond:  # batch t needs version t - 1 - k
                cond.wait_for(
                    lambda: errors or engine.version >= t - 1 - k or not receiver.is_alive()  # noqa: B023
                )
            if errors:
                raise errors[0]
            if engine.version < t - 1 - k:
                raise RuntimeError(f"the trainers stopped before step {t}'s batch")
            waited = time.perf_counter() - t0
            timings.clear()
            try:
                got = collector.collect(t).resolve()
            except Exception as e:  # the trainers raise it at their next take
                deliver((t, e))
                raise
            got.timings = dict(timings)
            # after this batch's draw and rewards: from before the next batch's draw when that came first
            got.sampler_after = before.pop(t + 1) if t + 1 in before else copy.deepcopy(sampler.state_dict())
            got.stats |= {"time/rollout_idle": waited}
            deliver((t, got))
            # an env's episode folders are made here: keep only those of the groups the trainer logs
            logged = got.trajectories[:ROLLOUTS_LOGGED]
            collector.retire_episodes(t, {tr.episode_id for row in logged for tr in row})
        deliver(None)
        if lead:
            sender.join()
        receiver.join()
        if errors:
            raise errors[0]
    finally:
        collector.close()
        if reward is not None:
            reward.close()
        if vllm:
            engine.close()
