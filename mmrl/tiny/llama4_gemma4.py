"""Tiny random checkpoints of Llama 4 and Gemma 4, built offline like those of :mod:`mmrl.tiny.families`.

``BUILDERS[name](seed)`` returns ``(model, processor, stop_token_strings, special_tokens)``; ``save_pretrained`` of the
model and the processor gives a folder that ``AutoModelForImageTextToText`` / ``AutoProcessor`` load like the
released checkpoint, so tests run the family's real modelling and processing code (and vLLM's, which reads the same
files).

- ``llama4``: ``Llama4ForConditionalGeneration``; ``Llama4Processor`` with ``Llama4ImageProcessor``, which tiles: the
  image is resized without distortion (never upscaled beyond one tile) into the best canvas of at most
  ``max_patches`` (16, as released) square tiles of ``size``, padded, cut into tiles, and followed by a global view
  (the whole image resized to one tile) when there is more than one tile. Each tile is a ``patch_size`` (14) grid
  whose tokens are pixel-shuffled by 0.5, so a tile of ``t`` px becomes ``(t // 14) ** 2 // 4`` ``<|patch|>`` tokens;
  the text is ``<|image_start|>`` then, for more than one tile, rows of tiles separated by ``<|tile_x_separator|>``,
  each row ending with ``<|tile_y_separator|>``, then ``<|image|>`` and the global view's ``<|patch|>`` tokens, then
  ``<|image_end|>`` (:func:`expected_image_tokens`). Text: Scout's layer set-up (qk-norm, llama3 RoPE scaling,
  chunked attention on RoPE layers, attention temperature tuning on the no-RoPE layers) with a no-RoPE layer every
  second layer instead of every fourth, and Maverick's dense/MoE interleave (4 experts, top 1, plus the shared
  expert), so that both attention kinds and both feed-forward kinds are present in two layers. Tokenizer:
  ``PreTrainedTokenizerFast`` (``TokenizersBackend``) as released, byte-level BPE with Llama 4's (o200k) split
  regex; it adds ``<|begin_of_text|>`` on encoding and the template writes it too.
- ``gemma4``: ``Gemma4ForConditionalGeneration`` without the audio tower (``audio_config`` None, as the 31B and
  26B-A4B releases); ``Gemma4Processor`` with ``Gemma4ImageProcessor`` (patch 16, pooling 3x3, ``max_soft_tokens``
  70: aspect-preserving resize to the largest multiple of 48 px on each side within 70 * 9 patches, i.e. at most 70
  soft tokens) and ``Gemma4VideoProcessor`` (same geometry, 70 soft tokens a frame, 4 frames sampled instead of 32).
  The text follows the 31B layout: sliding-window then full-attention layers, global layers with their own head
  size, one kv head and keys reused as values (``attention_k_eq_v``), no per-layer embeddings, bidirectional
  attention inside each image in the sliding layers (``use_bidirectional_attention="vision"``: the forward needs the
  processor's ``mm_token_type_ids`` for it; ``bidirectional_vision=False`` gives the E2B/E4B causal attention),
  final-logit soft-capping 30. ``GemmaTokenizer`` (Gemma's pipeline: spaces as ``▁``, byte fallback) with Gemma 4's
  special tokens; it adds ``<bos>`` on encoding and the template writes it too. Template: the 31B-it one without tools: an optional system turn (also opened, with ``<|think|>``, when
  ``enable_thinking``), the assistant called ``model``, thinking stripped from earlier model turns, and the
  generation prompt ``<|turn>model\\n`` followed, when thinking is off, by the empty thought channel
  ``<|channel>thought\\n<channel|>`` (the E2B/E4B release templates leave that out).

What is real: the processors' geometry (tile rule, patch, pixel shuffle, pooling, soft-token budgets), the special
token strings in their real relative order (reserved/unused placeholders between them are left out), the tokenizer
classes and pipelines, and the templates' structure. What is scaled down: widths and depths (text hidden 64, two
layers; vision hidden 32, two layers), the vocabulary (the BPE of :func:`mmrl.tiny.tokenization.tokenizer_corpus`), Llama 4's
tile (56 px instead of 336: 4x4 patches, 4 tokens a tile), Gemma 4's image budget (70 soft tokens, the smallest the
processor accepts; the release default is 280) and its vision position table (512 positions a side instead of
10240, enough for a patch grid up to 8192 px a side). Text attention heads are 32 wide (global Gemma 4 layers 64):
vLLM's CPU attention takes no smaller head size. Llama 4 ties its input and output embeddings here (the release does
not) to stay under 500 k parameters. Weights come from ``torch.manual_seed(seed)`` and the model's own
initialisation (the same files from transformers 5.19 and 5.23): neither family zero-initialises its image
projection (Llama 4's ``multi_modal_projector`` and Gemma 4's ``embed_vision`` are normal(0, 0.02)), so nothing is
redrawn; Gemma 4's vision position table starts at ones, as transformers initialises it.

Processor behaviour a caller must know (checked with these checkpoints):

- Both tokenizers add the BOS on encoding and both templates write it: call the processor with
  ``add_special_tokens=False`` on rendered text (its default doubles the BOS; ``apply_chat_template(tokenize=True)``
  does not). vLLM adds a BOS to a Llama 4 text prompt (strip the template's or the prompt starts with two) but not
  to a Gemma 4 one (vLLM's Gemma 4 processor turns ``add_special_tokens`` off when there is a chat template).
- Llama 4's image processor returns bfloat16 ``pixel_values`` (it rescales and normalises in bfloat16, as the
  original code): cast them to the model's dtype before a float32 forward. Tiles of all images are concatenated on
  dim 0 (``(total tiles, 3, tile, tile)``; ``aspect_ratios`` is dropped from the output), the processor pads left.
- Gemma 4 pads every image to ``max_soft_tokens * 9`` patches (``pixel_values (images, patches, 768)``,
  ``image_position_ids`` padded with -1, never 0) and pads text right. Its resize is reproduced exactly by resizing
  to :func:`gemma4_resize_target` with torchvision's antialiased bicubic on the uint8 image and ``do_resize=False``;
  with ``do_resize=False`` any image whose sides are multiples of ``patch_size * pooling_kernel_size`` (48) passes,
  budget unchecked, and gets ``(h / 48) * (w / 48)`` tokens; other sides fail. The resize is not idempotent (a
  resized 31x300 image, 96x1248, would be resized again to 96x1440).
- Gemma 4's forward needs ``mm_token_type_ids`` for the bidirectional image attention; vLLM's CPU backend has no
  such attention mode and runs it causally, so vLLM-CPU logprobs equal the transformers forward without
  ``mm_token_type_ids``, not with it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AddedToken, GenerationConfig

from mmrl.tiny.tokenization import GEMMA_CONTROL, GEMMA_IMAGE, train_gemma_tokenizer, train_tokenizer

# ------------------------------------------------------------------------------------------------------- Llama 4 --

# Llama 4's special tokens, exact strings in the order of their ids (200000...), reserved placeholders left out:
# the basic ones, the text post-training ones (<|eot|> 200008, <|finetune_right_pad|> 200018), the vision ones
# (<|image_start|> 200080, <|image_end|> 200081, <|tile_x_separator|> 200084, <|tile_y_separator|> 200085,
# <|image|> 200090, <|patch|> 200092 = the config's image_token_index).
LLAMA4_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eom|>",
    "<|eot|>",
    "<|step|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|finetune_right_pad|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
    "<|image|>",
    "<|patch|>",
)
# the release's generation_config.json: eos [200001, 200007, 200008]
LLAMA4_STOPS = ["<|end_of_text|>", "<|eom|>", "<|eot|>"]
# Llama 4's pre-tokenisation regex (o200k), as in transformers' convert_llama4_weights_to_hf.py
LLAMA4_SPLIT_REGEX = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Llama-4-*-Instruct's chat template without its tool branches: <|begin_of_text|> from the template, a leading system
# message (trimmed; of a content list only the first item's text) in its own header block, no default system prompt;
# text is not trimmed; each image item is one <|image|> that the processor expands into the tiles.
LLAMA4_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- if messages[0]['content'] is string %}{%- set system_message = messages[0]['content'] | trim %}"
    "{%- else %}{%- set system_message = messages[0]['content'][0]['text'] | trim %}{%- endif %}"
    "{%- set messages = messages[1:] %}"
    "{{- '<|header_start|>system<|header_end|>\\n\\n' + system_message + '<|eot|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<|image|>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|eot|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}{%- endif %}"
)
# Tiles: the real patch 14 and pixel shuffle 0.5 (4 patches -> 1 token) and max_patches 16; a 56 px tile (released:
# 336 px = 24x24 patches = 144 tokens a tile) is 4x4 patches = 4 tokens.
LLAMA4_TILE = 56
LLAMA4_PATCH = 14
LLAMA4_PIXEL_SHUFFLE = 0.5
LLAMA4_MAX_PATCHES = 16
LLAMA4_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 32,  # each expert (and the shared expert) of the MoE layers
    "intermediate_size_mlp": 128,  # the dense layers
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention takes head sizes 32, 64, 80, ... (16 fails)
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 2,  # layer 0 dense, layer 1 MoE (Maverick: every second layer; Scout: all)
    "no_rope_layers": [1, 0],  # layer 0 RoPE (chunked attention), layer 1 NoPE (released: every fourth)
    "use_qk_norm": True,
    "attention_chunk_size": 8192,
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 1.0,  # Scout's values (transformers warns that high should exceed low)
        "original_max_position_embeddings": 8192,
    },
}
# The vision MLP's intermediate size must be 4x hidden (the pixel-shuffled width feeds it), and the adapter's input
# and output widths must match (released: 1408 / 5632 / 4096).
LLAMA4_VISION = {
    "hidden_size": 32,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": LLAMA4_TILE,
    "patch_size": LLAMA4_PATCH,
    "pixel_shuffle_ratio": LLAMA4_PIXEL_SHUFFLE,
    "projector_input_dim": 64,
    "projector_output_dim": 64,
    "vision_output_dim": 64,
    "norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def _bpe_of(tokenizer: Any) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The trained BPE (vocabulary and merges, no added tokens) inside a transformers tokenizer."""
    trained = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    return trained["vocab"], merges


