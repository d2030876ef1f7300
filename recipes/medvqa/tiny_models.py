"""Build the shipped tiny judge (``assets/tiny-judge``) and tiny encoder (``assets/tiny-encoder``) from nothing:
``python -m mmrl.recipes.medvqa.tiny_models --out assets --seed 0``.

They let the model-based rewards (``judge``, ``embedding_similarity``, the MediX-style composite) run end to end on
a CPU with no download, on the medical-VQA recipe's language (:mod:`mmrl.recipes.medvqa.language`). They know only
that synthetic vocabulary; they are not medical models.

- **Pairs.** (question, reference, candidate, label): the reference is one phrasing of a finding (the canonical one
  half the time, as the judge reward passes the first reference variant); the candidate is a paraphrase of the same
  finding (YES), a paraphrase of a :func:`~mmrl.recipes.medvqa.language.contradiction` (NO), or degenerate (empty,
  the tissue alone when a lesion is present, the lesion alone, word salad). Labels come from the oracle
  :func:`~mmrl.recipes.medvqa.language.read`: YES iff the candidate reads as the reference's finding. Training
  candidates are also perturbed the way a policy's answers are (capitalised, a full stop, a ``<modality>`` prefix
  now and then, a neutral filler word); training pairs never use a held-apart template or term, the held-apart
  evaluation pairs (their own seed) always do, in every candidate but the degenerate ones.
- **Tokenizer.** Byte-level BPE (:func:`mmrl.tiny.tokenization.train_bpe`, Qwen2's pipeline) over the training vocabulary, the
  judge prompt and the filler words, so any text tokenizes; ``<|endoftext|>`` (pad), ``<|im_start|>``,
  ``<|im_end|>`` (eos) and a Qwen-style chat template without a system turn. The encoder's copy appends
  ``<|endoftext|>`` to every text (as Qwen-based embedders do), so that an empty answer still has a token to pool.
- **Judge.** A ``Qwen2ForCausalLM`` trained as a causal LM on ``chat(user=DEFAULT_TEMPLATE.format(...))`` +
  ``YES<|im_end|>`` or ``NO<|im_end|>``, the loss on the verdict and the end token; greedy decoding then writes
  exactly one verdict and stops. Learnt from the verdict bit alone, "same finding?" (an equality of two readings)
  sits on a plateau for longer than this build's budget. So for most of the steps a second loss, at prompt
  positions that are never generated, asks the template token that ends the reference line and the one that ends
  the candidate line to name the (tissue, lesion) the oracle reads there; the comparison is then quick to learn.
  The last steps train the verdict alone.
- **Encoder.** A ``BertModel`` whose mean-pooled, normalised embeddings are trained with a margin loss on all cosines
  of a batch (same finding above 0.9, others below 0.5; the hard negative of each anchor counted once more), so that
  paraphrases clear the 0.8 threshold and contradictions do not. Saved in the sentence-transformers layout.

Everything is seeded and single-threaded, so the same seed and library versions rebuild the same weights.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
import torch
import torch.nn.functional as F
import transformers
from tokenizers import processors
from transformers import (
    BertConfig,
    BertModel,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from mmrl.recipes.medvqa import language
from mmrl.rewards.judge import DEFAULT_TEMPLATE
from mmrl.tiny.tokenization import DOMAIN_WORDS, train_bpe

JUDGE_DIR, ENCODER_DIR = "tiny-judge", "tiny-encoder"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD, EOS = "<|endoftext|>", "<|im_end|>"
VERDICTS = {True: "YES", False: "NO"}
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BPE_VOCAB_SIZE = 1024
THRESHOLD = 0.8  # the encoder's paraphrase threshold (MediX-R1's)
HELD_APART_SEED = 1_000_003  # added to the build seed for the held-apart pairs
NEGATIONS = frozenset("no not nor without none never false wrong absent normal abnormal".split())
JUDGE_ARCH = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
ENCODER_ARCH = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "max_position_embeddings": 128,
}


@dataclass(frozen=True)
class Budget:
    """Sizes and steps of a build; the defaults take about 4 minutes on one thread of a 2-core CPU."""

    judge_steps: int = 900
    judge_batch: int = 64
    judge_lr: float = 2e-3
    reading_share: float = 0.7
    encoder_steps: int = 300
    encoder_batch: int = 64
    encoder_lr: float = 2e-3
    n_held_apart: int = 1000


@dataclass(frozen=True)
class Pair:
    question: str
    reference: str
    candidate: str
    label: bool
    kind: str  # paraphrase, contradiction or degenerate


# ---------------------------------------------------------------------------------------------------------- pairs


def _words(texts: list[str]) -> set[str]:
    return {w.strip(".,;:(){}").lower() for text in texts for w in text.split()} - {"t", "l", "n", ""}


def filler_words() -> list[str]:
    """Neutral English and vision words (from :data:`mmrl.tiny.tokenization.DOMAIN_WORDS`) that a policy's answer may add around
    its findings: no word of a term (so the oracle's reading never changes), no negation, and no word that only the
    held-apart templates and terms use. The training templates' own words ("is", "in", "with") stay in, so that
    they alone do not signal a lesion."""
    terms = [t for group in (*language.TISSUE_TERMS.values(), *language.LESION_TERMS.values()) for t in group]
    terms += list(language.NO_LESION_TERMS)
    training = [
        x for x in (*language.LESION_TEMPLATES, *language.CLEAR_TEMPLATES) if x not in language.HELD_APART
    ]
    held_only = _words(list(language.HELD_APART)) - _words(training)
    meaningful = (_words(terms) - _words(training)) | {"lesion"}
    words = (DOMAIN_WORDS["english"] + " " + DOMAIN_WORDS["vision"]).split()
    return sorted(set(words) - meaningful - held_only - NEGATIONS)


def _finding(rng: random.Random) -> tuple[str, str]:
    lesion = rng.choice(language.LESIONS) if rng.random() < 2 / 3 else "none"
    return rng.choice(language.TISSUES), lesion


def degenerate(tissue: str, lesion: str, rng: random.Random, fillers: list[str]) -> str:
    """Empty, the tissue alone (a lesion is present), the lesion alone, or word salad."""
    kind = rng.choice(["empty", "tissue", "lesion", "salad"] if lesion != "none" else ["empty", "salad"])
    if kind == "empty":
        return ""
    if kind == "tissue":
        return rng.choice(language.TISSUE_TERMS[tissue][:-1])
    if kind == "lesion":
        return rng.choice(language.LESION_TERMS[lesion][:-1])
    words = [w for t in language.TISSUES for w in language.TISSUE_TERMS[t][0].split()]
    words += rng.sample(fillers, 4)
    return " ".join(rng.sample(words, rng.randint(2, 5)))


def perturb(text: str, rng: random.Random, fillers: list[str]) -> str:
    """What a policy's answer may look like around the same words."""
    if rng.random() < 0.15:  # before or after, never inside a term
        filler = rng.choice(fillers)
        text = f"{filler} {text}" if rng.random() < 0.5 else f"{text} {filler}"
    if rng.random() < 0.3:
        text = text[:1].upper() + text[1:]
    if rng.random() < 0.2:
        text += "."
    if rng.random() < 0.15:
        text = f"<modality>{rng.choice(language.MODALITY_TERMS)}</modality> {text}"
    return text


def make_pairs(n: int, seed: int, *, held_apart: bool) -> list[Pair]:
    """``n`` pairs, about 45% paraphrases, 45% contradictions, 10% degenerate; labelled by the oracle."""
    rng, fillers = random.Random(seed), filler_words()
    pairs = []
    for _ in range(n):
        tissue, lesion = _finding(rng)
        reference = (
            language.canonical(tissue, lesion)
            if rng.random() < 0.5
            else language.describe(tissue, lesion, rng)
        )
        draw = rng.random()
        if draw < 0.1:
            kind, candidate = "degenerate", degenerate(tissue, lesion, rng, fillers)
        else:
            kind = "paraphrase" if draw < 0.55 else "contradiction"
            finding = (
                (tissue, lesion) if kind == "paraphrase" else language.contradiction(tissue, lesion, rng)
            )
            candidate = language.describe(*finding, rng, held_apart=held_apart)
            if not held_apart:
                candidate = perturb(candidate, rng, fillers)
        label = language.read(candidate) == (tissue, lesion)
        pairs.append(Pair(language.QUESTION, reference, candidate, label, kind))
    return pairs


def held_apart_pairs(n: int = 1000, seed: int = 0) -> list[Pair]:
    """The held-apart evaluation pairs of a build with ``seed``."""
    return make_pairs(n, seed + HELD_APART_SEED, held_apart=True)


# ------------------------------------------------------------------------------------------------------ tokenizer


def tokenizer_corpus() -> list[str]:
    """Every training-vocabulary sentence, the judge prompt and verdicts, the modality terms and the filler."""
    lines = [
        s
        for t in language.TISSUES
        for lesion in language.LESION_STATES
        for s in language.all_sentences(t, lesion, held_apart=False)
    ]
    lines += [
        DEFAULT_TEMPLATE.format(question=language.QUESTION, reference=s, response=s) for s in lines[::7]
    ]
    lines += ["user", "assistant", "YES", "NO", *language.MODALITY_TERMS, " ".join(filler_words())]
    lines += [f"<modality>{m}</modality>" for m in language.MODALITY_TERMS]
    return lines


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The judge's tokenizer: the domain BPE, the three special tokens after it, the chat template."""
    bpe = train_bpe(tokenizer_corpus(), BPE_VOCAB_SIZE)
    bpe.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=JUDGE_ARCH["max_position_embeddings"],
        extra_special_tokens=list(SPECIALS[1:]),
    )


