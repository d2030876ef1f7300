"""Encoder and packing introspection: which media tokens attend both ways, whether a model packs, its rope
positions per sequence, and its vision/audio encoder calls with the layout of their outputs (one call per modality
for a micro-batch's distinct prompts, split back per prompt)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used
    import torch


def media_blocks(model: Any, processor: Any = None) -> tuple[str, tuple[int, ...], frozenset[str]] | None:
    """Where media tokens attend to each other both ways (within one image or video's run of tokens), as the model's
    own masks make them: ``(key, values, layer types)``: the per-token input naming media tokens, the values that mark
    them, and the layer types whose mask gets the two-way blocks. Read from the checkpoint, as transformers' masks do:

    - the processor emits ``token_type_ids`` (Gemma 3: 1 marks image tokens): every layer, full and sliding;
    - ``use_bidirectional_attention: vision`` (Gemma 4: ``mm_token_type_ids`` 1 or 2, image or video tokens):
      sliding-window layers only, global layers stay causal.

    None where attention is causal everywhere."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    names = getattr(processor, "model_input_names", None) or []
    if any(getattr(c, "use_bidirectional_attention", None) == "vision" for c in (config, text)):
        return "mm_token_type_ids", (1, 2), frozenset({"sliding_attention"})
    if "token_type_ids" in names:
        return "token_type_ids", (1,), frozenset({"full_attention", "sliding_attention"})
    return None


def packing_support(model: Any, processor: Any = None, attn: str | None = None) -> tuple[bool, str]:
    """Whether a micro-batch of this model can be scored as one packed row (:func:`mmrl.model.packing.packed_hidden`)
    with the padded path's log-probs, and if not why. Read from the checkpoint, never from a family's name:

    - linear-attention layers (``layer_types`` holding ``linear_attention``: Qwen3.5's Gated-DeltaNet) pack with
      :mod:`mmrl.model.linear_attention`'s convolution and recurrence, which restart at each sequence (transformers' own
      torch path refuses packed rows, and its convolution would run across the boundary even with ``fla``);
    - media tokens that attend to each other both ways (:func:`media_blocks`: Gemma 3, Gemma 4) pack under
      ``mmrl_sdpa``, which builds each sequence's own mask with those blocks (:mod:`mmrl.model.attention`); not under
      flash-attention (``attn``), whose kernels are causal only; ``use_bidirectional_attention: all`` (no causal
      mask at all) never;
    - everything else (1-D RoPE, multimodal RoPE with ``get_rope_index``) packs exactly (tests/test_packing.py)."""
    from mmrl.model.linear_attention import packable

    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if "linear_attention" in (getattr(text, "layer_types", None) or []):
        ok, why = packable(model)
        if not ok:
            return False, why
    if any(getattr(c, "use_bidirectional_attention", None) in (True, "all") for c in (config, text)):
        return (
            False,
            "bidirectional attention over the whole sequence: a packed row has no causal order to keep",
        )
    if media_blocks(model, processor) and (attn or "").startswith("flash_attention"):
        return (
            False,
            "bidirectional media attention: flash-attention's kernels are causal only; "
            "model.attn_implementation: mmrl_sdpa packs it",
        )
    return True, ""


def rope_positions(
    model: Any, row: torch.Tensor, mm: dict[str, torch.Tensor], seq: dict[str, torch.Tensor]
) -> torch.Tensor | None:
    """A multimodal-RoPE model's positions ``[k, L]`` of one sequence alone (its own image/video grids), as the
    model computes them for that sequence in a padded batch; None for a model with plain 1-D positions."""
    import torch

    backbone = getattr(model, "model", None)
    rope_index = getattr(backbone, "get_rope_index", None)
    if rope_index is None:
        return None
    L = len(row)
    grids = {k: mm[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in mm}
    types = seq.get("mm_token_type_ids")
    if not any(k in grids for k in ("image_grid_thw", "video_grid_thw")) or types is None:
        return torch.arange(L).expand(3, L)
    dev = next(model.parameters()).device
    pos, _ = rope_index(
        input_ids=row[None].to(dev),
        mm_token_type_ids=types[None].to(dev),
        attention_mask=torch.ones((1, L), dtype=torch.long, device=dev),
        **{k: v.to(dev) for k, v in grids.items()},
    )
    return pos[:, 0].cpu()


def encoder_calls(model: Any) -> dict[str, tuple[str, Any, set[str]]]:
    """``modality -> (pixel input name, the backbone's feature function, the input names it takes)`` for a model whose
    forward takes precomputed vision features (transformers' ``mm_encoder_outputs``); empty otherwise."""
    import inspect

    backbone = getattr(model, "model", None) or model  # Llama 4 has no multimodal backbone: the model itself
    forward = getattr(backbone, "forward", None)
    if forward is None or "mm_encoder_outputs" not in inspect.signature(forward).parameters:
        return {}
    out = {}
    for modality, pixels, name in (
        ("image", "pixel_values", "get_image_features"),
        ("video", "pixel_values_videos", "get_video_features"),
    ):
        fn = getattr(backbone, name, None)
        if fn is not None:
            out[modality] = (pixels, fn, set(inspect.signature(fn).parameters))
    return out


def concat_encoder_outputs(outputs: list[Any]) -> Any:
    """Vision encoder outputs of several prompts as one batch's, for the fields a forward reads from
    ``mm_encoder_outputs``: ``pooler_output`` (a tensor over images or tiles: concatenated; a tuple of per-image
    features: joined), DeepStack's per-layer ``deepstack_features`` (joined layer by layer) and, where there is no
    pooled output (Llama 4), ``last_hidden_state``. The other fields (per-layer hidden states) are left out."""
    import torch

    def join(values: list[Any]) -> Any:
        if isinstance(values[0], torch.Tensor):
            return torch.cat(values, dim=0)
        return type(values[0])(x for v in values for x in v)

    first = outputs[0]
    keep = ["pooler_output", "deepstack_features"]
    if first.get("pooler_output") is None:
        keep.append("last_hidden_state")
    merged = {}
    for key in keep:
        values = [o.get(key) for o in outputs]
        if values[0] is None:
            continue
        if key == "deepstack_features":
            merged[key] = [join(list(layer)) for layer in zip(*values)]
        else:
            merged[key] = join(values)
    return type(first)(**merged)


# the inputs that hold one row per item of a vision encoder's output (an image, a video), where the pixel input's
# dim 0 counts something else (Qwen's patches, Gemma 4's video frames)
ITEM_SIZE_INPUTS = ("image_grid_thw", "video_grid_thw", "image_sizes", "num_frames_per_video")


def encoder_items(mm: dict[str, torch.Tensor], pixels: str, takes: set[str]) -> int:
    """How many items one prompt's media ``mm`` make along dim 0 of the vision encoder's output, for the feature
    function that takes ``pixels`` and the inputs ``takes`` (:func:`encoder_calls`): the rows of the per-item size
    input it takes (:data:`ITEM_SIZE_INPUTS`: grids of Qwen and GLM, image sizes of Mistral 3 and LLaVA-OneVision,
    Gemma 4's frames per video; only its own: a prompt with images and videos has a grid of each), else the pixel
    input's dim 0 (images of Gemma 3 and 4 and LLaVA-OneVision's videos, tiles of InternVL and Llama 4, Idefics3's one
    row of tiles per prompt)."""
    size = next((k for k in ITEM_SIZE_INPUTS if k in takes and k in mm), pixels)
    return int(mm[size].shape[0])


def encoder_tiles(mm: dict[str, torch.Tensor], pixels: str) -> int | None:
    """For a prompt whose pixel input stacks tiles per row (``[rows, tiles, C, H, W]``: Idefics3, SmolVLM2), the tiles
    that are not all zero: the feature function drops the all-zero padding tiles, and transformers before 5.23 returns
    one tensor over the real tiles rather than one entry per row; None for other inputs."""
    x = mm[pixels]
    return int((x.flatten(2) != 0).any(-1).sum()) if x.dim() == 5 else None


def split_encoder_outputs(output: Any, counts: list[int], name: str) -> list[Any]:
    """One vision encoder output of several prompts' media, encoded as one batch, split back into each prompt's: the
    inverse of :func:`concat_encoder_outputs`, for the same fields. ``counts`` are the prompts' items in order
    (:func:`encoder_items`). A field over items (a tuple or list of per-item tensors, or a tensor whose dim 0 is the
    items) is cut into runs of ``counts``; a DeepStack layer is cut likewise when it holds the same items, or by the
    prompts' tokens (their items' lengths in ``pooler_output``) when it is one tensor over all items' tokens. The
    pieces are slices of the one encoding, so gradients flow back into it. Raises, naming ``name`` (the family and
    modality) and the field, where a field does not hold the items the inputs say."""
    import torch

    def runs(sizes: list[int]) -> list[slice]:
        ends = torch.tensor(sizes, dtype=torch.long).cumsum(0).tolist()
        return [slice(e - n, e) for n, e in zip(sizes, ends)]

    def cut(value: Any, sizes: list[int], field: str) -> list[Any]:
        if isinstance(value, torch.Tensor) and value.dim() and len(value) == sum(sizes):
            return list(torch.split(value, sizes))
        if isinstance(value, (list, tuple)) and len(value) == sum(sizes):
            return [type(value)(value[r]) for r in runs(sizes)]
        held = f"a {type(value).__name__}"
        if isinstance(value, torch.Tensor):
            held = f"a tensor of shape {tuple(value.shape)}"
        elif isinstance(value, (list, tuple)):
            held += f" of {len(value)}"
        raise ValueError(
            f"{name}: cannot split the vision encoder's {field} ({held}) into the prompts' items {sizes} "
            f"(sum {sum(sizes)}): a layout mmrl.model.encoders.split_encoder_outputs does not know"
        )

    keep = ["pooler_output", "deepstack_features"]
    if output.get("pooler_output") is None:
        keep.append("last_hidden_state")
    parts: list[dict[str, Any]] = [{} for _ in counts]
    for key in keep:
        value = output.get(key)
        if value is None:
            continue
        if key == "deepstack_features":
            pooled = output.get("pooler_output")
            layers = []
            for i, layer in enumerate(value):
                sizes = counts
                if isinstance(layer, torch.Tensor) and isinstance(pooled, (list, tuple)):  # over all tokens
                    sizes = [sum(len(t) for t in pooled[r]) for r in runs(counts)]
                layers.append(cut(layer, sizes, f"{key}[{i}]"))
            pieces = [list(layer_pieces) for layer_pieces in zip(*layers)] if layers else [[] for _ in counts]
        else:
            pieces = cut(value, counts, key)
        for part, piece in zip(parts, pieces):
            part[key] = piece
    if not parts or not parts[0]:
        raise ValueError(f"{name}: the vision encoder's output holds none of {keep}; nothing to split")
    return [type(output)(**part) for part in parts]
