"""Packed rows through Gated-DeltaNet layers (mmrl.model.linear_attention): the causal convolution and the gated delta rule
of a packed row equal each sequence computed alone (transformers' own functions on that sequence), across several of
the rule's 64-token chunks, gradients included; without the boundaries both would mix sequences."""

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5

from mmrl.model import linear_attention as la

# single tokens, shorter than the kernel, across one and two chunk boundaries
LENGTHS = [1, 3, 70, 5, 130, 64]
CONV = getattr(qwen3_5.causal_conv1d_fn, la._ORIGINAL, qwen3_5.causal_conv1d_fn)
RULE = getattr(qwen3_5.torch_chunk_gated_delta_rule, la._ORIGINAL, qwen3_5.torch_chunk_gated_delta_rule)


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _pieces(x: torch.Tensor, lengths: list[int], dim: int) -> list[torch.Tensor]:
    return list(torch.split(x, lengths, dim=dim))


def test_packed_convolution_equals_each_sequence_alone():
    torch.manual_seed(0)
    C, K = 12, 4
    x = torch.randn(1, C, sum(LENGTHS), requires_grad=True)
    w, b = torch.randn(C, K, requires_grad=True), torch.randn(C, requires_grad=True)
    packed = la.packed_causal_conv1d(x, w, b, "silu", _cu(LENGTHS))
    alone = torch.cat([CONV(p, w, b, activation="silu") for p in _pieces(x, LENGTHS, -1)], dim=-1)
    assert (packed - alone).abs().max().item() < 1e-6
    g = torch.randn_like(packed)
    grads = torch.autograd.grad((packed * g).sum(), (x, w, b))
    ref = torch.autograd.grad((alone * g).sum(), (x, w, b))
    for a, r in zip(grads, ref):
        assert torch.allclose(a, r, rtol=1e-5, atol=1e-5)
    # the convolution of the whole row reaches K - 1 tokens into the previous sequence
    leaked = CONV(x, w, b, activation="silu")
    assert (leaked - alone).abs().max().item() > 1e-2


def _rule_repeats_key_heads() -> bool:
    """Whether transformers' rule takes fewer query/key heads than value heads and repeats them itself (5.18 on);
    before, the layer repeats them before the call and the rule needs as many as the values."""
    try:
        RULE(
            *(torch.zeros(1, 2, 2, 4),) * 2,
            torch.zeros(1, 2, 4, 4),
            torch.zeros(1, 2, 4),
            torch.zeros(1, 2, 4),
        )
    except RuntimeError:
        return False
    return True


def _rule_inputs(n: int, heads_k: int = 2, heads_v: int = 4, dk: int = 8, dv: int = 6):
    """Inputs as the installed transformers' Gated-DeltaNet layer hands them to the rule."""
    torch.manual_seed(1)
    q, k = torch.randn(1, n, heads_k, dk), torch.randn(1, n, heads_k, dk)
    if not _rule_repeats_key_heads():
        q, k = (x.repeat_interleave(heads_v // heads_k, dim=2) for x in (q, k))
    v = torch.randn(1, n, heads_v, dv)
    g = -torch.rand(1, n, heads_v) * 0.5  # log decays <= 0
    beta = torch.rand(1, n, heads_v)
    return [t.requires_grad_() for t in (q, k, v, g, beta)]


def test_packed_delta_rule_equals_each_sequence_alone():
    n = sum(LENGTHS)
    q, k, v, g, beta = _rule_inputs(n)
    packed, state = la.packed_chunk_gated_delta_rule(
        RULE, q, k, v, g, beta, _cu(LENGTHS), use_qk_l2norm_in_kernel=True
    )
    assert state is None and packed.shape == (1, n, 4, 6)
    alone = torch.cat(
        [
            RULE(*xs[:3], g=xs[3], beta=xs[4], use_qk_l2norm_in_kernel=True)[0]
            for xs in zip(*(_pieces(t, LENGTHS, 1) for t in (q, k, v, g, beta)))
        ],
        dim=1,
    )
    assert (packed - alone).abs().max().item() < 1e-5
    out_g = torch.randn_like(packed)
    grads = torch.autograd.grad((packed * out_g).sum(), (q, k, v, g, beta))
    ref = torch.autograd.grad((alone * out_g).sum(), (q, k, v, g, beta))
    for a, r in zip(grads, ref):
        assert torch.allclose(a, r, rtol=1e-4, atol=1e-5)
    # one recurrence over the whole row carries each sequence's state into the next
    whole = RULE(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]
    assert (whole - alone).abs().max().item() > 1e-2
    # and transformers' torch path cannot keep them apart: it refuses the cumulative lengths (5.18 on) or, before,
    # ignores them and runs the one recurrence over the whole row
    try:
        ignored = RULE(q, k, v, g=g, beta=beta, cu_seqlens=_cu(LENGTHS), use_qk_l2norm_in_kernel=True)[0]
    except ValueError as e:
        assert "packed sequences" in str(e)
    else:
        assert torch.equal(ignored, whole)


def test_install_routes_only_packed_calls(tiny_family):
    from mmrl.config import ModelConfig
    from mmrl.model.policy import Policy

    policy = Policy.from_pretrained(ModelConfig(path=str(tiny_family("qwen3_5"))))
    assert la.layer_modules(policy.model) == {qwen3_5.__name__}
    assert la.packable(policy.model) == (True, "")
    la.install(policy.model)
    la.install(policy.model)  # idempotent: one wrapper, over transformers' own function
    assert getattr(qwen3_5.causal_conv1d_fn, la._ORIGINAL) is CONV
    assert getattr(qwen3_5.torch_chunk_gated_delta_rule, la._ORIGINAL) is RULE
    x, w = torch.randn(1, 5, 9), torch.randn(5, 4)
    assert torch.equal(
        qwen3_5.causal_conv1d_fn(x, w, None, activation="silu"), CONV(x, w, None, activation="silu")
    )
    q, k, v, g, beta = (t.detach() for t in _rule_inputs(9))
    assert torch.equal(
        qwen3_5.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta)[0], RULE(q, k, v, g=g, beta=beta)[0]
    )
    # a model without linear attention has nothing to install
    plain = Policy.from_pretrained(ModelConfig(path=str(tiny_family("qwen3_vl"))))
    assert la.layer_modules(plain.model) == set() and la.packable(plain.model) == (True, "")


def test_with_fla_the_packed_row_goes_to_its_varlen_kernel_whole(monkeypatch):
    """Where flash-linear-attention is installed (CUDA), the row is not unpacked: transformers' wrapper gets it as fla's
    varlen kernel takes it (batch 1, ``cu_seqlens`` on the row's device, no state), and its output is returned."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "fla" else real(n, *a))
    seen = {}

    def kernel(q, k, v, g, beta, **kwargs):
        seen.update(shapes=[t.shape for t in (q, k, v, g, beta)], **kwargs)
        return v * 2, None

    q, k, v, g, beta = (t.detach() for t in _rule_inputs(sum(LENGTHS)))
    cu = _cu(LENGTHS)
    out, state = la.packed_chunk_gated_delta_rule(kernel, q, k, v, g, beta, cu, use_qk_l2norm_in_kernel=True)
    assert torch.equal(out, v * 2) and state is None
    assert seen["cu_seqlens"] is cu and seen["use_qk_l2norm_in_kernel"] is True
    assert [s[:2] for s in seen["shapes"]] == [(1, sum(LENGTHS))] * 5
    with pytest.raises(ValueError, match="no recurrent state"):
        la.packed_chunk_gated_delta_rule(kernel, q, k, v, g, beta, cu, output_final_state=True)
