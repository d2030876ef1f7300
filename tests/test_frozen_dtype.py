"""Frozen weights in the compute dtype (:meth:`mmrl.model.policy.Policy.from_pretrained`): under ``model.dtype: bfloat16``
LoRA's frozen base and a ``freeze_vision`` tower keep their Linear/Conv weights in bf16, everything trainable (and
the head, embeddings, norms, biases) in fp32. Autocast rounded those weights to bf16 at every use, so the policy, the
reference (adapters disabled), HF generation, gradients and whole training runs are bit for bit those of the policy
stored all in fp32 under the same autocast; LoRA merges add in fp32 over the bf16-rounded base; checkpoints hold the
frozen weights as stored; FSDP2 and DDP train such mixed-dtype modules."""

import dataclasses
from pathlib import Path

import pytest
import torch
from multiproc import torchrun
from PIL import Image
from safetensors.torch import load_file

from mmrl.cli import main
from mmrl.config import LoraConfig, ModelConfig
from mmrl.model.policy import Policy
from mmrl.rollout.base import SamplingParams
from mmrl.rollout.hf import HFEngine
from mmrl.run.metrics import read_metrics
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"
SFT = ROOT / "assets" / "shapes-sft" / "model"
MATMUL = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
FROZEN = {"lora": {"lora": LoraConfig(r=4, alpha=8.0)}, "freeze_vision": {"freeze_vision": True}}


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    p = tmp_path_factory.mktemp("img") / "a.png"
    Image.new("RGB", (56, 56), (200, 30, 30)).save(p)
    return Sample(
        "s", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}], [str(p)]
    )


def _cfg(kind: str, dtype: str = "bfloat16") -> ModelConfig:
    return ModelConfig(path=str(TINY), max_pixels=3136, dtype=dtype, device="cpu", **FROZEN[kind])


def _fp32_stored(cfg: ModelConfig, path: str | None = None, load=None) -> Policy:
    """The trainable policy as it was before: every weight stored in fp32, the forwards under ``cfg.dtype``'s
    autocast."""
    pol = (load or Policy.from_pretrained)(dataclasses.replace(cfg, dtype="float32"), path)
    pol.cfg, pol.compute_dtype = cfg, getattr(torch, cfg.dtype)
    return pol


def _pair(kind: str) -> tuple[Policy, Policy]:
    """The bf16-frozen policy and the fp32-stored one, with the same (moved) trainable weights."""
    torch.manual_seed(0)
    new = Policy.from_pretrained(_cfg(kind))
    torch.manual_seed(0)
    old = _fp32_stored(_cfg(kind))
    torch.manual_seed(1)
    with torch.no_grad():  # move what trains (LoRA's B starts at zero), identically in both
        for (n, a), (m, b) in zip(new.model.named_parameters(), old.model.named_parameters()):
            assert n == m
            if a.requires_grad:
                step = 0.05 * torch.randn_like(b)
                a.add_(step)
                b.add_(step)
    return new, old


def _matmul_weights(pol: Policy) -> dict[str, torch.nn.Parameter]:
    """Parameter name -> weight of every plain Linear/Conv module but the output head."""
    head = pol.model.get_output_embeddings()
    return {
        f"{name}.weight": m.weight
        for name, m in pol.model.named_modules()
        if type(m) in MATMUL and m is not head
    }


@pytest.mark.parametrize("kind", list(FROZEN))
def test_frozen_matmul_weights_are_bf16_and_the_rest_fp32(kind):
    pol = Policy.from_pretrained(_cfg(kind))
    matmul = _matmul_weights(pol)
    params = dict(pol.model.named_parameters())
    frozen = {n for n, p in matmul.items() if not p.requires_grad}
    assert frozen and all(params[n].dtype == torch.bfloat16 for n in frozen)
    assert all(p.dtype == torch.float32 for n, p in params.items() if n not in frozen)
    assert any(p.requires_grad for p in params.values())
    assert pol.model.get_output_embeddings().weight.dtype == torch.float32
    if kind == "lora":  # every frozen base, vision tower included; the adapters train in fp32
        assert all(".lora_" not in n for n in frozen) and any(".base_layer." in n for n in frozen)
        assert {n for n, p in params.items() if p.requires_grad} == {n for n in params if ".lora_" in n}
    else:
        assert all(n.startswith("model.visual.") for n in frozen)
    # model.dtype float32 changes nothing: every weight stays fp32
    fp32 = Policy.from_pretrained(_cfg(kind, "float32"))
    assert all(p.dtype == torch.float32 for p in fp32.model.parameters())


