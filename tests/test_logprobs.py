"""The chunked head's log-probs and their gradients (mmrl/model/logprobs.py): the written-out backward of a linear head
against autograd through the full ``[n, V]`` log-softmax, and the paths that keep autograd (soft-capping, an entropy
bonus, a wrapped head) against the same reference."""

from __future__ import annotations

import pytest
import torch

from mmrl.model.logprobs import _LinearLogp, selective_logprobs


class Wrapped(torch.nn.Module):
    """A head that is not a ``torch.nn.Linear`` (as a LoRA-wrapped one): scored through autograd."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        self.lin = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def _reference(head, hidden, target, temperature, suppress, softcap=None):
    logits = head(hidden).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    full = torch.log_softmax((logits / temperature).masked_fill(suppress, float("-inf")), -1)
    p = full.exp()
    return full.gather(-1, target[..., None]).squeeze(-1), -(p * full.masked_fill(p == 0, 0)).sum(-1)


def _case(dtype=torch.float32, bias=False, seed=0):
    torch.manual_seed(seed)
    head = torch.nn.Linear(24, 300, bias=bias).to(dtype)
    hidden = torch.randn(2, 19, 24).to(dtype).requires_grad_()
    suppress = torch.zeros(300, dtype=torch.bool)
    suppress[[0, 7, 150, 299]] = True
    target = torch.randint(1, 299, (2, 19))
    target[target == 7] = 8
    target[target == 150] = 151
    weight = torch.randn(2, 19)  # a loss that is not a plain sum: per-token weights
    return head, hidden, target, suppress, weight


def _grads(head, hidden, logp, weight):
    (logp * weight).sum().backward()
    grads = [hidden.grad.clone(), head.weight.grad.clone()] + (
        [head.bias.grad.clone()] if head.bias is not None else []
    )
    hidden.grad = None
    for p in head.parameters():
        p.grad = None
    return grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_linear_head_backward_equals_autograd_of_the_full_log_softmax(temperature, bias, with_entropy):
    head, hidden, target, suppress, weight = _case(bias=bias)
    calls = []
    apply = _LinearLogp.apply
    _LinearLogp.apply = lambda *a: calls.append(1) or apply(*a)  # type: ignore[method-assign]
    try:
        lp, ent = selective_logprobs(
            head,
            hidden,
            target,
            temperature=temperature,
            suppress=suppress,
            with_entropy=with_entropy,
            chunk=8,
        )
    finally:
        _LinearLogp.apply = apply  # type: ignore[method-assign]
    assert len(calls) == 5  # 38 rows in chunks of 8: every chunk took the written-out backward
    got = _grads(head, hidden, lp, weight)
    ref_lp, ref_ent = _reference(head, hidden, target, temperature, suppress)
    want = _grads(head, hidden, ref_lp, weight)
    assert torch.allclose(lp, ref_lp, atol=1e-5)
    if with_entropy:
        assert torch.allclose(ent, ref_ent, atol=1e-5) and not ent.requires_grad
    else:
        assert ent is None
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-5), (g - w).abs().max()


def test_the_training_forward_scores_exactly_what_the_no_grad_pass_scores():
    """pi / pi_old is exactly 1 on the first update of a step: the written-out forward is the no-gradient path's,
    op for op, so the log-probs and entropies are bitwise equal."""
    head, hidden, target, suppress, _ = _case()
    with torch.no_grad():
        old_lp, old_ent = selective_logprobs(
            head, hidden, target, temperature=0.9, suppress=suppress, chunk=8
        )
    lp, ent = selective_logprobs(head, hidden, target, temperature=0.9, suppress=suppress, chunk=8)
    assert lp.requires_grad and torch.equal(lp.detach(), old_lp) and torch.equal(ent, old_ent)


def test_suppressed_ids_score_as_the_mask_does():
    head, hidden, target, suppress, weight = _case()
    by_mask = selective_logprobs(head, hidden, target, temperature=0.9, suppress=suppress, chunk=8)
    got = _grads(head, hidden, by_mask[0], weight)
    by_ids = selective_logprobs(
        head, hidden, target, temperature=0.9, suppress=suppress.nonzero().flatten(), chunk=8
    )
    assert torch.equal(by_mask[0], by_ids[0]) and torch.equal(by_mask[1], by_ids[1])
    assert all(torch.equal(a, b) for a, b in zip(got, _grads(head, hidden, by_ids[0], weight), strict=True))


def test_bf16_head_gets_fp32_logits_and_gradients_in_its_own_dtype():
    head, hidden, target, suppress, weight = _case(dtype=torch.bfloat16)
    lp, _ = selective_logprobs(head, hidden, target, temperature=0.7, suppress=suppress, chunk=8)
    assert lp.dtype == torch.float32
    got = _grads(head, hidden, lp, weight)
    assert [g.dtype for g in got] == [torch.bfloat16, torch.bfloat16]
    # the reference: the same bf16 values, scored and differentiated in fp32
    ref_head = torch.nn.Linear(24, 300, bias=False)
    ref_head.weight.data.copy_(head.weight.detach().float())
    ref_hidden = hidden.detach().float().requires_grad_()
    ref_lp, _ = _reference(ref_head, ref_hidden, target, 0.7, suppress)
    assert torch.allclose(lp, ref_lp, atol=1e-5)
    want = _grads(ref_head, ref_hidden, ref_lp, weight)
    for g, w in zip(
        got, want, strict=True
    ):  # each chunk's gradient rounded to bf16 (8 bits) and summed in bf16
        assert (g.float() - w).abs().max() <= 2**-6 * w.abs().max(), (g.float() - w).abs().max()


def test_a_backward_called_under_autocast_stays_fp32():
    head, hidden, target, suppress, weight = _case()
    grads = []
    for autocast in (False, True):
        lp, _ = selective_logprobs(head, hidden, target, temperature=0.7, suppress=suppress, chunk=8)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            grads.append(_grads(head, hidden, lp, weight))
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


@pytest.mark.parametrize("path", ["wrapped", "softcap", "entropy_grad", "unfused"])
def test_the_autograd_paths_equal_the_reference(path):
    head, hidden, target, suppress, weight = _case(bias=True, seed=3)
    kwargs = {"temperature": 0.8, "suppress": suppress, "chunk": 8}
    scored = Wrapped(head) if path == "wrapped" else head
    softcap = 5.0 if path == "softcap" else None
    lp, ent = selective_logprobs(
        scored,
        hidden,
        target,
        softcap=softcap,
        entropy_grad=path == "entropy_grad",
        fused=path != "unfused",
        **kwargs,
    )
    ref_lp, ref_ent = _reference(head, hidden, target, 0.8, suppress, softcap)
    assert torch.allclose(lp, ref_lp, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    loss = lp * weight + (ent if path == "entropy_grad" else 0)
    ref_loss = ref_lp * weight + (ref_ent if path == "entropy_grad" else 0)
    got = _grads(head, hidden, loss, torch.ones(()))
    want = _grads(head, hidden, ref_loss, torch.ones(()))
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all() and torch.allclose(g, w, atol=1e-5), (g - w).abs().max()
