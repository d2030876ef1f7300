"""Tiny random checkpoints of InternVL 3 (HF format) and LLaVA-OneVision, built offline like :mod:`mmrl.tiny.families`.

Each builder returns ``(model, processor, stop_token_strings, special_tokens)``; saved with ``save_pretrained``, the
checkpoint loads back through ``AutoModelForImageTextToText`` / ``AutoProcessor`` like the released one, so tests run
the family's real modelling and processing code (tiling included).

- ``internvl`` (as ``OpenGVLab/InternVL3-1B-hf``): ``InternVLForConditionalGeneration`` (InternViT tower, pixel
  shuffle 0.5, the CLS feature dropped, a LayerNorm-MLP projector, a Qwen2 text model as Qwen2.5-0.5B);
  ``InternVLProcessor`` with ``GotOcr2ImageProcessor`` (dynamic tiles: the grid of at most ``max_patches`` tiles
  closest to the image's aspect ratio, plus a thumbnail when there is more than one tile) and
  ``InternVLVideoProcessor``. Each image becomes ``<img>`` + ``<IMG_CONTEXT>`` x (tiles x tokens per tile) +
  ``</img>``; each video frame ``Frame{i}: <img>...</img>``. As released, the image processor config stores
  ``crop_to_patches=False`` and tiling comes from ``InternVLProcessor``'s own call default (``crop_to_patches=True``);
  calling the image processor alone does not tile. The template is the -hf release's ``chat_template.jinja``
  verbatim (no default system prompt; a system message is rendered as an ordinary turn; string or list content;
  no BOS). The original (remote-code) InternVL3 ``chat()`` adds :data:`INTERNVL3_SYSTEM_PROMPT` when none is given.
- ``llava_onevision`` (as ``llava-hf/llava-onevision-qwen2-0.5b-ov-hf``): ``LlavaOnevisionForConditionalGeneration``
  (SigLIP tower with patch 14 and no head, all patch features kept: ``vision_feature_select_strategy="full"``, a
  learned ``image_newline``, a Qwen2 text model); ``LlavaOnevisionProcessor`` with ``LlavaOnevisionImageProcessor``
  (anyres: a base view plus the tiles of the best ``image_grid_pinpoints`` resolution, unpadded, one newline per
  feature row, bilinearly pooled down when above ``anyres_max_9``) and ``LlavaOnevisionVideoProcessor`` (frames
  pooled 2x2). Images handed over nested per prompt (``images=[[a, b]]``) make a multi-image prompt: the base view
  only for each (+1 newline); a flat list (``images=[a, b]``) makes each image a single-image case with anyres, as
  vLLM always does. The template is the -hf conversion's (images first, then videos, then the text; ``{% generation %}`` marks
  around assistant text; no default system prompt; list content only: a plain-string content renders as nothing;
  no BOS). The original LLaVA-NeXT ``qwen_1_5`` conversation uses :data:`LLAVA_OV_SYSTEM_PROMPT`.

What is real: the special-token strings and their order, the tokenizer class (``Qwen2Tokenizer``, Qwen2's split
regex), the named tokenizer tokens the processors read (InternVL's ``start_image_token``...), the patch size 14,
InternVL's pixel shuffle 0.5 and its tile rule, LLaVA-OV's pinpoint structure (every (i, j) tiles up to 6 x 6, as the
release's multiples of 384), ``anyres_max_9``, feature-selection strategies and feature layers, the processors'
normalisation and resampling. What is scaled down: widths and depths (text hidden 64, two layers; vision hidden 32,
two layers), the vocabulary (the BPE of :func:`mmrl.tiny.tokenization.tokenizer_corpus`, plus :data:`mmrl.tiny.tokenization.FORMAT_TAGS` as
ordinary added tokens, as in the Qwen tiny models; the Qwen2.5 tool/FIM added tokens are left out as there), the
tile sizes (InternVL 448 -> 56 = 4 x 14 px, so a tile gives (56 / 14 / 2)^2 = 4 tokens; SigLIP 384 -> 64 px, which
like 384 is not a multiple of 14, so a tile gives (64 // 14)^2 = 16 features) and InternVL's ``max_patches`` (12 ->
6). Text attention has 2 heads of 64 / 2 = 32 dims (one KV head): vLLM's CPU attention takes no head size below 32.
Weights come from ``torch.manual_seed(seed)`` and the model's own initialisation: neither family zero-initialises a
projection (InternViT's zero position embeddings and CLS token leave the patch embedding, and so the image, in play).
The LLaVA-OneVision model is handed back reloaded from the released key layout (``vision_tower.vision_model.*``,
:func:`mmrl.tiny.layouts.reload_in_release_layout`), so that ``save_pretrained`` writes a checkpoint vLLM can load.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import AddedToken, GenerationConfig

from mmrl.tiny.layouts import reload_in_release_layout
from mmrl.tiny.tokenization import FORMAT_TAGS, QWEN_SPECIAL_TOKENS, train_tokenizer

# ------------------------------------------------------------------------------------------------------ InternVL
# Added after Qwen2.5-VL's tokens by the -hf conversion, in this order (151665..151674 in the release); all but
# <video> are also listed as extra special tokens.
INTERNVL_TOKENS = (
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
    "<quad>",
    "</quad>",
    "<ref>",
    "</ref>",
    "<box>",
    "</box>",
    "<video>",
)
# the named tokenizer tokens InternVLProcessor reads (tokenizer_config.json of the -hf release)
INTERNVL_NAMED_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
# the default system message of the original InternVL 2.5 / 3 chat() (conversation template "internvl2_5"); the -hf
# template below does not add it
INTERNVL3_SYSTEM_PROMPT = "你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的多模态大语言模型。"
# OpenGVLab/InternVL3-1B-hf chat_template.jinja (481 bytes), verbatim
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)
INTERNVL_TILE = 56  # the release's 448 = 32 x 14, scaled to 4 x 14
INTERNVL_MAX_PATCHES = 6
INTERNVL_DOWNSAMPLE = 0.5
INTERNVL_TOKENS_PER_TILE = int((INTERNVL_TILE // 14 * INTERNVL_DOWNSAMPLE) ** 2)  # 4 (the release: 256)
INTERNVL_CONTEXT_LENGTH = 8192  # the -hf tokenizer's model_max_length
INTERNVL_MEAN_STD = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
INTERNVL_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": INTERNVL_TILE,
    "patch_size": 14,
    "attention_bias": True,  # InternViT-300M: qkv_bias
    "use_qk_norm": False,
    "norm_type": "layer_norm",
    "layer_norm_eps": 1e-6,
    "use_mean_pooling": True,
    "use_absolute_position_embeddings": True,
    "layer_scale_init_value": 0.1,
}

# ------------------------------------------------------------------------------------------------ LLaVA-OneVision
# Qwen2-Instruct's three special tokens, then <image> and <video> added by the -hf conversion (151643..151647)
LLAVA_OV_QWEN2_TOKENS = QWEN_SPECIAL_TOKENS[:3]
LLAVA_OV_MEDIA_TOKENS = ("<image>", "<video>")
# the system message of the original LLaVA-NeXT "qwen_1_5" conversation; the -hf template below does not add it
LLAVA_OV_SYSTEM_PROMPT = "You are a helpful assistant."
# the -hf conversion's chat template (convert_llava_onevision_weights_to_hf.py), verbatim
LLAVA_OV_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>\n' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] }}{% endgeneration %}{% endfor %}"
    "{% endif %}{{'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAVA_OV_TILE = 64  # SigLIP's 384 (not a multiple of 14: 27 patches a side) scaled to 64 (4 patches a side)
LLAVA_OV_GRID = 6  # pinpoints: every (rows, columns) up to 6 x 6 tiles, as the release's multiples of 384
LLAVA_OV_PINPOINTS = [
    [LLAVA_OV_TILE * i, LLAVA_OV_TILE * j]
    for i in range(1, LLAVA_OV_GRID + 1)
    for j in range(1, LLAVA_OV_GRID + 1)
]
LLAVA_OV_TOKENS_PER_TILE = (LLAVA_OV_TILE // 14) ** 2  # 16 (the release: 729)
LLAVA_OV_ASPECT = "anyres_max_9"
LLAVA_OV_MEAN_STD = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
LLAVA_OV_VISION = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,  # the release keeps 26 of SigLIP-so400m's 27 layers
    "num_attention_heads": 2,
    "image_size": LLAVA_OV_TILE,
    "patch_size": 14,
    "vision_use_head": False,
}

# Qwen2 / Qwen2.5 text models of both releases (0.5B: tied embeddings, rope theta 1e6, grouped-query attention),
# scaled down. head_dim 64 / 2 = 32: vLLM's CPU attention takes head sizes 32, 64, 80... (not 16)
QWEN2_TEXT = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "tie_word_embeddings": True,
}
STOP_TOKENS = ["<|im_end|>", "<|endoftext|>"]


def internvl_tokenizer() -> Any:
    """Qwen2.5-VL's tokenizer (:func:`mmrl.tiny.tokenization.train_tokenizer`) with InternVL's tokens after it and the named
    image/video tokens ``InternVLProcessor`` reads, as in the -hf release."""
    tokenizer = train_tokenizer(INTERNVL_CHAT_TEMPLATE)
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in INTERNVL_TOKENS], special_tokens=True
    )
    tokenizer.add_special_tokens(
        {"extra_special_tokens": list(INTERNVL_TOKENS[:-1])}, replace_extra_special_tokens=False
    )
    # transformers' own route for named model-specific tokens (what from_pretrained does with the saved config);
    # passing them to the constructor would add them to the vocabulary first, before Qwen's tokens
    tokenizer._set_model_specific_special_tokens(dict(INTERNVL_NAMED_TOKENS))
    tokenizer.model_max_length = INTERNVL_CONTEXT_LENGTH
    return tokenizer


def llava_onevision_tokenizer() -> Any:
    """Qwen2-Instruct's tokenizer (three special tokens; Qwen2-Instruct's tokenizer_config lists <|im_start|> and
    <|im_end|> as additional special tokens) with ``<image>`` and ``<video>``, over the BPE of
    :func:`mmrl.tiny.tokenization.train_tokenizer` (whose Qwen2.5-VL special tokens Qwen2 does not have)."""
    return train_tokenizer(
        LLAVA_OV_CHAT_TEMPLATE,
        specials=LLAVA_OV_QWEN2_TOKENS + LLAVA_OV_MEDIA_TOKENS,
        extra_specials=LLAVA_OV_QWEN2_TOKENS[1:],
    )


def _text_config(tokenizer: Any) -> dict[str, Any]:
    return dict(
        QWEN2_TEXT,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )


def _finish(config: Any, tokenizer: Any, seed: int) -> tuple[Any, list[str]]:
    from transformers import AutoModelForImageTextToText

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
    eos = [tokenizer.convert_tokens_to_ids(t) for t in STOP_TOKENS]
    model.generation_config = GenerationConfig(
        bos_token_id=config.get_text_config().bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model, list(STOP_TOKENS)


def build_internvl(seed: int = 0) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    """Tiny ``InternVLForConditionalGeneration`` + ``InternVLProcessor`` (see the module docstring)."""
    from transformers import GotOcr2ImageProcessor, InternVLConfig, InternVLProcessor, InternVLVideoProcessor

    tokenizer = internvl_tokenizer()
    config = InternVLConfig(
        text_config=_text_config(tokenizer),
        vision_config=dict(INTERNVL_VISION),
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=INTERNVL_TOKENS_PER_TILE,
        downsample_ratio=INTERNVL_DOWNSAMPLE,
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )
    tile = {"height": INTERNVL_TILE, "width": INTERNVL_TILE}
    # as released: crop_to_patches stays False here; InternVLProcessor's call default turns the tiling on
    image = GotOcr2ImageProcessor(
        size=tile, min_patches=1, max_patches=INTERNVL_MAX_PATCHES, crop_to_patches=False, **INTERNVL_MEAN_STD
    )
    video = InternVLVideoProcessor(size=tile, **INTERNVL_MEAN_STD)
    processor = InternVLProcessor(
        image_processor=image,
        tokenizer=tokenizer,
        video_processor=video,
        image_seq_length=INTERNVL_TOKENS_PER_TILE,
        chat_template=INTERNVL_CHAT_TEMPLATE,
    )
    model, stops = _finish(config, tokenizer, seed)
    return model, processor, stops, QWEN_SPECIAL_TOKENS + INTERNVL_TOKENS + FORMAT_TAGS


def build_llava_onevision(seed: int = 0) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    """Tiny ``LlavaOnevisionForConditionalGeneration`` + ``LlavaOnevisionProcessor`` (see the module docstring)."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    tokenizer = llava_onevision_tokenizer()
    config = LlavaOnevisionConfig(
        text_config=_text_config(tokenizer),
        vision_config=dict(LLAVA_OV_VISION),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        projector_hidden_act="gelu",
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=[list(p) for p in LLAVA_OV_PINPOINTS],
        vision_aspect_ratio=LLAVA_OV_ASPECT,
        multimodal_projector_bias=True,
        tie_word_embeddings=True,
    )
    tile = {"height": LLAVA_OV_TILE, "width": LLAVA_OV_TILE}
    image = LlavaOnevisionImageProcessor(
        size=tile,
        image_grid_pinpoints=[list(p) for p in LLAVA_OV_PINPOINTS],
        do_pad=True,
        **LLAVA_OV_MEAN_STD,
    )
    video = LlavaOnevisionVideoProcessor(size=tile, **LLAVA_OV_MEAN_STD)
    processor = LlavaOnevisionProcessor(
        image_processor=image,
        tokenizer=tokenizer,
        video_processor=video,
        num_image_tokens=LLAVA_OV_TOKENS_PER_TILE,
        vision_feature_select_strategy="full",
        chat_template=LLAVA_OV_CHAT_TEMPLATE,
        vision_aspect_ratio=LLAVA_OV_ASPECT,
    )
    model, stops = _finish(config, tokenizer, seed)
    model = reload_in_release_layout(model)
    return model, processor, stops, LLAVA_OV_QWEN2_TOKENS + LLAVA_OV_MEDIA_TOKENS + FORMAT_TAGS


