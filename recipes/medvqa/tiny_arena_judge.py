"""Build the shipped tiny pairwise judge (``assets/tiny-arena-judge``) from nothing, for the ``arena`` reward
(ArenaRL, docs/arena.md) on the medical-VQA recipe: ``python -m mmrl.recipes.medvqa.tiny_arena_judge --out assets
--seed 0``.

The pointwise ``assets/tiny-judge`` answers YES or NO; asked to score two answers it answers ``NO``, so every
tournament verdict failed to parse. This judge reads :data:`TEMPLATE` (question, reference, answer A, answer B and
the :data:`RUBRIC`) as one user turn of its chat template and answers ``A: <a> B: <b>`` then ``<|im_end|>``, each
score from the rubric: 6 points for naming the reference's tissue, 3 for its lesion (or for saying there is none
when there is none), as the oracle :func:`~mmrl.recipes.medvqa.language.read` reads the answer. An answer that
names two tissues or two lesion states reads as neither. So a tournament can order an answer with the right tissue
above one with nothing right, where the pointwise judge says NO to both: the spread ArenaRL is about.

- **Triples.** (reference, A, B): the reference one phrasing of a finding (canonical half the time, as ``arena``
  passes the first reference variant); each answer independently a paraphrase of the same finding (30%), a
  paraphrase of a :func:`~mmrl.recipes.medvqa.language.contradiction` (35%), degenerate (10%; the pointwise judge's
  :func:`~mmrl.recipes.medvqa.tiny_models.make_pairs` kinds), perturbed as a policy's answers are, or garbled
  (25%, :func:`noise`: random tokens of the tiny policies' tokenizer, often around a real term, as the warm start
  writes at temperature 1 before RL has shaped it; a judge never shown such text answers it with anything); one
  triple in ten has B equal to A. Held-apart triples (their own seed) phrase every non-degenerate answer with a held-apart
  template or term.
- **Tokenizer.** The pointwise judge's recipe (byte-level BPE over the training vocabulary) with this template
  and rubric added to the corpus.
- **Training.** As the pointwise judge: a causal LM whose loss is on the verdict's tokens and ``<|im_end|>``, plus,
  for the first part of the steps, a reading loss at the line break ending the reference line, answer A's line and
  answer B's line (and the token after each) that names the (tissue, lesion) the oracle reads in that line.

Seeded and single-threaded: the same seed and library versions rebuild the same weights.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import tokenizers
import torch
import torch.nn.functional as F
import transformers
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from mmrl.recipes.medvqa import language
from mmrl.recipes.medvqa.tiny_models import (
    BPE_VOCAB_SIZE,
    CHAT_TEMPLATE,
    EOS,
    HELD_APART_SEED,
    JUDGE_ARCH,
    PAD,
    SPECIALS,
    degenerate,
    filler_words,
    fit,
    fresh_folder,
    fresh_judge,
    padded,
    perturb,
    reading_ids,
    tokenizer_corpus,
)
from mmrl.rewards.arena import parse_pair
from mmrl.tiny.tokenization import train_bpe

JUDGE_DIR = "tiny-arena-judge"
HERE = Path(__file__).resolve().parent
POLICY_TOKENIZER = HERE.parent.parent / "assets" / "tiny-qwen2.5-vl" / "tokenizer.json"
TEMPLATE_FILE, RUBRIC_FILE = HERE / "arena_template.txt", HERE / "arena_rubric.txt"
TEMPLATE = TEMPLATE_FILE.read_text()
RUBRIC = RUBRIC_FILE.read_text().strip()
TISSUE_POINTS, LESION_POINTS = 6, 3
# the recipe's terms of each tissue and lesion that training may use (never a held-apart one)
TRAINING_TERMS = {
    k: [t for t in terms if t not in language.HELD_APART_TERMS]
    for k, terms in {**language.TISSUE_TERMS, **language.LESION_TERMS}.items()
}


@dataclass(frozen=True)
class ArenaBudget:
    """Sizes and steps of a build (about 25 minutes on one thread of a 2-core CPU that runs other work too)."""

    steps: int = 1000
    batch: int = 64
    lr: float = 2e-3
    reading_share: float = 0.7
    n_held_apart: int = 1000


@dataclass(frozen=True)
class Triple:
    reference: str
    answer_a: str
    answer_b: str
    truth: tuple[str, str]  # the reference's (tissue, lesion)
    kinds: tuple[str, str] = ("", "")  # each answer's: paraphrase, contradiction, degenerate or noise


def points(answer: str, truth: tuple[str, str]) -> int:
    """The rubric's score of one answer: 6 for the reference's tissue, 3 for its lesion state, as read."""
    tissue, lesion = language.read(answer)
    return TISSUE_POINTS * (tissue == truth[0]) + LESION_POINTS * (lesion == truth[1])


def verdict(t: Triple) -> str:
    return f"A: {points(t.answer_a, t.truth)} B: {points(t.answer_b, t.truth)}"


@cache
def policy_pieces() -> tuple[str, ...]:
    """The decoded tokens of the tiny policies' tokenizer (``assets/tiny-qwen2.5-vl``), newlines as spaces: what a
    policy's answer is made of early in training, when sampling at temperature 1 strings them together."""
    tok = PreTrainedTokenizerFast(tokenizer_file=str(POLICY_TOKENIZER))
    special = set(tok.all_special_ids)
    pieces = (tok.decode([i]).replace("\n", " ") for i in range(tok.vocab_size) if i not in special)
    return tuple(p for p in pieces if p.strip())


