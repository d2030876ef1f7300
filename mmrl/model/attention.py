"""Attention for packed micro-batches: ``model.attn_implementation: auto``.

A packed row (:func:`mmrl.model.packing.packed_hidden`) holds several sequences end to end. transformers' ``sdpa``
runs it as one sequence under a block-diagonal ``[N, N]`` mask that it builds element by element: attention then costs
``N^2`` for ``N = sum L_i`` instead of ``sum L_i^2`` (8 sequences of 500 tokens: 16 M scores instead of 2 M), and
building the mask alone takes seconds on a CPU. Flash-attention's varlen kernels take the cumulative lengths instead
and compute each sequence alone; they need CUDA and the ``flash-attn`` package.

``mmrl_sdpa`` (registered with transformers' attention and mask interfaces, so it is an ``attn_implementation`` like
``sdpa``) is the same thing with torch's own kernel, written here because no installed library does it on every
device: in a packed forward (the policy sets :data:`PACKED` and passes ``cu_seq_lens_q``) each causal attention runs
``scaled_dot_product_attention`` per sequence with ``is_causal`` (sliding-window and chunked layers get their local
mask per sequence; media tokens that attend to each other both ways, Gemma 3 and 4's, get their blocks in that mask:
:func:`mmrl.model.packing._media_blocks`), and no ``[N, N]`` mask is ever built; everywhere else (padded batches,
generation with a cache, vision towers) it is transformers' ``sdpa`` exactly, mask function included. The sequence
boundaries come as host ints too (:data:`BOUNDS`, and which sequences hold media blocks), so that no layer reads a
value back from the device: on a GPU each read is a sync, per layer per micro-batch (tests/test_packed_syncs.py).

``auto`` resolves to ``flash_attention_2`` where flash-attn is installed and the model runs on CUDA (transformers
then reads the packed row's cumulative lengths itself), else ``mmrl_sdpa`` (:func:`resolve`).
"""

from __future__ import annotations

import importlib.util
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F

NAME = "mmrl_sdpa"
# set while the policy runs a packed forward: decoder masks are not built (each sequence is attended alone)
PACKED: ContextVar[bool] = ContextVar("mmrl_packed", default=False)
# keyword of a packed forward: its cumulative lengths as host ints, next to transformers' ``cu_seq_lens_q`` (a device
# tensor, as flash-attention's kernels take it), so that no layer reads them back from the device
BOUNDS = "mmrl_cu_seqlens"


def resolve(name: str | None, device: torch.device, media_blocks: bool = False) -> str | None:
    """The ``attn_implementation`` to load the model with: ``auto`` -> flash-attention 2 on CUDA where installed,
    else :data:`NAME`; any other value as given (None: transformers' default). A model whose media tokens attend
    to each other both ways (``media_blocks``, :func:`mmrl.model.encoders.media_blocks`: Gemma 3 and 4) gets :data:`NAME`
    either way: flash-attention's kernels are causal only, so they would drop those blocks (and refuse packing)."""
    if name != "auto":
        return name
    if device.type == "cuda" and not media_blocks and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    register()
    return NAME


def is_varlen(name: str | None) -> bool:
    """Whether this implementation computes each sequence of a packed row alone (no ``[N, N]`` attention)."""
    return name == NAME or (name or "").startswith("flash_attention")


def _mask(*args: Any, **kwargs: Any) -> Any:
    from transformers.masking_utils import sdpa_mask

    if PACKED.get() and kwargs.get("attention_mask") is None:
        return None
    return sdpa_mask(*args, **kwargs)


def _local_mask(
    length: int, layer_type: str | None, config: Any, device: torch.device
) -> torch.Tensor | None:
    """A sequence's own mask for a windowed layer (None: plain causal attention is exact)."""
    if layer_type == "sliding_attention":
        window = getattr(config, "sliding_window", None)
        if window and length > window:
            i = torch.arange(length, device=device)
            return (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
    if layer_type == "chunked_attention":
        chunk = getattr(config, "attention_chunk_size", None)
        if chunk and length > chunk:
            i = torch.arange(length, device=device)
            return (i[None, :] <= i[:, None]) & (i[:, None] // chunk == i[None, :] // chunk)
    return None


def _with_media_blocks(ids: torch.Tensor, layer_type: str | None, config: Any) -> torch.Tensor:
    """A sequence's mask with its media tokens attending both ways within their own block (``ids``: a block id per
    token, -1 for text; the caller knows on the host that the sequence holds one), as transformers'
    ``blockwise_overlay``: ``causal | same block``, and for a sliding layer ``window & (causal | same block)``, the
    window one-sided (``kv > q - window``)."""
    i = torch.arange(len(ids), device=ids.device)
    mask = (i[None, :] <= i[:, None]) | ((ids[:, None] == ids[None, :]) & (ids[:, None] >= 0))
    window = getattr(config, "sliding_window", None) if layer_type == "sliding_attention" else None
    if window:
        mask &= i[None, :] > i[:, None] - window
    return mask


def _bounds(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    kwargs: dict[str, Any],
) -> tuple[int, ...] | None:
    """The packed row's sequence boundaries (cumulative lengths, host ints) where this call attends one causally,
    else None. Read from :data:`BOUNDS`, which the packed forward hands every layer; a caller that hands transformers'
    keywords alone (``cu_seq_lens_q``, a device tensor) costs one device->host read here, per layer."""
    cu = kwargs.get("cu_seq_lens_q")
    # not gated on PACKED: gradient checkpointing recomputes a layer in the backward, after the forward has reset it
    if (
        cu is None
        or attention_mask is not None
        or not getattr(module, "is_causal", True)
        or query.shape[0] != 1
    ):
        return None
    bounds = kwargs.get(BOUNDS)
    if bounds is None:
        bounds = tuple(cu.tolist())
    return bounds if bounds[-1] == query.shape[2] == key.shape[2] else None


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, L, D]
    key: torch.Tensor,  # [B, H_kv, L, D]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    bounds = _bounds(module, query, key, attention_mask, kwargs)
    if bounds is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    config = getattr(module, "config", None)
    types = getattr(config, "layer_types", None)
    layer_type = types[module.layer_idx] if types is not None and hasattr(module, "layer_idx") else None
    blocks, block_layers, with_media = kwargs.get("mmrl_media_blocks") or (None, (), ())
    blocked = blocks is not None and (layer_type or "full_attention") in block_layers
    outs = []
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        local = _local_mask(e - s, layer_type, config, query.device)
        if blocked and with_media[n]:
            local = _with_media_blocks(blocks[s:e], layer_type, config)
        outs.append(
            F.scaled_dot_product_attention(
                query[:, :, s:e],
                key[:, :, s:e],
                value[:, :, s:e],
                attn_mask=local,
                dropout_p=dropout,
                scale=scaling,
                is_causal=local is None,
            )
        )
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


_registered = False


def register() -> None:
    """Make :data:`NAME` an ``attn_implementation`` (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, _mask)
    _registered = True