BUILDERS = {"internvl": build_internvl, "llava_onevision": build_llava_onevision}


# ------------------------------------------------------------------------------------------ image-token counts
def expected_image_tokens(processor: Any, width: int, height: int, *, multi_image: bool = False) -> int:
    """How many image placeholder tokens (``<IMG_CONTEXT>`` / ``<image>``, the ones replaced by vision features) the
    processor writes for one ``width x height`` image, worked out from the processor's config alone (the released
    rules re-implemented here, not the processor's own counting). InternVL's ``<img>``/``</img>`` are not counted.
    ``multi_image``: the image is one of several in its prompt, the images handed over nested per prompt
    (LLaVA-OneVision then skips anyres; with a flat list of images, as vLLM, every image is a single-image case)."""
    name = type(processor).__name__
    if name == "InternVLProcessor":
        return _internvl_tiles(processor, width, height) * int(processor.image_seq_length)
    if name == "LlavaOnevisionProcessor":
        return _llava_ov_tokens(processor, width, height, multi_image)
    raise TypeError(f"expected_image_tokens: no rule for {name}")


def _call_default(processor: Any, key: str, fallback: Any) -> Any:
    """An images kwarg as a processor call resolves it: the processor class's call defaults (a class attribute
    ``images_kwargs`` from transformers 5.23, ``valid_processor_kwargs._defaults`` before) win over the image
    processor's own attribute."""
    declared = dict(getattr(type(processor), "images_kwargs", None) or {})
    legacy = getattr(getattr(processor, "valid_processor_kwargs", None), "_defaults", None) or {}
    declared.update(legacy.get("images_kwargs", {}))
    return declared.get(key, fallback)