def train_llama4_tokenizer() -> Any:
    """Byte-level BPE over :func:`mmrl.tiny.tokenization.tokenizer_corpus` (trained by :func:`mmrl.tiny.tokenization.train_tokenizer` with Llama
    4's split regex), wrapped as the released tokenizer is: ``PreTrainedTokenizerFast`` with Llama 4's special tokens
    after the BPE vocabulary and a post-processor that adds ``<|begin_of_text|>``."""
    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    vocab, merges = _bpe_of(train_tokenizer(LLAMA4_CHAT_TEMPLATE, Qwen2Tokenizer, LLAMA4_SPLIT_REGEX))
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA4_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA4_SPECIAL_TOKENS])
    bos = LLAMA4_SPECIAL_TOKENS[0]
    bpe.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, bpe.token_to_id(bos))],
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=bos,
        eos_token="<|eot|>",
        pad_token="<|finetune_right_pad|>",
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=LLAMA4_TEXT["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        chat_template=LLAMA4_CHAT_TEMPLATE,
    )


def _llama4(tokenizer: Any) -> tuple[Any, Any]:
    from transformers import Llama4Config, Llama4ImageProcessor, Llama4Processor

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in LLAMA4_SPECIAL_TOKENS}
    text = dict(
        LLAMA4_TEXT,
        vocab_size=len(tokenizer),
        bos_token_id=ids["<|begin_of_text|>"],
        eos_token_id=[ids[t] for t in LLAMA4_STOPS],
        pad_token_id=ids["<|finetune_right_pad|>"],
        tie_word_embeddings=True,
    )
    config = Llama4Config(
        text_config=text,
        vision_config=LLAMA4_VISION,
        boi_token_index=ids["<|image_start|>"],
        eoi_token_index=ids["<|image_end|>"],
        image_token_index=ids["<|patch|>"],
        tie_word_embeddings=True,
    )
    image = Llama4ImageProcessor(
        size={"height": LLAMA4_TILE, "width": LLAMA4_TILE},
        max_patches=LLAMA4_MAX_PATCHES,
        resize_to_max_canvas=False,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = Llama4Processor(
        image_processor=image,
        tokenizer=tokenizer,
        patch_size=LLAMA4_PATCH,
        pixel_shuffle_ratio=LLAMA4_PIXEL_SHUFFLE,
        chat_template=LLAMA4_CHAT_TEMPLATE,
    )
    return config, processor


# -------------------------------------------------------------------------------------------------------- Gemma 4 --

# Gemma 4's special tokens in the order of their ids: <pad> 0 <eos> 1 <bos> 2 <unk> 3 <mask> 4, the tool tokens 46-52,
# <|think|> 98, <|channel> 100, <channel|> 101, <|turn> 105, <turn|> 106; then, after the text vocabulary,
# <|image> 255999, <|audio> 256000, <|image|> 258880, <|audio|> 258881, <image|> 258882, <audio|> 258883,
# <|video|> 258884 (the config's boi/boa/image/audio/eoi/eoa/video ids).
GEMMA4_CONTROL = GEMMA_CONTROL[:5] + (
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|turn>",
    "<turn|>",
)
GEMMA4_MEDIA = ("<|image>", "<|audio>", "<|image|>", "<|audio|>", "<image|>", "<audio|>", "<|video|>")
# tokenizer_config.json's named special tokens (GemmaTokenizer attributes the processor reads)
GEMMA4_NAMED = {
    "image_token": "<|image|>",
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "audio_token": "<|audio|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "sot_token": "<|turn>",
    "eot_token": "<turn|>",
    "soc_token": "<|channel>",
    "eoc_token": "<channel|>",
    "think_token": "<|think|>",
    "std_token": "<|tool>",
    "etd_token": "<tool|>",
    "stc_token": "<|tool_call>",
    "etc_token": "<tool_call|>",
    "str_token": "<|tool_response>",
    "etr_token": "<tool_response|>",
    "escape_token": '<|"|>',
}
# the release's generation_config.json: eos [1, 106]
GEMMA4_STOPS = ["<eos>", "<turn|>"]
# Gemma-4-31B-it's chat template without its tool branches (see the module docstring).
GEMMA4_CHAT_TEMPLATE = (
    "{%- macro strip_thinking(text) -%}{%- set ns = namespace(result='') -%}"
    "{%- for part in text.split('<channel|>') -%}"
    "{%- if '<|channel>' in part -%}{%- set ns.result = ns.result + part.split('<|channel>')[0] -%}"
    "{%- else -%}{%- set ns.result = ns.result + part -%}{%- endif -%}"
    "{%- endfor -%}{{- ns.result | trim -}}{%- endmacro -%}"
    "{%- set enable_thinking = enable_thinking | default(false) -%}"
    "{%- set loop_messages = messages -%}"
    "{{- bos_token -}}"
    "{%- if enable_thinking or messages[0]['role'] in ['system', 'developer'] -%}"
    "{{- '<|turn>system\\n' -}}"
    "{%- if enable_thinking -%}{{- '<|think|>\\n' -}}{%- endif -%}"
    "{%- if messages[0]['role'] in ['system', 'developer'] -%}"
    "{%- if messages[0]['content'] is string -%}{{- messages[0]['content'] | trim -}}"
    "{%- else -%}{%- for item in messages[0]['content'] -%}{%- if item['type'] == 'text' -%}"
    "{{- item['text'] | trim -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- endif -%}"
    "{{- '<turn|>\\n' -}}"
    "{%- endif -%}"
    "{%- set ns_turn = namespace(last_user_idx=-1) -%}"
    "{%- for i in range(loop_messages | length) -%}"
    "{%- if loop_messages[i]['role'] == 'user' -%}{%- set ns_turn.last_user_idx = i -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<|turn>' + role + '\\n' -}}"
    "{%- set thinking_text = message.get('reasoning') or message.get('reasoning_content') -%}"
    "{%- if role == 'model' and thinking_text and loop.index0 > ns_turn.last_user_idx -%}"
    "{{- '<|channel>thought\\n' + thinking_text + '\\n<channel|>' -}}"
    "{%- endif -%}"
    "{%- if message['content'] is string -%}"
    "{%- if role == 'model' -%}{{- strip_thinking(message['content']) -}}"
    "{%- else -%}{{- message['content'] | trim -}}{%- endif -%}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}"
    "{%- if role == 'model' -%}{{- strip_thinking(item['text']) -}}{%- else -%}{{- item['text'] | trim -}}{%- endif -%}"
    "{%- elif item['type'] == 'image' -%}{{- '<|image|>' -}}"
    "{%- elif item['type'] == 'video' -%}{{- '<|video|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}"
    "{%- if not enable_thinking -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}"
    "{%- endif -%}"
)
# Processor: the real patch 16, pooling 3 and budget rule; the smallest budget the processor accepts (70 soft tokens
# = at most 630 patches an image; released default 280); video frames 70 soft tokens as released, 4 frames (32).
GEMMA4_PATCH = 16
GEMMA4_POOL = 3
GEMMA4_SOFT_TOKENS = 70
GEMMA4_VIDEO_FRAMES = 4
GEMMA4_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention takes head sizes 32, 64, 80, ... (16 fails)
    "global_head_dim": 64,  # full-attention layers (released 31B: 256 sliding, 512 global)
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 512,
    "final_logit_softcapping": 30.0,
    "use_bidirectional_attention": "vision",
    "hidden_size_per_layer_input": 0,  # no per-layer embeddings (those are the E2B/E4B models')
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
}
GEMMA4_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "patch_size": GEMMA4_PATCH,
    "pooling_kernel_size": GEMMA4_POOL,
    "position_embedding_size": 512,
    # soft tokens an image gets by default: in the released config, read by vLLM (not by transformers), which fails
    # without it ('Gemma4VisionConfig' object has no attribute 'default_output_length')
    "default_output_length": GEMMA4_SOFT_TOKENS,
}


