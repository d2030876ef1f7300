"""Where things sit inside an HF VLM: the text decoder's module name, which parameters are the vision side, the
LoRA targets, the experts, and the weights a release stores transposed. Read by LoRA, freezing, FSDP and the
planner."""

from __future__ import annotations

from typing import Any


# ---------------------------------------------------------------------------------------------- language model
def language_model_prefix(model: Any) -> str:
    """The module name of the text decoder inside an HF VLM (``model.language_model``, Idefics3's
    ``model.text_model``, ...): the module ``get_decoder()`` returns, else the first ``language_model`` or
    ``text_model``. Everything outside it but the output head is the vision side (tower and projector)."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    names = dict(model.named_modules())
    for name, module in names.items():
        if name and module is decoder:
            return name
    for name in names:
        if name.rsplit(".", 1)[-1] in ("language_model", "text_model"):
            return name
    raise ValueError(
        f"cannot find the language model inside {type(model).__name__}: no get_decoder() and no module named "
        "language_model or text_model; set model.lora.target_modules explicitly"
    )


def is_vision_param(name: str, decoder: str) -> bool:
    """Whether parameter ``name`` belongs to the vision side: neither the text decoder nor the output head."""
    return not (name.startswith(f"{decoder}.") or name.split(".")[0] == "lm_head")


def lora_targets(linears: list[str], decoder: str, vision: bool = False) -> list[str]:
    """peft's ``target_modules`` for the default LoRA set, as whole module names (a list: peft 0.21 reads a leaf
    name such as ``down_proj`` in a regex as a fused-expert parameter too, and would adapt the experts): every
    ``Linear`` of the text decoder by its leaf name (attention, MLP, fused projections such as GLM-4V's
    ``gate_up_proj``, Qwen3.5's linear-attention ``in_proj_qkv``/``in_proj_z``/``in_proj_b``/``in_proj_a``/
    ``out_proj``, shared experts and their ``shared_expert_gate``), and with ``vision`` every ``Linear`` of the
    vision tower and projector too. Fused MoE expert weights are 3-D parameters, not ``Linear`` modules: they stay
    frozen, and ``model.lora.experts`` is refused (:func:`mmrl.model.lora.lora_config`)."""
    text = [n for n in linears if n.startswith(f"{decoder}.")]
    if not text:
        raise ValueError(f"no Linear layer under {decoder}: set model.lora.target_modules explicitly")
    return text + ([n for n in linears if is_vision_param(n, decoder)] if vision else [])


def expert_params(model: Any) -> list[str]:
    """Fused MoE expert weights (3-D parameters under an ``experts`` module) of the model."""
    return [n for n, p in model.named_parameters() if p.dim() == 3 and ".experts." in f".{n}"]


def release_transposes(model: Any) -> list[tuple[str, int, int]]:
    """``(pattern, dim0, dim1)`` of weights whose released layout is the in-memory one transposed, read from
    transformers' conversion mapping: its shape-checked ``Transpose`` converters (Qwen3-VL-MoE's fused experts:
    ``gate_up_proj`` and ``down_proj`` are stored [experts, in, out] at release, [experts, out, in] in memory).
    transformers' own ``save_pretrained`` never transposes them back (the check compares a tensor with the model's
    own parameter, which always matches), so its saves are not in the release layout, while vLLM reads only that."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import Transpose, WeightConverter
    except ImportError:  # a transformers without conversion mappings
        return []
    out = []
    for conv in get_model_conversion_mapping(model, add_legacy=False):
        ops = getattr(conv, "operations", None) or []
        if not isinstance(conv, WeightConverter) or not ops:
            continue
        if (
            all(isinstance(op, Transpose) and getattr(op, "check_dims", False) for op in ops)
            and len(ops) == 1
        ):
            out += [(str(p), ops[0].dim0, ops[0].dim1) for p in conv.target_patterns]
    return out
