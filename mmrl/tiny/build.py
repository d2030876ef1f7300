"""Build and save a tiny checkpoint of any family (``mmrl build-tiny [--family NAME]``), with its model card.

``mmrl build-tiny`` builds the bundled tiny Qwen2.5-VL (:mod:`mmrl.tiny.qwen2_5_vl`); ``--family NAME`` builds the
other families of :data:`FAMILIES` (Qwen2-VL, Qwen3-VL dense and MoE, Qwen3.5 dense and MoE, Gemma 3 and 4, GLM-4.1V
and 4.5V, InternVL 3, LLaVA-OneVision, Idefics3, SmolVLM2, Mistral 3, Llama 4) the same way, offline. What is real
and what is scaled down in each is in its module (:mod:`mmrl.tiny.families` for Qwen2-VL, Qwen3-VL, Qwen3.5 and
Gemma 3; :mod:`mmrl.tiny.glm_mistral`, :mod:`mmrl.tiny.internvl_llava`, :mod:`mmrl.tiny.idefics` and
:mod:`mmrl.tiny.llama4_gemma4` for the others); what they share is in :mod:`mmrl.tiny.tokenization`,
:mod:`mmrl.tiny.archs`, :mod:`mmrl.tiny.processing` and :mod:`mmrl.tiny.layouts`, which import no builder. This module
builds the bundled model and each family's (:func:`build_family`) and saves it (weights in the released key layout)
with its model card; only the CLI and the tests import it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import GenerationConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

from mmrl.tiny import families, glm_mistral, idefics, internvl_llava, llama4_gemma4
from mmrl.tiny.archs import TEXT_ARCH, VISION_ARCH
from mmrl.tiny.families import gemma3_config_and_processor, qwen_config, qwen_processor, qwen_tokenizer
from mmrl.tiny.layouts import reload_in_release_layout
from mmrl.tiny.processing import (
    IMAGE_MAX_PIXELS,
    IMAGE_MIN_PIXELS,
    VIDEO_MAX_PIXELS,
    VIDEO_MIN_PIXELS,
    build_processor,
)
from mmrl.tiny.qwen2_5_vl import tiny_config
from mmrl.tiny.tokenization import (
    BPE_VOCAB_SIZE,
    FORMAT_TAGS,
    GEMMA_CONTROL,
    GEMMA_IMAGE,
    QWEN_SPECIAL_TOKENS,
    tokenizer_corpus,
    train_gemma_tokenizer,
    train_tokenizer,
)

DEFAULT_OUT_DIR = "assets/tiny-qwen2.5-vl"
# Families `mmrl build-tiny --family` builds: the bundled Qwen2.5-VL and the others of the family modules.
FAMILIES = (
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "gemma3",
    "gemma4",
    "glm4v",
    "glm4v_moe",
    "internvl",
    "llava_onevision",
    "idefics3",
    "smolvlm",
    "mistral3",
    "llama4",
)


def build_tiny(out_dir: str | Path | None = None, seed: int = 0, family: str = "qwen2_5_vl") -> Path:
    """Build the tiny checkpoint of ``family`` (:data:`FAMILIES`) into ``out_dir`` and return its path.

    ``out_dir`` defaults to ``assets/tiny-qwen2.5-vl`` for the bundled model and ``assets/tiny-<family>`` for the
    others (which are not shipped: tests build them into temporary folders). An existing ``out_dir`` is replaced only
    if it is empty or an earlier build (its README.md is one of this module's model cards), so stale files never
    survive a rebuild. Loads with ``AutoModelForImageTextToText.from_pretrained(out_dir)`` and
    ``AutoProcessor.from_pretrained(out_dir)``.
    """
    if family not in FAMILIES:
        raise ValueError(f"build-tiny: unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    out = Path(out_dir or (DEFAULT_OUT_DIR if family == "qwen2_5_vl" else f"assets/tiny-{family}"))
    if out.exists() and any(out.iterdir()) and not _is_tiny_build(out):
        raise FileExistsError(
            f"build-tiny: {out} exists and is not an earlier {_card_title(family)[2:-1]} build; "
            "choose a new or empty directory"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        if family == "qwen2_5_vl":
            _save_checkpoint(staging, seed)
        else:
            save_family_checkpoint(family, staging, seed, _card_title(family))
        staging.chmod(0o755)
        for path in staging.iterdir():
            path.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _card_title(family: str) -> str:
    return MODEL_CARD_TITLE if family == "qwen2_5_vl" else f"# tiny-{family}\n"


def _is_tiny_build(directory: Path) -> bool:
    card = directory / "README.md"
    if not card.is_file():
        return False
    first = card.read_text().split("\n", 1)[0] + "\n"
    return first in {_card_title(f) for f in FAMILIES}


def _save_checkpoint(out: Path, seed: int) -> None:
    tokenizer = train_tokenizer()
    config = tiny_config(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.text_config.bos_token_id,
        eos_token_id=[
            tokenizer.convert_tokens_to_ids("<|im_end|>"),
            tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        ],
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out)
    build_processor(tokenizer).save_pretrained(out)
    _write_model_card(out, model, tokenizer, seed)


MODEL_CARD_TITLE = "# tiny-qwen2.5-vl\n"
MODEL_CARD = (
    MODEL_CARD_TITLE
    + """
A randomly initialised, {n_params:,}-parameter model with the Qwen2.5-VL architecture
(`Qwen2_5_VLForConditionalGeneration`), its processor and chat template. It exists so that tests and recipe smoke runs
exercise the real Qwen2.5-VL code path on a CPU without any download. Its outputs are noise: it has never been trained.

Made by `mmrl build-tiny` (`mmrl.tiny.build.build_tiny(out_dir, seed={seed})`) with transformers {transformers_version}
and torch {torch_version}. The same seed and library versions reproduce these files byte for byte.

Load it like any Qwen2.5-VL checkpoint:

```python
from transformers import AutoModelForImageTextToText, AutoProcessor
model = AutoModelForImageTextToText.from_pretrained("{default_dir}")
processor = AutoProcessor.from_pretrained("{default_dir}")
```

## Architecture

- text: {text_arch}, vocab_size {vocab_size}, tied input/output embeddings
- vision: {vision_arch}, out_hidden_size {out_hidden_size}
- weights: float32, `torch.manual_seed({seed})` then the model's own initialisation

## Tokenizer

Byte-level BPE trained with the `tokenizers` library (target vocab {bpe_target} including the 256 byte symbols,
min frequency 1) on {corpus_lines} lines ({corpus_chars:,} characters) generated by `mmrl.tiny.tokenization.tokenizer_corpus()`:
words of the recipes' domains (shapes, charts and maths, LaTeX/HTML tables, GUI actions, pathology and radiology, RL
training), the shapes recipe's questions and think/answer formats, LaTeX tabulars, GUI action lists and chat roles.
No repository text and no downloaded data. Qwen2's normaliser (NFC), split regex and byte-level decoder.
{n_tokens} tokens in all. Added tokens and ids: {added_ids}. The `<think>`/`<answer>` tags are ordinary (non-special)
added tokens, so each is one token and survives `skip_special_tokens`. eos `<|im_end|>`, pad `<|endoftext|>`.
The chat template is Qwen2.5-VL-Instruct's `chat_template.json`, verbatim.

