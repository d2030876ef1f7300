"""Multi-process training: the one place that knows about ranks.

Launch with ``torchrun --nproc_per_node N -m mmrl train ...`` (CPU: gloo; GPU: nccl) or
``accelerate launch [--config_file recipes/accelerate/ddp.yaml] -m mmrl train ...``; accelerate's ``PartialState``
(made here, once) reads the launcher's environment, sets each process's device and creates the process group with
``train.dist_timeout_s`` as its collective timeout (NCCL's default of 10 minutes is shorter than writing a 7B
checkpoint).

Which group a collective runs on. NCCL moves CUDA tensors only: an all-reduce of a host tensor on an NCCL group
raises "No backend type associated with device type cpu". So ``Dist`` looks at the device types the default group
serves; when it lacks the CPU (NCCL, unless accelerate made a ``cuda:nccl,cpu:gloo`` group) it adds a gloo group,
``host_group``, for everything that lives on the host: metric sums, pickled objects (rollouts, rewards, RNG states),
barriers. Tensor collectives pick the group by the tensor's device (:meth:`Dist.group_for`); parameters and gradients
on the GPU stay on NCCL. Every collective in mmrl goes through this class or through torch's DDP/FSDP2
(``tests/test_distributed.py`` checks both: a 2-process run on a group that, like NCCL, serves no CPU tensors, and a
scan of the source for stray ``torch.distributed`` collectives).

How a step is split, so that N ranks x B/N rows give exactly the update of 1 rank x B rows:
- the sampler's choice is global: every rank runs the same sampler with the same seed and sees the same gathered
  rewards, so all ranks pick the same prompts; rank r takes a contiguous share of whole groups;
- each rank generates and rewards its share; completions, rewards and reward results are gathered, so every rank
  holds the whole batch's outcomes (but encodes and scores only its own prompts). Advantage estimators run on the
  gathered batch, identically everywhere, so batch-level statistics (REINFORCE++ whitening, MSSR's z-score) and
  estimator state are those of a single process;
- the update's mini-batches are drawn from the global rows with a generator seeded by (seed, step); each rank
  back-propagates its own rows divided by the global mini-batch's aggregation units, so the gradients must be
  SUMMED over ranks. torch's ``DistributedDataParallel`` does it (:meth:`Dist.replicate`): bucketed all-reduces that
  overlap the backward of the last micro-batch, ``no_sync`` across the others, a communication hook that sums instead
  of averaging. The policy scores a batch (backbone + the chunked language-model head, which runs outside the HF
  model's ``forward``) inside the DDP module's ``forward``, so DDP's hooks see the whole graph. With ``train.fsdp``
  the policy is sharded instead and FSDP2's reduce-scatter does the sum (:mod:`mmrl.model.fsdp`);
- every rank starts from rank 0's weights: a checkpoint loads identically everywhere, and fresh LoRA adapters (drawn
  from each rank's own RNG stream) are broadcast from rank 0 before training or sharding;
- rank 0 writes logs, reports and the HF weights; every rank saves and restores its own RNG; evaluation is split
  over the ranks (each generates and scores its share, rank 0 aggregates).
"""

from __future__ import annotations

import atexit
import os
import sys
from datetime import timedelta
from typing import Any

import torch

DEFAULT_TIMEOUT_S = 3600.0


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _serves_cpu(group: Any) -> bool:
    """Whether a process group moves host tensors (gloo, or a mixed ``cuda:nccl,cpu:gloo`` group)."""
    types = getattr(group, "_device_types", None)
    if types is None:  # an older torch without the attribute: ask the backend name
        return "gloo" in str(torch.distributed.get_backend(group))
    return any(torch.device(t).type == "cpu" for t in types)