def train_gemma4_tokenizer() -> Any:
    """Gemma's tokenizer pipeline (:func:`mmrl.tiny.tokenization.train_gemma_tokenizer`'s BPE, byte fallback and
    ``<bos>`` on encoding) with Gemma 4's special tokens: control tokens, byte tokens, the BPE pieces, then the
    media tokens, as in the released vocabulary."""
    from transformers import GemmaTokenizer

    gemma3 = train_gemma_tokenizer()
    vocab, merges = _bpe_of(gemma3)
    pieces = list(GEMMA4_CONTROL)
    pieces += [p for p in sorted(vocab, key=vocab.get) if p not in GEMMA_CONTROL + GEMMA_IMAGE]
    pieces += list(GEMMA4_MEDIA)
    tokenizer = GemmaTokenizer(
        vocab={p: i for i, p in enumerate(pieces)},
        merges=merges,
        add_bos_token=True,
        add_eos_token=False,
        eos_token="<turn|>",  # the released tokenizer_config.json (generation stops on <eos> too)
        padding_side="right",  # as released (GemmaTokenizer's own default is left)
        extra_special_tokens=dict(GEMMA4_NAMED),
        model_max_length=GEMMA4_TEXT["max_position_embeddings"],
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in GEMMA4_CONTROL + GEMMA4_MEDIA],
        special_tokens=True,
    )
    tokenizer.chat_template = GEMMA4_CHAT_TEMPLATE
    return tokenizer