def noise(tissue: str, lesion: str, rng: random.Random) -> str:
    """A policy's garbled answer: 3-40 random tokens of its tokenizer, often with a training term of some finding
    (this one's or another's) inside, sometimes after an unclosed ``<think>`` (a response without ``<answer>`` tags is
    shown whole)."""
    pieces = policy_pieces()
    words = [rng.choice(pieces) for _ in range(rng.randint(3, 40))]
    if rng.random() < 0.6:
        t, les = (
            (tissue, lesion)
            if rng.random() < 0.5
            else (rng.choice(language.TISSUES), rng.choice(language.LESION_STATES))
        )
        term = rng.choice(TRAINING_TERMS[t] if rng.random() < 0.6 or les == "none" else TRAINING_TERMS[les])
        words.insert(rng.randint(0, len(words)), f" {term} ")
    text = "".join(words).strip()
    return f"<think>{text}" if rng.random() < 0.4 else text


def _answer(
    tissue: str, lesion: str, rng: random.Random, fillers: list[str], held_apart: bool
) -> tuple[str, str]:
    """(kind, text) of one answer."""
    draw = rng.random()
    if draw < 0.25:
        return "noise", noise(tissue, lesion, rng)
    if draw < 0.35:
        return "degenerate", degenerate(tissue, lesion, rng, fillers)
    kind = "paraphrase" if draw < 0.65 else "contradiction"
    finding = (tissue, lesion) if kind == "paraphrase" else language.contradiction(tissue, lesion, rng)
    text = language.describe(*finding, rng, held_apart=held_apart)
    return kind, text if held_apart else perturb(text, rng, fillers)


def make_triples(n: int, seed: int, *, held_apart: bool) -> list[Triple]:
    rng, fillers = random.Random(seed), filler_words()
    out = []
    for _ in range(n):
        lesion = rng.choice(language.LESIONS) if rng.random() < 2 / 3 else "none"
        tissue = rng.choice(language.TISSUES)
        reference = (
            language.canonical(tissue, lesion)
            if rng.random() < 0.5
            else language.describe(tissue, lesion, rng)
        )
        a = _answer(tissue, lesion, rng, fillers, held_apart)
        b = a if rng.random() < 0.1 else _answer(tissue, lesion, rng, fillers, held_apart)
        (ka, a), (kb, b) = a, b
        out.append(Triple(reference, a, b, (tissue, lesion), (ka, kb)))
    return out


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The pointwise judge's BPE recipe over its corpus plus this template, rubric and verdicts."""
    corpus = tokenizer_corpus()
    sentences = corpus[::5]
    corpus += [
        TEMPLATE.format(question=language.QUESTION, reference=s, answer_a=s, answer_b=s, rubric=RUBRIC)
        for s in sentences
    ]
    corpus += [f"A: {a} B: {b}" for a in range(10) for b in range(10)]
    bpe = train_bpe(corpus, BPE_VOCAB_SIZE)
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


