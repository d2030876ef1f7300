"""FSDP2 sharding of the policy (``train.fsdp``): torch's ``fully_shard`` on every decoder and vision block
(the model's ``_no_split_modules``) and on the root, so parameters, gradients and AdamW state are split over the
processes and a block's full weights exist only while it runs.

How it fits mmrl's data parallelism (:mod:`mmrl.distributed`):

- The policy runs the language-model head chunk by chunk outside the model's ``forward`` (:mod:`mmrl.model.logprobs`),
  so the root's hooks must cover more than ``forward``: the whole scoring function runs inside ``mmrl_run``, a
  method registered with ``register_fsdp_forward_method``; the root's parameters (embeddings, tied head, norms,
  vision merger) are gathered for it and its backward.
- Each rank's loss is already divided by the global mini-batch's units, so gradients must be SUMMED over ranks;
  FSDP's reduce-scatter averages, so a sharded rank back-propagates its loss times the world size
  (:class:`mmrl.train.update.PolicyUpdate`; a divide factor of 1 would say the same, but gloo lacks the PREMUL_SUM it
  needs); no DDP wrapper is made.
- Every forward of a sharded model is a collective, so every rank must run the same number of them: the update
  pads a rank with fewer micro-batches with zero-weight ones (:class:`mmrl.train.update.PolicyUpdate`), and a packed
  micro-batch runs the vision tower once per modality however many distinct prompts it holds, their rows sharing
  their prompt's encoding (:func:`mmrl.model.packing.encode_media_once`), as the padded path runs it once; a rank whose
  micro-batch holds fewer modalities (text only, where another's has images) encodes a blank image to match
  (:func:`matched_tower_calls`).
- Generation (the HF engine, evaluation) runs inside :func:`full_weights`: all ranks gather every block once and
  keep it (no resharding after each forward), so ranks may generate different numbers of tokens, and rank 0 may
  evaluate alone, without per-token collectives; the blocks are resharded on exit.
- Checkpoints hold full HF weights (loadable by transformers and vLLM), gathered to rank 0 shard by shard onto its
  CPU, and the optimizer state saved sharded with torch's distributed checkpoint (every rank writes its own shard;
  :mod:`mmrl.run.checkpoint`); on resume every rank loads the full weights before sharding and reads only its slice of
  the optimizer state.

With ``model.dtype: bfloat16`` the blocks are gathered in bf16 and gradients reduced in fp32
(``MixedPrecisionPolicy``); the sharded fp32 trainable parameters stay the master weights.

With LoRA (``model.lora``), peft injects the adapters before sharding, so each block's FSDP unit holds its frozen
base weights and its trainable adapters together (FSDP2 shards both and reduces gradients only for the adapters,
which alone are in the optimizer). A checkpoint then holds the adapter (``adapter/``, peft format) and, with
``lora.save_merged``, the merged HF model, both made on rank 0 from the gathered full state
(:meth:`mmrl.model.policy.Policy.save`).

With the vLLM engine (``rollout.engine: vllm``), every rank's engine holds the full weights (or its tensor-parallel
slice of them), so its generation needs nothing from the shards (the trainer's :func:`full_weights` around rollouts
and evaluation still gathers them, for nothing, with this engine). The weight sync after each update streams them:
:func:`stream_full_tensors` all-gathers one tensor at a time onto every rank, cast shard-wise to the engine's dtype
before the gather (so a bf16 engine moves and holds bf16), and hands it to vLLM's in-place reload, which keeps it
only until its layer is complete. No rank ever holds a full state dict, fp32 or otherwise; LoRA layers are merged
one at a time on the way (:meth:`mmrl.model.policy.Policy.stream_weights`).
"""

from __future__ import annotations

import os
import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

RUN_METHOD = "mmrl_run"

# the blank image each policy encodes once for matched tower calls, kept while the policy lives
_PROBES: weakref.WeakKeyDictionary[Any, tuple[Any, dict[str, torch.Tensor]]] = weakref.WeakKeyDictionary()


def wanted(setting: bool | None, launched: bool) -> bool:
    """Whether to shard: ``train.fsdp`` when set, else what the launcher asked (accelerate's FSDP configs export
    ``ACCELERATE_USE_FSDP=true``); never without a process group (a plain ``mmrl train``)."""
    if setting is None:
        setting = os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes")
    return bool(setting) and launched