def _gemma4(tokenizer: Any, bidirectional_vision: bool = True) -> tuple[Any, Any]:
    from transformers import (
        Gemma4AudioFeatureExtractor,
        Gemma4Config,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
    )

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GEMMA4_CONTROL + GEMMA4_MEDIA}
    text = dict(
        GEMMA4_TEXT,
        vocab_size=len(tokenizer),
        vocab_size_per_layer_input=len(tokenizer),
        bos_token_id=ids["<bos>"],
        eos_token_id=[ids[t] for t in GEMMA4_STOPS],
        pad_token_id=ids["<pad>"],
        use_bidirectional_attention="vision" if bidirectional_vision else None,
    )
    config = Gemma4Config(
        text_config=text,
        vision_config=GEMMA4_VISION,
        audio_config=None,
        boi_token_id=ids["<|image>"],
        eoi_token_id=ids["<image|>"],
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        boa_token_id=ids["<|audio>"],
        eoa_token_index=ids["<audio|>"],
        audio_token_id=ids["<|audio|>"],
    )
    geometry = {
        "patch_size": GEMMA4_PATCH,
        "pooling_kernel_size": GEMMA4_POOL,
        "max_soft_tokens": GEMMA4_SOFT_TOKENS,
    }
    image = Gemma4ImageProcessor(**geometry)
    video = Gemma4VideoProcessor(num_frames=GEMMA4_VIDEO_FRAMES, **geometry)
    processor = Gemma4Processor(
        # Gemma4Processor requires its audio feature extractor even without an audio tower (the 31B release ships
        # one too); it only holds settings, and no audio goes through the tiny model
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=image,
        tokenizer=tokenizer,
        video_processor=video,
        chat_template=GEMMA4_CHAT_TEMPLATE,
        image_seq_length=GEMMA4_SOFT_TOKENS,
    )
    return config, processor


