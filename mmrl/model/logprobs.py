"""Log-probs of the sampled tokens and token entropies without ever holding the full ``[B, T, V]`` logits.

A policy-gradient step needs only ``log pi(y_t)`` of the one sampled token per position (and, for logging or MSSR's
full-vocabulary option, the entropy), yet the textbook path materialises ``logits [B, T, V]`` in fp32, then
``log_softmax`` (another copy), then ``exp`` and a product for the entropy, and keeps them all for the backward.
With Qwen's 151,936-token vocabulary and B=8, T=1024 that is about 5 GB per copy.

Here the language-model head runs on ``chunk`` rows of hidden states at a time: each chunk's fp32 logits give the
sampled token's log-prob (``logit[y] - logsumexp``) and the entropy (``logsumexp - sum p * logit``), and are freed
before the next chunk. With gradients on, the backward recomputes one chunk's logits at a time instead of storing
them: peak memory is O(chunk x V), independent of B x T. The values equal the full computation up to float
summation order (tested to 1e-5).

The backward is written out (:class:`_LinearLogp`) for a plain linear head, the common case, because autograd
through a checkpointed chunk does the chunk's work three times: the forward, then in the backward a re-run of the
whole chunk (scaling, mask, ``logsumexp``, gather, and the entropy's softmax that no gradient needs) and autograd's
backward of each of those ops. The written-out backward keeps each chunk's ``logsumexp`` and recomputes only the
logits, then forms ``(onehot(y) - softmax) * dL/dlogp / temperature`` in place for the two matmuls. Suppressed ids
are set by index (``n x |suppressed|`` writes, not a pass over ``n x V``) on every path.
``benchmarks/logprob_backward.py``: forward + backward 1.5x faster at the tiny GRPO update's shape, 1.3x at Qwen's
vocabulary, where the three matmuls dominate. Checkpointed autograd remains the path of a head that is not a
``torch.nn.Linear`` (LoRA-wrapped), of logit soft-capping and of an entropy bonus in the loss.

The head runs in fp32 whatever the compute dtype: inside each chunk autocast is off and the chunk's hidden states
and the head's weight are upcast (a no-op for fp32 master weights), so ``model.dtype: bfloat16`` changes the
backbone's arithmetic but never rounds a logit to bf16. A bf16 logit near 16-32 is off by up to 0.06 (half its
spacing, 0.125), and which way it rounds depends on the last bits of the hidden state, which in turn depend on the
micro-batch's padding: a token's log-prob then moved by that much between a micro-batch and another. The cost is
one fp32 copy of the head's weight while a chunk runs (none for fp32 weights) and an fp32 matmul; the peak stays
O(chunk x V + V x H), independent of B x T. :func:`fp32_head` gives engines that call the model's own forward
(HF ``generate``) the same fp32 head, so the rollout's log-probs are computed as the training forward's are.

Suppressed tokens (vision placeholders, see :mod:`mmrl.model.policy`) get logit -inf before the softmax, so the
distribution scored here is exactly the one the rollout engines sample from.
"""

from __future__ import annotations

import threading
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


_patched: dict[int, int] = {}  # id(head) -> how many fp32_head blocks are open on it
_patch_lock = threading.Lock()


@contextmanager
def fp32_head(head: torch.nn.Module) -> Iterator[None]:
    """Within: calling ``head`` returns :func:`head_logits` (fp32), for code that runs the model's own forward.

    Re-entrant and thread-safe: with asynchronous rollouts the producer's generation and the trainer's held-out
    validation run the same engine's model from two threads; the patch stays until the last block on the head ends."""
    if not isinstance(head, torch.nn.Linear):
        yield
        return
    with _patch_lock:
        if _patched.get(id(head), 0) == 0:
            head.forward = lambda hidden: head_logits(
                head, hidden
            )  # the instance attribute shadows Linear.forward
        _patched[id(head)] = _patched.get(id(head), 0) + 1
    try:
        yield
    finally:
        with _patch_lock:
            _patched[id(head)] -= 1
            if _patched[id(head)] == 0:
                del _patched[id(head)]
                del head.forward


def _scaled_masked(logits: torch.Tensor, temperature: float, drop: torch.Tensor | None) -> torch.Tensor:
    """``logits / temperature`` with the suppressed columns ``drop`` (indices) at -inf, in place."""
    if temperature != 1.0:
        logits.div_(temperature)
    if drop is not None:
        # touches n x |drop| entries, not n x V as a [V] mask would
        logits.index_fill_(-1, drop, float("-inf"))
    return logits