def encoder_tokenizer(judge_tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The judge's BPE with ``<|endoftext|>`` appended to every text (pad and attention mask unchanged)."""
    bpe = tokenizers.Tokenizer.from_str(judge_tokenizer.backend_tokenizer.to_str())
    pad_id = bpe.token_to_id(PAD)
    bpe.post_processor = processors.TemplateProcessing(
        single=f"$A {PAD}", pair=f"$A {PAD} $B:1 {PAD}:1", special_tokens=[(PAD, pad_id)]
    )
    bpe.no_padding()
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=PAD,
        pad_token=PAD,
        padding_side="right",  # BERT's absolute positions: the text starts at position 0 whatever the batch
        model_max_length=ENCODER_ARCH["max_position_embeddings"],
    )


# ---------------------------------------------------------------------------------------------------------- judge


def judge_prompt(tokenizer: PreTrainedTokenizerFast, pair: Pair) -> str:
    """The judge's input text, as the ``judge`` reward renders it."""
    user = DEFAULT_TEMPLATE.format(question=pair.question, reference=pair.reference, response=pair.candidate)
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False
    )


# What the reading loss asks the model to name, per slot and finding value (None: the oracle reads nothing).
READING_WORDS = {
    "tissue": {**{t: f" {t}" for t in language.TISSUES}, None: " unclear"},
    "lesion": {**{x: f" {x}" for x in language.LESIONS}, "none": " no", None: " unclear"},
}


