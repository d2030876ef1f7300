"""Tiny random checkpoints of the Idefics3 family: Idefics3 and SmolVLM2 (image splitting on, as released).

Built offline like :mod:`mmrl.tiny.families` (saved with ``save_pretrained``, loaded back through
``AutoModelForImageTextToText`` / ``AutoProcessor``), so tests run the families' real modelling and processing code.

- ``idefics3``: ``Idefics3ForConditionalGeneration`` (SigLIP-style tower with NaViT position buckets, pixel-shuffle
  connector, Llama text model with an untied head), ``Idefics3Processor`` + ``Idefics3ImageProcessor``. Modelled on
  ``HuggingFaceM4/Idefics3-8B-Llama3`` (Llama 3.1 text model): patch 14, pixel shuffle 2, tiles of
  ``max_image_size`` with ``size.longest_edge`` = 4 tiles (the release: 364 and 1456). Its tokenizer is Llama 3's
  (byte-level BPE, Llama 3 split regex, ``<|begin_of_text|>`` added on encoding) plus three added tokens,
  ``<fake_token_around_image>``, ``<image>``, ``<end_of_utterance>`` (ids 128256..128258 in the release, whose text
  vocabulary is 128259): ``<global-img>`` and ``<row_i_col_j>`` are NOT tokens of Idefics3, the processor writes them
  as text and they tokenise into several BPE pieces. The template writes ``<|begin_of_text|>`` itself, so a rendered
  prompt must be encoded with ``add_special_tokens=False`` (the processor's default ``True`` doubles the BOS).
- ``smolvlm``: ``SmolVLMForConditionalGeneration`` (same architecture), ``SmolVLMProcessor`` +
  ``SmolVLMImageProcessor`` + ``SmolVLMVideoProcessor``. Modelled on ``HuggingFaceTB/SmolVLM2-2.2B-Instruct``
  (SmolLM2 text model): patch 14, pixel shuffle 3, tiles of ``max_image_size`` with ``size.longest_edge`` = 4 tiles
  (the release: 384 and 1536; 384 is not a multiple of 14, the tower's convolution drops the last 6 px, the tiny
  tile is an exact multiple). Its tokenizer is SmolLM2's (individual digits, then GPT-2's byte-level regex; nothing
  added on encoding) with SmolLM2's 17 control tokens before the BPE vocabulary and the image tokens after it:
  ``<global-img>``, ``<row_1_col_1>`` .. ``<row_6_col_6>``, ``<fake_token_around_image>``, ``<image>`` (49152..49190
  in the release), ``<end_of_utterance>`` (49279; the 88 ids between are not reproduced). The template opens with
  ``<|im_start|>``, which is also the tokenizer's ``bos_token`` (but is never added by the tokenizer). Videos are
  expanded by the processor into one global tile per frame with timestamps (``num2words`` is required).

What is real: the processors and their splitting rule (resize the longest edge to ``size.longest_edge``, round both
sides up to whole tiles, ``rows x cols`` tiles then a global view resized to one tile), the patch size and pixel
shuffle factor, the special-token strings and their relative order, the tokenizers' pre-tokenisation, the released
chat templates (plus a branch for string content), the untied text heads. What is scaled down: widths and depths
(text hidden 64, two layers, two query heads of 32 over one KV head, MLP 64; vision hidden 32, two layers), the tile
(56 px = 4x4 patches -> 2x2 = 4 tokens for Idefics3; 84 px = 6x6 patches -> 2x2 = 4 tokens for SmolVLM2), the
vocabulary (the BPE of :func:`mmrl.tiny.tokenization.tokenizer_corpus`, trained by :func:`mmrl.tiny.tokenization.train_tokenizer` with each
family's split regex), and the reserved tokens (Llama 3.1's ``<|reserved_special_token_3..247|>`` are left out, as
Gemma's unused tokens are in :mod:`mmrl.tiny.families`). Weights come from ``torch.manual_seed(seed)`` and the
models' own initialisation, which zeroes no projection (the connector gets the default N(0, 0.02); only biases
start at zero), so nothing is redrawn. Both build alike with transformers 5.19 and 5.23, and vLLM loads both (its CPU attention needs head_dim >= 32).
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from tokenizers import AddedToken as RawAddedToken
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import GenerationConfig

from mmrl.tiny.tokenization import train_tokenizer

# Llama 3's pre-tokenisation regex (the released tokenizer.json's Split): digits in groups of up to three.
LLAMA3_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# SmolLM2 pre-tokenises with Digits(individual_digits) then ByteLevel(use_regex) (GPT-2's regex); as one regex for
# training the BPE: GPT-2's, with single digits.
SMOLLM2_TRAIN_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Llama 3.1's special tokens 128000..128010 in their order (the reserved 3..247 that follow are left out).
LLAMA3_SPECIAL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)
# The tokens Idefics3 adds after Llama's 128256.
IDEFICS3_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>")
# SmolLM2's control tokens, ids 0..16, before the BPE vocabulary.
SMOLLM2_SPECIAL = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<repo_name>",
    "<reponame>",
    "<file_sep>",
    "<filename>",
    "<gh_stars>",
    "<issue_start>",
    "<issue_comment>",
    "<issue_closed>",
    "<jupyter_start>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<jupyter_output>",
    "<jupyter_script>",
    "<empty_output>",
)
# SmolVLM's image tokens after the BPE vocabulary (49152..49190), then <end_of_utterance> (49279).
ROW_COL_TOKENS = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))
SMOLVLM_TOKENS = (
    "<global-img>",
    *ROW_COL_TOKENS,
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
)

# Idefics3-8B-Llama3's chat template; the released one iterates message['content'] as a list, the is-string branch
# is an addition. A system message is rendered like any turn ("System: ...<end_of_utterance>\n").
IDEFICS3_CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{ message['role'].capitalize() }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
# SmolVLM2's chat template (transformers' SmolVLMProcessor DEFAULT_CHAT_TEMPLATE, which the processor substitutes for
# any conversation with a video); the is-string branch is an addition.
SMOLVLM_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% elif line['type'] == 'video' %}{{ '<video>' }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

PATCH = 14
# Idefics3: tile 56 = 4x4 patches, pixel shuffle 2 -> 2x2 = 4 tokens per tile; up to 4x4 tiles (longest edge 224).
IDEFICS3_TILE, IDEFICS3_SCALE = 4 * PATCH, 2
# SmolVLM2-2.2B: tile 84 = 6x6 patches, pixel shuffle 3 -> 2x2 = 4 tokens per tile; up to 4x4 tiles (336).
SMOLVLM_TILE, SMOLVLM_SCALE = 6 * PATCH, 3
TILES_PER_EDGE = 4
MEAN_STD = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}

# Llama text model: two query heads over one KV head of head_dim 32 (vLLM's CPU attention needs at least 32; the
# releases: Llama 3.1 8B 32 over 8 of 128, SmolLM2-1.7B 32 over 32 of 64); an MLP as wide as the model keeps the
# untied head under the 500k-parameter budget.
TEXT = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "patch_size": PATCH,
}


def _trained_bpe(split_regex: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The byte-level BPE of :func:`mmrl.tiny.tokenization.train_tokenizer` trained with ``split_regex``: its pieces in id order
    and its merges (the Qwen tokens that function adds are added tokens, not part of the BPE model)."""
    trained = json.loads(train_tokenizer(split_regex=split_regex).backend_tokenizer.to_str())["model"]
    pieces = sorted(trained["vocab"], key=trained["vocab"].get)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    return pieces, merges


