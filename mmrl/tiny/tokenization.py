"""The tokenizers every tiny family is built from: the enumerated training corpus (:func:`tokenizer_corpus`), the
byte-level BPE over it (:func:`train_bpe`), Qwen2.5-VL's tokenizer with its special tokens and chat template
(:func:`train_tokenizer`, which the other families retrain with their own split regex and re-wrap) and Gemma's
(:func:`train_gemma_tokenizer`, the base of Gemma 3's and Gemma 4's).

The corpus is the vocabulary of the project's recipes (shapes questions, LaTeX tables, GUI actions, think/answer
formats, chat roles), generated here with no randomness; the repository's own source text is deliberately not part of
it, so a rebuild reproduces the shipped tokenizers byte for byte.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AddedToken, Qwen2Tokenizer

from mmrl.tiny.archs import GEMMA3_TEXT, TEXT_ARCH

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

BPE_VOCAB_SIZE = 3000  # target of the BPE trainer, 256 byte symbols included; added tokens come on top
# Qwen2's pre-tokenisation regex (transformers' Qwen2Tokenizer / the released tokenizer.json).
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

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
# Gemma 3 (-it)'s chat template: <bos> comes from the template (the processor call must not add a second one), the
# system message is folded into the first user turn, the assistant role is called 'model'.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}"
    "{%- else -%}{{ raise_exception('Invalid content type') }}{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

# Gemma's special tokens in the real order: control tokens first, image tokens after the text vocabulary.
GEMMA_CONTROL = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>")
GEMMA_IMAGE = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")

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


def train_gemma_tokenizer() -> Any:
    """Gemma's tokenizer pipeline (spaces as ``▁``, BPE with byte fallback over ``<0x..>`` tokens, ``<bos>`` added
    on encoding) over :func:`tokenizer_corpus`, with Gemma 3's special and image tokens."""
    from transformers import GemmaTokenizer

    bpe = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    bpe.normalizer = normalizers.Replace(" ", "▁")
    bpe.pre_tokenizer = pre_tokenizers.Split(pattern="▁", behavior="merged_with_next", invert=False)
    bpe.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB_SIZE, min_frequency=1, show_progress=False)
    bpe.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    trained = json.loads(bpe.to_str())["model"]
    pieces = list(GEMMA_CONTROL) + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [p for p in sorted(trained["vocab"], key=trained["vocab"].get) if p not in pieces]
    # vLLM's Gemma 3 processor looks newline runs ("\n\n", "\n\n\n") up by name to find the image sequence the HF
    # processor writes ("\n\n<start_of_image>...")
    newlines = ["\n" * k for k in range(1, 32)]  # as Gemma's vocabulary: runs of 1..31 newlines
    pieces += [p for p in newlines if p not in pieces]
    pieces += list(GEMMA_IMAGE)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    merges += [m for m in (("\n" * (k - 1), "\n") for k in range(2, 32)) if m not in merges]
    tokenizer = GemmaTokenizer(
        vocab={p: i for i, p in enumerate(pieces)},
        merges=merges,
        add_bos_token=True,
        add_eos_token=False,
        extra_special_tokens={
            "boi_token": GEMMA_IMAGE[0],
            "eoi_token": GEMMA_IMAGE[1],
            "image_token": GEMMA_IMAGE[2],
        },
        model_max_length=GEMMA3_TEXT["max_position_embeddings"],
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in GEMMA_CONTROL + GEMMA_IMAGE],
        special_tokens=True,
    )
    # newline runs are matched whole (longest first), as Gemma's own tokenizer does and as vLLM's Gemma 3 processor
    # assumes when it joins the newlines around an image
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in reversed(newlines)])
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    return tokenizer
