"""Log-probs of the sampled tokens and token entropies without ever holding the full ``[B, T, V]`` logits.

A policy-gradient step needs only ``log pi(y_t)`` of the one sampled token per position (and, for logging or MSSR's
full-vocabulary option, the entropy), yet the textbook path materialises ``logits [B, T, V]`` in fp32, then
``log_softmax`` (another copy), then ``exp`` and a product for the entropy, and keeps them all for the backward.
With Qwen's 151,936-token vocabulary and B=8, T=1024 that is about 5 GB per copy.

Here the language-model head runs on ``chunk`` rows of hidden states at a time: each chunk's fp32 logits give the
sampled token's log-prob (``logit[y] - logsumexp``) and the entropy (``logsumexp - sum p * logit``), and are freed
before the next chunk. With gradients on, each chunk is wrapped in non-reentrant activation checkpointing, so the
backward recomputes one chunk's logits at a time instead of storing them: peak memory is O(chunk x V), independent
of B x T. The values equal the full computation up to float summation order (tested to 1e-5).
``benchmarks/logprob_memory.py`` measures the peak against the naive path.

The head runs in fp32 whatever the compute dtype: inside each chunk autocast is off and the chunk's hidden states
and the head's weight are upcast (a no-op for fp32 master weights), so ``model.dtype: bfloat16`` changes the
backbone's arithmetic but never rounds a logit to bf16. A bf16 logit near 16-32 is off by up to 0.06 (half its
spacing, 0.125), and which way it rounds depends on the last bits of the hidden state, which in turn depend on the
micro-batch's padding: a token's log-prob then moved by that much between a micro-batch and another. The cost is
one fp32 copy of the head's weight while a chunk runs (none for fp32 weights) and an fp32 matmul; the peak stays
O(chunk x V + V x H), independent of B x T. :func:`fp32_head` gives engines that call the model's own forward
(HF ``generate``) the same fp32 head, so the rollout's log-probs are computed as the training forward's are.

Suppressed tokens (vision placeholders, see :mod:`mmrl.policy`) get logit -inf before the softmax, so the
distribution scored here is exactly the one the rollout engines sample from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def head_logits(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits ``[..., V]`` of ``hidden [..., H]``: autocast off, ``hidden`` and a linear head's weight (and
    bias) upcast to fp32. Any other head (a LoRA-wrapped one) runs in its own weights' dtype, output upcast."""
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        if isinstance(head, torch.nn.Linear):  # FSDP2's FSDPLinear too (its weight is gathered while scoring)
            bias = None if head.bias is None else head.bias.float()
            return F.linear(hidden.float(), head.weight.float(), bias)
        dtype = next(head.parameters()).dtype  # type: ignore[attr-defined]
        return head(hidden.to(dtype)).float()


@contextmanager
def fp32_head(head: torch.nn.Module) -> Iterator[None]:
    """Within: calling ``head`` returns :func:`head_logits` (fp32), for code that runs the model's own forward."""
    if not isinstance(head, torch.nn.Linear):
        yield
        return
    head.forward = lambda hidden: head_logits(head, hidden)  # the instance attribute shadows Linear.forward
    try:
        yield
    finally:
        del head.forward


def _chunk_logp_entropy(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,  # [n, H]
    target: torch.Tensor,  # [n]
    temperature: float,
    suppress: torch.Tensor | None,  # [V] bool or None
    with_entropy: bool,
    entropy_grad: bool = False,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head_logits(head, hidden)  # [n, V] fp32: the one chunk-sized buffer kept until the chunk ends
    if softcap:  # the model's final logit soft-capping (Gemma 2/4): c * tanh(logits / c), as its forward does
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    if suppress is not None:
        logits = logits.masked_fill(suppress, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # [n]
    logp = logits.gather(-1, target[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, logp.new_zeros(()).expand_as(logp)
    grad = entropy_grad and torch.is_grad_enabled()
    with torch.set_grad_enabled(grad):
        p = torch.softmax(logits, dim=-1)
        if grad and suppress is not None:  # the gradient of 0 * -inf is nan even where nansum drops the value
            ent = lse - (p * logits.masked_fill(suppress, 0.0)).sum(-1)
        else:
            ent = lse - (p * logits).nansum(-1)  # [n]; a suppressed token's 0 * -inf (nan) counts as 0
    return logp, ent


def selective_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,  # [B, T, H]
    target: torch.Tensor,  # [B, T]
    *,
    temperature: float = 1.0,
    suppress: torch.Tensor | None = None,
    with_entropy: bool = True,
    entropy_grad: bool = False,
    chunk: int = 1024,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(head(hidden) / temperature)[target]`` and the entropy, ``[B, T]`` each, chunk by chunk.

    Gradients flow through the log-probs when ``hidden`` requires grad, and through the entropy too when
    ``entropy_grad`` (an entropy bonus in the loss). ``softcap``: the model's final logit soft-capping
    (``final_logit_softcapping``: Gemma 2 and 4 apply ``c * tanh(logits / c)`` after the head), applied in fp32.
    """
    B, T, H = hidden.shape
    flat_h, flat_t = hidden.reshape(B * T, H), target.reshape(B * T)
    grad = torch.is_grad_enabled() and hidden.requires_grad
    logps, ents = [], []
    for s in range(0, B * T, max(1, chunk)):
        args = (
            head,
            flat_h[s : s + chunk],
            flat_t[s : s + chunk],
            temperature,
            suppress,
            with_entropy,
            entropy_grad,
            softcap,
        )
        if grad:
            lp, ent = checkpoint(_chunk_logp_entropy, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logp_entropy(*args)
        logps.append(lp)
        ents.append(ent if entropy_grad else ent.detach())
    logp = torch.cat(logps).view(B, T) if logps else hidden.new_zeros((B, T), dtype=torch.float32)
    entropy = (torch.cat(ents).view(B, T) if ents else torch.zeros_like(logp)) if with_entropy else None
    return logp, entropy
