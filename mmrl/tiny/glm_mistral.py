"""Tiny random checkpoints of GLM-4.1V-Thinking, GLM-4.5V and Mistral Small 3.1, built offline.

The same pattern as :mod:`mmrl.tiny.families`: each builder returns a randomly initialised model of the family's real
class, its real processor class with the real patch / merge / temporal sizes, a tokenizer with the release's special
tokens in their real order, and a chat template modelled on the released one (without its tool-calling branches).
Saved with ``save_pretrained``, they load back through ``AutoModelForImageTextToText`` / ``AutoProcessor``.

- ``glm4v`` (GLM-4.1V-9B-Thinking): ``Glm4vForConditionalGeneration``; ``Glm4vProcessor`` with ``Glm4vImageProcessor``
  and ``Glm4vVideoProcessor`` (patch 14 x merge 2 = a 28 px grid, temporal patch 2). The template writes
  ``[gMASK]<sop>`` itself (the tokenizer adds nothing and has no bos token), then ``<|system|>\\n``, ``<|user|>\\n``
  and ``<|assistant|>\\n`` turns; an image is ``<|begin_of_image|><|image|><|end_of_image|>``, a video
  ``<|begin_of_video|><|video|><|end_of_video|>`` (the processor expands ``<|video|>`` into per-frame image spans and
  timestamps). The release always thinks: the model writes ``<think>...</think><answer>...</answer>`` after the
  generation prompt and ``</answer>`` is a stop token. ``enable_thinking=False`` is an mmrl addition: the generation
  prompt then closes an empty ``<think></think>``.
- ``glm4v_moe`` (GLM-4.5V): ``Glm4vMoeForConditionalGeneration`` (layer 0 dense, layer 1 MoE with 4 routed experts,
  top 2, one shared expert: the release's first_k_dense_replace=1 layout); the same processor. GLM-4.5's hybrid
  thinking template: the generation prompt is ``<|assistant|>`` (the model opens ``\\n<think>`` itself);
  ``enable_thinking=False`` appends ``/nothink`` to user turns and closes ``\\n<think></think>`` after the generation
  prompt; assistant turns after the last user turn keep their reasoning, earlier ones an empty think block.
- ``mistral3`` (Mistral Small 3.1): ``Mistral3ForConditionalGeneration`` (Pixtral tower, 2x2 patch merger);
  ``PixtralProcessor`` with ``PixtralImageProcessor`` (patch 14, spatial_merge_size 2: images are resized to sides
  that are multiples of 28 under ``longest_edge``, one ``[IMG]`` per merged 28x28 patch, ``[IMG_BREAK]`` after each
  row but the last, ``[IMG_END]`` after it). The template writes ``<s>`` (bos) itself and the tokenizer also adds
  it on encoding (``add_bos_token``), so a rendered prompt is encoded with ``add_special_tokens=False``. System text
  goes in ``[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]``, a default one when the chat has none (the release's is a long
  Le Chat prompt with today's date; here a short fixed sentence so prompts do not change with the date); user turns
  are ``[INST]...[/INST]`` and there is no separate generation prompt.

What is real: the model and processor classes, the patch, merge and temporal-patch sizes, the special-token strings
and their order (GLM's from ``<|endoftext|>`` 151329 on; Mistral's tekken control tokens 0..19, so ``[IMG]`` keeps
id 10 as in the release), the GLM-4 / tekken pre-tokenisation regexes, the byte-level BPE pipeline, the stop tokens,
which template writes the bos and GLM's M-RoPE layout (partial rotary 0.5, the released [8, 12, 12] sections scaled
to [2, 3, 3]). What is scaled down: widths and depths (text hidden 64, two layers, text head_dim 32 since vLLM's CPU
attention supports no smaller head; vision hidden 32, two blocks; 0.34-0.37 M parameters, GLM-4.5V 0.57 M because
its output embedding is untied, see :func:`_glm`), the vocabulary (the BPE of :func:`mmrl.tiny.tokenization.tokenizer_corpus`,
trained by :func:`mmrl.tiny.tokenization.train_tokenizer` with the family's split regex, then the family's special tokens on top;
tekken's 980 unused ``<SPECIAL_n>`` slots are left out), the pixel budgets (GLM: 4..16 merged 28x28 patches per
image; Pixtral: longest edge 224 px) and the vision position tables. The ``<think>``, ``</think>``, ``<answer>``
and ``</answer>`` tags that a release lacks are ordinary (non-special) added tokens, as :data:`mmrl.tiny.tokenization.FORMAT_TAGS`
are for the Qwen models; those a release has are special tokens there and here, so ``skip_special_tokens=True`` drops
them when decoding (GLM: the think tags, the box tokens and GLM-4.1V's answer tags).

Weights come from ``torch.manual_seed(seed)`` and the model's own initialisation (none of these families
initialises a multimodal projection to zeros, so nothing is redrawn).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, pre_tokenizers
from transformers import AddedToken, GenerationConfig

from mmrl.tiny.tokenization import FORMAT_TAGS, QWEN_SPECIAL_TOKENS, train_tokenizer

# ---------------------------------------------------------------------------------------------------------------- GLM
# GLM-4's special tokens from <|endoftext|> (151329) to <|end_of_video|> (151342), shared by GLM-4.1V and GLM-4.5V.
GLM_BASE_SPECIALS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
)
# GLM-4.1V-Thinking: <|image|> 151343 and <|video|> 151344 (its config's image/video_token_id), then its reasoning
# tags; </answer> is 151348, the fourth id of its generation config's eos_token_id. The relative order of the tags
# after <|video|> is reconstructed from those ids (the box tokens last).
GLM41V_SPECIALS = GLM_BASE_SPECIALS + (
    "<|image|>",
    "<|video|>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "<|begin_of_box|>",
    "<|end_of_box|>",
)
# GLM-4.5V (GLM-4.5-Air's tokenizer): 151343..151364, <|image|> 151363 and <|video|> 151364 as in its config.
GLM45V_SPECIALS = GLM_BASE_SPECIALS + (
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
    "<|code_prefix|>",
    "<|code_middle|>",
    "<|code_suffix|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "/nothink",
    "<|begin_of_box|>",
    "<|end_of_box|>",
    "<|image|>",
    "<|video|>",
)
# generation_config.json eos_token_id of the releases: <|endoftext|>, <|user|>, <|observation|> (+ </answer> for 4.1V)
GLM41V_STOPS = ["<|endoftext|>", "<|user|>", "<|observation|>", "</answer>"]
GLM45V_STOPS = ["<|endoftext|>", "<|user|>", "<|observation|>"]
# GLM-4's pre-tokenisation regex (ChatGLM4Tokenizer / tokenizer.json): cl100k's, digits in runs of up to three.
GLM4_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Content renderer shared by the GLM templates: images and videos as the releases write them.
_GLM_RENDER = (
    "{%- macro render(content) -%}{%- if content is string -%}{{- content }}"
    "{%- elif content is iterable and content is not mapping -%}{%- for item in content -%}"
    "{%- if item is string -%}{{- item }}"
    "{%- elif item.type == 'video' or 'video' in item -%}{{- '<|begin_of_video|><|video|><|end_of_video|>' }}"
    "{%- elif item.type == 'image' or 'image' in item or 'image_url' in item -%}"
    "{{- '<|begin_of_image|><|image|><|end_of_image|>' }}"
    "{%- elif item.type == 'text' -%}{{- item.text }}{%- endif -%}{%- endfor -%}"
    "{%- elif content is not none -%}{{- content }}{%- endif -%}{%- endmacro -%}"
)
# GLM-4.1V-9B-Thinking's chat template without tools: roles in order, assistant turns verbatim, generation prompt
# '<|assistant|>\n'. The enable_thinking=False branch is mmrl's (the release has no switch; see module docstring).
GLM41V_CHAT_TEMPLATE = (
    "[gMASK]<sop>" + _GLM_RENDER + "{%- for msg in messages -%}"
    "{%- if msg.role == 'system' -%}{{- '<|system|>\\n' + render(msg.content) }}"
    "{%- elif msg.role == 'user' -%}{{- '<|user|>\\n' + render(msg.content) }}"
    "{%- elif msg.role == 'assistant' -%}{{- '<|assistant|>\\n' + render(msg.content) }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think></think>' }}{%- endif -%}"
    "{%- endif -%}"
)
# GLM-4.5V's chat template without tools (GLM-4.5's hybrid thinking): '/nothink' on user turns and an empty think
# block after the generation prompt when enable_thinking is false; reasoning kept only after the last user turn.
GLM45V_CHAT_TEMPLATE = (
    "[gMASK]<sop>" + _GLM_RENDER + "{%- set ns = namespace(last_user_index=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user_index = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- set no_think = enable_thinking is defined and not enable_thinking -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}{%- set text = render(m.content) -%}"
    "{{- '<|user|>\\n' + text }}{{- '/nothink' if no_think and not text.endswith('/nothink') else '' }}"
    "{%- elif m.role == 'assistant' -%}{{- '<|assistant|>' }}{%- set content = render(m.content) -%}"
    "{%- set reasoning = '' -%}"
    "{%- if m.reasoning_content is string -%}{%- set reasoning = m.reasoning_content -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{%- if loop.index0 > ns.last_user_index and reasoning -%}{{- '\\n<think>' + reasoning.strip() + '</think>' }}"
    "{%- else -%}{{- '\\n<think></think>' }}{%- endif -%}"
    "{%- if content.strip() -%}{{- '\\n' + content.strip() }}{%- endif -%}"
    "{%- elif m.role == 'system' -%}{{- '<|system|>\\n' + render(m.content) }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' }}{{- '\\n<think></think>' if no_think else '' }}"
    "{%- endif -%}"
)

# GLM processors: the real patch 14 x merge 2 and temporal patch 2. Their `size` budgets count the temporal patch
# (smart_resize compares 2 x h x w for an image, frames x h x w for a video), hence the factor 2: 4..16 merged 28x28
# patches per image; a video's budget is over all its frames (4 frames: up to 8 merged patches each).
GLM_PATCH = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}
GLM_IMAGE_SIZE = {"shortest_edge": 2 * 28 * 28 * 4, "longest_edge": 2 * 28 * 28 * 16}
GLM_VIDEO_SIZE = {"shortest_edge": 2 * 28 * 28 * 4, "longest_edge": 2 * 28 * 28 * 16}

# Text: head_dim 64 / 2 = 32 (GLM derives it from the width; vLLM's CPU attention needs at least 32), one KV head
# (grouped-query like the releases' 32:2 and 96:8); partial rotary 0.5 rotates 16 dims, so the M-RoPE sections
# (t, h, w) sum to 8: [2, 3, 3], the releases' [8, 12, 12] (head_dim 128, 64 rotary dims) scaled by 1/4.
GLM_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [2, 3, 3],
    },
}
# GLM-4.5V: layer 0 dense, layer 1 MoE (the release: first_k_dense_replace=1, 128 experts top 8, 1 shared). Its
# config states head_dim (the release: 128) and use_qk_norm (false), which vLLM's GLM-4.5 text model reads.
GLM_MOE = {
    "head_dim": 32,
    "use_qk_norm": False,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "n_group": 1,
    "topk_group": 1,
    "attention_bias": True,
}
# Vision: blocks' MLP width is out_hidden_size and the merger's is intermediate_size (the text MLP width), as in
# the releases; image_size 112 gives an 8x8 learned position table, interpolated to every image's grid like the
# real 24x24 one.
GLM_VISION = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 128,
    "num_heads": 2,
    "image_size": 112,
    "patch_size": GLM_PATCH["patch_size"],
    "spatial_merge_size": GLM_PATCH["merge_size"],
    "temporal_patch_size": GLM_PATCH["temporal_patch_size"],
    "out_hidden_size": 64,
    "rms_norm_eps": 1e-5,
}

# ----------------------------------------------------------------------------------------------------------- Mistral
# tekken's control tokens, ids 0..19 in the release (Mistral Small 3.1's [IMG] is 10, <pad> 11).
MISTRAL_SPECIALS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)
MISTRAL_STOPS = ["</s>"]
# tekken's pre-tokenisation regex (transformers' fix_mistral_regex one).
TEKKEN_SPLIT_REGEX = r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
MISTRAL_DEFAULT_SYSTEM = (
    "You are Mistral Small 3.1, a Large Language Model (LLM) created by Mistral AI, a French startup headquartered "
    "in Paris."
)
# Mistral Small 3.1's chat template: <s> from the template, a leading system message (else the default one) in
# [SYSTEM_PROMPT], [INST]...[/INST] user turns with [IMG] per image, assistant turns closed by </s>.
MISTRAL3_CHAT_TEMPLATE = (
    "{%- set default_system_message = '" + MISTRAL_DEFAULT_SYSTEM + "' -%}"
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{%- set system_message = messages[0]['content'] -%}"
    "{%- else -%}{%- set system_message = messages[0]['content'][0]['text'] -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set system_message = default_system_message -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "{%- if message['content'] is string -%}{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- else -%}{{- '[INST]' }}{%- for block in message['content'] -%}"
    "{%- if block['type'] == 'text' -%}{{- block['text'] }}"
    "{%- elif block['type'] in ['image', 'image_url'] -%}{{- '[IMG]' }}"
    "{%- else -%}{{- raise_exception('Only text and image blocks are supported in message content!') }}"
    "{%- endif -%}{%- endfor -%}{{- '[/INST]' }}{%- endif -%}"
    "{%- elif message['role'] == 'system' -%}"
    "{%- if message['content'] is string -%}{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- else -%}{{- '[SYSTEM_PROMPT]' + message['content'][0]['text'] + '[/SYSTEM_PROMPT]' }}{%- endif -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- if message['content'] is string -%}{{- message['content'] + eos_token }}"
    "{%- else -%}{{- message['content'][0]['text'] + eos_token }}{%- endif -%}"
    "{%- else -%}{{- raise_exception('Only user, system and assistant roles are supported!') }}{%- endif -%}"
    "{%- endfor -%}"
)
# Pixtral at the real patch 14 and merge 2; longest edge 224 px (the release: 1540) -> at most 8x8 merged patches.
PIXTRAL_LONGEST_EDGE = 224
# Text: 4 query heads over 2 KV heads (the release: 32 over 8) of head_dim 32 (vLLM's CPU attention needs at least
# 32), so the attention width (128) differs from the hidden size as in the release (4096 vs 5120).
MISTRAL_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "sliding_window": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000000.0},
}
PIXTRAL_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "patch_size": 14,
    # = the processor's longest edge, as in the release: vLLM numbers patch positions on a grid this many pixels wide
    "image_size": PIXTRAL_LONGEST_EDGE,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


# -------------------------------------------------------------------------------------------------------- tokenizers
def _byte_level_bpe(split_regex: str) -> Tokenizer:
    """:func:`mmrl.tiny.tokenization.train_tokenizer`'s byte-level BPE over the tiny corpus, trained with ``split_regex``, with the
    same regex as its pre-tokeniser and without the Qwen special and format tokens (ids then start at the vocab's
    end, for the family's own)."""
    trained = train_tokenizer(split_regex=split_regex)
    spec = json.loads(trained.backend_tokenizer.to_str())
    qwen_added = set(QWEN_SPECIAL_TOKENS) | set(FORMAT_TAGS)
    assert {t["content"] for t in spec["added_tokens"]} <= qwen_added, "unexpected added tokens"
    assert max(spec["model"]["vocab"].values()) + 1 == len(spec["model"]["vocab"]), (
        "BPE ids are not contiguous"
    )
    spec["added_tokens"] = []
    spec["post_processor"] = None
    bpe = Tokenizer.from_str(json.dumps(spec))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return bpe


def _wrap(
    bpe: Tokenizer,
    specials: tuple[str, ...],
    ordinary: tuple[str, ...],
    chat_template: str,
    max_length: int,
    **named: Any,
) -> Any:
    """``bpe`` with ``specials`` (special added tokens, in order) then ``ordinary`` (non-special added tokens) as a
    tokenizers-backed transformers tokenizer; ``named`` sets bos/eos/pad/unk and add_bos_token."""
    from transformers import TokenizersBackend

    before = bpe.get_vocab_size(with_added_tokens=True)
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in ordinary])
    ids = [bpe.token_to_id(t) for t in specials + ordinary]
    assert ids == list(range(before, before + len(ids))), "added tokens are not in order after the vocab"
    tokenizer = TokenizersBackend(
        tokenizer_object=bpe,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
        extra_special_tokens=list(specials),
        **named,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def _mistral_tokenizer() -> Any:
    """tekken's pipeline (byte-level BPE, tekken regex, no normaliser), control tokens 0..19 before the BPE vocab and
    ``<s>`` added on encoding."""
    from transformers import TokenizersBackend

    trained = _byte_level_bpe(TEKKEN_SPLIT_REGEX)
    spec = json.loads(trained.to_str())
    offset = len(MISTRAL_SPECIALS)
    # the control tokens are vocabulary entries 0..19 (added tokens only keep the ids of pieces in the vocab)
    vocab = {t: i for i, t in enumerate(MISTRAL_SPECIALS)}
    vocab.update({piece: i + offset for piece, i in spec["model"]["vocab"].items()})
    spec["model"]["vocab"] = vocab
    spec["normalizer"] = None
    bpe = Tokenizer.from_str(json.dumps(spec))
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MISTRAL_SPECIALS])
    ordinary = FORMAT_TAGS
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in ordinary])
    assert [bpe.token_to_id(t) for t in MISTRAL_SPECIALS] == list(range(offset))
    tokenizer = TokenizersBackend(
        tokenizer_object=bpe,
        model_max_length=MISTRAL_TEXT["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        add_bos_token=True,
        add_eos_token=False,
    )
    tokenizer.chat_template = MISTRAL3_CHAT_TEMPLATE
    return tokenizer


def _glm_tokenizer(family: str) -> tuple[Any, tuple[str, ...]]:
    specials = GLM41V_SPECIALS if family == "glm4v" else GLM45V_SPECIALS
    ordinary = tuple(t for t in FORMAT_TAGS if t not in specials)
    template = GLM41V_CHAT_TEMPLATE if family == "glm4v" else GLM45V_CHAT_TEMPLATE
    tokenizer = _wrap(
        _byte_level_bpe(GLM4_SPLIT_REGEX),
        specials,
        ordinary,
        template,
        GLM_TEXT["max_position_embeddings"],
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    return tokenizer, specials + ordinary


# ------------------------------------------------------------------------------------------------------------ models
def _from_config(config: Any, seed: int) -> Any:
    from transformers import AutoModelForImageTextToText

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForImageTextToText.from_config(config)


def _glm(family: str, seed: int) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    import transformers
    from transformers import Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor

    tokenizer, special_tokens = _glm_tokenizer(family)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in special_tokens}
    stops = GLM41V_STOPS if family == "glm4v" else GLM45V_STOPS
    text = dict(
        GLM_TEXT,
        vocab_size=len(tokenizer),
        eos_token_id=[ids[t] for t in stops],
        pad_token_id=ids["<|endoftext|>"],
    )
    if family == "glm4v_moe":
        text.update(GLM_MOE)
    config_cls = transformers.Glm4vConfig if family == "glm4v" else transformers.Glm4vMoeConfig
    config = config_cls(
        text_config=text,
        vision_config=dict(GLM_VISION),
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
        # GLM-4.5V is untied like the release: vLLM's GLM-4.5 text model never ties its lm_head, so a tied checkpoint
        # (no lm_head.weight) would run there with an uninitialised head. GLM-4.1V ties to save parameters (vLLM's
        # GLM-4 text model honours tie_word_embeddings).
        tie_word_embeddings=family == "glm4v",
    )
    image = Glm4vImageProcessor(size=dict(GLM_IMAGE_SIZE), **GLM_PATCH)
    video = Glm4vVideoProcessor(
        size=dict(GLM_VIDEO_SIZE),
        max_image_size={"longest_edge": GLM_VIDEO_SIZE["longest_edge"]},
        **GLM_PATCH,
    )
    processor = Glm4vProcessor(
        image_processor=image,
        tokenizer=tokenizer,
        video_processor=video,
        chat_template=tokenizer.chat_template,
    )
    model = _from_config(config, seed)
    eos = [ids[t] for t in stops]
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"])
    return model, processor, list(stops), special_tokens


def build_glm4v(seed: int = 0) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    """Tiny GLM-4.1V-Thinking: (model, processor, stop token strings, special tokens); see the module docstring."""
    return _glm("glm4v", seed)


def build_glm4v_moe(seed: int = 0) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    """Tiny GLM-4.5V: (model, processor, stop token strings, special tokens); see the module docstring."""
    return _glm("glm4v_moe", seed)


def build_mistral3(seed: int = 0) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    """Tiny Mistral Small 3.1: (model, processor, stop token strings, special tokens); see the module docstring."""
    from transformers import Mistral3Config, PixtralImageProcessor, PixtralProcessor

    tokenizer = _mistral_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in MISTRAL_SPECIALS}
    text = dict(
        MISTRAL_TEXT,
        model_type="mistral",
        vocab_size=len(tokenizer),
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=ids["<pad>"],
    )
    config = Mistral3Config(
        text_config=text,
        vision_config=dict(PIXTRAL_VISION, model_type="pixtral"),
        image_token_index=ids["[IMG]"],
        spatial_merge_size=2,
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        multimodal_projector_bias=False,
        tie_word_embeddings=True,
    )
    image = PixtralImageProcessor(
        size={"longest_edge": PIXTRAL_LONGEST_EDGE},
        patch_size={"height": PIXTRAL_VISION["patch_size"], "width": PIXTRAL_VISION["patch_size"]},
    )
    processor = PixtralProcessor(
        image_processor=image,
        tokenizer=tokenizer,
        patch_size=PIXTRAL_VISION["patch_size"],
        spatial_merge_size=2,
        chat_template=MISTRAL3_CHAT_TEMPLATE,
    )
    model = _from_config(config, seed)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<s>"], eos_token_id=[ids[t] for t in MISTRAL_STOPS], pad_token_id=ids["<pad>"]
    )
    return model, processor, list(MISTRAL_STOPS), MISTRAL_SPECIALS + FORMAT_TAGS


BUILDERS: dict[str, Callable[[int], tuple[Any, Any, list[str], tuple[str, ...]]]] = {
    "glm4v": build_glm4v,
    "glm4v_moe": build_glm4v_moe,
    "mistral3": build_mistral3,
}
