"""The HF engine's own draw (mmrl.rollout.hf.draw) samples exactly the processed softmax: chi-square tests against
the exact probabilities and against torch.multinomial, truncation and suppression respected, seeded runs repeated,
the ends of the CDF safe; and through HFEngine on the tiny model, the same distribution and the same log-probs as
the training forward."""

import pytest
import torch
from scipy.stats import chi2_contingency, chisquare
from transformers import TopKLogitsWarper, TopPLogitsWarper

from mmrl.config import ModelConfig
from mmrl.model.policy import Policy
from mmrl.rollout import HFEngine, SamplingParams
from mmrl.rollout.hf import draw
from mmrl.types import Sample

ROWS = 200_000
INF = float("-inf")
# 14 tokens: blocks of 3 plus a tail of 2; suppressed tokens first, inside a block, and last
LOGITS = torch.tensor([INF, 0.3, -1.2, 2.0, 0.0, 1.1, INF, -0.5, 0.8, -2.5, 1.6, 0.2, -0.1, INF])


def _counts(scores: torch.Tensor, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    tokens = draw(torch.softmax(scores.expand(ROWS, -1), dim=-1))  # [ROWS], one batched call
    return torch.bincount(tokens, minlength=scores.shape[-1])


def _assert_fits(counts: torch.Tensor, probs: torch.Tensor) -> None:
    """Zero draws where the probability is 0; elsewhere a chi-square goodness-of-fit test at p > 1e-3."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, counts
    kept = probs[keep].double()
    expected = kept / kept.sum() * counts.sum().item()
    assert chisquare(counts[keep].double().numpy(), expected.numpy()).pvalue > 1e-3, (counts, expected)


def test_draws_follow_the_softmax_and_match_multinomial():
    probs = torch.softmax(LOGITS, dim=-1)
    counts = _counts(LOGITS)
    _assert_fits(counts, probs)
    torch.manual_seed(1)
    reference = torch.bincount(torch.multinomial(probs.expand(ROWS, -1), 1)[:, 0], minlength=len(LOGITS))
    keep = probs > 0
    table = torch.stack([counts[keep], reference[keep]]).numpy()
    assert chi2_contingency(table).pvalue > 1e-3, table  # the two samplers: one distribution


@pytest.mark.parametrize("warper", [TopKLogitsWarper(4), TopPLogitsWarper(0.8)], ids=["top_k", "top_p"])
def test_truncation_is_respected(warper):
    scores = warper(None, LOGITS[None].clone())[0]  # [V], -inf outside the kept set
    probs = torch.softmax(scores, dim=-1)
    assert 0 < (probs > 0).sum() < (LOGITS > INF).sum()
    _assert_fits(_counts(scores), probs)


def test_never_draws_a_suppressed_token_at_qwen_vocabulary():
    torch.manual_seed(0)
    scores = torch.randn(64, 151_936) * 4  # [B, V]
    suppressed = torch.randint(0, 151_936, (5000,))
    scores[:, suppressed] = INF
    scores[:, -1000:] = INF  # a suppressed tail block
    tokens = torch.cat([draw(torch.softmax(scores, dim=-1)) for _ in range(50)])
    assert not torch.isin(tokens, suppressed).any() and tokens.max() < 151_936 - 1000


def test_draws_repeat_under_manual_seed():
    probs = torch.softmax(LOGITS.expand(1000, -1), dim=-1)
    torch.manual_seed(3)
    a = draw(probs)
    torch.manual_seed(3)
    assert torch.equal(a, draw(probs))
    torch.manual_seed(4)
    assert not torch.equal(a, draw(probs))


def _fixed_uniform(monkeypatch, value: float) -> None:
    monkeypatch.setattr(torch, "rand", lambda *size, **kw: torch.full(size, value, **kw))


def test_a_rare_token_owns_its_slice(monkeypatch):
    """A token of probability 1e-9 between two of 0.5 is drawn for exactly the uniforms in its own slice: a float32
    CDF (0.5 + 1e-9 rounds to 0.5) would never draw it."""
    probs = torch.zeros(10)
    probs[2], probs[4], probs[7] = 0.5, 1e-9, 0.5
    p = probs.double()
    total = p.sum().item()
    for at, token in [(0.5 - 1e-12, 2), (0.5 + 0.5 * p[4].item(), 4), (0.5 + 2e-9, 7)]:
        _fixed_uniform(monkeypatch, at / total)
        assert draw(probs[None]).item() == token, (at, token)


@pytest.mark.parametrize("vocab", [1, 5, 13, 1000])
def test_the_ends_of_the_cdf_never_draw_a_zero_token(monkeypatch, vocab):
    """u = 0 draws the first token with probability; u * total == total (rounding) still draws a token with
    probability, here with zero-probability tokens first and last (a whole zero block at the end for 1000)."""
    torch.manual_seed(0)
    scores = torch.randn(8, vocab)
    if vocab > 2:
        scores[:, 0] = scores[:, -1] = INF
    if vocab == 1000:
        scores[:, -40:] = INF
    probs = torch.softmax(scores, dim=-1)
    first = (probs > 0).int().argmax(-1)
    _fixed_uniform(monkeypatch, 0.0)
    assert torch.equal(draw(probs), first)
    _fixed_uniform(monkeypatch, 1.0)
    for _ in range(20):
        assert (probs.gather(-1, draw(probs)[:, None]) > 0).all()


@pytest.fixture(scope="module")
def policy():
    return Policy.from_pretrained(
        ModelConfig(path="assets/tiny-qwen2.5-vl", min_pixels=3136, max_pixels=12544)
    )


@pytest.fixture(scope="module")
def prompt(policy):
    return policy.encode(
        Sample("t", [{"role": "user", "content": [{"type": "text", "text": "Say something."}]}])
    )


def _no_multinomial(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the HF engine sampled with torch.multinomial")

    monkeypatch.setattr(torch, "multinomial", fail)


def test_engine_first_token_follows_the_model(policy, prompt, monkeypatch):
    """3,000 first tokens drawn by HFEngine (top_k=8, one batch) fit the model's own top-8 softmax."""
    with torch.no_grad():
        seq = {k: v[None] for k, v in prompt.seq.items()}
        logits = policy.model(input_ids=prompt.input_ids[None], **prompt.mm, **seq).logits[0, -1].float()
    logits[policy.suppressed_token_ids] = INF
    top = logits.topk(9)
    assert top.values[7] - top.values[8] > 1e-4  # the kept set does not depend on cached-decoding rounding
    _no_multinomial(monkeypatch)
    torch.manual_seed(0)
    rows = HFEngine(policy).generate([prompt], SamplingParams(n=3000, top_k=8, max_new_tokens=1))[0]
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in rows]), minlength=len(logits))
    probs = torch.zeros_like(logits).scatter_(0, top.indices[:8], torch.softmax(top.values[:8], dim=-1))
    _assert_fits(counts, probs)
    lp = torch.log_softmax(logits, dim=-1)  # recorded log-probs: of the untruncated distribution
    assert max(abs(c.logprobs[0] - lp[c.token_ids[0]].item()) for c in rows) < 1e-5