def _sum_hook(group, bucket):  # no annotations: DDP checks them against its own classes
    """DDP communication hook: all-reduce SUM of a gradient bucket (DDP's default divides by the world size, but
    each rank's loss is already divided by the global mini-batch's units)."""
    fut = torch.distributed.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class Dist:
    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = 0
        self.device: torch.device = torch.device("cpu")
        self.host_group: Any = None  # None: the default group serves host tensors itself
        # a launcher (torchrun, accelerate) exports these; it gets a process group even for one process, so that
        # `torchrun --nproc_per_node 1` runs every collective, DDP and FSDP2 on the real backend (the GPU check)
        self.active = self.world > 1 or all(k in os.environ for k in ("RANK", "MASTER_ADDR", "MASTER_PORT"))
        if self.active:
            from accelerate import PartialState

            backend = "nccl" if torch.cuda.is_available() else "gloo"
            timeout = timedelta(seconds=timeout_s)
            state = PartialState(backend=backend, timeout=timeout)  # a group made before is kept as it is
            self.rank, self.world, self.device = state.process_index, state.num_processes, state.device
            if not _serves_cpu(torch.distributed.distributed_c10d._get_default_group()):
                self.host_group = torch.distributed.new_group(backend="gloo", timeout=timeout)
            atexit.register(_destroy_process_group)  # for a process that ends without close()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def group_for(self, t: torch.Tensor) -> Any:
        """The group that moves tensors on ``t``'s device (None = the default group)."""
        return self.host_group if t.device.type == "cpu" else None

    def share(self, n: int) -> range:
        """This rank's contiguous share of ``n`` items (whole groups); ``n`` must divide evenly."""
        if n % self.world:
            raise ValueError(
                f"{n} prompts per step cannot be split evenly over {self.world} processes: make "
                "train.prompts_per_step a multiple of the number of processes"
            )
        k = n // self.world
        return range(self.rank * k, (self.rank + 1) * k)

    def balanced(self, blocks: list[list[int]], costs: list[float]) -> list[int]:
        """This rank's rows of a balanced split of ``blocks`` (rows that stay together: a group where a loss needs
        whole groups, else one row) by ``costs`` (tokens): every rank gets the same number of blocks (the first ranks
        one more where they do not divide evenly), and the costs are spread by longest-first greedy assignment to the
        rank with the least so far. Deterministic: every rank computes every rank's share alike."""
        return balanced_split(blocks, costs, self.world)[self.rank]

    def split(self, n: int) -> range:
        """This rank's contiguous part of ``n`` items that need not divide evenly (the first ranks take one more)."""
        k, extra = divmod(n, self.world)
        start = self.rank * k + min(self.rank, extra)
        return range(start, start + k + (self.rank < extra))

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (picklable objects; CPU tensors inside), over the host group."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj, group=self.host_group)
        return out

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Overwrite every rank's ``tensors`` with rank 0's, in place, one at a time (no flat copy of them all)."""
        if not self.active:
            return
        with torch.no_grad():
            for t in tensors:
                torch.distributed.broadcast(t.data, src=0, group=self.group_for(t))

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        if not self.active:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)  # on the host: over the host group
        torch.distributed.all_reduce(t, group=self.host_group)
        return dict(zip(keys, t.tolist()))

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier(group=self.host_group)

    def close(self) -> None:
        """After a run that ended normally on every rank: meet (no rank leaves while another still talks to it),
        then unregister the process groups. Their C++ objects live on while a model (DDP's reducer, FSDP's mesh)
        holds them; :meth:`exit` ends the process safely with them."""
        if self.active and torch.distributed.is_initialized():
            self.barrier()
            _destroy_process_group()

    def exit(self, code: int = 0) -> None:
        """The end of a launched process whose work is done: :meth:`close` (if not yet), the ``atexit`` handlers
        and a flush of the standard streams while Python is whole, then ``os._exit(code)``, without the
        interpreter's teardown. Returns at once without a launcher (no collective threads: the caller ends the
        process as usual).

        Why: gloo's worker threads let go of a finished collective's work (and of the tensors in it) a moment after
        the collective has returned, and a barrier's work even keeps the works that were still in progress when it
        was queued. Dropping the last reference to a tensor that Python has let go of needs the GIL (torch keeps
        the tensor's Python object alive while C++ holds the tensor). Once the interpreter has begun to finalize,
        CPython ends any other thread that asks for the GIL with ``pthread_exit``, whose forced unwinding meets
        that ``noexcept`` destructor: ``std::terminate``, "terminate called without an active exception", SIGABRT,
        after a run that had finished (core dump of a 2-process LoRA run: ``ProcessGroupGloo::runLoop`` ->
        ``~AsyncBarrierWork`` -> ``~AsyncAllgatherWork`` -> ``TensorImpl::decref_pyobject`` -> ``take_gil`` ->
        ``pthread_exit``). Neither the barrier nor ``destroy_process_group`` (the groups outlive it inside the
        model: DDP's reducer, FSDP's mesh) closes that window; not finalizing does."""
        if not self.active:
            return
        self.close()
        atexit._run_exitfuncs()  # what the interpreter would run at exit (logging's flush, multiprocessing's)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def replicate(self, module: torch.nn.Module) -> torch.nn.parallel.DistributedDataParallel:
        """``module`` under torch's DDP, summing gradients over the ranks. The weights are not broadcast (every rank
        loaded the same checkpoint; fresh LoRA adapters are broadcast by the trainer); parameters that a batch does
        not reach (the vision tower on a text-only micro-batch) are found each step."""
        from torch.nn.parallel import DistributedDataParallel

        cuda = self.device.type == "cuda"
        ddp = DistributedDataParallel(
            module,
            device_ids=[self.device.index] if cuda else None,
            broadcast_buffers=False,  # buffers (rotary frequencies) are computed, equal everywhere
            init_sync=False,
            find_unused_parameters=True,
            gradient_as_bucket_view=True,  # gradients live in the buckets: no second copy of them
        )
        ddp.register_comm_hook(None, _sum_hook)
        return ddp


def balanced_split(blocks: list[list[int]], costs: list[float], world: int) -> list[list[int]]:
    """:meth:`Dist.balanced` for every rank: ``world`` lists of rows, each in ascending order."""
    capacity = [len(blocks) // world + (r < len(blocks) % world) for r in range(world)]
    load, taken = [0.0] * world, [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for b in sorted(range(len(blocks)), key=lambda b: (-costs[b], b)):
        r = min((r for r in range(world) if taken[r] < capacity[r]), key=lambda r: (load[r], r))
        out[r] += blocks[b]
        load[r] += costs[b]
        taken[r] += 1
    return [sorted(rows) for rows in out]