def prompt(tokenizer: PreTrainedTokenizerFast, t: Triple) -> str:
    """The judge's input text, as the ``arena`` reward renders it with this template and rubric."""
    user = TEMPLATE.format(
        question=language.QUESTION,
        reference=t.reference,
        answer_a=t.answer_a,
        answer_b=t.answer_b,
        rubric=RUBRIC,
    )
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False
    )


@dataclass(frozen=True)
class Example:
    ids: list[int]  # prompt, verdict, <|im_end|>
    n_verdict: int  # the first n_verdict targets are the verdict's
    targets: list[tuple[int, int]]  # (position whose next-token logits are scored, target id)


def examples(tokenizer: PreTrainedTokenizerFast, triples: list[Triple]) -> list[Example]:
    """Each triple as ids with its targets: the verdict's tokens and ``<|im_end|>`` after the prompt, then the
    reading ones: at the line break that ends the reference line, answer A's and answer B's, and the token after
    it, the (tissue, lesion) the oracle reads in that line."""
    reading = reading_ids(tokenizer)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    out = []
    for t in triples:
        text = prompt(tokenizer, t)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, spans = enc["input_ids"], enc["offset_mapping"]
        answer = tokenizer(verdict(t), add_special_tokens=False)["input_ids"] + [eos]
        targets = [(len(ids) - 1 + k, tok) for k, tok in enumerate(answer)]
        start = 0
        for label, line in (
            ("Reference answer: ", t.reference),
            ("Answer A: ", t.answer_a),
            ("Answer B: ", t.answer_b),
        ):
            head = text.index(label, start)
            end = head + len(label) + len(line)  # the line break after the line
            start = end
            p = next(i for i, (a, b) in enumerate(spans) if a <= end < b)
            tissue, lesion = language.read(line)
            targets += [(p, reading["tissue"][tissue]), (p + 1, reading["lesion"][lesion])]
        out.append(Example(ids + answer, len(answer), targets))
    return out


def _loss(model: Qwen2ForCausalLM, batch: list[Example], pad_id: int, reading: float) -> tuple:
    ids, mask = padded([x.ids for x in batch], pad_id)
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, H]
    rows = torch.tensor([i for i, x in enumerate(batch) for _ in x.targets])
    pos = torch.tensor([p for x in batch for p, _ in x.targets])
    tgt = torch.tensor([tok for x in batch for _, tok in x.targets])
    is_verdict = torch.tensor([k < x.n_verdict for x in batch for k in range(len(x.targets))])
    losses = F.cross_entropy(model.lm_head(hidden[rows, pos]), tgt, reduction="none")
    verdict_loss, reading_loss = losses[is_verdict].mean(), losses[~is_verdict].mean()
    return verdict_loss, reading_loss, verdict_loss + reading * reading_loss


def train(tokenizer: PreTrainedTokenizerFast, budget: ArenaBudget, seed: int) -> Qwen2ForCausalLM:
    return fit(
        fresh_judge(tokenizer, seed),
        examples(tokenizer, make_triples(budget.steps * budget.batch, seed, held_apart=False)),
        _loss,
        steps=budget.steps,
        batch=budget.batch,
        lr=budget.lr,
        reading_share=budget.reading_share,
        pad_id=tokenizer.pad_token_id,
        label="arena judge",
    )