@pytest.mark.parametrize("kind", list(FROZEN))
def test_logprobs_and_gradients_equal_the_fp32_stored_policy(kind, sample):
    """Exactly: autocast cast each fp32 weight to bf16 (round to nearest) before its matmul, the same rounding the
    bf16 weight had once; the backward multiplies by the same bf16 weight."""
    new, old = _pair(kind)
    comps = [[5, 6, 7, 8], [9, 10]]
    got = []
    for pol in (new, old):
        p = pol.encode(sample)
        with torch.no_grad():
            ref = None
            if pol.peft is not None:
                with pol.reference():
                    ref = pol.logprobs([p, p], comps)[0]
        logp, ent, mask = pol.logprobs([p, p], comps)
        (-(logp * mask).sum() - ent.sum()).backward()
        grads = {n: q.grad for n, q in pol.model.named_parameters() if q.requires_grad}
        got.append((logp.detach(), ent.detach(), ref, grads))
    (lp1, e1, r1, g1), (lp2, e2, r2, g2) = got
    assert torch.equal(lp1, lp2) and torch.equal(e1, e2)
    assert (r1 is None) == (kind != "lora")
    if r1 is not None:
        assert torch.equal(r1, r2) and not torch.equal(r1, lp1)  # the reference really is another model
    assert g1.keys() == g2.keys() and g1
    assert all(torch.equal(g1[k], g2[k]) for k in g1)


@pytest.mark.parametrize("kind", list(FROZEN))
def test_hf_generation_equals_the_fp32_stored_policy(kind, sample):
    new, old = _pair(kind)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=12)
    out = []
    for pol in (new, old):
        torch.manual_seed(7)
        out.append(HFEngine(pol, batch_size=2).generate([pol.encode(sample)], params)[0])
    assert [c.token_ids for c in out[0]] == [c.token_ids for c in out[1]]
    assert [c.logprobs for c in out[0]] == [c.logprobs for c in out[1]]
    assert sum(len(c.token_ids) for c in out[0]) > 6


def test_lora_merge_adds_in_fp32_over_the_bf16_rounded_base():
    """The merged weights are the fp32 path's merge with the base rounded to bf16: ``bf16(W) + s B A`` added in fp32
    (then given the base's dtype); every other weight is the fp32 path's, the frozen Linear/Conv ones rounded."""
    new, old = _pair("lora")
    merged, before = new.merged_state_dict(), old.merged_state_dict()
    assert merged.keys() == before.keys()
    rounded = {
        k: v.to(torch.bfloat16).float() if k.endswith(".base_layer.weight") else v
        for k, v in old.model.state_dict().items()
    }
    expected = old.merged_state_dict(rounded)  # the fp32 path's own merge, over bf16-rounded bases
    adapted = {k.replace(".base_layer", "") for k in rounded if k.endswith(".base_layer.weight")}
    matmul = set(_matmul_weights(old))
    assert adapted
    for k, v in merged.items():
        if k in adapted:
            assert torch.equal(v, expected[k].to(v.dtype)), k
            base = old.model.state_dict()[k.replace(".weight", ".base_layer.weight")]
            # within two bf16 roundings (the base's and the merged value's, 2^-8 relative each) of the fp32 merge
            assert ((v.float() - before[k]).abs() <= 1.01 * 2**-8 * (base.abs() + before[k].abs())).all(), k
            assert not torch.equal(v.float(), base.to(torch.bfloat16).float())  # the adapter is in it
        elif k in matmul:
            assert v.dtype == torch.bfloat16 and torch.equal(v, before[k].to(torch.bfloat16)), k
        else:
            assert torch.equal(v, before[k]), k


def test_a_full_checkpoint_saves_the_frozen_tower_as_stored_and_resumes_to_the_same_weights(tmp_path):
    """freeze_vision: the checkpoint holds the tower in bf16 (a bf16 release's own values; this fp32 tiny release's
    rounded ones, the values every forward used) and the trained weights in fp32; loading it back gives the same
    policy, and transformers loads it."""
    from transformers import AutoModelForImageTextToText

    pol = Policy.from_pretrained(_cfg("freeze_vision"))
    pol.save(tmp_path / "model")
    saved = load_file(tmp_path / "model" / "model.safetensors")
    stored = pol.model.state_dict()
    bf16 = [k for k, v in saved.items() if v.dtype == torch.bfloat16]  # the release layout: visual.*, model.*
    assert len(bf16) == sum(v.dtype == torch.bfloat16 for v in stored.values())
    assert all(k.startswith("visual.") for k in bf16)
    back = Policy.from_pretrained(_cfg("freeze_vision"), str(tmp_path / "model"))
    assert all(torch.equal(v, back.model.state_dict()[k]) for k, v in stored.items())
    plain = AutoModelForImageTextToText.from_pretrained(tmp_path / "model", dtype=torch.float32)
    assert all(torch.equal(v.float(), plain.state_dict()[k]) for k, v in stored.items())