def _wrap(backend: Tokenizer, specials: tuple[str, ...], **kwargs: Any) -> Any:
    from transformers import TokenizersBackend

    backend.add_special_tokens([RawAddedToken(t, special=True, normalized=False) for t in specials])
    return TokenizersBackend(tokenizer_object=backend, **kwargs)


def train_idefics3_tokenizer() -> Any:
    """Llama 3's tokenizer pipeline (Llama 3 split regex, byte-level, ``<|begin_of_text|>`` prepended on encoding)
    over the tiny BPE, with Llama 3.1's named special tokens then Idefics3's three, as ``TokenizersBackend`` (what
    transformers 5 loads the released ``PreTrainedTokenizerFast`` as)."""
    pieces, merges = _trained_bpe(LLAMA3_SPLIT_REGEX)
    bos_id = len(pieces)  # <|begin_of_text|>, the first token after the BPE vocabulary
    backend = Tokenizer(
        models.BPE(
            vocab={p: i for i, p in enumerate(pieces)},
            merges=merges,
            ignore_merges=True,
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                special_tokens=[("<|begin_of_text|>", bos_id)],
            ),
        ]
    )
    tokenizer = _wrap(
        backend,
        LLAMA3_SPECIAL + IDEFICS3_TOKENS,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|reserved_special_token_0|>",
        padding_side="left",
        model_max_length=131072,
        extra_special_tokens=list(IDEFICS3_TOKENS),
    )
    tokenizer.chat_template = IDEFICS3_CHAT_TEMPLATE
    return tokenizer


