"""``mmrl plan``'s memory model against torch's own accounting of a real training step, per component, on a CPU.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/plan_accuracy.py [--arch 3b 7b] [--micro-batch 2]
        [--tokens 256] [--max-pixels 1003520]
    OMP_NUM_THREADS=1 python benchmarks/plan_accuracy.py --arch tiny --real     # the tiny model, real tensors too

What is measured. The real Qwen2.5-VL-3B and 7B architectures (the shipped config folders under
``mmrl/plan/configs/``) are built under torch's ``FakeTensorMode`` (``torch._subclasses.fake_tensor``): every tensor
has its real shape, dtype and storage size but no data, so a 7B training step runs in seconds and a few hundred MB
of host memory. The step is mmrl's own code, unchanged: ``Policy.from_pretrained`` (fp32 master weights, bf16
autocast, gradient checkpointing, LoRA via peft), ``Policy.logprobs`` (the chunked fp32 head) for pi_old and the
reference, and ``PolicyUpdate`` (two micro-batches of ``--micro-batch`` rows accumulated into one AdamW step, the
optimizer with ``foreach=True`` as torch picks it for CUDA tensors). Each prompt is the bundled tokenizer's chat
template around one image of ``--max-pixels`` pixels (taken whole), each completion ``--tokens`` tokens, one row
shorter than the others so the micro-batch is padded as in training.

A ``TorchDispatchMode`` sees every tensor an op returns and follows its storage with a weak reference: the live
bytes are the sum of the storages not yet freed, in four categories (parameters, gradients, optimizer state, the
rest = activations and temporaries). Measured per component: the policy's weights, the reference model's, the
gradients after the backward, the AdamW state after the step, the peak of the rest during the update's forwards
and backwards (activations, the autocast bf16 weight copies, the chunked head's buffers, backward temporaries),
during the optimizer step (its temporaries), and during each no-grad log-prob forward. The planner
(:func:`mmrl.plan.planner.plan_run`) is asked the same questions about the same run (its prompt length set to the one
measured), and the table gives planned GiB, measured GiB and their ratio; the last line is
``worst ratio <component>: X (within 15%: yes|no)``.

Data-dependent index arithmetic (M-RoPE positions, the vision tower's windows, ``.tolist()`` of the image grid)
cannot run on data-less tensors, so integer tensors keep a real "shadow": an op whose inputs all have shadows also
runs on them, and ``.item()`` reads the shadow (``Shadow``). Only index tensors (ids, masks, grids, positions, a few
MB) ever hold data.

What this cannot measure (and the planner takes from elsewhere): vLLM (its weights, KV cache and sleep states are
what vLLM is configured to take: ``gpu_memory_utilization`` x the GPU, or ``kv_cache_memory_bytes``), the CUDA
context and NCCL buffers outside torch's allocator, the caching allocator's fragmentation, and which attention
kernel CUDA picks: the CPU runs torch's flash kernel for CPU, which like CUDA's flash and memory-efficient kernels
keeps O(S) per head (no S x S scores), and with a padding mask both convert it to a bf16 bias of B x S x S per layer.
CPU autocast casts the same ops to bf16 as CUDA autocast for everything here (linear, conv, matmul, sdpa). One known
difference: LoRA's dropout saves an fp32 noise tensor on CPU where CUDA's fused dropout saves a bool mask, so the
LoRA row uses ``lora.dropout: 0`` (the planner adds CUDA's 1 byte per adapted input element when dropout is on).
``--real`` also runs the tiny model with real tensors and compares the same tracker's numbers (and torch's CPU
profiler's memory categories) with the fake run: identical sizes are expected, and printed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.weak import WeakIdKeyDictionary

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"
ARCHS = {
    "3b": ROOT / "mmrl" / "plan" / "configs" / "Qwen2.5-VL-3B-Instruct",
    "7b": ROOT / "mmrl" / "plan" / "configs" / "Qwen2.5-VL-7B-Instruct",
    "tiny": TINY,
}
GIB = 2**30
SHADOW_MAX_NUMEL = 1 << 24  # factory ops get a real shadow only when they make small integer tensors
ACT = "activations"


class Shadow(TorchDispatchMode):
    """Keeps a real copy of every integer tensor whose inputs are all known, so data-dependent index code runs."""

    def __init__(self, fake: FakeTensorMode):
        super().__init__()
        self.fake = fake
        self.real: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def shadow_of(self, t: torch.Tensor) -> torch.Tensor | None:
        return self.real.get(t) if isinstance(t, FakeTensor) else t

    def adopt(self, real: Any) -> Any:
        """A fake tensor with ``real`` as its shadow (pytree-mapped)."""

        def one(r: Any) -> Any:
            if not isinstance(r, torch.Tensor):
                return r
            f = self.fake.from_tensor(r)
            self.real[f] = r
            return f

        return tree_map(one, real)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not tensors:  # a factory: shadow small integer results (ids, positions, masks)
            out = func(*args, **kwargs)
            if (
                isinstance(out, FakeTensor)
                and not out.is_floating_point()
                and out.numel() <= SHADOW_MAX_NUMEL
            ):
                with unset_fake_temporarily():
                    self.real[out] = func(*args, **kwargs)
            return out
        if any(self.shadow_of(t) is None for t in tensors):
            if func is torch.ops.aten._local_scalar_dense.default:
                return 0  # a value computed from weights (a loss, a norm): only sizes matter here
            return func(*args, **kwargs)
        rargs, rkwargs = tree_map(
            lambda x: self.shadow_of(x) if isinstance(x, torch.Tensor) else x, (args, kwargs)
        )
        with unset_fake_temporarily():
            rout = func(*rargs, **rkwargs)
        if not any(isinstance(x, torch.Tensor) for x in tree_leaves(rout)):
            return rout  # .item(), bool(): the real value
        try:
            out = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            return self.adopt(rout)  # nonzero, masked_select: the size comes from the data
        for f, r in zip(tree_leaves(out), tree_leaves(rout)):
            if isinstance(f, FakeTensor) and isinstance(r, torch.Tensor):
                self.real[f] = r
        return out

    def on_shadows(self, fn):
        """``fn`` (index arithmetic that builds tensors from Python values) run on its arguments' shadows."""

        def run(*args, **kwargs):
            def real(x: Any) -> Any:
                if isinstance(x, FakeTensor):
                    r = self.real.get(x)
                    if r is None:
                        raise RuntimeError(f"{fn.__qualname__}: a data-less argument")
                    return r
                return x

            rargs, rkwargs = tree_map(real, (args, kwargs))
            with _disable_current_modes():
                out = fn(*rargs, **rkwargs)
            return self.adopt(out)

        return run


