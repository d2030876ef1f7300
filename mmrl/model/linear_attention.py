"""Packed rows through linear-attention layers (Qwen3.5's and Qwen3.5-MoE's Gated-DeltaNet): each sequence of a
packed row (:func:`mmrl.model.packing.packed_hidden`) gets exactly the token mixing it gets alone, as
:mod:`mmrl.model.attention` does for the softmax-attention layers.

A Gated-DeltaNet layer mixes tokens in two places, and both run across a packed row's sequence boundaries unless
told where they are:

- a depthwise causal convolution (kernel 4) over the q/k/v projections: the first three tokens of a sequence would
  see the previous sequence's last three;
- the gated delta rule, a recurrence whose state must start at zero for each sequence.

transformers' layer hands the row's cumulative lengths (``cu_seq_lens_q``) to both functions, but only
flash-linear-attention's delta-rule kernel uses them: transformers' torch fallback refuses a packed row (and
so the family could not pack without ``fla``, which is CUDA/Triton only), and neither the torch convolution nor
the ``causal-conv1d`` package's (whose ``seq_idx`` the layer does not pass) stops at the boundaries, with or without
``fla``. Written here because no installed library does it on every device:

- :func:`packed_causal_conv1d`: the convolution as ``kernel`` shifted multiply-adds of the row, a shifted tap
  zeroed where it would reach before its sequence's first token; the same sums as the convolution of each sequence
  alone (left-padded with zeros, as in a padded batch), in another order;
- :func:`packed_chunk_gated_delta_rule`: with ``fla`` installed, its varlen kernel as transformers calls it; else
  transformers' own torch chunked rule over the sequences unpacked into a right-padded batch ``[B, L_max]`` (the
  recurrence is causal, so trailing zeros change nothing before them), the outputs gathered back into the row.
  Only this recurrence sees padding; the projections, MLPs and attention layers around it stay packed.

:func:`install` puts the two in place of the names the layer's module calls (once per modeling module: Qwen3.5 and
Qwen3.5-MoE each have their own copies); the replacements hand every call without cumulative lengths (padded
batches, generation, the vision tower) to transformers' originals unchanged. tests/test_packing.py holds both
families to the padded path's log-probs (1e-5) and gradients; tests/test_linear_attention.py checks the two
functions against each sequence computed alone, across several chunks.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import torch
import torch.nn.functional as F

from mmrl.model.attention import BOUNDS

# the functions a Gated-DeltaNet layer's forward calls by module-level name, and their packed replacements
_CONV, _RULE = "causal_conv1d_fn", "torch_chunk_gated_delta_rule"
_ORIGINAL = "_mmrl_original"


def layer_modules(model: torch.nn.Module) -> set[str]:
    """The modeling modules of the model's linear-attention layers (a module holding a depthwise ``conv1d`` and the
    decay ``A_log`` of a Gated-DeltaNet); empty for a model without."""
    return {
        type(m).__module__
        for m in model.modules()
        if hasattr(m, "A_log") and isinstance(getattr(m, "conv1d", None), torch.nn.Conv1d)
    }


def packable(model: torch.nn.Module) -> tuple[bool, str]:
    """Whether every linear-attention layer of the model calls the two functions :func:`install` replaces."""
    for name in sorted(layer_modules(model)):
        module = sys.modules.get(name)
        if module is None or not all(callable(getattr(module, f, None)) for f in (_CONV, _RULE)):
            return False, f"linear-attention layers of {name}: no {_CONV}/{_RULE} for mmrl to keep packed"
    return True, ""


def install(model: torch.nn.Module) -> None:
    """Replace ``causal_conv1d_fn`` and ``torch_chunk_gated_delta_rule`` in the modeling modules of the model's
    linear-attention layers by their packed-aware versions (idempotent; calls without cumulative lengths reach the
    originals)."""
    for name in layer_modules(model):
        module = sys.modules[name]
        conv, rule = getattr(module, _CONV), getattr(module, _RULE)
        if getattr(conv, _ORIGINAL, None) is None:
            setattr(module, _CONV, _conv_dispatch(conv))
        if getattr(rule, _ORIGINAL, None) is None:
            setattr(module, _RULE, _rule_dispatch(rule))


def _conv_dispatch(original: Any) -> Any:
    def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        cu = kwargs.get("cu_seq_lens_q")
        if cu is None:
            return original(hidden_states, weight, bias, activation=activation, **kwargs)
        return packed_causal_conv1d(hidden_states, weight, bias, activation, cu)

    setattr(causal_conv1d_fn, _ORIGINAL, original)
    return causal_conv1d_fn


def _rule_dispatch(original: Any) -> Any:
    def torch_chunk_gated_delta_rule(query, key, value, g, beta, **kwargs):
        cu = kwargs.pop("cu_seqlens", None)
        kwargs.pop(BOUNDS, None)  # mmrl_sdpa's: neither transformers' nor fla's functions take it
        if cu is None:
            return original(query, key, value, g=g, beta=beta, **kwargs)
        return packed_chunk_gated_delta_rule(original, query, key, value, g, beta, cu, **kwargs)

    setattr(torch_chunk_gated_delta_rule, _ORIGINAL, original)
    return torch_chunk_gated_delta_rule


def positions_in_sequence(cu: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's sequence and its position in it ``([N], [N])``, from cumulative lengths ``[B + 1]``."""
    cu = cu.long()
    lengths = cu[1:] - cu[:-1]
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), lengths, output_size=n)
    return seq, torch.arange(n, device=cu.device) - cu[:-1][seq]


