"""Packed attention reads nothing back to the host (issue 35, section 1). On a GPU every value read from a device
tensor (``.tolist()``, ``.item()``, ``int(t)``, ``bool(t)``, a data-dependent shape: ``nonzero``, a boolean index, a
``repeat_interleave`` without its output size) waits for the device: done in the attention, that is a sync per layer
per micro-batch. The packed forward hands the boundaries down as host ints instead (:mod:`mmrl.model.attention`).

Here, on the CPU, a dispatch mode counts those reads during a packed scoring forward and backward with gradient
checkpointing (so every layer also runs again in the backward, and must get the same boundaries there): none inside
the attention of any layer, softmax (``mmrl_sdpa``, Gemma's two-way media blocks included) or linear (Qwen3.5's
Gated-DeltaNet). The log-probs stay the padded path's (tests/test_packing.py's tolerance), and the log-probs and
gradients are bit for bit those of the path that reads the boundaries back from the device (the attention's own
fallback for a caller that hands transformers' keywords alone), whose reads the counter must see."""

import sys
from collections import Counter
from contextlib import contextmanager

import pytest
import torch
from test_packing import _completions, _samples, media  # noqa: F401 (media: the fixture)
from torch.utils._python_dispatch import TorchDispatchMode

from mmrl.config import ModelConfig
from mmrl.model import attention, linear_attention
from mmrl.model.policy import Policy

# a packed scoring step: the host side and the shared vision encoding, the model's forward over the packed row (the
# decoder layers), the head, the backward (the layers recomputed)
PHASES = ("prepare", "model", "head", "backward")
# ops whose result needs a tensor's values on the host (a device->host sync on a GPU), by overload packet; lift_fresh
# is a tensor made from host data inside the traced code, a host->device copy (and sync) on a GPU
_READ_OPS = {
    "_local_scalar_dense",  # .item(), int(t), float(t), bool(t)
    "nonzero",
    "masked_select",
    "equal",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "lift_fresh",
}


def _host_read(func, args, kwargs) -> str | None:
    """The name of the host read ``func`` makes, else None."""
    name = func.overloadpacket.__name__
    if name in _READ_OPS:
        return name
    if name == "repeat_interleave" and kwargs.get("output_size") is None:
        return name  # the output's length is the repeats' sum
    if name in {"index", "index_put", "index_put_", "_index_put_impl_"} and len(args) > 1:
        if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in args[1]):
            return f"{name}[mask]"  # a boolean index is a nonzero
    if (
        name == "_to_copy"
        and kwargs.get("device") is not None
        and torch.device(kwargs["device"]).type == "cpu"
    ):
        return "to(cpu)"
    return None