class LiveBytes(TorchDispatchMode):
    """Live bytes of every storage an op returned (weakly followed), by category; peaks of the activation part."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, list] = {}  # id(storage) -> [category, bytes]
        self.by: dict[str, int] = {"parameters": 0, "gradients": 0, "optimizer": 0, ACT: 0}
        self.peak = 0  # of the activations category since the last reset()

    def track(self, t: torch.Tensor, category: str = ACT) -> None:
        st = t.untyped_storage()
        key = id(st)
        entry = self.storages.get(key)
        if entry is None:
            self.storages[key] = [category, st.nbytes()]
            self.by[category] += st.nbytes()
            weakref.finalize(st, self._free, key)
        elif category != ACT and entry[0] != category:  # a gradient or an optimizer state made by an op
            self.by[entry[0]] -= entry[1]
            self.by[category] += entry[1]
            entry[0] = category
        self.peak = max(self.peak, self.by[ACT])

    def _free(self, key: int) -> None:
        category, n = self.storages.pop(key)
        self.by[category] -= n

    def reset(self) -> int:
        self.peak = self.by[ACT]
        return self.peak

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out


def _special_ids(config: Any) -> None:
    """The bundled tokenizer's vision token ids (its prompts are encoded with it), set on the big config."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY)
    for attr, token in (
        ("image_token_id", "<|image_pad|>"),
        ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"),
    ):
        setattr(config, attr, tok.convert_tokens_to_ids(token))


