"""Multi-process training: the one place that knows about ranks.

Launch with ``torchrun --nproc_per_node N -m mmrl train ...`` (CPU: gloo; GPU: nccl) or
``accelerate launch [--config_file recipes/accelerate/ddp.yaml] -m mmrl train ...``; accelerate's ``PartialState``
(made here, once) reads the launcher's environment and sets each process's device.

How a step is split, so that N ranks x B/N rows give exactly the update of 1 rank x B rows:
- the sampler's choice is global: every rank runs the same sampler with the same seed and sees the same gathered
  rewards, so all ranks pick the same prompts; rank r takes a contiguous share of whole groups;
- each rank generates and rewards its share; completions, rewards and reward results are gathered, so every rank
  holds the whole batch's outcomes (but encodes and scores only its own prompts). Advantage estimators run on the
  gathered batch, identically everywhere, so batch-level statistics (REINFORCE++ whitening, MSSR's z-score) and
  estimator state are those of a single process;
- the update's mini-batches are drawn from the global rows with a generator seeded by (seed, step); each rank
  back-propagates its own rows divided by the global mini-batch's aggregation units, and gradients are then summed
  across ranks (no DDP wrapper: the policy runs the language-model head chunk by chunk outside the model's
  ``forward``, which a DDP wrapper's hooks would not see); with ``train.fsdp`` the policy is sharded instead and
  FSDP2's reduce-scatter does the sum (:mod:`mmrl.fsdp`);
- every rank starts from rank 0's weights: a checkpoint loads identically everywhere, and fresh LoRA adapters (drawn
  from each rank's own RNG stream) are broadcast from rank 0 before training or sharding;
- rank 0 alone writes logs, reports and checkpoints (full HF weights); every rank saves and restores its own RNG.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

import torch


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class Dist:
    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = 0
        self.device: torch.device | None = None
        if self.world > 1:
            from accelerate import PartialState

            backend = "nccl" if torch.cuda.is_available() else "gloo"
            state = PartialState(backend=backend)
            self.rank, self.world, self.device = state.process_index, state.num_processes, state.device
            # a process group left to interpreter teardown can abort the process at exit ("terminate called
            # without an active exception": gloo's threads still hold tensors); destroy it while Python is alive
            atexit.register(_destroy_process_group)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, n: int) -> range:
        """This rank's contiguous share of ``n`` items (whole groups); ``n`` must divide evenly."""
        if n % self.world:
            raise ValueError(
                f"{n} prompts per step cannot be split evenly over {self.world} processes: make "
                "train.prompts_per_step a multiple of the number of processes"
            )
        k = n // self.world
        return range(self.rank * k, (self.rank + 1) * k)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (picklable objects; CPU tensors inside)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum gradients over ranks (each rank's loss is already divided by the global denominator)."""
        if self.world == 1:
            return
        for p in params:  # a process whose rows missed this mini-batch still joins the sum, with zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Overwrite every rank's ``tensors`` with rank 0's, in place, one at a time (no flat copy of them all)."""
        if self.world == 1:
            return
        with torch.no_grad():
            for t in tensors:
                torch.distributed.broadcast(t.data, src=0)

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        if self.world == 1:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return dict(zip(keys, t.tolist()))

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()
