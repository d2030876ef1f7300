"""The bundled tiny Qwen2.5-VL checkpoint (``mmrl build-tiny``, :func:`mmrl.tiny.build.build_tiny`): its config.

The checkpoint lets tests, recipes and demos run the real Qwen2.5-VL code path on a 2-core CPU with no network: it is
a randomly initialised ``Qwen2_5_VLForConditionalGeneration`` of about 0.9 M parameters, a byte-level BPE tokenizer,
the ``Qwen2_5_VLProcessor`` (image + video processors) and Qwen2.5-VL's own chat template, all saved in Hugging Face
format so that ``AutoModelForImageTextToText.from_pretrained`` and ``AutoProcessor.from_pretrained`` load it exactly
as they load ``Qwen/Qwen2.5-VL-3B-Instruct``.

What is not the real model's, and why:
- The tokenizer is trained with the ``tokenizers`` library, on text :mod:`mmrl.tiny.tokenization` generates (the
  vocabulary of the project's recipes: shapes questions, LaTeX tables, GUI actions, think/answer formats, chat
  roles). The real Qwen vocabulary (151 k tokens) would make the embedding alone ~20 M parameters; a downloaded
  tokenizer would break the no-network rule. The pre-tokenizer, normaliser and decoder are Qwen2's (same split
  regex, NFC, byte-level), and the special tokens carry Qwen's exact strings in Qwen's order, after the BPE
  vocabulary, as in the real tokenizer. The repository's own source text is deliberately not part of the corpus: the
  tokenizer would then change with every commit and a rebuild could no longer reproduce the shipped files.
- The model vocabulary equals ``len(tokenizer)`` (Qwen pads its embedding to 152064 rows; a random tiny model would
  then sample ids the tokenizer cannot decode).
- The processor's default pixel budgets are small (:mod:`mmrl.tiny.processing`'s ``IMAGE_MIN_PIXELS`` ..
  ``IMAGE_MAX_PIXELS``: 4..16 merged 28x28 patches per image; video frames 4..8) so CPU forwards stay fast; recipes
  override them like for the real model.

The architecture is :mod:`mmrl.tiny.archs`' ``TEXT_ARCH`` and ``VISION_ARCH``; :mod:`mmrl.tiny.build` builds and saves
the model with its processor and model card.

Everything is deterministic: the tokenizer corpus is enumerated (no randomness) and the weights come from
``torch.manual_seed(seed)``, so the same seed and library versions give byte-identical files.
"""

from __future__ import annotations

from transformers import Qwen2_5_VLConfig, Qwen2Tokenizer

from mmrl.tiny.archs import TEXT_ARCH, VISION_ARCH
from mmrl.tiny.tokenization import QWEN_SPECIAL_TOKENS, qwen_media_token_ids


def tiny_config(tokenizer: Qwen2Tokenizer) -> Qwen2_5_VLConfig:
    """The tiny model's config, with token ids taken from ``tokenizer``."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    text = dict(
        TEXT_ARCH,
        vocab_size=len(tokenizer),
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision = dict(VISION_ARCH, out_hidden_size=TEXT_ARCH["hidden_size"])
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        **qwen_media_token_ids(ids),
        tie_word_embeddings=True,
    )