class HostReads(TorchDispatchMode):
    """Counts the host reads of the code it runs, attributed to the attention call under way (:meth:`scope`) or to
    the rest of the forward and backward; ``.tolist()``, ``.numpy()`` and ``.cpu()`` do not dispatch an op and are
    counted by patching them."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, str, Counter]] = []  # (phase, attention function, its reads)
        self.outside: dict[str, Counter] = {phase: Counter() for phase in PHASES}
        self.phase = PHASES[0]
        self._current: Counter | None = None

    def note(self, read: str) -> None:
        (self._current if self._current is not None else self.outside[self.phase])[read] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        read = _host_read(func, args, kwargs)
        if read is not None:
            self.note(read)
        return func(*args, **kwargs)

    @contextmanager
    def scope(self, name: str):
        outer, self._current = self._current, Counter()
        self.calls.append((self.phase, name, self._current))
        try:
            yield
        finally:
            self._current = outer

    def patch_host_methods(self, monkeypatch) -> None:
        for method in ("tolist", "numpy", "cpu"):
            real = getattr(torch.Tensor, method)

            def counted(t, *a, _real=real, _name=method, **k):
                self.note(f".{_name}()")
                return _real(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, method, counted)

    def inside(self, phase: str) -> Counter:
        return sum((c for p, _, c in self.calls if p == phase), Counter())

    def watch_model(self, policy: Policy, monkeypatch) -> None:
        """Phases: the packed forward calls ``policy.last_hidden`` once, and the head after it."""
        real = policy.last_hidden

        def last_hidden(**inputs):
            self.phase = "model"
            try:
                return real(**inputs)
            finally:
                self.phase = "head"

        monkeypatch.setattr(policy, "last_hidden", last_hidden)


def _watch_attention(policy: Policy, reads: HostReads, monkeypatch, host_bounds: bool) -> None:
    """Wrap every attention function a packed layer calls so that ``reads`` attributes what it reads to it;
    ``host_bounds=False`` takes the host boundaries out of its keywords (``mmrl_cu_seqlens``, ``max_length_q``), the
    path that reads them back from the device."""
    from transformers import AttentionInterface

    strip = () if host_bounds else (attention.BOUNDS, "max_length_q")

    def watched(fn, name):
        def call(*args, **kwargs):
            with reads.scope(name):
                return fn(*args, **{k: v for k, v in kwargs.items() if k not in strip})

        return call

    # the registry the layers look mmrl_sdpa up in at each call
    monkeypatch.setitem(
        AttentionInterface._global_mapping, attention.NAME, watched(attention.attention, "mmrl_sdpa")
    )
    linear_attention.install(policy.model)
    for module in linear_attention.layer_modules(policy.model):
        for fn in (linear_attention._CONV, linear_attention._RULE):
            installed = getattr(sys.modules[module], fn)
            wrapper = watched(installed, fn)
            setattr(wrapper, linear_attention._ORIGINAL, getattr(installed, linear_attention._ORIGINAL))
            monkeypatch.setattr(sys.modules[module], fn, wrapper)  # install() sees it installed


def _packed_run(policy: Policy, prompts, comps, monkeypatch, host_bounds: bool = True):
    """A packed scoring forward and backward under :class:`HostReads`: log-probs, entropies, gradients, reads."""
    reads = HostReads()
    with monkeypatch.context() as m:
        _watch_attention(policy, reads, m, host_bounds)
        reads.patch_host_methods(m)
        reads.watch_model(policy, m)
        policy.model.zero_grad(set_to_none=True)
        with policy.training(), reads:
            lp, ent, _ = policy.logprobs(prompts, comps, packed=True)
            reads.phase = "backward"
            (lp.sum() + 0.1 * ent.sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), grads, reads


def _report(family: str, reads: HostReads) -> str:
    lines = [family]
    for phase in PHASES:
        calls = [c for p, _, c in reads.calls if p == phase]
        inside = reads.inside(phase)
        lines.append(
            f"  {phase}: {len(calls)} attention calls, {sum(inside.values())} host reads inside "
            f"({dict(inside)}), {sum(reads.outside[phase].values())} outside ({dict(reads.outside[phase])})"
        )
    return "\n".join(lines)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "gemma4", "qwen3_5"])
def test_packed_attention_reads_nothing_back_to_the_host(family, tiny_family, media, monkeypatch):  # noqa: F811
    policy = Policy.from_pretrained(
        ModelConfig(
            path=str(tiny_family(family)), min_pixels=3136, max_pixels=12544, gradient_checkpointing=True
        )
    )
    assert policy.packs and policy.model.config._attn_implementation == attention.NAME
    encoded = [policy.encode(s) for s in _samples(media, video=False)]
    prompts = encoded + [encoded[0], encoded[1]]  # a group's rows share their prompt, as in a batch
    comps = _completions(policy, len(prompts))

    lp, ent, grads, reads = _packed_run(policy, prompts, comps, monkeypatch)
    print("\n" + _report(family, reads))
    forward = Counter(name for phase, name, _ in reads.calls if phase != "backward")
    assert forward == Counter(name for phase, name, _ in reads.calls if phase == "backward")  # all recomputed
    assert any(phase == "model" for phase, _, _ in reads.calls)
    for phase, name, counted in reads.calls:
        assert not counted, (family, phase, name, dict(counted))

    # the same numbers as the path that reads the boundaries back from the device, whose reads the counter sees
    old_lp, old_ent, old_grads, old_reads = _packed_run(
        policy, prompts, comps, monkeypatch, host_bounds=False
    )
    print(_report(f"{family}, boundaries read from the device", old_reads))
    assert old_reads.inside("model") and old_reads.inside("backward")
    assert torch.equal(lp, old_lp) and torch.equal(ent, old_ent)
    assert grads.keys() == old_grads.keys() and all(torch.equal(g, old_grads[n]) for n, g in grads.items())

    # and the padded path's log-probs (tests/test_packing.py holds the gradients too)
    with torch.no_grad():
        padded = policy.logprobs(prompts, comps, packed=False)[0]
    assert (lp - padded).abs().max().item() < 1e-5, (family, (lp - padded).abs().max().item())
