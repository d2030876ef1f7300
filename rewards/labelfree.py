"""Rewards without labels: the group's own answers stand in for the reference (docs/labelfree.md).

All three are group rewards (``register_reward(..., group=True)``): the composite hands them whole groups, the G
responses to one prompt laid side by side with the same sample id, and the score of a response depends on the others.
Each response's final answer is parsed as ``answer`` says and the group's answers are clustered greedily: a response
joins the first cluster whose first answer it equals (``letter``: the option letter; ``number``: the last number, equal
within 1e-9 relative; ``exact``: SQuAD-normalised text; ``math``: math-verify equivalence, needs the ``render`` extra).
A response without an answer votes for nothing and agrees with nothing.

- ``ttrl`` (TTRL): the pseudo-label is the cluster with the most votes among the first ``votes`` responses (0: all;
  ties go to the answer seen first); r_i = 1 when response i's answer is the label, else 0.
- ``scope`` (SCOPE): votes weighted by confidence, several subgroup labels, the subgroup size chosen on a Pareto front
  (:func:`pareto_choice`). Confidence C_i = exp(mean token log-prob), the geometric-mean probability of the sampled
  tokens (in (0, 1], higher = more confident; the authors' code weighs by the mean NLL, the reverse, see the docs page).
  The log-probs are ``metadata["response_logprobs"]``, which the trainer provides; where they are absent (a reward
  called from the CLI, held-out validation) every C_i is 1 and the votes are plain frequency votes (part
  ``confidence_weighted`` says which).
- ``empo`` (EMPO): r_i = p(c_i) = |c_i| / G, the share of response i's meaning cluster; unanswered responses form one
  cluster of their own and score ``empty_score``; a group whose answers are all distinct scores 0.

Parts: ``pseudo_label_correct`` (only when the sample has a reference: whether the label, response i's own subgroup
label under SCOPE, equals the true answer; left out when the reference cannot be read as ``answer``) measures the
pseudo-labels' accuracy without the score ever using the reference; ``agreement`` (TTRL, SCOPE: the share of the
group whose answer is its label), ``subgroup_size`` and ``confidence_weighted`` (SCOPE), ``semantic_entropy`` (EMPO).
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from mmrl.rewards.base import LOGPROBS_KEY, group_spans, register_reward
from mmrl.rewards.general import math_parse
from mmrl.rewards.text import (
    answer_text,
    extract_answer,
    extract_choice_letter,
    normalize_text,
    reference_letters,
)
from mmrl.types import RewardInput, RewardResult

AnswerKind = Literal["letter", "number", "exact", "math"]
_NUMBER = re.compile(r"-?(?:\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)(?:\s*/\s*-?\d+(?:\.\d+)?)?")


# -- answers -----------------------------------------------------------------------------------------------------


def parse_number(text: str) -> float | None:
    """The last number in ``text`` (thousands commas dropped, ``a/b`` as its value), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    num, _, den = found[-1].replace(",", "").partition("/")
    try:
        value = float(num) / float(den) if den else float(num)
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None


