"""Padding-free scoring (issue: throughput at real scale): a micro-batch packed into one row, positions restarting
per sequence (multimodal RoPE included), gives the padded path's log-probs to 1e-5 and its gradients, for every family
that packs; the others say why not and stay padded. Micro-batches by token budget keep every row once, whole groups
together, and the accumulated gradient of the update (test_hardening_runs checks the row path)."""

import logging

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.config import Config, ModelConfig, from_dict
from mmrl.model.encoders import packing_support
from mmrl.model.policy import Policy
from mmrl.tiny.build import FAMILIES
from mmrl.train.update import RolloutBatch, micro_batches
from mmrl.types import Sample

# families that cannot pack here, and the reason's words (read from the checkpoint: tests/test_packing.py docstring);
# every built family packs (Qwen3.5's linear attention through mmrl.model.linear_attention)
NOT_PACKED: dict[str, str] = {}


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    d = tmp_path_factory.mktemp("pack")
    out = {}
    for w, h in [(57, 83), (200, 120), (31, 300)]:
        a = np.zeros((h, w, 3), np.uint8)
        a[:, : w // 2] = (230, 20, 20)
        a[:, w // 2 :] = (20, 20, 230)
        Image.fromarray(a).save(d / f"{w}x{h}.png")
        out[(w, h)] = str(d / f"{w}x{h}.png")
    clip = d / "clip.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (90, 50))
    for i in range(15):
        writer.write(np.full((50, 90, 3), 12 * i, np.uint8))
    writer.release()
    out["video"] = str(clip)
    return out


def _samples(media, video: bool) -> list[Sample]:
    def user(parts, text):
        return {"role": "user", "content": [*({"type": t} for t in parts), {"type": "text", "text": text}]}

    out = [
        Sample("one", [user(["image"], "What colour?")], images=[media[(57, 83)]]),
        Sample(
            "two",
            [{"role": "system", "content": "Answer briefly."}, user(["image", "image"], "How many shapes?")],
            images=[media[(200, 120)], media[(31, 300)]],
        ),
        Sample(
            "text", [{"role": "user", "content": "no image at all, a longer question to vary the lengths"}]
        ),
    ]
    if (
        video
    ):  # videos apart from images: GLM-4.1V's forward cannot take both at once (transformers counts a video
        # frame's <|image|> tokens as image placeholders too), padded or packed
        return [Sample("clip", [user(["video"], "What happens?")], videos=[media["video"]]), out[2]]
    return out


def _completions(policy: Policy, n: int) -> list[list[int]]:
    """Ordinary text tokens (no placeholder, no stop id) of several lengths."""
    bad = set(policy.suppressed_token_ids) | set(policy.eos_ids) | {policy.pad_id}
    ok = [t for t in range(40, 400) if t not in bad]
    return [ok[3 * i : 3 * i + 2 + (5 * i) % 7] for i in range(n)]


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_logprobs_and_gradients_equal_the_padded_path(family, tiny_family, media, monkeypatch, caplog):
    """...and the vision tower runs once per micro-batch and modality in the packed pass, on the distinct prompts'
    media only (the rows of a group share its encoding, gradients included), where the padded pass encodes every
    row's media (tests/test_packing_shared_vision.py: mixed images and videos, the split, under FSDP)."""
    policy = Policy.from_pretrained(
        ModelConfig(path=str(tiny_family(family)), min_pixels=3136, max_pixels=12544)
    )
    ok, why = packing_support(policy.model, policy.processor)
    if family in NOT_PACKED:
        assert not ok and NOT_PACKED[family] in why and not policy.packs
        return
    assert ok and policy.packs, why
    import mmrl.model.encoders as encoders

    calls: list[str] = []
    real = encoders.encoder_calls

    def counting(model):
        def count(fn, modality):
            return lambda *a, **k: calls.append(modality) or fn(*a, **k)

        return {m: (pix, count(fn, m), takes) for m, (pix, fn, takes) in real(model).items()}

    monkeypatch.setattr(encoders, "encoder_calls", counting)
    # transformers >= 5.18: the forward takes precomputed features (mm_encoder_outputs); 5.16 and 5.17 do not, and
    # the model's forward encodes every row's media instead (same values), with a warning
    shared = bool(real(policy.model))
    with caplog.at_level(logging.WARNING, logger="mmrl.model.policy"):
        _check_packed(policy, [policy.encode(s) for s in _samples(media, video=False)], family)
    assert calls == (["image"] if shared else [])  # two prompts with images, each repeated: one call for both
    assert shared or "vision once per prompt is off" in caplog.text
    if policy.geometry.video_factor is not None:
        calls.clear()
        _check_packed(policy, [policy.encode(s) for s in _samples(media, video=True)], family)
        assert len(calls) == int(shared)  # one video prompt (InternVL and SmolVLM2 encode frames as images)


def _check_packed(policy: Policy, encoded, family: str) -> None:
    prompts = encoded + [encoded[0], encoded[1]]  # a group's rows share their prompt object, as in a batch
    comps = _completions(policy, len(prompts))

    def run(packed: bool):
        policy.model.zero_grad(set_to_none=True)
        with policy.training():
            lp, ent, mask = policy.logprobs(prompts, comps, packed=packed)
            (lp.sum() + 0.1 * ent.sum()).backward()
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
        return lp.detach(), ent.detach(), mask, grads

    lp, ent, mask, grads = run(False)
    plp, pent, pmask, pgrads = run(True)
    assert (lp[mask == 0] == 0).all() and torch.equal(mask, pmask)
    assert (lp - plp).abs().max().item() < 1e-5, (family, (lp - plp).abs().max().item())
    assert (ent - pent).abs().max().item() < 1e-4
    assert grads.keys() == pgrads.keys()
    # summation orders differ: an absolute floor scaled to the tensor's largest entry (a wrong mask is off by ~1 of
    # it: gemma4 without its media blocks, 1.9)
    for name, g in grads.items():
        atol = 5e-5 * max(1.0, g.abs().max().item())
        assert torch.allclose(g, pgrads[name], rtol=1e-3, atol=atol), (
            family,
            name,
            (g - pgrads[name]).abs().max(),
        )


def _batch(policy: Policy, media, G: int) -> RolloutBatch:
    encoded = [policy.encode(s) for s in _samples(media, video=False)]
    prompts = [p for p in encoded for _ in range(G)]
    comps = _completions(policy, len(prompts))
    T = max(len(c) for c in comps)
    return RolloutBatch.one_turn(prompts, comps, G, torch.zeros(len(comps), T))


def test_micro_batches_by_token_budget(tiny_family, media):
    policy = Policy.from_pretrained(ModelConfig(path=str(tiny_family("qwen2_5_vl"))))
    batch = _batch(policy, media, G=4)
    rows = list(range(len(batch)))
    size = {r: batch.trajectories[r].length for r in rows}
    for unit in (1, 4):
        for budget in (1, 60, 150, 10_000):
            cfg = from_dict(Config, {"optim": {"micro_batch_tokens": budget}})
            micros = micro_batches(batch, rows, unit, cfg)
            assert sorted(r for m in micros for r in m) == rows  # every row once
            for m in micros:
                assert all(len({r // unit for r in m[i : i + unit]}) == 1 for i in range(0, len(m), unit))
                assert sum(size[r] for r in m) <= budget or len(m) == unit  # a block over budget goes alone
            if budget == 10_000:
                assert len(micros) == 1
    by_rows = micro_batches(batch, rows, 1, from_dict(Config, {"optim": {"micro_batch_size": 5}}))
    assert by_rows == [rows[i : i + 5] for i in range(0, len(rows), 5)]


def test_mmrl_sdpa_attends_each_packed_sequence_alone():
    """The per-sequence path equals one dense masked attention over the packed row (block-diagonal causal, with a
    sliding window or chunks inside each sequence where the layer has them), GQA heads included."""
    from types import SimpleNamespace

    from mmrl.model.attention import PACKED, attention

    torch.manual_seed(0)
    lengths = [5, 9, 3, 12]
    N, H, Hkv, D = sum(lengths), 4, 2, 8
    q, k, v = torch.randn(1, H, N, D), torch.randn(1, Hkv, N, D), torch.randn(1, Hkv, N, D)
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    pos = torch.cat([torch.arange(n) for n in lengths])
    for layer_type, extra, allowed in [
        ("full_attention", {}, lambda i, j: True),
        ("sliding_attention", {"sliding_window": 4}, lambda i, j: i - j < 4),
        ("chunked_attention", {"attention_chunk_size": 4}, lambda i, j: i // 4 == j // 4),
    ]:
        config = SimpleNamespace(layer_types=[layer_type], **extra)
        module = SimpleNamespace(is_causal=True, num_key_value_groups=H // Hkv, config=config, layer_idx=0)
        token = PACKED.set(True)
        try:
            out, _ = attention(module, q, k, v, None, scaling=D**-0.5, cu_seq_lens_q=cu)
        finally:
            PACKED.reset(token)
        dense = torch.zeros(N, N, dtype=torch.bool)
        for i in range(N):
            for j in range(N):
                pi, pj = int(pos[i]), int(pos[j])
                dense[i, j] = bool(seq[i] == seq[j]) and pj <= pi and allowed(pi, pj)
        ref = F_sdpa(q, k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1), dense, D**-0.5)
        assert torch.allclose(out, ref.transpose(1, 2), atol=1e-6), layer_type


def F_sdpa(q, k, v, mask, scale):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def test_auto_attention_is_sdpa_on_padded_batches_and_packs_only_where_varlen(tiny_family, media):
    """``model.attn_implementation: auto`` (here mmrl_sdpa) scores a padded batch exactly as transformers' sdpa does;
    under plain sdpa the policy does not pack (a packed row would cost N^2 attention and an N x N mask)."""
    path = str(tiny_family("qwen3_vl"))
    auto = Policy.from_pretrained(ModelConfig(path=path))
    sdpa = Policy.from_pretrained(ModelConfig(path=path, attn_implementation="sdpa"))
    assert auto.model.config._attn_implementation == "mmrl_sdpa" and auto.packs
    assert sdpa.model.config._attn_implementation == "sdpa" and not sdpa.packs
    prompts = [auto.encode(s) for s in _samples(media, video=False)]
    comps = _completions(auto, len(prompts))
    with torch.no_grad():
        a = auto.logprobs(prompts, comps, packed=False)[0]
        b = sdpa.logprobs(prompts, comps, packed=False)[0]
    assert torch.equal(a, b)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "internvl", "llama4"])
def test_generation_encodes_each_prompts_media_once(family, tiny_family, media, monkeypatch):
    """The HF engine generates n rows per prompt from one vision encoding (mm_encoder_outputs), and samples exactly
    the tokens (and log-probs) it samples from n encodings of the same pixels."""
    import transformers

    import mmrl.model.encoders as encoders
    from mmrl.rollout import SamplingParams
    from mmrl.rollout.hf import HFEngine

    policy = Policy.from_pretrained(
        ModelConfig(path=str(tiny_family(family)), min_pixels=3136, max_pixels=12544)
    )
    prompts = [policy.encode(s) for s in _samples(media, video=False)]
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6)
    calls: list[str] = []
    real = encoders.encoder_calls
    # the fallback is checked by test_packed_logprobs_and_gradients_equal_the_padded_path
    if not real(policy.model):
        version = transformers.__version__
        pytest.skip(f"transformers {version}: the forward takes no mm_encoder_outputs (5.18 on)")

    def counting(model):
        return {
            m: (pix, (lambda *a, _f=fn, _m=m, **k: calls.append(_m) or _f(*a, **k)), takes)
            for m, (pix, fn, takes) in real(model).items()
        }

    monkeypatch.setattr(encoders, "encoder_calls", counting)
    torch.manual_seed(0)
    shared = HFEngine(policy, batch_size=3).generate(prompts, params)
    assert calls == ["image"]  # two prompts with images, three rows each: one call for the generate batch
    monkeypatch.setattr(encoders, "encoder_calls", lambda model: {})  # the pixels of every row, as before
    torch.manual_seed(0)
    plain = HFEngine(policy, batch_size=3).generate(prompts, params)
    for g, h in zip(shared, plain):
        for c, d in zip(g, h):
            assert c.token_ids == d.token_ids
            assert max(abs(a - b) for a, b in zip(c.logprobs, d.logprobs)) < 1e-5


@pytest.mark.parametrize(
    ("family", "key", "layers"),
    [
        ("gemma3", "token_type_ids", {"full_attention", "sliding_attention"}),
        ("gemma4", "mm_token_type_ids", {"sliding_attention"}),
    ],
)
def test_media_blocks_pack_under_mmrl_sdpa_only(family, key, layers, tiny_family):
    """Two-way media blocks are read from the checkpoint (Gemma 3: every layer; Gemma 4: sliding layers only, as
    transformers' masks); flash-attention's causal kernels cannot hold them, so a packed row is refused there."""
    from mmrl.model.encoders import media_blocks

    policy = Policy.from_pretrained(
        ModelConfig(path=str(tiny_family(family)), min_pixels=3136, max_pixels=12544)
    )
    spec = media_blocks(policy.model, policy.processor)
    assert spec is not None and spec[0] == key and set(spec[2]) == layers
    assert packing_support(policy.model, policy.processor, "mmrl_sdpa") == (True, "")
    ok, why = packing_support(policy.model, policy.processor, "flash_attention_2")
    assert not ok and "mmrl_sdpa packs it" in why
    assert policy.model.config._attn_implementation == "mmrl_sdpa" and policy.packs  # auto, read at load


def test_auto_keeps_media_blocks_off_flash_attention(monkeypatch):
    """On CUDA with flash-attn installed, ``auto`` picks flash-attention 2, except for a model with two-way media
    blocks, whose mask its causal kernels cannot hold: that one gets mmrl_sdpa (and packs)."""
    import importlib.util

    from mmrl.model import attention

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "flash_attn" else real(n, *a)
    )
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert attention.resolve("auto", cuda) == "flash_attention_2"
    assert attention.resolve("auto", cuda, media_blocks=True) == attention.NAME
    assert attention.resolve("auto", cpu) == attention.NAME
    assert attention.resolve("sdpa", cuda, media_blocks=True) == "sdpa"  # an explicit choice is kept
