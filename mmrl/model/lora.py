"""LoRA for the policy (peft): the adapters injected or loaded, the default targets, and the merge of an adapted
``Linear`` into plain weights for the vLLM weight sync and merged checkpoints (:class:`mmrl.model.policy.Policy`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from mmrl.config import ModelConfig

log = logging.getLogger("mmrl.model.policy")


def add_lora(model: Any, cfg: ModelConfig, adapter: Path | None) -> Any:
    """Inject LoRA adapters into ``model`` in place (fresh, or loaded from a checkpoint's ``adapter/``)."""
    from peft import PeftModel, get_peft_model

    with _native_peft_targets():
        if adapter is not None:
            if not (adapter / "adapter_config.json").is_file():
                raise FileNotFoundError(
                    f"LoRA checkpoint without an adapter: {adapter} (was it saved with model.lora.r > 0?)"
                )
            return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
        return get_peft_model(model, lora_config(model, cfg))


@contextmanager
def _native_peft_targets():
    """Keep peft from rewriting mmrl's LoRA targets as transformers-v4 MoE names.

    peft (0.19-0.21) converts every LoRA config it injects as if it were written for transformers v4: on a model
    whose conversion mapping fused the experts (GLM-4.5V, Qwen3-MoE and the other ``qwen2_moe``-mapped types) any
    target ending in ``.gate_proj``/``.up_proj``/``.down_proj`` is taken for a v4 expert, dropped from
    ``target_modules`` and turned into the fused ``target_parameters``: GLM-4.5V's dense first MLP and its shared
    experts then get no adapter, and the frozen experts get one (huggingface/peft#3711, open). mmrl's targets are
    whole module names of the loaded v5 model, and its saved adapters are v5 ones, so there is nothing to convert:
    the conversion is switched off while mmrl injects or loads an adapter."""
    try:
        from peft.utils import transformers_weight_conversion as conv
    except ImportError:  # a peft without the v4 -> v5 conversion
        yield
        return
    original = conv.convert_peft_config_for_transformers
    conv.convert_peft_config_for_transformers = lambda *args, **kwargs: None
    try:
        yield
    finally:
        conv.convert_peft_config_for_transformers = original


def lora_config(model: Any, cfg: ModelConfig) -> Any:
    """peft's ``LoraConfig`` for ``model.lora``; ``target_modules: auto`` is read from the model's module names
    (:func:`mmrl.model.layout.lora_targets`)."""
    from peft import LoraConfig as PeftLoraConfig

    from mmrl.model.layout import expert_params, language_model_prefix, lora_targets

    lo = cfg.lora
    experts = expert_params(model)
    if lo.experts:
        raise ValueError(
            f"model.lora.experts: {type(model).__name__} has {len(experts)} fused MoE expert weights "
            f"({experts[0] if experts else 'none'}, ...); peft adapts such 3-D parameters only through "
            "target_parameters, whose adapters mmrl cannot merge into the vLLM engine or a merged checkpoint. "
            "Set model.lora.experts: false (the experts stay frozen; attention, shared experts and dense MLPs get "
            "adapters) or train the full model (model.lora.r: 0)"
        )
    target = lo.target_modules
    if target == "auto":
        head = model.get_output_embeddings()
        # plain Linears only: a subclass with its own forward (Llama 4's router returns a tuple) is not a projection
        linears = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear and m is not head]
        target = lora_targets(linears, language_model_prefix(model), vision=lo.vision)
    if experts:
        log.info("LoRA: %d fused MoE expert weights stay frozen (model.lora.experts)", len(experts))
    return PeftLoraConfig(r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout, target_modules=target)


def lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """The model's LoRA layers by module name; only plain ``Linear`` adapters (no DoRA) can be merged."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    layers = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        dora = any(getattr(module, "use_dora", {}).get(a, False) for a in module.active_adapters)
        if not isinstance(module, LoraLinear) or dora:
            raise TypeError(
                f"LoRA layer {name} is a {type(module).__name__}: only plain Linear adapters can be merged; "
                "narrow model.lora.target_modules to Linear projections"
            )
        layers[name] = module
    return layers


def lora_owner(key: str, layers: dict[str, Any]) -> str | None:
    """The LoRA layer a state key belongs to (``<layer>.base_layer.*``, ``<layer>.lora_A.*``, ...), or None."""
    for marker in (".base_layer.", ".lora_"):
        owner = key.split(marker)[0] if marker in key else None
        if owner in layers:
            return owner
    return None


def merge_lora(
    items: Iterable[tuple[str, torch.Tensor]], layers: dict[str, Any], dtype: torch.dtype | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``items`` (state keys in model order) with each LoRA layer's tensors replaced by its merged weight
    ``W + sum_a scaling_a B_a A_a`` (peft's ``get_delta_weight`` for ``Linear``, computed here from the tensors
    because a sharded module holds only its shard) and its bias, yielded once the layer's last tensor has been read.
    Merged tensors are cast to ``dtype`` (default: the base weight's); the others are passed on as they come."""
    owner, held = None, {}
    for key, t in items:
        layer = lora_owner(key, layers)
        if held and layer != owner:
            yield from _merged_layer(owner, layers[owner], held, dtype)
            held = {}
        if layer is None:
            yield key, t
        else:
            owner = layer
            held[key[len(layer) + 1 :]] = t
    if held:
        yield from _merged_layer(owner, layers[owner], held, dtype)


def _merged_layer(
    name: str, module: Any, held: dict[str, torch.Tensor], dtype: torch.dtype | None
) -> Iterator[tuple[str, torch.Tensor]]:
    w = held["base_layer.weight"]
    delta = torch.zeros_like(w, dtype=torch.float32)
    for a in module.active_adapters:
        d = held[f"lora_B.{a}.weight"].float() @ held[f"lora_A.{a}.weight"].float()
        delta += (d.T if module.fan_in_fan_out else d) * module.scaling[a]
    yield f"{name}.weight", (w.float() + delta).to(dtype or w.dtype)
    if "base_layer.bias" in held:
        bias = held["base_layer.bias"]
        yield f"{name}.bias", bias if dtype is None else bias.to(dtype)