def _same_number(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _math_timeout() -> int | None:
    # math-verify's timeouts use signal.alarm, which only works in the main thread (see mmrl.rewards.general)
    return 5 if threading.current_thread() is threading.main_thread() else None


class _Kind:
    """How one answer kind reads a response, compares two answers and checks an answer against a reference."""

    def __init__(self, kind: AnswerKind):
        self.kind = kind

    def parse(self, x: RewardInput) -> Any | None:
        if self.kind == "letter":
            return extract_choice_letter(answer_text(x.response), x.metadata.get("choices"))
        if self.kind == "number":
            return parse_number(answer_text(x.response))
        if self.kind == "exact":  # "A" normalises to "" (an article): still an answer
            text = answer_text(x.response)
            return normalize_text(text) if text else None
        tagged = extract_answer(x.response)
        return math_parse(tagged if tagged is not None else x.response, _math_timeout()) or None

    def same(self, a: Any, b: Any) -> bool:
        if self.kind == "number":
            return _same_number(a, b)
        if self.kind == "math":
            from math_verify import verify

            return bool(verify(a, b, timeout_seconds=_math_timeout()))
        return a == b

    def matches_reference(self, answer: Any, x: RewardInput) -> float | None:
        """1.0/0.0: whether ``answer`` is the sample's true answer; None when the reference cannot be read."""
        ref = x.reference
        if self.kind == "letter":
            try:
                return float(answer in reference_letters(ref, x.metadata.get("choices"), x.id))
            except ValueError:
                return None
        refs = ref if isinstance(ref, (list, tuple)) else [ref]
        if self.kind == "exact":
            return float(any(answer == normalize_text(str(r)) for r in refs))
        if self.kind == "number":
            values = [v for v in (parse_number(str(r)) for r in refs) if v is not None]
            return float(any(_same_number(answer, v) for v in values)) if values else None
        golds = [g for g in (math_parse(str(r), _math_timeout()) for r in refs) if g]
        return float(any(self.same(g, answer) for g in golds)) if golds else None


def cluster(answers: Sequence[Any | None], same: Callable[[Any, Any], bool]) -> list[int | None]:
    """Greedy clustering: each answer joins the first cluster whose first answer it equals; None stays None."""
    firsts: list[Any] = []
    ids: list[int | None] = []
    for a in answers:
        if a is None:
            ids.append(None)
            continue
        found = next((c for c, rep in enumerate(firsts) if same(rep, a)), None)
        if found is None:
            found = len(firsts)
            firsts.append(a)
        ids.append(found)
    return ids


def vote(ids: Sequence[int | None], weights: Sequence[float]) -> int | None:
    """The cluster with the largest total weight (ties: the one seen first); None when nobody answered."""
    totals: dict[int, float] = {}
    for c, w in zip(ids, weights):
        if c is not None:
            totals[c] = totals.get(c, 0.0) + w
    return max(totals, key=totals.__getitem__) if totals else None


class _Group:
    """One group's responses with their parsed answers and cluster ids (None: no answer)."""

    def __init__(self, items: Sequence[RewardInput], kind: AnswerKind):
        self.items, self.kind = items, _Kind(kind)
        self.answers = [self.kind.parse(x) for x in items]
        self.ids = cluster(self.answers, self.kind.same)

    def label_parts(self, label: int | None) -> dict[str, float]:
        """``pseudo_label_correct`` for cluster ``label`` when the sample has a readable reference, else nothing."""
        x = self.items[0]
        if x.reference is None:
            return {}
        if label is None:
            return {"pseudo_label_correct": 0.0}
        correct = self.kind.matches_reference(self.answers[self.ids.index(label)], x)
        return {} if correct is None else {"pseudo_label_correct": correct}


def _groups(batch: list[RewardInput], kind: AnswerKind) -> list[_Group]:
    return [_Group(batch[s.start : s.stop], kind) for s in group_spans(batch)]


def _check(reward: str) -> Callable[[dict[str, Any]], None]:
    """Pre-flight of the options beyond their kinds: ranges, SCOPE's sizes, math-verify installed for ``math``."""

    def check(options: dict[str, Any]) -> None:
        if options.get("answer") == "math":
            from mmrl.extras import require

            require("render", f"reward {reward!r} with answer: math", ["math_verify"])
        for key in ("votes", "votes_per_subgroup"):
            if options.get(key, 0) < 0:
                raise ValueError(
                    f"reward {reward!r}: option {key!r} must be >= 0 (0: all), got {options[key]}"
                )
        sizes = options.get("subgroup_sizes")
        if sizes is not None and (
            not isinstance(sizes, list) or not sizes or not all(isinstance(g, int) and g > 0 for g in sizes)
        ):
            raise ValueError(
                f"reward {reward!r}: option 'subgroup_sizes' must be a list of positive integers, got {sizes!r}"
            )
        if not 0.0 <= options.get("lam", 0.0) <= 1.0:
            raise ValueError(f"reward {reward!r}: option 'lam' must be in [0, 1], got {options['lam']}")
        if not 0.0 <= options.get("min_top_share", 0.0) <= 1.0:
            raise ValueError(f"reward {reward!r}: option 'min_top_share' must be in [0, 1]")
        empty = options.get("empty_score")
        if empty is not None and (isinstance(empty, bool) or not isinstance(empty, (int, float))):
            raise ValueError(f"reward {reward!r}: option 'empty_score' must be a number, got {empty!r}")

    return check


# -- TTRL --------------------------------------------------------------------------------------------------------


@register_reward("ttrl", group=True, check=_check("ttrl"))
def ttrl(batch: list[RewardInput], *, answer: AnswerKind = "exact", votes: int = 0) -> list[RewardResult]:
    """Majority vote of the first ``votes`` responses (0: all) is the label; r_i = 1[answer_i = label]."""
    out = []
    for g in _groups(batch, answer):
        voters = g.ids[: votes or None]
        label = vote(voters, [1.0] * len(voters))
        rewards = [float(c is not None and c == label) for c in g.ids]
        parts = {"agreement": sum(rewards) / len(rewards)} | g.label_parts(label)
        out += [RewardResult(score=r, parts=parts) for r in rewards]
    return out


# -- SCOPE -------------------------------------------------------------------------------------------------------


def confidence(x: RewardInput) -> float | None:
    """exp(mean log-prob of the sampled tokens), in (0, 1]: higher = more confident; None without log-probs, 1 for a
    response of no tokens. A mean above 0 (greedy engines report logits) counts as 0, certainty."""
    lps = x.metadata.get(LOGPROBS_KEY)
    if lps is None:
        return None
    return math.exp(min(0.0, sum(lps) / len(lps))) if len(lps) else 1.0


def pareto_choice(candidates: dict[int, tuple[float, float]], lam: float = 0.7) -> int:
    """SCOPE's subgroup size: of ``{size: (R, D)}`` (R: mean pseudo-reward, D: distinct labels) keep the sizes no
    other beats on both (better on one, no worse on the other), min-max normalise R and D over them and return the
    one closest to the ideal (1, 1): argmin sqrt(lam (1 - R~)^2 + (1 - lam) (1 - D~)^2); ties go to the smaller."""

    def dominated(a: tuple[float, float]) -> bool:
        return any(b[0] >= a[0] and b[1] >= a[1] and b != a for b in candidates.values())

    front = {g: rd for g, rd in sorted(candidates.items()) if not dominated(rd)}
    r_lo, r_hi = min(r for r, _ in front.values()), max(r for r, _ in front.values())
    d_lo, d_hi = min(d for _, d in front.values()), max(d for _, d in front.values())

    def distance(rd: tuple[float, float]) -> float:
        r, d = (rd[0] - r_lo) / (r_hi - r_lo + 1e-8), (rd[1] - d_lo) / (d_hi - d_lo + 1e-8)
        return math.sqrt(lam * (1 - r) ** 2 + (1 - lam) * (1 - d) ** 2)

    return min(front, key=lambda g: distance(front[g]))


def subgroup_labels(
    ids: Sequence[int | None], weights: Sequence[float], size: int, k: int, rng: random.Random
) -> list[int | None]:
    """Each response's label: the G responses form G/size consecutive blocks; each block's label is the weighted
    vote of ``k`` responses drawn at random (without replacement) from the whole group."""
    n = len(ids)
    labels = []
    for _ in range(n // size):
        draw = rng.sample(range(n), k)
        labels.append(vote([ids[i] for i in draw], [weights[i] for i in draw]))
    return [labels[i // size] for i in range(n)]


def _sizes(n: int, sizes: list[int] | None) -> list[int]:
    default = sorted({2**p for p in range(n.bit_length()) if n % 2**p == 0} | {n})
    return [g for g in (sizes or default) if n % g == 0] or [n]


def _rng(seed: int, items: Sequence[RewardInput]) -> random.Random:
    # the same group always draws the same subgroups: a reward is a function of its inputs
    text = "\x1f".join([str(seed), items[0].id, *(x.response for x in items)])
    return random.Random(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())


@register_reward("scope", group=True, check=_check("scope"))
def scope(
    batch: list[RewardInput],
    *,
    answer: AnswerKind = "exact",
    subgroup_sizes: list[int] | None = None,
    votes_per_subgroup: int = 0,
    lam: float = 0.7,
    seed: int = 0,
) -> list[RewardResult]:
    """Confidence-weighted subgroup votes. ``subgroup_sizes``: the candidates (default: the powers of two that divide
    G, and G; sizes that do not divide G are skipped); ``votes_per_subgroup``: responses drawn per subgroup label
    (0: half the group, SCOPE's 32 of 64; capped at G); ``lam``: the weight of the pseudo-reward rate against label
    diversity in the choice of the size, chosen per group (:func:`pareto_choice`)."""
    out = []
    for g in _groups(batch, answer):
        n = len(g.items)
        conf = [confidence(x) for x in g.items]
        weighted = all(c is not None for c in conf)
        weights = [c if weighted else 1.0 for c in conf]
        k = min(votes_per_subgroup or -(-n // 2), n)
        rng = _rng(seed, g.items)
        runs: dict[int, tuple[list[int | None], list[float]]] = {}
        for size in _sizes(n, subgroup_sizes):
            labels = subgroup_labels(g.ids, weights, size, k, rng)
            runs[size] = labels, [float(c is not None and c == lab) for c, lab in zip(g.ids, labels)]
        stats = {
            s: (sum(r) / n, float(len({lab for lab in ls if lab is not None}))) for s, (ls, r) in runs.items()
        }
        best = pareto_choice(stats, lam)
        labels, rewards = runs[best]
        common = {
            "agreement": stats[best][0],
            "subgroup_size": float(best),
            "confidence_weighted": float(weighted),
        }
        out += [RewardResult(score=r, parts=common | g.label_parts(lab)) for r, lab in zip(rewards, labels)]
    return out


# -- EMPO --------------------------------------------------------------------------------------------------------


@register_reward("empo", group=True, check=_check("empo"))
def empo(
    batch: list[RewardInput],
    *,
    answer: AnswerKind = "exact",
    empty_score: float | None = None,
    min_top_share: float = 0.0,
) -> list[RewardResult]:
    """r_i = share of response i's meaning cluster. ``empty_score``: an unanswered response's score (default: EMPO's
    -0.5 for free-form ``exact`` answers, 0 for the rule-checked kinds); a group whose answers are all distinct
    scores 0, and so does one whose largest cluster holds less than ``min_top_share`` of it (EMPO's free-form runs:
    0.2)."""
    empty = empty_score if empty_score is not None else (-0.5 if answer == "exact" else 0.0)
    out = []
    for g in _groups(batch, answer):
        n = len(g.items)
        ids = [-1 if c is None else c for c in g.ids]  # the unanswered: one cluster of their own
        share = {c: ids.count(c) / n for c in ids}
        entropy = -sum(p * math.log(p) for p in share.values())
        flat = len(share) == n or (len(share) > 1 and max(share.values()) < min_top_share)
        answered = [c for c in g.ids if c is not None]
        label = max(answered, key=answered.count) if answered else None  # ties: the first seen
        parts = {"semantic_entropy": entropy} | g.label_parts(label)
        scores = [empty if c == -1 else 0.0 if flat else share[c] for c in ids]
        out += [RewardResult(score=s, parts=parts) for s in scores]
    return out


__all__ = [
    "cluster",
    "confidence",
    "empo",
    "pareto_choice",
    "parse_number",
    "scope",
    "subgroup_labels",
    "ttrl",
    "vote",
]