def _train_config(tmp_path: Path, model: str, extra: str = "") -> Path:
    from mmrl.recipes.shapes.data import build

    if not (tmp_path / "data").exists():
        build(tmp_path / "data", n_train=8, n_eval=4, seed=6)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {SFT}, min_pixels: 3136, max_pixels: 3136, dtype: bfloat16, {model}}}
data: {{train: data/train.jsonl}}
rollout: {{n: 2, max_new_tokens: 3, batch_size: 4}}
algo: {{kl_coef: 0.01, entropy_coef: 0.01}}  # the entropy term has gradients even when every reward is 0
optim: {{lr: 0.001, micro_batch_size: 4}}
rewards: [{{name: exact_match}}]
train: {{prompts_per_step: 2, progress: false, seed: 3{extra}}}
"""
    )
    return cfg


def _rows(out: Path) -> list[dict]:
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "sys/"))} for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(FROZEN))
def test_two_bf16_training_steps_equal_the_fp32_stored_run(kind, tmp_path, monkeypatch):
    """`mmrl train` 2 GRPO steps (HF rollouts, KL to the reference, updates, a checkpoint) with bf16 + LoRA and bf16
    + freeze_vision: every logged number equals the run whose policy stores all weights in fp32."""
    model = "lora: {r: 4, alpha: 8}" if kind == "lora" else "freeze_vision: true"
    cfg = _train_config(tmp_path, model)
    assert main(["train", str(cfg), "--output-dir", str(tmp_path / "new"), "--max-steps", "2"]) == 0
    original = Policy.from_pretrained.__func__

    def fp32_stored(cls, cfg, path=None, *, trainable=True):
        if not trainable:  # the reference copy (freeze_vision with KL): stored in bf16 as before
            return original(cls, cfg, path, trainable=False)
        return _fp32_stored(cfg, path, lambda c, p: original(cls, c, p))

    monkeypatch.setattr(Policy, "from_pretrained", classmethod(fp32_stored))
    assert main(["train", str(cfg), "--output-dir", str(tmp_path / "old"), "--max-steps", "2"]) == 0
    monkeypatch.undo()
    new, old = _rows(tmp_path / "new"), _rows(tmp_path / "old")
    assert [r["step"] for r in new] == [1, 2] and new[-1]["grad_norm"] > 0
    assert new == old
    ck = tmp_path / "new" / "checkpoints" / "step-2" / "model"
    if kind == "lora":  # the adapter alone, trained, in fp32
        adapter = load_file(ck / "adapter" / "adapter_model.safetensors")
        assert adapter and all(v.dtype == torch.float32 for v in adapter.values())
    else:
        saved = load_file(ck / "model.safetensors")
        assert all(
            (v.dtype == torch.bfloat16) == k.startswith("visual.") for k, v in saved.items() if v.dim() > 1
        )


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(FROZEN))
def test_fsdp_and_ddp_train_modules_with_bf16_frozen_weights(kind, tmp_path):
    """2 processes: FSDP2 shards units that hold bf16 frozen and fp32 trainable weights (only the trainable ones must
    share a dtype, torch >= 2.8), and DDP replicates them; both train and save."""
    model = "lora: {r: 4, alpha: 8, save_merged: true}" if kind == "lora" else "freeze_vision: true"
    for name, extra in (("fsdp", ", fsdp: true"), ("ddp", "")):
        cfg = _train_config(tmp_path, model, extra)
        out = tmp_path / name
        torchrun(
            2, "-m", "mmrl", "train", str(cfg), "--output-dir", str(out), "--max-steps", "2", cwd=tmp_path
        )
        rows = _rows(out)
        assert [r["step"] for r in rows] == [1, 2] and rows[-1]["grad_norm"] > 0
        ck = out / "checkpoints" / "step-2" / "model"
        saved = load_file(ck / "model.safetensors")
        if kind == "lora":  # the merged model: bf16 frozen weights, merged projections
            assert (ck / "adapter" / "adapter_config.json").is_file() and not any("lora" in k for k in saved)
        assert any(v.dtype == torch.bfloat16 for v in saved.values())