## Processor

`Qwen2_5_VLProcessor` with `Qwen2VLImageProcessor` (min_pixels {image_min}, max_pixels {image_max}) and
`Qwen2VLVideoProcessor` (min_pixels {video_min}, max_pixels {video_max} per frame, cap_pixels_per_frame) — small
defaults for CPU runs; recipes override them. A 56x56 image becomes a 1x4x4 patch grid = 4 `<|image_pad|>` tokens.

## Files (size in bytes, sha256 prefix)

| file | bytes | sha256 |
|---|---|---|
{file_rows}
"""
)


def _write_model_card(
    out: Path, model: Qwen2_5_VLForConditionalGeneration, tokenizer: Qwen2Tokenizer, seed: int
) -> None:
    corpus = tokenizer_corpus()
    files = sorted(p for p in out.iterdir() if p.is_file() and p.name != "README.md")
    card = MODEL_CARD.format(
        n_params=model.num_parameters(),
        seed=seed,
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        default_dir=DEFAULT_OUT_DIR,
        text_arch=json.dumps(TEXT_ARCH),
        vocab_size=model.config.text_config.vocab_size,
        vision_arch=json.dumps(VISION_ARCH),
        out_hidden_size=model.config.vision_config.out_hidden_size,
        bpe_target=BPE_VOCAB_SIZE,
        corpus_lines=len(corpus),
        corpus_chars=sum(len(line) for line in corpus),
        n_tokens=len(tokenizer),
        added_ids=", ".join(
            f"`{t}` {tokenizer.convert_tokens_to_ids(t)}" for t in QWEN_SPECIAL_TOKENS + FORMAT_TAGS
        ),
        image_min=IMAGE_MIN_PIXELS,
        image_max=IMAGE_MAX_PIXELS,
        video_min=VIDEO_MIN_PIXELS,
        video_max=VIDEO_MAX_PIXELS,
        file_rows="\n".join(
            f"| {p.name} | {p.stat().st_size} | {hashlib.sha256(p.read_bytes()).hexdigest()[:16]} |"
            for p in files
        ),
    )
    (out / "README.md").write_text(card)


def other_builders() -> dict[str, Any]:
    """The families built in their own modules: ``build(seed) -> (model, processor, stop tokens, special tokens)``."""
    return {
        **families.BUILDERS,
        **glm_mistral.BUILDERS,
        **internvl_llava.BUILDERS,
        **idefics.BUILDERS,
        **llama4_gemma4.BUILDERS,
    }


def build_family(family: str, seed: int) -> tuple[Any, Any, list[int], tuple[str, ...]]:
    """The tiny model (random, ``torch.manual_seed(seed)``), its processor, its stop ids and its special tokens."""
    from transformers import AutoModelForImageTextToText

    others = other_builders()
    if family in others:
        model, processor, stops, specials = others[family](seed)
        return (
            model,
            processor,
            [processor.tokenizer.convert_tokens_to_ids(t) for t in stops],
            tuple(specials),
        )
    if family == "gemma3":
        tokenizer = train_gemma_tokenizer()
        config, processor = gemma3_config_and_processor(tokenizer)
        stops = ["<eos>", "<end_of_turn>"]
    else:
        tokenizer = qwen_tokenizer(family)
        config, processor = qwen_config(family, tokenizer), qwen_processor(tokenizer)
        stops = ["<|im_end|>", "<|endoftext|>"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
        # Gemma 3 initialises its image projection to zeros: a random model would be blind, its tower untrained
        if family == "gemma3":
            torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.02)
    if (
        family == "gemma3"
    ):  # saved as released (vision_tower.vision_model.*), the layout vLLM's weight reload takes
        before = {k: v.clone() for k, v in model.state_dict().items()}
        model = reload_in_release_layout(model)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    eos = [tokenizer.convert_tokens_to_ids(t) for t in stops]
    text = config.get_text_config()
    model.generation_config = GenerationConfig(
        bos_token_id=text.bos_token_id, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
    )
    specials = GEMMA_CONTROL + GEMMA_IMAGE if family == "gemma3" else QWEN_SPECIAL_TOKENS + FORMAT_TAGS
    return model, processor, eos, specials


FAMILY_CARD = """{title}
A randomly initialised, {n_params:,}-parameter `{model_class}` with `{processor_class}` and a chat template modelled
on the released checkpoint's, for tests on a CPU without downloads. Its outputs are noise: it has never been trained.