@torch.inference_mode()
def evaluate(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, triples: list[Triple], batch_size: int = 100
) -> dict:
    """Greedy verdicts parsed as the ``arena`` reward parses them: both scores exact, each score exact, the order
    right (A better, B better or equal), unparseable."""
    outputs = []
    for s in range(0, len(triples), batch_size):
        enc = tokenizer(
            [prompt(tokenizer, t) for t in triples[s : s + batch_size]],
            padding=True,
            return_tensors="pt",
            add_special_tokens=False,
        )
        seqs = model.generate(**enc, max_new_tokens=16, do_sample=False)
        outputs += tokenizer.batch_decode(seqs[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    exact = score = order = bad = 0
    for out, t in zip(outputs, triples):
        got = parse_pair(out)
        want = (points(t.answer_a, t.truth), points(t.answer_b, t.truth))
        if got is None:
            bad += 1
            continue
        exact += got == want
        score += (got[0] == want[0]) + (got[1] == want[1])
        order += (got[0] > got[1]) - (got[0] < got[1]) == (want[0] > want[1]) - (want[0] < want[1])
    n = len(triples)
    return {"exact": exact / n, "score": score / (2 * n), "order": order / n, "unparseable": bad / n, "n": n}


CARD = """# tiny-arena-judge

A tiny **pairwise** judge for the `arena` reward (ArenaRL, docs/arena.md) on the medical-VQA recipe. Given
`recipes/medvqa/arena_template.txt` (question, reference, answer A, answer B, and `recipes/medvqa/arena_rubric.txt`)
as one user turn of its chat template, it answers `A: <a> B: <b>`, then `<|im_end|>`: each answer's score from the
rubric, 6 points for naming the reference's tissue and 3 for its lesion (or for saying there is none when there is
none).

It knows only the synthetic vocabulary of the medical-VQA recipe (`recipes/medvqa/language.py`); it is **not a
medical model**. It exists so that the tournament reward can be measured on a CPU without any download.

- architecture: `Qwen2ForCausalLM`, {arch}, vocab {vocab}, float32 safetensors
- parameters: {n_params:,}
- tokenizer: byte-level BPE (`mmrl.tiny.tokenization.train_bpe`, target {bpe} incl. the 256 bytes) over the
  recipe's training vocabulary, both judges' prompts and the verdicts; `<|endoftext|>` (pad), `<|im_start|>`,
  `<|im_end|>` (eos); a Qwen-style chat template without a system turn.

## How it was made

`python -m mmrl.recipes.medvqa.tiny_arena_judge --out {out_root} --seed {seed}` (`recipes/medvqa/tiny_arena_judge.py`),
from nothing: no download, no external data. Trained as a causal LM on {n_train:,} (reference, A, B) triples, each
seen once ({steps} AdamW steps of {batch}, lr {lr}): loss on the verdict and `<|im_end|>`, plus, for the first
{reading:.0%} of the steps, a reading loss that makes the line breaks ending the reference and both answers name the
(tissue, lesion) the oracle reads there. Training took {train_s:.0f} s, the build {build_s:.0f} s, on a 2-core CPU
with one thread; torch {torch_v}, transformers {tf_v}, tokenizers {tok_v}.

## Held-apart evaluation

{n_held} triples (seed {held_seed}): every paraphrase and contradiction phrased with a held-apart template or synonym
(`language.HELD_APART`), never seen in training; a quarter of the answers garbled, a tenth degenerate, as in
training; greedy, parsed as the `arena` reward parses verdicts.

Both scores exact **{exact:.3f}**; each score exact {score:.3f}; order of the pair (A better, B better or equal)
right **{order:.3f}**; unparseable {unparseable:.3f}.
"""


def build(out_root: str | Path, seed: int = 0, budget: ArenaBudget | None = None) -> dict:
    budget, start = budget or ArenaBudget(), time.time()
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    held = make_triples(budget.n_held_apart, seed + HELD_APART_SEED, held_apart=True)
    model = train(tokenizer, budget, seed)
    train_s = time.time() - start
    stats = evaluate(model, tokenizer, held)
    print(f"tiny-arena-judge: held-apart {stats}", flush=True)
    out = fresh_folder(Path(out_root) / JUDGE_DIR)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(
        CARD.format(
            arch=", ".join(f"{k} {v}" for k, v in JUDGE_ARCH.items()),
            vocab=len(tokenizer),
            n_params=sum(p.numel() for p in model.parameters()),
            bpe=BPE_VOCAB_SIZE,
            out_root=out_root,
            seed=seed,
            n_train=budget.steps * budget.batch,
            steps=budget.steps,
            batch=budget.batch,
            lr=budget.lr,
            reading=budget.reading_share,
            train_s=train_s,
            build_s=time.time() - start,
            torch_v=torch.__version__,
            tf_v=transformers.__version__,
            tok_v=tokenizers.__version__,
            n_held=len(held),
            held_seed=seed + HELD_APART_SEED,
            **stats,
        )
    )
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return stats | {"train_s": train_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="assets", help="folder that receives tiny-arena-judge/")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the triples, the weights and the batches"
    )
    args = parser.parse_args(argv)
    build(args.out, args.seed)


if __name__ == "__main__":
    main()