# ------------------------------------------------------------------------------------------------------ builders --


def _build(config: Any, tokenizer: Any, stops: list[str], seed: int) -> Any:
    from transformers import AutoModelForImageTextToText

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
    text = config.get_text_config()
    model.generation_config = GenerationConfig(
        bos_token_id=text.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in stops],
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def build_llama4(seed: int = 0) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    """Tiny ``Llama4ForConditionalGeneration``, its ``Llama4Processor``, stop strings and special tokens."""
    tokenizer = train_llama4_tokenizer()
    config, processor = _llama4(tokenizer)
    return _build(config, tokenizer, LLAMA4_STOPS, seed), processor, list(LLAMA4_STOPS), LLAMA4_SPECIAL_TOKENS


def build_gemma4(
    seed: int = 0, bidirectional_vision: bool = True
) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    """Tiny ``Gemma4ForConditionalGeneration`` (no audio tower), its ``Gemma4Processor``, stop strings and special
    tokens. ``bidirectional_vision=False`` makes image tokens attend causally, as the E2B/E4B releases
    (``use_bidirectional_attention`` None) and as vLLM's CPU backend runs every Gemma 4."""
    tokenizer = train_gemma4_tokenizer()
    config, processor = _gemma4(tokenizer, bidirectional_vision)
    return (
        _build(config, tokenizer, GEMMA4_STOPS, seed),
        processor,
        list(GEMMA4_STOPS),
        GEMMA4_CONTROL + GEMMA4_MEDIA,
    )