Made by `mmrl build-tiny --family {family}` (`mmrl.tiny.build.build_tiny(out_dir, seed={seed}, family="{family}")`) with
transformers {transformers_version} and torch {torch_version}; what is real and what is scaled down is in
`mmrl/tiny/families.py`.

- config: {config}
- image processor: {image_processor}
- stop ids: {eos}; {n_tokens} tokens; special tokens: {special}

## Files (size in bytes, sha256 prefix)

| file | bytes | sha256 |
|---|---|---|
{file_rows}
"""


def save_family_checkpoint(family: str, out: Path, seed: int, title: str) -> None:
    """Build ``family`` and save it (model, processor, model card) into the empty folder ``out``."""
    model, processor, eos, specials = build_family(family, seed)
    model.save_pretrained(out)
    _to_release_layout(model, out)
    processor.save_pretrained(out)
    files = sorted(p for p in out.iterdir() if p.is_file())
    tok = processor.tokenizer
    geometry = {
        k: v
        for k, v in processor.image_processor.to_dict().items()
        if k
        in (
            "size",
            "patch_size",
            "merge_size",
            "temporal_patch_size",
            "resample",
            "do_pan_and_scan",
            "do_image_splitting",
            "max_image_size",
            "image_grid_pinpoints",
            "crop_to_patches",
            "max_patches",
            "max_soft_tokens",
            "pooling_kernel_size",
        )
    }
    card = FAMILY_CARD.format(
        title=title,
        n_params=model.num_parameters(),
        model_class=type(model).__name__,
        processor_class=type(processor).__name__,
        family=family,
        seed=seed,
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        config=json.dumps(
            {"text": _arch(model.config.get_text_config()), "vision": _arch(model.config.vision_config)}
        ),
        image_processor=json.dumps(geometry),
        eos=eos,
        n_tokens=len(tok),
        special=", ".join(f"`{t}` {tok.convert_tokens_to_ids(t)}" for t in specials),
        file_rows="\n".join(
            f"| {p.name} | {p.stat().st_size} | {hashlib.sha256(p.read_bytes()).hexdigest()[:16]} |"
            for p in files
        ),
    )
    (out / "README.md").write_text(card)


def _to_release_layout(model: Any, out: Path) -> None:
    """Rewrite the saved weights that transformers keeps transposed from their release layout
    (:func:`mmrl.model.layout.release_transposes`) as released, which is what vLLM reads; transformers transposes them
    back when it loads the folder."""
    import re

    from safetensors.torch import load_file, save_file

    from mmrl.model.layout import release_transposes

    transposes = release_transposes(model)
    if not transposes:
        return
    for f in sorted(out.glob("*.safetensors")):
        state = load_file(f)
        for key, t in state.items():
            for pattern, d0, d1 in transposes:
                if re.search(pattern, key):
                    state[key] = t.transpose(d0, d1).contiguous()
        save_file(state, f, metadata={"format": "pt"})


def _arch(conf: Any) -> dict[str, Any]:
    keys = (
        "hidden_size",
        "depth",
        "num_hidden_layers",
        "num_experts",
        "layer_types",
        "image_size",
        "patch_size",
    )
    out = {k: getattr(conf, k) for k in keys if getattr(conf, k, None) is not None}
    if "depth" in out:  # the Qwen vision configs alias num_hidden_layers to depth (transformers >= 5.23)
        out.pop("num_hidden_layers", None)
    return out