def _logp_entropy(logits: torch.Tensor, target: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, ...]:
    """The sampled tokens' log-probs, the entropies and the ``logsumexp`` of final logits (no gradient)."""
    lse = torch.logsumexp(logits, dim=-1)  # [n]
    logp = logits.gather(-1, target[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, logp.new_zeros(()).expand_as(logp), lse
    p = torch.softmax(logits, dim=-1)
    return logp, lse - (p * logits).nansum(-1), lse  # a suppressed token's 0 * -inf (nan) counts as 0


def _chunk_logp_entropy(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,  # [n, H]
    target: torch.Tensor,  # [n]
    temperature: float,
    drop: torch.Tensor | None,  # suppressed token ids or None
    with_entropy: bool,
    entropy_grad: bool = False,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """No-gradient scoring, and the autograd fallback (run under activation checkpointing by the caller)."""
    logits = head_logits(head, hidden)  # [n, V] fp32: the one chunk-sized buffer kept until the chunk ends
    if not torch.is_grad_enabled():
        # the model's final logit soft-capping (Gemma 2/4): c * tanh(logits / c), as its forward does
        if softcap:
            logits = logits.div_(softcap).tanh_().mul_(softcap)
        return _logp_entropy(_scaled_masked(logits, temperature, drop), target, with_entropy)[:2]
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    if drop is not None:
        logits = logits.index_fill(-1, drop, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # [n]
    logp = logits.gather(-1, target[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, logp.new_zeros(()).expand_as(logp)
    grad = entropy_grad
    with torch.set_grad_enabled(grad):
        p = torch.softmax(logits, dim=-1)
        if grad and drop is not None:  # the gradient of 0 * -inf is nan even where nansum drops the value
            ent = lse - (p * logits.index_fill(-1, drop, 0.0)).sum(-1)
        else:
            ent = lse - (p * logits).nansum(-1)  # [n]; a suppressed token's 0 * -inf (nan) counts as 0
    return logp, ent


class _LinearLogp(torch.autograd.Function):
    """One chunk's ``log softmax(hidden @ W.T (+ b) / temperature)[target]`` (suppressed ids at -inf) and its
    entropy, for a linear head, with a hand-written backward: the gradient of ``logp_i`` w.r.t. the logits is
    ``(onehot(y_i) - p_i) / temperature``, with ``p_i`` recomputed from the chunk's logits and its saved
    ``logsumexp``. The forward is the no-gradient path's, op for op (equal values); the entropy has no gradient.
    Logits are fp32 whatever the weight's dtype (as :func:`head_logits`); each input's gradient comes back in its
    own dtype."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, temperature, drop, with_entropy):  # type: ignore[override]
        logits = _scaled_masked(_linear_fp32(hidden, weight, bias), temperature, drop)
        logp, ent, lse = _logp_entropy(logits, target, with_entropy)
        ctx.save_for_backward(hidden, weight, bias, target, drop, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):  # type: ignore[override]
        hidden, weight, bias, target, drop, lse = ctx.saved_tensors
        scale = grad_logp.float() / ctx.temperature  # [n]: dL/dlogp, through the temperature
        g = _linear_fp32(hidden, weight, bias)  # the chunk's raw logits, recomputed
        g = torch.add(-lse[:, None], g, alpha=1.0 / ctx.temperature).exp_()  # p
        if drop is not None:
            g.index_fill_(-1, drop, 0.0)
        g.mul_(-scale[:, None]).scatter_add_(-1, target[:, None], scale[:, None])  # (onehot - p) * scale
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        # fp32 matmuls even where the backward is called under autocast
        with torch.autocast(device_type=g.device.type, enabled=False):
            grad_h = (g @ weight.float()).to(hidden.dtype) if need_h else None
            grad_w = (g.T @ hidden.float()).to(weight.dtype) if need_w else None
        grad_b = g.sum(0).to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None, None


def _linear_fp32(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        return F.linear(hidden.float(), weight.float(), None if bias is None else bias.float())


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
    fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(head(hidden) / temperature)[target]`` and the entropy, ``[B, T]`` each, chunk by chunk.

    Gradients flow through the log-probs when ``hidden`` requires grad, and through the entropy too when
    ``entropy_grad`` (an entropy bonus in the loss). ``softcap``: the model's final logit soft-capping
    (``final_logit_softcapping``: Gemma 2 and 4 apply ``c * tanh(logits / c)`` after the head), applied in fp32.
    ``suppress``: the token ids scored at -inf, as a ``[V]`` bool mask or as the ids (a long tensor).
    ``fused=False`` takes the checkpointed autograd path even where the written-out backward applies (its
    benchmark's peer).
    """
    B, T, H = hidden.shape
    flat_h, flat_t = hidden.reshape(B * T, H), target.reshape(B * T)
    grad = torch.is_grad_enabled() and hidden.requires_grad
    if suppress is None or suppress.dtype != torch.bool:
        drop = suppress  # the suppressed ids themselves (the policy keeps them on the device)
    else:
        drop = suppress.nonzero().flatten()  # a [V] mask: one host sync per call, not per chunk
    # the written-out backward for a plain linear head; autograd through a checkpointed chunk otherwise
    fused = (
        fused and isinstance(head, torch.nn.Linear) and not softcap and not (with_entropy and entropy_grad)
    )
    logps, ents = [], []
    for s in range(0, B * T, max(1, chunk)):
        h, t = flat_h[s : s + chunk], flat_t[s : s + chunk]
        if grad and fused:
            lp, ent = _LinearLogp.apply(h, head.weight, head.bias, t, temperature, drop, with_entropy)
        elif grad:
            args = (head, h, t, temperature, drop, with_entropy, entropy_grad, softcap)
            lp, ent = checkpoint(_chunk_logp_entropy, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logp_entropy(head, h, t, temperature, drop, with_entropy, entropy_grad, softcap)
        logps.append(lp)
        ents.append(ent if entropy_grad else ent.detach())
    logp = torch.cat(logps).view(B, T) if logps else hidden.new_zeros((B, T), dtype=torch.float32)
    entropy = (torch.cat(ents).view(B, T) if ents else torch.zeros_like(logp)) if with_entropy else None
    return logp, entropy