@contextlib.contextmanager
def fake_checkpoint(arch: Path, fake: FakeTensorMode | None, shadow: Shadow | None) -> Iterator[None]:
    """``from_pretrained`` builds ``arch`` from its config (fake tensors when ``fake``), random weights, no files
    read; modules stay where they are (fake tensors live on the fake CPU); index helpers run on shadows."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    def build(src: str, dtype: torch.dtype = torch.float32, **kwargs: Any) -> Any:
        config = AutoConfig.from_pretrained(arch)
        if arch != TINY:
            _special_ids(config)
        config._attn_implementation = kwargs.get("attn_implementation") or "sdpa"
        with fake or contextlib.nullcontext(), shadow or contextlib.nullcontext():
            torch.manual_seed(0)
            return AutoModelForImageTextToText.from_config(config, dtype=dtype)

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        wanted = {x for x in (*args, kwargs.get("dtype")) if isinstance(x, torch.dtype)}
        have = {p.dtype for p in self.parameters() if p.is_floating_point()}
        return module_to(self, *args, **kwargs) if wanted and have - wanted else self

    saved = AutoModelForImageTextToText.from_pretrained, qwen.Qwen2_5_VLModel.get_rope_index
    module_to = torch.nn.Module.to
    AutoModelForImageTextToText.from_pretrained = staticmethod(build)
    if fake is not None:
        rope = qwen.Qwen2_5_VLModel.get_rope_index
        qwen.Qwen2_5_VLModel.get_rope_index = lambda self, *a, **k: shadow.on_shadows(
            lambda *x, **y: rope(self, *x, **y)
        )(*a, **k)
        torch.nn.Module.to = to
    try:
        yield
    finally:
        AutoModelForImageTextToText.from_pretrained = staticmethod(saved[0])
        qwen.Qwen2_5_VLModel.get_rope_index = saved[1]
        torch.nn.Module.to = module_to


def _image(max_pixels: int) -> Any:
    """An image that smart_resize keeps whole at max_pixels // 784 visual tokens (as near square as that allows)."""
    from PIL import Image

    tokens = max(4, max_pixels // (28 * 28))
    a = max(d for d in range(1, int(math.isqrt(tokens)) + 1) if tokens % d == 0)
    return Image.new("RGB", (28 * (tokens // a), 28 * a), "white")


def _model_cfg(args: argparse.Namespace, checkpointing: bool) -> Any:
    from mmrl.config import LoraConfig, ModelConfig

    return ModelConfig(
        path=str(TINY),
        dtype="bfloat16",
        device="cpu",
        attn_implementation="sdpa",
        gradient_checkpointing=checkpointing,
        min_pixels=3136,
        max_pixels=args.max_pixels,
        lora=LoraConfig(r=args.lora, alpha=2.0 * max(args.lora, 1), dropout=0.0),
    )


def _run_config(args: argparse.Namespace, checkpointing: bool) -> Any:
    from mmrl.config import Config

    cfg = Config()
    cfg.model = _model_cfg(args, checkpointing)
    cfg.rollout.n = args.micro_batch
    cfg.rollout.max_new_tokens = args.tokens
    cfg.optim.micro_batch_size = args.micro_batch
    cfg.algo.kl_coef = 0.01
    cfg.algo.old_logprobs = "recompute"
    cfg.train.prompts_per_step = 2
    return cfg


def measure(args: argparse.Namespace, checkpointing: bool, real: bool = False) -> dict[str, Any]:
    """One training step of ``args.arch`` (fake tensors unless ``real``): bytes per component (see the docstring)."""
    from mmrl.model.policy import Policy

    fake = None if real else FakeTensorMode(allow_non_fake_inputs=True)
    shadow = None if real else Shadow(fake)
    modes = (lambda: contextlib.nullcontext()) if real else (lambda: _stack(fake, shadow))
    cfg = _run_config(args, checkpointing)
    with fake_checkpoint(ARCHS[args.arch], fake, shadow):
        with modes():
            policy = Policy.from_pretrained(cfg.model)
            ref = Policy.from_pretrained(cfg.model, trainable=False) if cfg.model.lora.r == 0 else None
        return _step(args, cfg, policy, ref, modes)


def _step(args: argparse.Namespace, cfg: Any, policy: Any, ref: Any, modes: Any) -> dict[str, Any]:
    from mmrl.train.trainer import build_scheduler
    from mmrl.train.update import PolicyUpdate, RolloutBatch
    from mmrl.types import Sample

    sample = Sample(
        "m", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}]
    )
    sample.images = [_image(args.max_pixels)]
    prompt = policy.encode(sample)
    B, T = args.micro_batch, args.tokens
    rows = 2 * B  # two micro-batches: the second runs with the first one's gradients allocated
    completions = [[7 + (i + j) % 40 for i in range(T - (j % B == B - 1))] for j in range(rows)]
    live = LiveBytes()
    out: dict[str, Any] = {"prompt_tokens": len(prompt.input_ids), "completion_tokens": T}
    params = [p for p in policy.model.parameters()]
    for p in params:
        live.track(p, "parameters")
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda q: live.track(q.grad, "gradients"))
    for p in ref.model.parameters() if ref else []:
        live.track(p, "parameters")
    out["policy weights"] = sum(p.untyped_storage().nbytes() for p in params)
    out["reference model"] = sum(p.untyped_storage().nbytes() for p in ref.model.parameters()) if ref else 0
    with modes(), live:
        with torch.no_grad():
            live.reset()
            policy.logprobs([prompt] * B, completions[:B], with_entropy=False)  # as Trainer.forward_no_grad
            out["activations, log-probs (policy)"] = live.peak - live.reset()
            if ref is not None:
                ref.logprobs([prompt] * B, completions[:B], with_entropy=False)
                out["activations, log-probs (reference)"] = live.peak - live.reset()
        trainable = [p for p in policy.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=1e-6, foreach=True)
        step = _OptimizerWatch(opt, live, out)
        update = PolicyUpdate(cfg, policy, opt, build_scheduler(opt, cfg), temperature=1.0)
        batch = RolloutBatch.one_turn(
            [prompt] * rows,
            completions,
            B,
            torch.zeros(rows, T),
            ref_logp=torch.zeros(rows, T),
            advantages=torch.linspace(-1, 1, rows),
        )
        with policy.training():
            step.start = live.reset()
            update(batch)
        step.remove()
    return out


class _OptimizerWatch:
    """Around ``opt.step()``: the gradients' total and the activation peak before it, the state and the step's own
    temporaries after it."""

    def __init__(self, opt: torch.optim.Optimizer, live: LiveBytes, out: dict[str, Any]):
        self.opt, self.live, self.out = opt, live, out
        self.handles = [opt.register_step_pre_hook(self.pre), opt.register_step_post_hook(self.post)]

    def pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.out["activations, update"] = self.live.peak - self.start
        self.out["gradients"] = self.live.by["gradients"]
        self.base = self.live.reset()

    def post(self, opt: Any, args: Any, kwargs: Any) -> None:
        state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        for t in state:
            self.live.track(t, "optimizer")
        self.out["optimizer state"] = self.live.by["optimizer"]
        self.out["optimizer step temporaries"] = self.live.peak - self.base - self.out["optimizer state"]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@contextlib.contextmanager
def _stack(fake: FakeTensorMode, shadow: Shadow) -> Iterator[None]:
    with fake, shadow:
        yield


COMPONENTS = (
    "policy weights",
    "reference model",
    "gradients",
    "optimizer state",
    "optimizer step temporaries",
    "activations, update",
    "activations, log-probs (policy)",
    "activations, log-probs (reference)",
)


def planned(args: argparse.Namespace, checkpointing: bool, measured: dict[str, Any]) -> dict[str, float]:
    """The planner's numbers for the measured run (its prompt length set to the measured one): the rows ``mmrl plan``
    prints for the update stage, and the activation peaks it takes the maximum of."""
    from mmrl.plan import memory
    from mmrl.plan import planner as plan

    cfg = _run_config(args, checkpointing)
    cfg.model.path = str(ARCHS[args.arch])
    opts = memory.PlanOptions(images=1, videos=0, text_tokens=_text_tokens(args, measured))
    p = plan.plan_run(cfg, opts, advise=False)
    s, rows = p.setup, {k: v["update"] for k, v in p.rows.items()}
    return {
        "policy weights": rows["policy weights (fp32)"],
        "reference model": rows["reference model"],
        "gradients": rows["gradients (fp32)"],
        "optimizer state": rows["AdamW state (2 x fp32)"],
        "optimizer step temporaries": 4.0 * s.trainable / s.shard,
        "activations, update": memory.update_activations(s)["peak"],
        "activations, log-probs (policy)": memory.nograd_activations(s, policy=True),
        "activations, log-probs (reference)": memory.nograd_activations(s, policy=False)
        if s.ref_copy
        else 0.0,
    }


def _text_tokens(args: argparse.Namespace, measured: dict[str, Any]) -> int:
    from mmrl.plan import memory

    cfg = _run_config(args, True)
    cfg.model.path = str(ARCHS[args.arch])
    s = memory.setup(cfg, memory.PlanOptions(images=1, videos=0, text_tokens=0))
    return measured["prompt_tokens"] - s.seq.visual_tokens


def compare(args: argparse.Namespace, checkpointing: bool) -> list[tuple[str, float, float]]:
    """(component, planned bytes, measured bytes) for one architecture and setting."""
    m = measure(args, checkpointing)
    p = planned(args, checkpointing, m)
    return [(c, p[c], m.get(c, 0.0)) for c in COMPONENTS if m.get(c, 0.0) or p[c]]


def real_vs_fake(
    args: argparse.Namespace, checkpointing: bool
) -> tuple[list[tuple[str, float, float]], float, float]:
    """(component, fake-tensor bytes, real-tensor bytes) of the same step (the fake accounting is the real one), and
    the real step's peak of all live tensors by the tracker and by ``torch.profiler``'s memory timeline."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    fake = measure(args, checkpointing)
    peak = [0]
    track = LiveBytes.track

    def track_total(self: LiveBytes, t: torch.Tensor, category: str = ACT) -> None:
        track(self, t, category)
        peak[0] = max(peak[0], sum(self.by.values()))

    LiveBytes.track = track_total
    try:
        with profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
        ) as p:
            real = measure(args, checkpointing, real=True)
    finally:
        LiveBytes.track = track
    _, sizes = MemoryProfileTimeline(p._memory_profile())._coalesce_timeline(torch.device("cpu"))
    profiled = max(sum(row) for row in sizes)
    rows = [(c, fake.get(c, 0.0), real.get(c, 0.0)) for c in COMPONENTS if fake.get(c) or real.get(c)]
    return rows, float(peak[0]), float(profiled)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", nargs="+", default=["3b", "7b"], choices=sorted(ARCHS))
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--max-pixels", type=int, default=1003520)
    p.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    p.add_argument(
        "--no-checkpointing", action="store_true", help="also measure without gradient checkpointing"
    )
    p.add_argument(
        "--real", action="store_true", help="the tiny model: fake-tensor accounting vs real tensors"
    )
    a = p.parse_args()
    if a.real:
        a.arch = "tiny"
        print(f"{'component':36s} {'fake GiB':>10s} {'real GiB':>10s}")
        rows, tracked, profiled = real_vs_fake(a, True)
        for name, f, r in rows:
            print(f"{name:36s} {f / GIB:10.5f} {r / GIB:10.5f}")
        print(
            f"real step, peak of all live tensors: tracker {tracked / 2**20:.1f} MiB, torch.profiler {profiled / 2**20:.1f} MiB"
        )
        worst = max(abs(f - r) / max(r, 1) for _, f, r in rows)
        print(f"largest difference fake vs real: {worst:.2%}")
        return
    worst: tuple[float, str] = (1.0, "")
    print(
        f"{'arch':5s} {'ckpt':5s} {'component':36s} {'planned GiB':>12s} {'measured GiB':>13s} {'ratio':>7s}"
    )
    for arch in a.arch:
        for ckpt in (True, False) if a.no_checkpointing else (True,):
            a.arch = arch
            for name, plan_b, meas_b in compare(a, ckpt):
                ratio = plan_b / meas_b if meas_b else float("inf")
                if abs(math.log(ratio)) > abs(math.log(worst[0])):
                    worst = (ratio, f"{arch} {name}{'' if ckpt else ' (no checkpointing)'}")
                print(
                    f"{arch:5s} {'on' if ckpt else 'off':5s} {name:36s} {plan_b / GIB:12.3f} {meas_b / GIB:13.3f} "
                    f"{ratio:7.3f}",
                    flush=True,
                )
    ok = 1 / 1.15 <= worst[0] <= 1.15
    print(f"worst ratio {worst[1]}: {worst[0]:.3f} (within 15%: {'yes' if ok else 'no'})")


if __name__ == "__main__":
    main()