def _internvl_tiles(processor: Any, width: int, height: int) -> int:
    """InternVL's dynamic tiling: among the grids of ``min_patches..max_patches`` tiles (ordered by tile count), the
    one whose columns/rows ratio is closest to the image's width/height; on a tie the later (larger) grid wins while
    the image's area exceeds half the grid's. More than one tile adds a thumbnail."""
    ip = processor.image_processor
    if not _call_default(processor, "crop_to_patches", ip.crop_to_patches):
        return 1
    lo, hi = int(ip.min_patches), int(ip.max_patches)
    tile_h, tile_w = int(ip.size["height"]), int(ip.size["width"])
    grids = sorted(
        ((c, r) for c in range(1, hi + 1) for r in range(1, hi + 1) if lo <= c * r <= hi),
        key=lambda g: g[0] * g[1],
    )
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in grids:
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and area > 0.5 * tile_h * tile_w * cols * rows:
            best = (cols, rows)
    n = best[0] * best[1]
    return n + 1 if n > 1 else 1


def _best_pinpoint(height: int, width: int, pinpoints: list[list[int]]) -> tuple[int, int]:
    """LLaVA-NeXT's choice of resolution: the most of the image kept (scaled to fit, never above its own size),
    then the least padding."""
    best, best_kept, best_waste = None, -1, float("inf")
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        waste = ph * pw - kept
        if kept > best_kept or (kept == best_kept and waste < best_waste):
            best, best_kept, best_waste = (ph, pw), kept, waste
    return best


