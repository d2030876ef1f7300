"""FSDP2 sharding of the policy (``train.fsdp``): torch's ``fully_shard`` on every decoder and vision block
(the model's ``_no_split_modules``) and on the root, so parameters, gradients and AdamW state are split over the
processes and a block's full weights exist only while it runs.

How it fits mmrl's data parallelism (:mod:`mmrl.distributed`):

- The policy runs the language-model head chunk by chunk outside the model's ``forward`` (:mod:`mmrl.logprobs`),
  so the root's hooks must cover more than ``forward``: the whole scoring function runs inside ``mmrl_run``, a
  method registered with ``register_fsdp_forward_method``; the root's parameters (embeddings, tied head, norms,
  vision merger) are gathered for it and its backward.
- Each rank's loss is already divided by the global mini-batch's units, so gradients must be SUMMED over ranks;
  FSDP's reduce-scatter averages, so a sharded rank back-propagates its loss times the world size
  (:class:`mmrl.update.PolicyUpdate`; a divide factor of 1 would say the same, but gloo lacks the PREMUL_SUM it
  needs), and
  :meth:`Dist.sum_grads` is skipped.
- Every forward of a sharded model is a collective, so every rank must run the same number of them: the update
  pads a rank with fewer micro-batches with zero-weight ones (:class:`mmrl.update.PolicyUpdate`).
- Generation (the HF engine, evaluation) runs inside :func:`full_weights`: all ranks gather every block once and
  keep it (no resharding after each forward), so ranks may generate different numbers of tokens, and rank 0 may
  evaluate alone, without per-token collectives; the blocks are resharded on exit.
- Checkpoints hold full HF weights (loadable by transformers and vLLM) and the full optimizer state keyed by
  parameter name, both gathered to rank 0 (``torch.distributed.checkpoint.state_dict``); on resume every rank loads
  the full weights before sharding and its slice of the optimizer state.

With ``model.dtype: bfloat16`` the blocks are gathered in bf16 and gradients reduced in fp32
(``MixedPrecisionPolicy``); the sharded fp32 parameters stay the master weights.

With LoRA (``model.lora``), peft injects the adapters before sharding, so each block's FSDP unit holds its frozen
base weights and its trainable adapters together (FSDP2 shards both and reduces gradients only for the adapters,
which alone are in the optimizer). A checkpoint then holds the adapter (``adapter/``, peft format) and, with
``lora.save_merged``, the merged HF model, both made on rank 0 from the gathered full state
(:meth:`mmrl.policy.Policy.save`). Not combined yet: the vLLM engine (its weight sync would need the gathered full
state on every rank), refused by the pre-flight checks.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

RUN_METHOD = "mmrl_run"


def wanted(setting: bool | None, world: int) -> bool:
    """Whether to shard: ``train.fsdp`` when set, else what the launcher asked (accelerate's FSDP configs export
    ``ACCELERATE_USE_FSDP=true``); never for one process."""
    if setting is None:
        setting = os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes")
    return bool(setting) and world > 1


def _run(self: torch.nn.Module, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def shard_model(model: torch.nn.Module, compute_dtype: torch.dtype) -> list[torch.nn.Module]:
    """``fully_shard`` each block named in ``model._no_split_modules``, then the root; returns the sharded
    modules (root last)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(
            f"{type(model).__name__} declares no _no_split_modules: FSDP does not know its blocks"
        )
    mp = (
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        if compute_dtype != torch.float32
        else MixedPrecisionPolicy()
    )
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    for block in blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.mmrl_run = types.MethodType(_run, model)
    register_fsdp_forward_method(model, RUN_METHOD)
    # FSDP makes the first module whose forward runs the root. HF's generate runs the vision tower's blocks before
    # the model's own forward, so the root is set up now (torch has no public call for it; the root's first
    # pre-forward runs the same method)
    model._get_fsdp_state()._lazy_init()
    return [*blocks, model]


@contextmanager
def full_weights(sharded: list[torch.nn.Module]) -> Iterator[None]:
    """Every sharded module's full weights on every rank for the duration (a collective on entry): forwards inside
    need no communication. Resharded on exit."""
    for m in reversed(sharded):  # the root first: its lazy initialisation sets up every block's state
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in sharded:  # blocks reshard after each forward again; the root keeps its default (it does not)
            m.set_reshard_after_forward(m is not sharded[-1], recurse=False)
            m.reshard()


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full weights on rank 0's CPU (empty elsewhere); a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state keyed by parameter name, full, on rank 0's CPU (empty elsewhere); a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(
        model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def load_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full, name-keyed optimizer state (every rank passes the whole of it; each keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, opt, state, options=StateDictOptions(full_state_dict=True))