@dataclass(frozen=True)
class JudgeExample:
    ids: list[int]  # prompt, verdict, <|im_end|>
    targets: list[tuple[int, int]]  # (position whose next-token logits are scored, target id); verdict first


def reading_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, dict[Any, int]]:
    """The first token of each reading word; distinct within a slot."""
    out = {}
    for slot, words in READING_WORDS.items():
        out[slot] = {k: tokenizer(w, add_special_tokens=False)["input_ids"][0] for k, w in words.items()}
        if len(set(out[slot].values())) != len(words):
            raise ValueError(
                f"tiny judge: the {slot} reading words {list(words.values())} share a first token"
            )
    return out


def judge_examples(tokenizer: PreTrainedTokenizerFast, pairs: list[Pair]) -> list[JudgeExample]:
    """Each pair as ids with its targets: the verdict and ``<|im_end|>`` after the prompt, then the reading ones,
    the reference's (tissue, lesion) at the two template tokens that end its line (the line break, "Candidate") and
    the candidate's at the two that end its own (the line break, "Does")."""
    prompts = tokenizer([judge_prompt(tokenizer, p) for p in pairs], add_special_tokens=False)["input_ids"]
    reading = reading_ids(tokenizer)
    candidate, does = (tokenizer(m, add_special_tokens=False)["input_ids"][0] for m in ("Candidate", "Does"))
    eos = tokenizer.convert_tokens_to_ids(EOS)
    verdict = {v: tokenizer(VERDICTS[v], add_special_tokens=False)["input_ids"] for v in VERDICTS}
    out = []
    for ids, pair in zip(prompts, pairs):
        answer = verdict[pair.label] + [eos]
        targets = [(len(ids) - 1 + k, t) for k, t in enumerate(answer)]
        for end, text in ((ids.index(candidate), pair.reference), (ids.index(does), pair.candidate)):
            tissue, lesion = language.read(text)
            targets += [(end - 1, reading["tissue"][tissue]), (end, reading["lesion"][lesion])]
        out.append(JudgeExample(ids + answer, targets))
    return out