def _llava_ov_tokens(processor: Any, width: int, height: int, multi_image: bool) -> int:
    """Base view + anyres grid: the grid's features with the padding rows/columns removed (the image is letterboxed
    into the pinpoint), pooled bilinearly when above ``anyres_max_N`` tiles' worth (> 1.1 x), one newline per
    feature row; a multi-image prompt gets the base view and one newline per image."""
    ip = processor.image_processor
    base = int(processor.num_image_tokens)
    side = math.isqrt(base)
    if multi_image:
        total = base + 1
    else:
        tile = int(ip.size["height"])
        ph, pw = _best_pinpoint(height, width, ip.image_grid_pinpoints)
        cur_h, cur_w = side * (ph // tile), side * (pw // tile)
        if width / height > cur_w / cur_h:
            pad = (cur_h - int(round(height * (cur_w / width), 7))) // 2
            cur_h -= 2 * pad
        else:
            pad = (cur_w - int(round(width * (cur_h / height), 7))) // 2
            cur_w -= 2 * pad
        rows, cols = cur_h, cur_w
        max_tiles = int(processor.vision_aspect_ratio.removeprefix("anyres_max_"))
        ratio = math.sqrt(cur_h * cur_w / (max_tiles * side**2))
        if ratio > 1.1:
            rows, cols = int(cur_h // ratio), int(cur_w // ratio)
        total = base + rows * cols + rows
    if processor.vision_feature_select_strategy == "default":
        total -= 1
    return total
