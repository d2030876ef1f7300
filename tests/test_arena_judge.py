"""The tiny pairwise judge for ArenaRL on medvqa (recipes/medvqa/tiny_arena_judge.py, assets/tiny-arena-judge): the
rubric's points on hand-read answers, the training targets (the verdict's tokens, the reading positions at the line
breaks), and the shipped judge through the ``arena`` reward: its verdicts parse, it scores held-apart answers by the
rubric, and a group's tournament puts the true answer first."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mmrl.config import load_config
from mmrl.recipes.medvqa import language
from mmrl.recipes.medvqa import tiny_arena_judge as J
from mmrl.recipes.medvqa.rewards import medvqa_oracle
from mmrl.rewards.arena import arena, parse_pair
from mmrl.rewards.local_model import Loaded
from mmrl.types import RewardInput

ROOT = Path(__file__).resolve().parents[1]
JUDGE = ROOT / "assets" / "tiny-arena-judge"
shipped = pytest.mark.skipif(
    not (JUDGE / "config.json").is_file(), reason="assets/tiny-arena-judge is not here"
)


def test_rubric_points_by_hand():
    truth = ("adipose", "tumour")
    assert J.points("adipose tissue with tumour", truth) == 9  # 6 + 3
    assert J.points("fat containing a neoplasm", truth) == 9  # synonyms read the same
    assert J.points("adipose tissue, no lesion", truth) == 6  # the tissue only
    assert J.points("fibrous stroma with tumour", truth) == 3  # the lesion only
    assert J.points("fibrous stroma, no lesion", truth) == 0
    assert J.points("", truth) == 0
    assert (
        J.points("adipose tissue and fibrous stroma with tumour", truth) == 3
    )  # two tissues read as neither
    assert (
        J.points("lymphoid tissue, no lesion", ("lymphoid", "none")) == 9
    )  # "no lesion" is the lesion state
    t = J.Triple("adipose tissue with tumour", "fat with a tumour", "", truth)
    assert J.verdict(t) == "A: 9 B: 0" and parse_pair(J.verdict(t)) == (9.0, 0.0)


def test_training_targets_sit_on_the_verdict_and_the_line_breaks():
    tok = J.build_tokenizer()
    truth = ("stroma", "necrosis")
    t = J.Triple("fibrous stroma with necrosis", "stroma with necrotic debris", "fat, no lesion", truth)
    (ex,) = J.examples(tok, [t])
    verdict = ex.targets[: ex.n_verdict]
    # the verdict's targets are the ids after the prompt, in order, then <|im_end|>
    assert [p for p, _ in verdict] == list(range(len(ex.ids) - 1 - ex.n_verdict, len(ex.ids) - 1))
    assert tok.decode([i for _, i in verdict]) == "A: 9 B: 0<|im_end|>"
    assert ex.ids[-ex.n_verdict :] == [i for _, i in verdict]
    # reading targets: the line break after the reference, answer A and answer B, and the token after each
    reading = ex.targets[ex.n_verdict :]
    breaks = [p for p, _ in reading[::2]]
    assert [tok.decode([ex.ids[p]]) for p in breaks] == ["\n"] * 3
    assert [p + 1 for p in breaks] == [p for p, _ in reading[1::2]]
    words = [tok.decode([i]).strip() for _, i in reading]
    assert words == ["stroma", "necrosis", "stroma", "necrosis", "adipose", "no"]


def test_triples_are_seeded_and_held_apart():
    a, b = J.make_triples(50, 7, held_apart=True), J.make_triples(50, 7, held_apart=True)
    assert a == b
    phrased = [
        x
        for t in a
        for x, k in zip((t.answer_a, t.answer_b), t.kinds)
        if k in ("paraphrase", "contradiction")
    ]
    assert phrased and all(language.uses_held_apart(x) for x in phrased)
    train = J.make_triples(400, 7, held_apart=False)
    assert not any(language.uses_held_apart(x) for t in train for x in (t.answer_a, t.answer_b))
    assert any(t.answer_a == t.answer_b for t in train)  # identical answers meet in a group too
    kinds = [k for t in train for k in t.kinds]
    assert {k: round(kinds.count(k) / len(kinds), 1) for k in set(kinds)} == {
        "noise": 0.2, "degenerate": 0.1, "paraphrase": 0.3, "contradiction": 0.3
    }  # fmt: skip
    noisy = [x for t in train for x, k in zip((t.answer_a, t.answer_b), t.kinds) if k == "noise"]
    assert any(x.startswith("<think>") for x in noisy) and any(all(language.read(x)) for x in noisy)


@shipped
@torch.inference_mode()
def test_shipped_judge_scores_held_apart_answers_by_the_rubric():
    model, tok = AutoModelForCausalLM.from_pretrained(JUDGE).eval(), AutoTokenizer.from_pretrained(JUDGE)
    tok.padding_side = "left"
    triples = J.make_triples(200, 2024, held_apart=True)  # not the card's seed
    stats = J.evaluate(model, tok, triples)
    assert stats["unparseable"] == 0.0, stats
    assert stats["order"] >= 0.85 and stats["score"] >= 0.85, stats
    card = (JUDGE / "README.md").read_text()
    assert "not a\nmedical model" in card and "Held-apart evaluation" in card
    assert sum(p.stat().st_size for p in JUDGE.rglob("*") if p.is_file()) < 6 * 2**20


def _group(answers: list[str], finding: tuple[str, str]) -> list[RewardInput]:
    prompt = f"<image>{language.QUESTION}"
    refs = language.variants(*finding, 3, random.Random(0))
    meta = {"question": language.QUESTION, "tissue": finding[0], "lesion": finding[1]}
    return [
        RewardInput("tile-1", f"<think>t</think><answer>{a}</answer>", refs, prompt=prompt, metadata=meta)
        for a in answers
    ]


@shipped
def test_the_tournament_puts_the_true_answer_first():
    finding = ("epithelium", "tumour")
    answers = [
        "glandular epithelium, no lesion",  # tissue only: 6
        "adipose tissue, no lesion",  # 0
        "fibrous stroma with carcinoma",  # lesion only: 3
        "glandular epithelium containing a tumour",  # right: 9
    ]
    batch = _group(answers, finding)
    cfg = load_config(ROOT / "recipes" / "medvqa" / "tiny-arena.yaml", [])
    options = dict(cfg.rewards[0].options)
    options |= {
        k: str(ROOT / options[k]) for k in ("model", "template", "rubric")
    }  # the recipe's, from any folder
    try:
        out = arena(batch, **options)
    finally:
        Loaded.clear()
    assert [r.parts["rank"] for r in out] == [1.0, 3.0, 2.0, 0.0]  # by the rubric's points: 9 > 6 > 3 > 0
    assert [r.score for r in out] == pytest.approx([2 / 3, 0.0, 1 / 3, 1.0])  # normalize: false, 1 - rank / 3
    assert out[0].parts["parse_failures"] == 0.0 and out[0].parts["order_accuracy"] == 1.0
    assert [r.parts["true_correct"] for r in out] == [0.0, 0.0, 0.0, 1.0]
    assert [r.score for r in medvqa_oracle(batch)] == [0.0, 0.0, 0.0, 1.0]
