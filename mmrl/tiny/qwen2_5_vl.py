"""Build the bundled tiny Qwen2.5-VL checkpoint (``mmrl build-tiny``), and tiny checkpoints of other families.

``mmrl build-tiny --family NAME`` builds the other families of :data:`FAMILIES` (Qwen3-VL dense and MoE, Qwen3.5
dense and MoE, Gemma 3 and 4, GLM-4.1V and 4.5V, InternVL 3, LLaVA-OneVision, Idefics3, SmolVLM2, Mistral 3,
Llama 4) the same way, offline; what each takes from here and what is its own is in :mod:`mmrl.tiny.families` and
the modules it names. The rest of this docstring is about the bundled Qwen2.5-VL model.

The checkpoint lets tests, recipes and demos run the real Qwen2.5-VL code path on a 2-core CPU with no network: it is
a randomly initialised ``Qwen2_5_VLForConditionalGeneration`` of about 0.9 M parameters, a byte-level BPE tokenizer,
the ``Qwen2_5_VLProcessor`` (image + video processors) and Qwen2.5-VL's own chat template, all saved in Hugging Face
format so that ``AutoModelForImageTextToText.from_pretrained`` and ``AutoProcessor.from_pretrained`` load it exactly
as they load ``Qwen/Qwen2.5-VL-3B-Instruct``.

What is not the real model's, and why:
- The tokenizer is trained here, with the ``tokenizers`` library, on text this module generates (the vocabulary of the
  project's recipes: shapes questions, LaTeX tables, GUI actions, think/answer formats, chat roles). The real Qwen
  vocabulary (151 k tokens) would make the embedding alone ~20 M parameters; a downloaded tokenizer would break the
  no-network rule. The pre-tokenizer, normaliser and decoder are Qwen2's (same split regex, NFC, byte-level), and the
  special tokens carry Qwen's exact strings in Qwen's order, after the BPE vocabulary, as in the real tokenizer.
  The repository's own source text is deliberately not part of the corpus: the tokenizer would then change with every
  commit and a rebuild could no longer reproduce the shipped files.
- The model vocabulary equals ``len(tokenizer)`` (Qwen pads its embedding to 152064 rows; a random tiny model would
  then sample ids the tokenizer cannot decode).
- The processor's default pixel budgets are small (``IMAGE_MIN_PIXELS`` .. ``IMAGE_MAX_PIXELS``: 4..16 merged 28x28
  patches per image; video frames 4..8) so CPU forwards stay fast; recipes override them like for the real model.

Everything is deterministic: the tokenizer corpus is enumerated (no randomness) and the weights come from
``torch.manual_seed(seed)``, so the same seed and library versions give byte-identical files.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    AddedToken,
    GenerationConfig,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2Tokenizer,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
)

DEFAULT_OUT_DIR = "assets/tiny-qwen2.5-vl"
# Families `mmrl build-tiny --family` builds: this module's Qwen2.5-VL, and the others of mmrl.tiny.families.
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

# Qwen2.5-VL's special tokens, exact strings, in the order of their ids in the real tokenizer (151643...).
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Format tags of the reasoning rewards: ordinary added tokens, so each is one token and survives skip_special_tokens.
FORMAT_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
# Qwen3's tool tags: ordinary added tokens before <think> in the real vocabulary (151657, 151658, 151665, 151666)
QWEN3_TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

BPE_VOCAB_SIZE = 3000  # target of the BPE trainer, 256 byte symbols included; added tokens come on top
# Qwen2's pre-tokenisation regex (transformers' Qwen2Tokenizer / the released tokenizer.json).
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Pixel budgets of the processor (a merged 28x28 patch is one LLM token): a 56x56 image gives 4 image tokens.
IMAGE_MIN_PIXELS = 28 * 28 * 4
IMAGE_MAX_PIXELS = 28 * 28 * 16
VIDEO_MIN_PIXELS = 28 * 28 * 4
VIDEO_MAX_PIXELS = 28 * 28 * 8

# Qwen2.5-VL-Instruct's chat_template.json, verbatim.
QWEN25_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Architecture of the tiny model: Qwen2.5-VL's shape, scaled down. The text head_dim is 128 / 4 = 32, so the M-RoPE
# sections (temporal, height, width) must sum to 32 / 2 = 16 (the real 7B: head_dim 128, [16, 24, 24]).
TEXT_ARCH = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]},
}
# Two vision blocks: block 0 uses windowed attention (112 px windows = 4x4 merged patches), block 1 full attention,
# mirroring the real tower where the last block of each group of eight is global.
VISION_ARCH = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 4,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "tokens_per_second": 2,
    "window_size": 112,
    "fullatt_block_indexes": [1],
}

COLOURS = ("red", "green", "blue", "yellow", "purple", "orange")
SHAPES = ("circle", "square", "triangle")
POSITIONS = (
    "left",
    "right",
    "top",
    "bottom",
    "centre",
    "top left",
    "top right",
    "bottom left",
    "bottom right",
)
GUI_ACTIONS = ("click", "open_app", "scroll", "navigate_back", "input_text")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
GENERAL_TEXT = (
    "You are a helpful assistant.",
    "system",
    "user",
    "assistant",
    "Describe the image.",
    "Answer the question using a single word or phrase.",
    "First think about the question step by step, then give the final answer.",
    "Put your reasoning inside <think> </think> and the final answer inside <answer> </answer>.",
    "Convert the table in the image to LaTeX.",
    "Which action should be taken next to complete the task on the screen?",
    "The image shows a tissue sample stained with haematoxylin and eosin under the microscope.",
    "The findings suggest a benign lesion; the modality is a CT scan of the chest.",
    "Let me count the shapes one by one. The answer is",
    "The frames of the video show the shape moving from the left to the right.",
)

# Domain vocabulary of the recipes and rewards, one string per domain; each becomes one corpus line per casing.
DOMAIN_WORDS = {
    "english": """the a an of and or not to in on at by for with from into over under between above below next
    is are was were be been being has have had do does did can could should would will may might must shall this that
    these those there here what which who whom whose when where why how all any each every both few more most other
    some such no nor only own same so than too very just also then once again still yet because while if else until
    about against during before after through out up down off further it its they them their we us our you your he
    she his her him me my i one two three four five six seven eight nine ten first second third last many much less
    least small large big little long short high low left right top bottom middle centre center near far inside
    outside front back side around across along behind beside beyond within without per new old good bad best better
    worse worst true false yes correct wrong answer question problem solution step steps reason reasoning think
    thought final result results value values number numbers count counted counting total sum difference product
    ratio percent percentage image images picture pictures photo figure figures frame frames video videos scene
    object objects shape shapes colour colours color colors size sizes position positions location region area
    point points line lines box boxes edge edges corner corners background foreground border label labels text
    word words letter letters sentence describe description explain explanation show shows shown showing see seen
    look looks looking find found give given make made use used using please let us consider note therefore thus
    hence so since given assume suppose compute calculate determine identify choose select option options choice""",
    "vision": """red green blue yellow purple orange black white grey gray brown pink cyan magenta circle circles
    square squares triangle triangles rectangle rectangles ellipse polygon star hexagon pentagon diamond arrow dot
    dots grid cell cells row rows column columns pixel pixels patch patches height width depth resolution crop
    resize rotate rotated flip scale scaled bright dark light colourful striped dotted solid filled empty hollow
    touching overlapping adjacent leftmost rightmost topmost lowest highest largest smallest biggest closest farthest
    horizontal vertical diagonal clockwise anticlockwise moving moves moved appears disappears before after during""",
    "math": """add added adding subtract subtracting multiply multiplied divide divided equal equals equation
    equations variable variables function functions angle angles degree degrees radius diameter circumference
    perimeter area volume triangle hypotenuse sine cosine tangent integer integers fraction fractions decimal prime
    even odd square root power exponent logarithm mean median mode average maximum minimum probability chart bar pie
    axis axes plot graph slope intercept linear quadratic solve solved solving simplify expression therefore
    frac sqrt cdot times div pm leq geq neq approx infty alpha beta gamma theta pi sigma mu lambda boxed""",
    "tables": """begin end tabular tabularx hline cline toprule midrule bottomrule cmidrule cdashline multicolumn
    multirow textbf textit emph centering caption table tables header headers body cell spanning colspan rowspan
    align aligned documentclass standalone usepackage amsmath booktabs xcolor graphicx multicol bm document latex
    html thead tbody tr td th structure content compile compiled rendering rendered reference prediction""",
    "gui": """click open_app scroll navigate_back input_text action actions coordinate coordinates button buttons
    screen screenshot app apps application settings menu icon icons search bar tab tabs page pages home back
    forward swipe tap type typed typing keyboard enter submit cancel confirm dialog window scroll down scroll up
    open close select checkbox toggle switch slider link links address browser email message messages contact
    contacts calendar camera gallery photos music maps weather clock alarm notes files download upload share save
    delete edit copy paste login password username account profile cart checkout order shopping task goal instruction""",
    "medical": """pathology pathologist histology histopathology tissue tissues cell cells nucleus nuclei
    cytoplasm stain stained staining haematoxylin hematoxylin eosin slide slides biopsy specimen tumour tumor
    tumours tumors carcinoma adenocarcinoma lymphoma sarcoma melanoma benign malignant metastasis metastatic
    inflammation inflammatory necrosis fibrosis lesion lesions gland glands epithelium epithelial stroma stromal
    mitosis mitotic grade grading diagnosis diagnostic patient patients clinical radiology radiograph xray ct mri
    ultrasound scan scans chest lung lungs liver kidney brain heart breast colon skin bone blood vessel modality
    finding findings impression normal abnormal mass nodule opacity effusion fracture enlarged present absent""",
    "training": """policy reward rewards rollout rollouts advantage advantages group groups sample samples sampled
    sampling prompt prompts response responses completion completions token tokens sequence sequences batch batches
    loss gradient gradients update updates step learning rate entropy clip clipped ratio reference model models
    train training trained evaluation evaluate accuracy format formatted valid invalid score scores verifier""",
}


def _domain_text() -> list[str]:
    lines = []
    for text in DOMAIN_WORDS.values():
        words = text.split()
        lines += [
            " ".join(words),
            " ".join(w.capitalize() for w in words),
            " ".join(w.upper() for w in words[:40]),
        ]
    return lines


def _shapes_text() -> list[str]:
    lines = []
    for colour, shape in itertools.product(COLOURS, SHAPES):
        lines += [
            f"What colour is the {shape}?",
            f"The {shape} is {colour}.",
            f"How many {colour} {shape}s are there?",
            f"Is the {colour} {shape} on the left or on the right?",
            f"The {colour} {shape} is at the {POSITIONS[len(lines) % len(POSITIONS)]} of the image.",
            f"<think>I see a {colour} {shape}.</think><answer>{colour}</answer>",
        ]
    for n, word in enumerate(NUMBER_WORDS):
        lines += [
            f"How many shapes are in the image? There are {n} shapes.",
            f"<think>I count {word} shapes.</think><answer>{n}</answer>",
        ]
    lines += [f"{n} + {n + 1} = {2 * n + 1}, so the answer is \\boxed{{{2 * n + 1}}}." for n in range(100)]
    return lines


def _latex_text() -> list[str]:
    lines = []
    for cols in range(1, 5):
        spec = "|" + "c|" * cols
        header = " & ".join(f"h{c}" for c in range(cols))
        body = " \\\\ \\hline\n".join(" & ".join(str(r * cols + c) for c in range(cols)) for r in range(3))
        lines.append(
            f"\\begin{{tabular}}{{{spec}}}\n\\hline\n{header} \\\\ \\hline\n{body} \\\\ \\hline\n\\end{{tabular}}"
        )
        lines.append(
            f"\\begin{{tabular}}{{{'l' * cols}}}\n\\toprule\n{header} \\\\\n\\midrule\n\\bottomrule\n\\end{{tabular}}"
        )
    lines.append("\\multicolumn{2}{c}{total} & \\multirow{2}{*}{x} \\\\ \\cline{1-2}")
    lines.append('<table><tr><td>a</td><td colspan="2">b</td></tr><tr><td rowspan="2">c</td></tr></table>')
    return lines


def _gui_text() -> list[str]:
    lines = []
    for action, x in itertools.product(GUI_ACTIONS, range(0, 1000, 37)):
        y = (x * 7) % 1000
        lines.append(f"<answer>[{{'action': '{action}', 'coordinate': [{x}, {y}]}}]</answer>")
    lines.append("[{'action': 'input_text', 'text': 'hello world'}]")
    return lines


def tokenizer_corpus() -> list[str]:
    """The text the tiny tokenizer is trained on: enumerated recipe vocabulary, no randomness."""
    return list(GENERAL_TEXT) + _domain_text() + _shapes_text() + _latex_text() + _gui_text()


def train_bpe(corpus: list[str], vocab_size: int, split_regex: str = QWEN2_SPLIT_REGEX) -> Tokenizer:
    """Byte-level BPE over ``corpus`` (target ``vocab_size``, the 256 byte symbols included, min frequency 1) with
    Qwen2's pipeline: NFC, ``split_regex``, byte-level pre-tokenizer and decoder; no special tokens. Any text
    tokenizes."""
    bpe = Tokenizer(
        models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    )
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    return bpe


def train_tokenizer(
    chat_template: str = QWEN25_VL_CHAT_TEMPLATE,
    tokenizer_cls: type = Qwen2Tokenizer,
    split_regex: str = QWEN2_SPLIT_REGEX,
    specials: tuple[str, ...] = QWEN_SPECIAL_TOKENS,
    extra_specials: tuple[str, ...] = QWEN_SPECIAL_TOKENS[1:],
    added: tuple[str, ...] = FORMAT_TAGS,
) -> Any:
    """Byte-level BPE over ``tokenizer_corpus()`` with Qwen2's pipeline, wrapped as transformers' Qwen2Tokenizer
    (``tokenizer_cls``), with ``specials`` added after the BPE vocabulary in their order (``extra_specials`` of them
    listed as the tokenizer config's extra special tokens) and ``added`` (:data:`FORMAT_TAGS`; Qwen3's tool tags
    before them) as ordinary added tokens.

    The other Qwen families (:mod:`mmrl.tiny.families`) pass their own template, tokenizer class and split regex
    (Qwen3.5's also keeps combining marks with letters); the special tokens are the same strings in the same order.
    """
    trained = json.loads(train_bpe(tokenizer_corpus(), BPE_VOCAB_SIZE, split_regex).to_str())["model"]
    # Built without special tokens first so that the Qwen ones get Qwen's relative order right after the BPE vocab.
    tokenizer = tokenizer_cls(
        vocab=trained["vocab"],
        merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]],
        unk_token=None,
        bos_token=None,
        eos_token=None,
        pad_token=None,
        model_max_length=TEXT_ARCH["max_position_embeddings"],
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in specials], special_tokens=True
    )
    # As in the released tokenizer_config.json: all Qwen specials but <|endoftext|> are listed as extra specials.
    tokenizer.add_special_tokens({"extra_special_tokens": list(extra_specials)})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.chat_template = chat_template
    return tokenizer


def qwen_media_token_ids(ids: dict[str, int]) -> dict[str, int]:
    """A Qwen-VL config's media token ids, from the tokenizer's ids of :data:`QWEN_SPECIAL_TOKENS`."""
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }


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


def build_processor(tokenizer: Qwen2Tokenizer) -> Qwen2_5_VLProcessor:
    """Qwen2.5-VL's processor with the tiny pixel budgets (see module docstring)."""
    patch = {k: VISION_ARCH[k] for k in ("patch_size", "temporal_patch_size")}
    merge = VISION_ARCH["spatial_merge_size"]
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": IMAGE_MIN_PIXELS, "longest_edge": IMAGE_MAX_PIXELS}, merge_size=merge, **patch
    )
    # cap_pixels_per_frame=True: qwen-vl-utils' total-video pixel budget, the default from transformers 5.22 on.
    video_processor = Qwen2VLVideoProcessor(
        size={"shortest_edge": VIDEO_MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS},
        merge_size=merge,
        cap_pixels_per_frame=True,
        **patch,
    )
    return Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN25_VL_CHAT_TEMPLATE,
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
            from mmrl.tiny.families import save_family_checkpoint

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

Made by `mmrl build-tiny` (`mmrl.tiny.qwen2_5_vl.build_tiny(out_dir, seed={seed})`) with transformers {transformers_version}
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
min frequency 1) on {corpus_lines} lines ({corpus_chars:,} characters) generated by `mmrl.tiny.qwen2_5_vl.tokenizer_corpus()`:
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