BUILDERS = {"llama4": build_llama4, "gemma4": build_gemma4}

# ---------------------------------------------------------------------------------------------- image token count --


def _llama4_canvas(height: int, width: int, tile: int, max_tiles: int, to_max: bool) -> tuple[int, int]:
    """Tiles (rows, columns) of the canvas Llama 4's image processor picks for a ``height`` x ``width`` image: the
    grids of at most ``max_tiles`` tiles, scaled without distortion; the smallest upscale if one is >= 1 (the largest
    with ``to_max``), else the mildest downscale; the smallest area among equal scales (the first, in the processor's
    order: grids grouped by aspect ratio in order of first appearance, tile counts from the largest down)."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for n in range(max_tiles, 0, -1):
        for r in range(1, n + 1):
            if n % r == 0:
                by_ratio.setdefault(r / (n // r), []).append((r, n // r))
    grids = [g for group in by_ratio.values() for g in group]
    scale = {g: min(g[0] * tile / height, g[1] * tile / width) for g in grids}
    up = [s for s in scale.values() if s >= 1]
    best = (max(up) if to_max else min(up)) if up else max(scale.values())
    return min((g for g in grids if scale[g] == best), key=lambda g: g[0] * g[1])


def gemma4_resize_target(height: int, width: int, patch: int, pool: int, soft_tokens: int) -> tuple[int, int]:
    """Gemma 4's resize target ``(height, width)``: the image scaled to the area of ``soft_tokens * pool**2`` patches, each side rounded
    down to a multiple of ``patch * pool``; a side that rounds to 0 becomes one multiple and the other side
    ``floor(aspect) * patch * pool``, at most ``soft_tokens * patch * pool``."""
    side = patch * pool
    area = soft_tokens * pool**2 * patch**2
    factor = math.sqrt(area / (height * width))
    h, w = math.floor(factor * height / side) * side, math.floor(factor * width / side) * side
    if h == 0 and w == 0:
        raise ValueError(f"a {width}x{height} image rounds to 0x0")
    if h == 0:
        h, w = side, min(width // height * side, soft_tokens * side)
    elif w == 0:
        h, w = min(height // width * side, soft_tokens * side), side
    return h, w


def expected_image_features(processor: Any, width: int, height: int, **overrides: Any) -> int:
    """Image-feature slots (the tokens the model overwrites with vision features: Llama 4's ``<|patch|>``, Gemma 4's
    ``<|image|>``) of one ``width`` x ``height`` image, from the processor's config alone; ``overrides`` are
    processor-call image settings (``max_soft_tokens``, ``max_patches``...)."""
    ip = processor.image_processor
    name = type(processor).__name__
    if name == "Llama4Processor":
        tile = overrides.get("size", ip.size)["height"]
        rows, cols = _llama4_canvas(
            height,
            width,
            tile,
            overrides.get("max_patches", ip.max_patches),
            overrides.get("resize_to_max_canvas", ip.resize_to_max_canvas),
        )
        per_tile = (tile // processor.patch_size) ** 2 // processor.downsample_ratio
        return per_tile * (rows * cols + (1 if rows * cols > 1 else 0))
    if name == "Gemma4Processor":
        patch = overrides.get("patch_size", ip.patch_size)
        pool = overrides.get("pooling_kernel_size", ip.pooling_kernel_size)
        h, w = gemma4_resize_target(
            height, width, patch, pool, overrides.get("max_soft_tokens", ip.max_soft_tokens)
        )
        return (h // patch) * (w // patch) // pool**2
    raise ValueError(f"expected_image_features: {name} is neither Llama4Processor nor Gemma4Processor")


def expected_image_tokens(processor: Any, width: int, height: int, **overrides: Any) -> int:
    """Tokens one ``<|image|>`` of the rendered template expands to in ``input_ids`` for a ``width`` x ``height``
    image, from the processor's config alone: Llama 4: ``<|image_start|>``, the tiles' ``<|patch|>`` tokens with a
    ``<|tile_x_separator|>`` between the tiles of a row and a ``<|tile_y_separator|>`` after each row (only for more
    than one tile), ``<|image|>``, the global view's (or the single tile's) ``<|patch|>`` tokens, ``<|image_end|>``;
    Gemma 4: ``<|image>``, the soft tokens, ``<image|>``."""
    features = expected_image_features(processor, width, height, **overrides)
    if type(processor).__name__ == "Llama4Processor":
        ip = processor.image_processor
        rows, cols = _llama4_canvas(
            height,
            width,
            overrides.get("size", ip.size)["height"],
            overrides.get("max_patches", ip.max_patches),
            overrides.get("resize_to_max_canvas", ip.resize_to_max_canvas),
        )
        separators = rows * cols if rows * cols > 1 else 0  # (cols - 1) x-separators + 1 y-separator a row
        return features + separators + 3
    return features + 2