def _judge_loss(model: Qwen2ForCausalLM, batch: list[JudgeExample], pad_id: int, reading: float) -> tuple:
    """(verdict loss, reading loss, weighted sum): cross-entropy of the next-token logits at the target
    positions; the verdict targets are the first two of each example."""
    ids, mask = padded([x.ids for x in batch], pad_id)
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, H]
    rows = torch.tensor([[i] * len(x.targets) for i, x in enumerate(batch)])  # [B, 6]
    pos = torch.tensor([[p for p, _ in x.targets] for x in batch])  # [B, 6]
    tgt = torch.tensor([[t for _, t in x.targets] for x in batch])  # [B, 6]
    logits = model.lm_head(hidden[rows, pos])  # [B, 6, V]
    losses = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none").view(tgt.shape)
    verdict_loss, reading_loss = losses[:, :2].mean(), losses[:, 2:].mean()
    return verdict_loss, reading_loss, verdict_loss + reading * reading_loss


def padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and their attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return ids, mask


def fit(
    model: Qwen2ForCausalLM,
    examples: list[Any],
    loss_fn: Any,
    *,
    steps: int,
    batch: int,
    lr: float,
    reading_share: float,
    pad_id: int,
    label: str,
) -> Qwen2ForCausalLM:
    """The judges' training loop: AdamW, warm-up then cosine, ``batch`` examples a step, each seen once, the
    reading loss on for the first ``reading_share`` of the steps; ``loss_fn(model, batch, pad_id, reading)``
    returns (verdict loss, reading loss, total)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = schedule(opt, steps, warmup=30)
    model.train()
    for step in range(steps):
        rows = examples[step * batch : (step + 1) * batch]
        reading = 1.0 if step < reading_share * steps else 0.0
        verdict_loss, reading_loss, loss = loss_fn(model, rows, pad_id, reading)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(
                f"{label} step {step}: verdict loss {verdict_loss.item():.4f}, reading {reading_loss.item():.4f}",
                flush=True,
            )
    return model.eval()


def schedule(opt: torch.optim.Optimizer, steps: int, warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then cosine decay to a tenth."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def fresh_judge(tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen2ForCausalLM:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
    config = Qwen2Config(
        **JUDGE_ARCH,
        vocab_size=len(tokenizer),
        bos_token_id=ids[PAD],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids[PAD], eos_token_id=ids[EOS], pad_token_id=ids[PAD], do_sample=False
    )
    return model


def train_judge(tokenizer: PreTrainedTokenizerFast, budget: Budget, seed: int) -> Qwen2ForCausalLM:
    """A fresh judge trained on ``budget.judge_steps * budget.judge_batch`` training pairs, each seen once; the
    reading loss is on for the first ``budget.reading_share`` of the steps (see the module docstring)."""
    pairs = make_pairs(budget.judge_steps * budget.judge_batch, seed, held_apart=False)
    return fit(
        fresh_judge(tokenizer, seed),
        judge_examples(tokenizer, pairs),
        _judge_loss,
        steps=budget.judge_steps,
        batch=budget.judge_batch,
        lr=budget.judge_lr,
        reading_share=budget.reading_share,
        pad_id=tokenizer.pad_token_id,
        label="judge",
    )


@torch.inference_mode()
def judge_outputs(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, pairs: list[Pair], batch_size: int = 100
) -> list[str]:
    """Greedy generations (at most 4 new tokens), decoded with special tokens kept; ``tokenizer`` pads left."""
    out = []
    for s in range(0, len(pairs), batch_size):
        texts = [judge_prompt(tokenizer, p) for p in pairs[s : s + batch_size]]
        enc = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        seqs = model.generate(**enc, max_new_tokens=4, do_sample=False)
        new = seqs[:, enc["input_ids"].shape[1] :]
        out += tokenizer.batch_decode(new, skip_special_tokens=False)
    return out


def parse_verdict(output: str) -> bool | None:
    """True/False for exactly ``YES``/``NO`` then ``<|im_end|>`` (padding after it allowed), else None."""
    body, sep, rest = output.partition(EOS)
    if not sep or rest.replace(PAD, "").strip():
        return None
    return {"YES": True, "NO": False}.get(body.strip())


def evaluate_judge(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, pairs: list[Pair]) -> dict:
    verdicts = [parse_verdict(o) for o in judge_outputs(model, tokenizer, pairs)]
    return {
        "accuracy": sum(v == p.label for v, p in zip(verdicts, pairs)) / len(pairs),
        "unparseable": sum(v is None for v in verdicts) / len(pairs),
        "n": len(pairs),
    }


# -------------------------------------------------------------------------------------------------------- encoder


def embed(model: BertModel, tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """Mean-pooled, L2-normalised embeddings [N, H] (the sentence-transformers pipeline of the saved folder)."""
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    hidden = model(**enc).last_hidden_state  # [N, T, H]
    mask = enc["attention_mask"].unsqueeze(-1).float()  # [N, T, 1]
    return F.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0), dim=-1)


def _encoder_batch(rng: random.Random, size: int, fillers: list[str]) -> tuple[list[str], list[Any], int]:
    """Anchors, positives and hard negatives (``size`` each) then a few degenerate texts, with the oracle's reading
    of each; anchors and hard negatives are the first and third blocks."""
    findings = [_finding(rng) for _ in range(size)]
    anchors = [
        language.canonical(*f) if rng.random() < 0.4 else perturb(language.describe(*f, rng), rng, fillers)
        for f in findings
    ]
    positives = [perturb(language.describe(*f, rng), rng, fillers) for f in findings]
    negatives = [
        perturb(language.describe(*language.contradiction(*f, rng), rng), rng, fillers) for f in findings
    ]
    broken = [degenerate(*f, rng, fillers) for f in findings[: size // 8]]
    texts = anchors + positives + negatives + broken
    return texts, [language.read(t) for t in texts], size


def train_encoder(tokenizer: PreTrainedTokenizerFast, budget: Budget, seed: int) -> BertModel:
    """A fresh encoder trained with the margin loss on cosines (see the module docstring)."""
    config = BertConfig(**ENCODER_ARCH, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = BertModel(
        config
    )  # the pooler is unused (mean pooling) but saved, so AutoModel loads every weight
    opt = torch.optim.AdamW(model.parameters(), lr=budget.encoder_lr, weight_decay=0.01)
    sched = schedule(opt, budget.encoder_steps, warmup=30)
    rng, fillers = random.Random(seed + 7), filler_words()
    model.train()
    for step in range(budget.encoder_steps):
        texts, readings, b = _encoder_batch(rng, budget.encoder_batch, fillers)
        e = embed(model, tokenizer, texts)
        cos = e @ e.T  # [N, N]
        same = torch.tensor([[r == s for s in readings] for r in readings])
        off = ~torch.eye(len(texts), dtype=torch.bool)
        pull = F.relu(0.9 - cos[same & off]).pow(2).mean()
        push = F.relu(cos[~same] - 0.5).pow(2).mean()
        hard = torch.arange(b)
        hard_push = F.relu(cos[hard, hard + 2 * b] - 0.5).pow(2).mean()
        loss = pull + push + hard_push
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == budget.encoder_steps - 1:
            print(f"encoder step {step}: loss {loss.item():.4f}", flush=True)
    return model.eval()


@torch.inference_mode()
def pair_cosines(model: BertModel, tokenizer: PreTrainedTokenizerFast, pairs: list[Pair]) -> list[float]:
    refs = embed(model, tokenizer, [p.reference for p in pairs])
    cands = embed(model, tokenizer, [p.candidate for p in pairs])
    return (refs * cands).sum(-1).tolist()


def evaluate_encoder(model: BertModel, tokenizer: PreTrainedTokenizerFast, pairs: list[Pair]) -> dict:
    cos = pair_cosines(model, tokenizer, pairs)

    def mean(xs: list[float]) -> float:
        return sum(xs) / max(1, len(xs))

    return {
        "accuracy": sum((c >= THRESHOLD) == p.label for c, p in zip(cos, pairs)) / len(pairs),
        "mean_cos_paraphrase": mean([c for c, p in zip(cos, pairs) if p.label]),
        "mean_cos_contradiction": mean([c for c, p in zip(cos, pairs) if p.kind == "contradiction"]),
        "mean_cos_degenerate": mean([c for c, p in zip(cos, pairs) if p.kind == "degenerate"]),
        "threshold": THRESHOLD,
        "n": len(pairs),
    }


def save_encoder(model: BertModel, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """HF files at the root, plus the sentence-transformers modules (Transformer, mean Pooling, Normalize). Like
    the released sentence-transformers models, no ``2_Normalize`` folder: Normalize has no files, and git keeps no
    empty folder."""
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    pooling = {
        "word_embedding_dimension": model.config.hidden_size,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    }
    _write_json(out / "modules.json", modules)
    _write_json(out / "1_Pooling" / "config.json", pooling)
    _write_json(
        out / "sentence_bert_config.json",
        {"max_seq_length": ENCODER_ARCH["max_position_embeddings"], "do_lower_case": False},
    )
    _write_json(
        out / "config_sentence_transformers.json",
        {
            "__version__": {"transformers": transformers.__version__, "pytorch": torch.__version__},
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    )


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------------------- cards

CARD = """# {name}