def test_engine_rollouts_match_the_training_forward(policy, prompt, monkeypatch):
    _no_multinomial(monkeypatch)
    params = SamplingParams(n=6, temperature=0.8, top_p=0.95, top_k=50, max_new_tokens=8)
    torch.manual_seed(0)
    comps = HFEngine(policy, batch_size=1).generate([prompt], params)[0]
    with torch.no_grad():
        lp, _, mask = policy.logprobs([prompt] * 6, [c.token_ids for c in comps], temperature=0.8)
    for i, c in enumerate(comps):
        assert mask[i].sum().item() == len(c.token_ids) == len(c.logprobs)
        assert not set(c.token_ids) & set(policy.suppressed_token_ids)
        assert (lp[i, : len(c.token_ids)] - torch.tensor(c.logprobs)).abs().max().item() < 1e-5
    torch.manual_seed(0)
    again = HFEngine(policy, batch_size=1).generate([prompt], params)[0]
    assert [c.token_ids for c in again] == [c.token_ids for c in comps]  # seeded runs repeat


def test_top_k_1_sampling_is_greedy(policy, prompt):
    greedy = HFEngine(policy).generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=8))[0][0]
    torch.manual_seed(0)
    sampled = HFEngine(policy).generate([prompt], SamplingParams(n=3, top_k=1, max_new_tokens=8))[0]
    assert all(c.token_ids == greedy.token_ids for c in sampled)