def train_smolvlm_tokenizer() -> Any:
    """SmolLM2's tokenizer pipeline (individual digits, GPT-2's byte-level regex, no post-processor: nothing is
    added on encoding) over the tiny BPE, with SmolLM2's control tokens at ids 0..16 and SmolVLM's image tokens after
    the BPE vocabulary, as ``TokenizersBackend`` (transformers 5 forces it for ``smolvlm``)."""
    pieces, merges = _trained_bpe(SMOLLM2_TRAIN_REGEX)
    vocab = {p: i for i, p in enumerate(list(SMOLLM2_SPECIAL) + pieces)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    tokenizer = _wrap(
        backend,
        SMOLLM2_SPECIAL + SMOLVLM_TOKENS,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        model_max_length=8192,
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    tokenizer.chat_template = SMOLVLM_CHAT_TEMPLATE
    return tokenizer


def _config(config_cls: type, tokenizer: Any, tile: int, scale: int, rope_theta: float, max_pos: int) -> Any:
    ids = {
        t: tokenizer.convert_tokens_to_ids(t) for t in (tokenizer.bos_token, tokenizer.pad_token, "<image>")
    }
    text = dict(
        TEXT,
        vocab_size=len(tokenizer),
        max_position_embeddings=max_pos,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        bos_token_id=ids[tokenizer.bos_token],
        eos_token_id=tokenizer.convert_tokens_to_ids(tokenizer.eos_token),
        pad_token_id=ids[tokenizer.pad_token],
    )
    return config_cls(
        text_config=text,
        vision_config=dict(VISION, image_size=tile),
        scale_factor=scale,
        image_token_id=ids["<image>"],
        pad_token_id=ids[tokenizer.pad_token],
        tie_word_embeddings=False,
    )


def _image_seq_len(tile: int, scale: int) -> int:
    return (tile // PATCH) ** 2 // scale**2


def _idefics3() -> tuple[Any, Any, list[str], tuple[str, ...]]:
    from transformers import Idefics3Config, Idefics3ImageProcessor, Idefics3Processor

    tokenizer = train_idefics3_tokenizer()
    config = _config(Idefics3Config, tokenizer, IDEFICS3_TILE, IDEFICS3_SCALE, 500000.0, 131072)
    image = Idefics3ImageProcessor(
        do_image_splitting=True,
        size={"longest_edge": TILES_PER_EDGE * IDEFICS3_TILE},
        max_image_size={"longest_edge": IDEFICS3_TILE},
        **MEAN_STD,
    )
    processor = Idefics3Processor(
        image_processor=image,
        tokenizer=tokenizer,
        image_seq_len=_image_seq_len(IDEFICS3_TILE, IDEFICS3_SCALE),
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )
    return config, processor, ["<end_of_utterance>", "<|end_of_text|>"], LLAMA3_SPECIAL + IDEFICS3_TOKENS


def _smolvlm() -> tuple[Any, Any, list[str], tuple[str, ...]]:
    from transformers import SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    tokenizer = train_smolvlm_tokenizer()
    config = _config(SmolVLMConfig, tokenizer, SMOLVLM_TILE, SMOLVLM_SCALE, 273768.0, 16384)
    tile = {"longest_edge": SMOLVLM_TILE}
    image = SmolVLMImageProcessor(
        do_image_splitting=True,
        size={"longest_edge": TILES_PER_EDGE * SMOLVLM_TILE},
        max_image_size=tile,
        **MEAN_STD,
    )
    # The release samples 1 fps, at most 64 frames, each frame resized to one tile (no splitting for video frames).
    video = SmolVLMVideoProcessor(
        size=tile,
        max_image_size=tile,
        video_sampling={"fps": 1, "max_frames": 64, "video_size": tile},
        **MEAN_STD,
    )
    processor = SmolVLMProcessor(
        image_processor=image,
        tokenizer=tokenizer,
        video_processor=video,
        image_seq_len=_image_seq_len(SMOLVLM_TILE, SMOLVLM_SCALE),
        chat_template=SMOLVLM_CHAT_TEMPLATE,
    )
    return config, processor, ["<end_of_utterance>"], SMOLLM2_SPECIAL + SMOLVLM_TOKENS


def _build(
    parts: tuple[Any, Any, list[str], tuple[str, ...]], seed: int
) -> tuple[Any, Any, list[str], tuple]:
    from transformers import AutoModelForImageTextToText

    config, processor, stops, specials = parts
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
    tokenizer = processor.tokenizer
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in stops],
        pad_token_id=tokenizer.pad_token_id,
    )
    return model, processor, stops, specials


def build_idefics3(seed: int) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    """The tiny Idefics3 (random, ``torch.manual_seed(seed)``), its processor, stop strings and special tokens."""
    return _build(_idefics3(), seed)


def build_smolvlm(seed: int) -> tuple[Any, Any, list[str], tuple[str, ...]]:
    """The tiny SmolVLM2 (random, ``torch.manual_seed(seed)``), its processor, stop strings and special tokens."""
    return _build(_smolvlm(), seed)


BUILDERS = {"idefics3": build_idefics3, "smolvlm": build_smolvlm}


def image_grid(processor: Any, width: int, height: int) -> tuple[int, int]:
    """(rows, cols) of tiles a ``width`` x ``height`` image is split into, (0, 0) when it is not split: the image
    processor's rule, computed from its config. The longest edge is resized to ``size.longest_edge`` (up or down; the
    other edge keeps the aspect ratio, truncated, then made even), both edges are rounded up to whole tiles of
    ``max_image_size.longest_edge`` (the short one from the aspect ratio again), and an image larger than one tile is
    cut into tiles (plus a global view resized to one tile)."""
    ip = processor.image_processor
    if not ip.do_image_splitting:
        return 0, 0
    longest, tile = ip.size["longest_edge"], ip.max_image_size["longest_edge"]
    h, w = height, width
    if ip.do_resize:
        aspect = w / h
        if w >= h:
            w, h = longest, int(longest / aspect)
            h += h % 2
        else:
            h, w = longest, int(longest * aspect)
            w += w % 2
        h, w = max(h, 1), max(w, 1)
        if max(h, w) > 4096:  # the processors' absolute cap
            aspect = w / h
            h, w = (int(4096 / aspect), 4096) if w >= h else (4096, int(4096 * aspect))
            h, w = max(h, 1), max(w, 1)
    aspect = w / h
    if w >= h:
        w = math.ceil(w / tile) * tile
        h = math.ceil(int(w / aspect) / tile) * tile
    else:
        h = math.ceil(h / tile) * tile
        w = math.ceil(int(h * aspect) / tile) * tile
    if h > tile or w > tile:
        return math.ceil(h / tile), math.ceil(w / tile)
    return 0, 0


def expected_image_soft_tokens(processor: Any, width: int, height: int) -> int:
    """How many ``<image>`` tokens one image becomes: ``image_seq_len`` per tile, ``rows x cols`` tiles + the global
    view (one tile when not split)."""
    rows, cols = image_grid(processor, width, height)
    return (rows * cols + 1) * processor.image_seq_len


def expected_image_tokens(processor: Any, width: int, height: int) -> int:
    """How many tokens one ``<image>`` placeholder of a prompt becomes, wrappers included: per tile
    ``<fake_token_around_image>``, ``<row_r_col_c>``, ``image_seq_len`` x ``<image>``; a newline after each row; then a
    newline, ``<fake_token_around_image>``, ``<global-img>``, ``image_seq_len`` x ``<image>``,
    ``<fake_token_around_image>``. The wrapper strings are counted with the tokenizer: one token each for SmolVLM2, but
    ``<global-img>`` and ``<row_r_col_c>`` are plain text for Idefics3, and the newlines depend on the BPE (the last row's
    newline and the global view's one form a single "\\n\\n" pre-token)."""
    tok = processor.tokenizer

    def n(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    rows, cols = image_grid(processor, width, height)
    seq = processor.image_seq_len
    glob = 1 + n("<global-img>") + seq + 1
    if rows == 0:
        return glob
    tiles = sum(1 + n(f"<row_{r}_col_{c}>") + seq for r in range(1, rows + 1) for c in range(1, cols + 1))
    return tiles + (rows - 1) * n("\n") + n("\n\n") + glob