def _run(self: torch.nn.Module, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def shard_model(
    model: torch.nn.Module, compute_dtype: torch.dtype, mesh: Any = None
) -> list[torch.nn.Module]:
    """``fully_shard`` each block named in ``model._no_split_modules``, then the root, over ``mesh`` (None: every
    process; a separate placement's training processes: :meth:`mmrl.distributed.Dist.mesh`); returns the sharded
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
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
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


def stream_full_tensors(
    model: torch.nn.Module, dtype_of: Callable[[str], torch.dtype | None]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's state (``state_dict`` names and order) one full tensor at a time, on every rank: a sharded tensor
    is all-gathered just before it is yielded, in ``dtype_of(name)`` when that is not None (the cast runs on the
    local shard, before the gather). A collective per sharded tensor: every rank must consume the whole iterator, in
    the same order."""
    from torch.distributed.tensor import DTensor

    for name, t in model.state_dict().items():
        t, dtype = t.detach(), dtype_of(name)
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        yield name, t.full_tensor() if isinstance(t, DTensor) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole on every rank: a sharded (DTensor) parameter gathered (a collective of its mesh), else itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def save_sharded_optimizer(
    model: torch.nn.Module, opt: torch.optim.Optimizer, folder: Path, group: Any = None
) -> None:
    """The optimizer state, each rank writing its own shard with torch's distributed checkpoint (a collective of
    ``group``: the training processes, None = every process)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=str(folder), process_group=group)


def load_sharded_optimizer(
    model: torch.nn.Module, opt: torch.optim.Optimizer, folder: Path, group: Any = None
) -> None:
    """Read back :func:`save_sharded_optimizer`'s state, each rank only its shard (resharded by DCP if the number
    of processes changed); a collective of ``group``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = {"optim": get_optimizer_state_dict(model, opt)}
    dcp.load(state, checkpoint_id=str(folder), process_group=group)
    set_optimizer_state_dict(model, opt, state["optim"])


# the pixel inputs a multimodal forward runs the vision tower on, one call each (the backbones' own forwards)
TOWER_INPUTS = ("pixel_values", "pixel_values_videos")


@contextmanager
def matched_tower_calls(policy: Any, inputs: dict[str, Any]) -> Iterator[None]:
    """Around one sharded scoring forward and the encoding of its media ``inputs`` (entered before either:
    :meth:`mmrl.model.policy.Policy.matched_tower_calls`): every rank runs the vision tower
    as many times as the rank that runs it most, so that its blocks' collectives (an all-gather per block forward; in
    the backward an all-gather and a reduce-scatter) pair up. A micro-batch runs the tower once per modality it holds
    (:data:`TOWER_INPUTS` given to the forward, or features already encoded: ``mm_encoder_outputs``), so a rank whose
    micro-batch is text only, or holds images where another's holds images and videos, would skip collectives the
    others wait in. Such a rank encodes a blank image (:func:`media_probe`) the missing number of times before its
    forward, and adds 0 x those features to its input embeddings, so their backward runs too, after the decoder's, as
    a real image's does. Adds nothing to the values or gradients. One object gather over the host group per forward."""
    encoded = inputs.get("mm_encoder_outputs") or {}
    local = len(encoded) + sum(inputs.get(k) is not None for k in TOWER_INPUTS)
    missing = max(policy.dist.gather(local)) - local
    if missing <= 0:
        yield
        return
    fn, probe = media_probe(policy)
    with policy.autocast():
        outs = [fn(**probe) for _ in range(missing)]
    zero = sum(0.0 * t.float().sum() for o in outs for t in _float_tensors(o))
    embed = policy.model.get_input_embeddings()
    handle = embed.register_forward_hook(lambda _m, _args, out: out + zero.to(out.dtype))
    try:
        yield
    finally:
        handle.remove()


def media_probe(policy: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The backbone's image feature function and its inputs for a blank 64 px image encoded as any prompt's
    (:meth:`mmrl.model.policy.Policy.encode`), made once per policy."""
    import base64
    import inspect
    import io

    from PIL import Image

    from mmrl.model.encoders import encoder_calls
    from mmrl.types import Sample

    cached = _PROBES.get(policy)
    if cached is not None:
        return cached
    if "image" in (calls := encoder_calls(policy.model)):
        pixels, fn, takes = calls["image"]
    else:
        fn = (getattr(policy.model, "model", None) or policy.model).get_image_features
        pixels, takes = "pixel_values", set(inspect.signature(fn).parameters)
    png = io.BytesIO()
    Image.new("RGB", (64, 64), (128, 128, 128)).save(png, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    ask = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "."}]}]
    mm = policy.encode(Sample("mmrl-fsdp-probe", ask, images=[uri])).mm
    probe = {k: v.to(policy.device) for k, v in mm.items() if k in takes}
    probe[pixels] = probe[pixels].to(policy.model.dtype)
    _PROBES[policy] = (fn, probe)
    return _PROBES[policy]


def _float_tensors(value: Any) -> Iterator[torch.Tensor]:
    """The floating-point tensors in an encoder output (a ModelOutput, tuples and lists of them)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _float_tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _float_tensors(v)