{what}

It knows only the synthetic vocabulary of the medical-VQA recipe (`recipes/medvqa/language.py`: four tissues, tumour /
necrosis / no lesion, their synonyms and sentence templates); it is **not a medical model** and says nothing useful
about real pathology text. It exists so that tests and the recipe's smoke runs exercise the model-based rewards on a
CPU without any download.

- architecture: `{arch_class}`, {arch}, vocab {vocab}, float32 safetensors
- parameters: {n_params:,}
- tokenizer: byte-level BPE (`mmrl.tiny.tokenization.train_bpe`, Qwen2's pipeline, target {bpe} incl. the 256 bytes) over the
  recipe's training vocabulary, the judge prompt and filler words; `<|endoftext|>` (pad), `<|im_start|>`,
  `<|im_end|>`{tok_note}

## How it was made

`python -m mmrl.recipes.medvqa.tiny_models --out {out_root} --seed {seed}` (`recipes/medvqa/tiny_models.py`), from
nothing: no download, no external data.

{training}

Training took {train_s:.0f} s, the whole build (both models and their evaluation) {build_s:.0f} s, on a 2-core CPU with
one thread; torch {torch_v}, transformers {tf_v}, tokenizers {tok_v}. The same seed and library versions give the
same weights.

## Held-apart evaluation

{n_held} pairs (seed {held_seed}): the reference in the training vocabulary; the candidate a paraphrase of the same
finding, a contradiction or (about 10%) degenerate; every non-degenerate candidate uses a held-apart template or
synonym (`language.HELD_APART`), never seen in training.

{results}
"""


@dataclass(frozen=True)
class BuildInfo:
    out_root: str
    seed: int
    budget: Budget
    n_held: int
    build_s: float


def _write_card(out: Path, model: torch.nn.Module, tokenizer: Any, info: BuildInfo, **fields: Any) -> None:
    text = CARD.format(
        name=out.name,
        arch_class=type(model).__name__,
        vocab=len(tokenizer),
        n_params=sum(p.numel() for p in model.parameters()),
        bpe=BPE_VOCAB_SIZE,
        out_root=info.out_root,
        seed=info.seed,
        build_s=info.build_s,
        n_held=info.n_held,
        held_seed=info.seed + HELD_APART_SEED,
        torch_v=torch.__version__,
        tf_v=transformers.__version__,
        tok_v=tokenizers.__version__,
        **{
            k: textwrap.fill(v, 118) if k in ("what", "training", "results") else v for k, v in fields.items()
        },
    )
    (out / "README.md").write_text(text)


def _judge_card(out: Path, model: Qwen2ForCausalLM, tok: Any, stats: dict, info: BuildInfo) -> None:
    b = info.budget
    what = (
        "A tiny reference-based judge: given `mmrl.rewards.judge.DEFAULT_TEMPLATE` (question, reference answer, "
        "candidate answer) as one user turn of its chat template, it answers `YES` or `NO`, then `<|im_end|>`."
    )
    training = (
        f"Trained as a causal LM on {b.judge_steps * b.judge_batch:,} training pairs, each seen once "
        f"({b.judge_steps} AdamW steps of {b.judge_batch}, lr {b.judge_lr}): loss on the verdict and `<|im_end|>`, "
        f"plus, for the first {b.reading_share:.0%} of the steps, a reading loss that makes the template tokens "
        "ending the reference line and the candidate line name their (tissue, lesion) as the oracle reads them "
        "(prompt positions, never generated; it breaks the long plateau of learning an equality from the verdict "
        "bit alone). The last steps train the verdict only."
    )
    results = (
        f"Accuracy **{stats['accuracy']:.3f}** (greedy `generate`, parsed strictly: exactly `YES` or `NO`, then "
        f"`<|im_end|>`); unparseable {stats['unparseable']:.3f}."
    )
    _write_card(
        out,
        model,
        tok,
        info,
        what=what,
        arch=", ".join(f"{k} {v}" for k, v in JUDGE_ARCH.items()),
        tok_note=" (eos); a Qwen-style chat template without a system turn.",
        training=training,
        train_s=stats["train_s"],
        results=results,
    )


def _encoder_card(out: Path, model: BertModel, tok: Any, stats: dict, info: BuildInfo) -> None:
    b = info.budget
    what = (
        "A tiny sentence encoder in the sentence-transformers layout (HF files at the root; `modules.json`: "
        "Transformer, mean `1_Pooling`, `2_Normalize`): paraphrases of the same finding have cosine >= 0.8, "
        "contradictions less."
    )
    training = (
        f"Trained for {b.encoder_steps} AdamW steps (lr {b.encoder_lr}) on fresh batches of {b.encoder_batch} "
        "anchors, positives and hard negatives (contradictions), plus degenerate texts: a squared-hinge loss on all "
        "cosines of the batch (same finding above 0.9, others below 0.5, each hard negative counted once more)."
    )
    results = (
        f"Accuracy **{stats['accuracy']:.3f}** at threshold {THRESHOLD} (paraphrase iff cosine >= {THRESHOLD}); "
        f"mean cosine: paraphrases {stats['mean_cos_paraphrase']:.3f}, contradictions "
        f"{stats['mean_cos_contradiction']:.3f}, degenerate answers {stats['mean_cos_degenerate']:.3f}."
    )
    _write_card(
        out,
        model,
        tok,
        info,
        what=what,
        arch=", ".join(f"{k} {v}" for k, v in ENCODER_ARCH.items()),
        tok_note="; `<|endoftext|>` is appended to every text, so that an empty text still has a token to pool.",
        training=training,
        train_s=stats["train_s"],
        results=results,
    )


# ----------------------------------------------------------------------------------------------------------- main


def build(out_root: str | Path, seed: int = 0, budget: Budget | None = None) -> dict[str, dict]:
    """Train, evaluate and save both models under ``out_root`` (replacing earlier builds); return the held-apart
    numbers."""
    budget, start = budget or Budget(), time.time()
    torch.set_num_threads(1)
    tokenizer, held = build_tokenizer(), held_apart_pairs(budget.n_held_apart, seed)
    judge = train_judge(tokenizer, budget, seed)
    judge_stats = evaluate_judge(judge, tokenizer, held) | {"train_s": time.time() - start}
    print(
        f"tiny-judge: held-apart accuracy {judge_stats['accuracy']:.3f}, unparseable {judge_stats['unparseable']:.3f}"
    )
    enc_tokenizer, enc_start = encoder_tokenizer(tokenizer), time.time()
    encoder = train_encoder(enc_tokenizer, budget, seed)
    enc_stats = evaluate_encoder(encoder, enc_tokenizer, held) | {"train_s": time.time() - enc_start}
    print(
        f"tiny-encoder: held-apart accuracy {enc_stats['accuracy']:.3f} at {THRESHOLD}, mean cosine paraphrase "
        f"{enc_stats['mean_cos_paraphrase']:.3f} vs contradiction {enc_stats['mean_cos_contradiction']:.3f}"
    )
    info = BuildInfo(str(out_root), seed, budget, len(held), time.time() - start)
    judge_dir, enc_dir = fresh_folder(Path(out_root) / JUDGE_DIR), fresh_folder(Path(out_root) / ENCODER_DIR)
    judge.save_pretrained(judge_dir)
    tokenizer.save_pretrained(judge_dir)
    _judge_card(judge_dir, judge, tokenizer, judge_stats, info)
    save_encoder(encoder, enc_tokenizer, enc_dir)
    _encoder_card(enc_dir, encoder, enc_tokenizer, enc_stats, info)
    for path in (*judge_dir.rglob("*"), *enc_dir.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return {"judge": judge_stats, "encoder": enc_stats}


def fresh_folder(folder: Path) -> Path:
    if folder.exists():
        card = folder / "README.md"
        if not card.is_file() or not card.read_text().startswith(f"# {folder.name}\n"):
            raise FileExistsError(
                f"tiny_models: {folder} exists and is not an earlier build; choose another --out"
            )
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="assets", help="folder that receives tiny-judge/ and tiny-encoder/")
    parser.add_argument("--seed", type=int, default=0, help="seed of the pairs, the weights and the batches")
    args = parser.parse_args(argv)
    build(args.out, args.seed)


if __name__ == "__main__":
    main()