def packed_causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    cu: torch.Tensor,
) -> torch.Tensor:
    """transformers' depthwise causal convolution (``x`` ``[1, C, N]``, ``weight`` ``[C, K]``) of a packed row,
    each sequence convolved alone: ``out[t] = sum_j weight[:, K-1-j] * x[t-j]`` over the taps ``j`` that stay
    inside ``t``'s sequence."""
    from transformers.activations import ACT2FN

    N, K = x.shape[-1], weight.shape[-1]
    _, pos = positions_in_sequence(cu.to(x.device), N)
    xs = x.to(weight.dtype)
    out = xs * weight[:, K - 1 : K]
    for j in range(1, K):  # tap j reads x[t - j]; zero where t - j is before the sequence's first token
        shifted = F.pad(xs, (j, 0))[..., :N].masked_fill(pos < j, 0.0)
        out = out + shifted * weight[:, K - 1 - j : K - j]
    if bias is not None:
        out = out + bias[:, None]
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(x.dtype)


def packed_chunk_gated_delta_rule(
    original: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu: torch.Tensor,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule of a packed row (``query`` ``[1, N, H, D]``, ``g``/``beta`` ``[1, N, H]``) with the
    state reset at each sequence: ``fla``'s varlen kernel where installed (transformers' ``original`` dispatches
    to it), else ``original``'s torch path over the right-padded batch of the sequences, as long as the longest:
    ``max_length_q``, the host int transformers' varlen keywords carry (without it, read back from ``cu``: a sync on
    a GPU). No final state: a packed row is a training forward, never a cache fill."""
    if kwargs.get("initial_state") is not None or kwargs.get("output_final_state"):
        raise ValueError("a packed row carries no recurrent state (training forwards only)")
    if importlib.util.find_spec("fla") is not None:
        return original(query, key, value, g=g, beta=beta, cu_seqlens=cu, **kwargs)
    N = query.shape[1]
    seq, pos = positions_in_sequence(cu.to(query.device), N)
    B, L = len(cu) - 1, kwargs.get("max_length_q") or int((cu[1:] - cu[:-1]).max())

    def unpack(x: torch.Tensor) -> torch.Tensor:  # [1, N, ...] -> [B, L, ...], zeros after each sequence
        return x.new_zeros((B, L, *x.shape[2:])).index_put((seq, pos), x[0])

    out, _ = original(*(unpack(t) for t in (query, key, value)), g=unpack(g), beta=unpack(beta), **kwargs)
    return out[seq, pos][None], None
