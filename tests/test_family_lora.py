"""Default LoRA targets and ``freeze_vision`` per family, read from the checkpoint's module names: every Linear of
the language model (fused and linear-attention projections, shared experts included), the vision side optional,
fused MoE experts frozen (adapting them is refused with a reason)."""

import pytest
import torch

from mmrl.config import LoraConfig, ModelConfig
from mmrl.model.layout import language_model_prefix
from mmrl.model.policy import Policy
from mmrl.tiny.build import FAMILIES

# leaf names of Linear layers the default set must adapt, beyond attention q/k/v/o and the dense MLP
MUST = {
    "qwen3_5": {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"},
    "qwen3_5_moe": {"in_proj_qkv", "out_proj", "shared_expert_gate"},
    "qwen3_vl_moe": set(),
    # layer 0's dense MLP and the shared experts: peft's v4-MoE renaming would drop both (mmrl.model.lora._native_peft_targets)
    "glm4v_moe": {"gate_proj", "up_proj", "down_proj"},
}


def _lora_policy(path, **lora) -> Policy:
    return Policy.from_pretrained(ModelConfig(path=str(path), lora=LoraConfig(r=2, alpha=4, **lora)))


def _adapted(policy: Policy) -> set[str]:
    return {
        n.removesuffix(".lora_A.default")
        for n, _ in policy.model.named_modules()
        if n.endswith(".lora_A.default")
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_default_lora_covers_every_language_linear(family, tiny_family):
    policy = _lora_policy(tiny_family(family))
    base = policy.model  # peft injects the adapters in place
    decoder = language_model_prefix(base)
    adapted = _adapted(policy)
    head = base.get_output_embeddings()
    linears = {  # plain Linears (Llama 4's router subclasses Linear and returns a tuple), the head excluded
        n.removesuffix(".base_layer")
        for n, m in base.named_modules()
        if type(m) is torch.nn.Linear and ".lora_" not in n and m is not getattr(head, "base_layer", head)
    }
    assert adapted == {
        n for n in linears if n.startswith(f"{decoder}.")
    }  # every language Linear, nothing else
    leaves = {n.rsplit(".", 1)[-1] for n in adapted}
    assert {"q_proj", "k_proj", "v_proj"} <= leaves and MUST.get(family, set()) <= leaves
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    if family.endswith("_moe"):
        experts = [n for n, p in base.named_parameters() if ".experts." in n]
        assert experts and not any(p.requires_grad for n, p in base.named_parameters() if n in experts)
        with pytest.raises(ValueError, match="target_parameters"):
            _lora_policy(tiny_family(family), experts=True)


@pytest.mark.parametrize("family", ["qwen3_vl", "gemma3"])
def test_lora_vision_option_adapts_the_tower_and_projector(family, tiny_family):
    text_only = _adapted(_lora_policy(tiny_family(family)))
    both = _adapted(_lora_policy(tiny_family(family), vision=True))
    vision = both - text_only
    assert text_only < both and vision
    assert not any(n.startswith("lm_head") for n in both)
    assert any(("visual" in n or "vision" in n) for n in vision)


@pytest.mark.parametrize("family", ["gemma3", "qwen3_vl"])
def test_freeze_vision_freezes_tower_and_projector(family, tiny_family):
    policy = Policy.from_pretrained(ModelConfig(path=str(tiny_family(family)), freeze_vision=True))
    decoder = language_model_prefix(policy.model)
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    frozen = {n for n, p in policy.model.named_parameters() if not p.requires_grad}
    assert all(n.startswith(f"{decoder}.") or n.startswith("lm_head") for n in trainable)
    assert any("projector" in n or "merger" in n for n in frozen)  # not the tower alone
    assert any(n.startswith(f"{decoder}.") for n in trainable)


@pytest.mark.parametrize("family", ["glm4v_moe", "qwen3_5_moe"])
def test_moe_lora_adapter_saves_and_loads_as_trained(family, tiny_family, tmp_path):
    """A LoRA checkpoint of an MoE family (shared experts, GLM-4.5V's dense first MLP) is read back onto the same
    modules with the same weights: peft's v4-MoE conversion must not rename them on load either."""
    path = tiny_family(family)
    policy = _lora_policy(path)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if ".lora_B." in n:
                p.normal_()  # non-zero B: the loaded adapter must change the output as the trained one does
    policy.save(tmp_path)
    loaded = Policy.from_pretrained(ModelConfig(path=str(path), lora=LoraConfig(r=2, alpha=4)), str(tmp_path))
    assert _adapted(loaded) == _adapted(policy)
    if family == "glm4v_moe":
        assert {"gate_proj", "up_proj", "down_proj"} <= {
            n.rsplit(".", 1)[-1] for n in _adapted(loaded) if ".shared_experts." in n or ".layers.0.mlp." in n
        }
    mine = {n: p for n, p in policy.model.named_parameters() if ".lora_" in n}
    theirs = {n: p for n, p in loaded.model.named_parameters() if ".lora_" in n}
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[n], theirs[n]) for n in mine)
