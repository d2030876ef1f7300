"""``arena``: ArenaRL's tournament-based relative ranking of a group's open-ended answers (docs/arena.md).

A group reward (``register_reward(..., group=True)``): the G responses to one prompt play a tournament judged
pairwise by a local LLM judge, and each response's reward is its place in the group, not a pointwise score:

    rank_i   = place of response i in the tournament (0 = champion, G - 1 = last)
    reward_i = 1 - rank_i / (G - 1)
    score_i  = (reward_i - mean_G) / (std_G + 1e-6)     with ``normalize`` (default), std unbiased

The tournament core (:func:`play`, :func:`play_groups` and the topologies) knows no model: a topology is a generator
that yields one round of matches ``(i, j)`` at a time, receives each match's points ``(score_i, score_j)`` and returns
the ranks. The reward drives every group's tournament in lockstep, so one judge call scores one round of all groups.

- ``single_elimination`` (the paper's): every response j >= 1 first plays the anchor, response 0 (seeding; the
  anchor's seeding points are the mean of what it scored in those matches); the seeds, best first, fill a standard
  bracket (1 vs P, 2 vs P - 1, ... for P the next power of two), the missing seeds are byes and the best seeds get
  them; the winner of a match advances. Rank: the champion, the final's loser, the semifinals' losers, ...; losers
  of one round are ordered by their mean points over all their matches, then by seed. 2G - 2 matches.
- ``anchor``: only the seeding matches; rank by points against the anchor. G - 1 matches.
- ``round_robin``: every pair plays once; rank by wins (a drawn match is half a win each). G(G - 1)/2 matches.

Equal points (``anchor``, ``round_robin``) share the best place among them (competition ranking: rank = how many did
strictly better). A drawn knockout match goes to the better seed. A group the tournament does not separate (every
answer scored the same against the anchor and every knockout match drawn: a judge that never parses) shares one
place under every topology: all score alike, and GRPO gives them no advantage.

Each match is judged both ways: the judge sees (A = i, B = j) and then (A = j, B = i), and each side's points are
the sum of its two scores (:func:`both_ways`), which cancels a position bias. A verdict is two 0-10 scores
(:func:`parse_pair`); an unparseable or timed-out one counts 5.0 for each side and is counted in part
``parse_failures``.

Departures from the authors' code (docs/arena.md names it and argues each):
- byes go to the best seeds of a standard bracket; the code drops the bye slots and pairs the rest in order, so with
  G = 5 its top seed plays in the first round and its third seed sits out;
- a drawn knockout match goes to the better seed (the code: to the upper slot of the bracket), and a group the
  tournament does not separate shares one place (the code ranks it by bracket position);
- ``anchor`` and ``round_robin``: the code maps ranks to (max_rank - r)/(max_rank - 1), which is affine in r like
  1 - r/(G - 1); after the z-normalisation both give the same scores;
- a group of one plays no match and scores the group mean: 0.5, or 0 with ``normalize`` (the code refuses it).

Parts: ``rank`` (0 = best), ``matches`` (matches the group played; 2 judge generations each), ``judge_calls`` (the
group's generations the content cache did not answer), ``parse_failures`` (the group's verdicts scored 5.0-5.0), and,
when the sample has a reference and ``truth`` names a reward that reads it (default ``exact_match``), ``true_correct``
(that reward's score for the response) and ``order_accuracy`` (of the group's pairs of a correct and a wrong response,
the share the tournament put in the right order; ties half). The reference never changes the score.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

from mmrl.rewards.base import (
    call_reward,
    group_spans,
    load_reward,
    register_reward,
    validate_options,
)
from mmrl.rewards.judge import load_judge, question_of
from mmrl.rewards.local_model import (
    LRU,
    check_model_folder,
    clean_reference,
    content_key,
    open_images,
)
from mmrl.rewards.text import answer_text
from mmrl.types import RewardInput, RewardResult

Pair = tuple[int, int]
Points = tuple[float, float]
# A topology: yields (stage, the round's matches), receives the matches' points, returns the ranks (0 = best).
Rounds = Generator[tuple[str, list[Pair]], list[Points], list[int]]
Topology = Literal["single_elimination", "anchor", "round_robin"]
ANCHOR = 0  # the anchor is the group's first response (the authors' code; their blog names a greedy answer)
PARSE_FAILURE = 5.0  # the points each side gets from a verdict that cannot be read (the authors' default)
EPS = 1e-6


# -- the tournament core (no model) --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    stage: str  # "seeding", "round 1", ..., "anchor", "round robin"
    i: int
    j: int
    score_i: float
    score_j: float


@dataclass
class Standing:
    ranks: list[int]  # per response, 0 = best
    matches: list[Match] = field(default_factory=list)


def competition_ranks(values: Sequence[float]) -> list[int]:
    """Higher is better; equal values share the best place: rank = how many values are strictly higher."""
    return [sum(v > x for v in values) for x in values]


def bracket_order(size: int) -> list[int]:
    """The seeds (0 = best) in bracket slots for ``size`` a power of two; slots 2k and 2k + 1 meet in round 1:
    4 -> [0, 3, 1, 2], 8 -> [0, 7, 3, 4, 1, 6, 2, 5], so the two best seeds can only meet in the final."""
    order = [0]
    while len(order) < size:
        m = 2 * len(order)
        order = [x for s in order for x in (s, m - 1 - s)]
    return order


def _against_anchor(n: int, stage: str) -> Generator[tuple[str, list[Pair]], list[Points], list[float]]:
    """Every response plays the anchor once: its points from that match; the anchor's, the mean of its own."""
    duels = [(j, ANCHOR) for j in range(n) if j != ANCHOR]
    got = yield stage, duels
    points = [0.0] * n
    for (j, _), (sj, _) in zip(duels, got):
        points[j] = sj
    points[ANCHOR] = statistics.fmean(s0 for _, s0 in got)
    return points


def _knockout(
    seeds: list[int], points: list[list[float]]
) -> Generator[tuple[str, list[Pair]], list[Points], tuple[int, list[list[int]], bool]]:
    """The bracket for ``seeds`` (best first), byes to the best; adds each match's points to ``points``. Returns the
    champion, each round's losers and whether any match was decided (not drawn)."""
    seed_of = {p: s for s, p in enumerate(seeds)}
    n = len(seeds)
    slots: list[int | None] = [seeds[s] if s < n else None for s in bracket_order(1 << (n - 1).bit_length())]
    eliminated: list[list[int]] = []
    decided = False
    while len(slots) > 1:
        duels = [(a, b) for a, b in zip(slots[::2], slots[1::2]) if a is not None and b is not None]
        got = yield f"round {len(eliminated) + 1}", duels
        decided = decided or any(sa != sb for sa, sb in got)
        winner = {}
        for (a, b), (sa, sb) in zip(duels, got):
            points[a].append(sa)
            points[b].append(sb)
            winner[a] = winner[b] = (
                a if (sa, -seed_of[a]) > (sb, -seed_of[b]) else b
            )  # a draw: the better seed
        eliminated.append([p for d in duels for p in d if winner[p] != p])
        # a slot facing a bye advances; the bracket never pairs two byes (P < 2n)
        slots = [winner.get(a, a) if a is not None else b for a, b in zip(slots[::2], slots[1::2])]
    return slots[0], eliminated, decided  # type: ignore[return-value]


def single_elimination(n: int) -> Rounds:
    """Seeding against the anchor, then a seeded knockout bracket with byes for the best seeds (module docstring)."""
    if n < 2:
        return [0] * n
    seeding = yield from _against_anchor(n, "seeding")
    seeds = sorted(range(n), key=lambda p: -seeding[p])  # stable: equal seeding points keep response order
    points = [[s] for s in seeding]
    champion, eliminated, decided = yield from _knockout(seeds, points)
    if (
        not decided and len(set(seeding)) == 1
    ):  # nobody separated (a judge that never parses): one shared place
        return [0] * n
    seed_of = {p: s for s, p in enumerate(seeds)}
    order = [champion]
    for losers in reversed(eliminated):
        order += sorted(losers, key=lambda p: (-statistics.fmean(points[p]), seed_of[p]))
    return [order.index(p) for p in range(n)]


def anchor(n: int) -> Rounds:
    """Rank by points against the anchor (:func:`_against_anchor`)."""
    if n < 2:
        return [0] * n
    points = yield from _against_anchor(n, "anchor")
    return competition_ranks(points)


def round_robin(n: int) -> Rounds:
    """Every pair plays once; a win counts 1, a draw 1/2 to each."""
    if n < 2:
        return [0] * n
    duels = list(combinations(range(n), 2))
    got = yield "round robin", duels
    wins = [0.0] * n
    for (i, j), (si, sj) in zip(duels, got):
        wins[i] += 1.0 if si > sj else 0.5 if si == sj else 0.0
        wins[j] += 1.0 if sj > si else 0.5 if si == sj else 0.0
    return competition_ranks(wins)


TOPOLOGIES: dict[str, Callable[[int], Rounds]] = {
    "single_elimination": single_elimination,
    "anchor": anchor,
    "round_robin": round_robin,
}


def play_groups(
    sizes: Sequence[int],
    judge: Callable[[list[tuple[int, int, int]]], list[Points]],
    topology: Topology = "single_elimination",
) -> list[Standing]:
    """One tournament per group of ``sizes``, in lockstep: each call ``judge([(group, i, j), ...])`` scores the
    current round of every group still playing and returns one ``(score_i, score_j)`` per match."""
    games = [TOPOLOGIES[topology](n) for n in sizes]
    standings = [Standing(ranks=[]) for _ in sizes]
    playing: dict[int, tuple[str, list[Pair]]] = {}

    def advance(k: int, got: list[Points] | None) -> None:
        try:
            playing[k] = games[k].send(got)  # type: ignore[arg-type]  # the first send is None (start)
        except StopIteration as done:
            standings[k].ranks = done.value
            playing.pop(k, None)

    for k in range(len(games)):
        advance(k, None)
    while playing:
        todo = [(k, i, j) for k, (_, duels) in playing.items() for i, j in duels]
        points = iter(judge(todo))
        for k, (stage, duels) in list(playing.items()):
            got = [next(points) for _ in duels]
            standings[k].matches += [Match(stage, i, j, si, sj) for (i, j), (si, sj) in zip(duels, got)]
            advance(k, got)
    return standings


def play(
    n: int, compare: Callable[[int, int], Points], topology: Topology = "single_elimination"
) -> Standing:
    """One group's tournament with ``compare(i, j) -> (score_i, score_j)`` (bidirectional already, if wanted)."""
    return play_groups([n], lambda todo: [compare(i, j) for _, i, j in todo], topology)[0]


def both_ways(ab: Points, ba: Points) -> Points:
    """Points of (i, j) from the verdicts on (A = i, B = j) and (A = j, B = i): each side's two scores summed."""
    return ab[0] + ba[1], ab[1] + ba[0]


def rank_rewards(ranks: Sequence[int]) -> list[float]:
    """1 - rank/(G - 1): the champion 1, the last 0; a group of one 0.5 (the mean of any larger group's)."""
    n = len(ranks)
    return [1.0 - r / (n - 1) for r in ranks] if n > 1 else [0.5] * n


def znorm(values: Sequence[float]) -> list[float]:
    """(v - mean) / (unbiased std + 1e-6), as the authors' code; a group of one scores 0."""
    if len(values) < 2:
        return [0.0] * len(values)
    mean, std = statistics.fmean(values), statistics.stdev(values)
    return [(v - mean) / (std + EPS) for v in values]


def order_accuracy(ranks: Sequence[int], correct: Sequence[float]) -> float | None:
    """Of the pairs (a correct response, a wrong one), the share ranked correct-first (a shared rank counts 1/2);
    None when the group has no such pair."""
    good = [r for r, c in zip(ranks, correct) if c >= 0.5]
    bad = [r for r, c in zip(ranks, correct) if c < 0.5]
    if not good or not bad:
        return None
    right = sum(1.0 if g < b else 0.5 if g == b else 0.0 for g in good for b in bad)
    return right / (len(good) * len(bad))


# -- the judge ------------------------------------------------------------------------------------------------------

DEFAULT_RUBRIC = (
    "Compare the two answers to the question about the image. A better answer states correct findings, is "
    "specific and complete, does not contradict itself and is clearly worded."
)
# Fields: {question}, {answer_a}, {answer_b}, {rubric}, and {reference} (empty when the sample has none; the default
# leaves it out: ArenaRL ranks without a reference).
DEFAULT_TEMPLATE = (
    "Question: {question}\n"
    "Answer A: {answer_a}\n"
    "Answer B: {answer_b}\n"
    "{rubric}\n"
    "Score each answer from 0 to 10. Reply exactly in the form: A: <score> B: <score>"
)
NO_ANSWER = "(no answer)"
_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)
_NUM = r"([0-9]+(?:\.[0-9]+)?)(?:\s*/\s*10)?"
_PAIR = re.compile(rf"A\s*[:=]\s*{_NUM}\s*[,;]?\s*B\s*[:=]\s*{_NUM}", re.IGNORECASE)
_CACHE: LRU[str] = LRU(4096)


def parse_pair(text: str) -> Points | None:
    """The verdict ``A: x B: y`` (scores in [0, 10], optionally ``x/10``, a comma or semicolon between), after one
    leading ``<think>`` block and before trailing ``.``/``!``; None when the text is anything else."""
    t = _THINK.sub("", text, count=1).strip().rstrip(".!").strip()
    m = _PAIR.fullmatch(t)
    if m is None:
        return None
    a, b = float(m[1]), float(m[2])
    return (a, b) if 0.0 <= a <= 10.0 and 0.0 <= b <= 10.0 else None


def _text_or_file(option: str, value: str, default: str) -> str:
    """An option given inline, or as the path of a .txt/.md/.jinja file holding it."""
    if value.endswith((".txt", ".jinja", ".md")) and "\n" not in value:
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"reward 'arena': option {option!r}: file not found: {value}")
        return path.read_text()
    return value or default


def _check(options: dict[str, Any]) -> None:
    check_model_folder("arena", "model", options.get("model", ""))
    template = _text_or_file("template", options.get("template", ""), DEFAULT_TEMPLATE)
    if "{answer_a}" not in template or "{answer_b}" not in template:
        raise ValueError("reward 'arena': option 'template' must contain {answer_a} and {answer_b}")
    try:
        template.format(question="", reference="", answer_a="", answer_b="", rubric="")
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"reward 'arena': option 'template': {type(e).__name__} {e} (its fields: {{question}}, {{answer_a}}, "
            "{answer_b}, {rubric}, {reference}; write a literal brace twice)"
        ) from None
    _text_or_file("rubric", options.get("rubric", ""), DEFAULT_RUBRIC)
    truth = options.get("truth", "exact_match")
    if truth:
        try:
            spec = load_reward(truth)
        except KeyError as e:
            raise ValueError(f"reward 'arena': option 'truth': {e.args[0]}") from None
        validate_options(spec, options.get("truth_options", {}))


@dataclass
class _Group:
    """One group as the judge sees it, and what its tournament cost."""

    question: str
    reference: str
    answers: list[str]
    images: list[Any]
    images_key: str
    judge_calls: int = 0
    parse_failures: int = 0


class _PairJudge:
    """``judge`` for :func:`play_groups`: each match is two prompts (both orders), all of a round in one call."""

    def __init__(
        self, model: Any, key: str, groups: list[_Group], template: str, rubric: str, settings: dict
    ):
        self.model, self.key, self.groups = model, key, groups
        self.template, self.rubric, self.settings = template, rubric, settings

    def __call__(self, todo: list[tuple[int, int, int]]) -> list[Points]:
        asked = [(k, a, b) for k, i, j in todo for a, b in ((i, j), (j, i))]
        texts = self._generate([(k, self._prompt(k, a, b)) for k, a, b in asked])
        verdicts = []
        for (k, _, _), text in zip(asked, texts):
            v = None if text is None else parse_pair(text)
            if v is None:
                self.groups[k].parse_failures += 1
            verdicts.append(v or (PARSE_FAILURE, PARSE_FAILURE))
        return [both_ways(ab, ba) for ab, ba in zip(verdicts[::2], verdicts[1::2])]

    def _prompt(self, k: int, a: int, b: int) -> str:
        g = self.groups[k]
        user = self.template.format(
            question=g.question,
            reference=g.reference,
            answer_a=g.answers[a],
            answer_b=g.answers[b],
            rubric=self.rubric,
        )
        return self.model.render(user, len(g.images), self.settings["chat_template_kwargs"])

    def _generate(self, prompts: list[tuple[int, str]]) -> list[str | None]:
        """The judge's text per prompt (None: timed out); cached by content, only verdicts that parse are kept."""
        s = self.settings
        texts: list[str | None] = [None] * len(prompts)
        todo: dict[str, list[int]] = {}
        inputs: dict[str, tuple[str, list]] = {}
        for n, (k, prompt) in enumerate(prompts):
            ck = content_key(self.key, prompt, str(s["max_new_tokens"]), self.groups[k].images_key)
            cached = _CACHE.get(ck)
            if cached is not None:
                texts[n] = cached
                continue
            if ck not in todo:
                self.groups[k].judge_calls += 1
            todo.setdefault(ck, []).append(n)
            inputs[ck] = (prompt, self.groups[k].images)
        keys = list(todo)
        if not keys:
            return texts
        out = self.model.generate(
            [inputs[ck] for ck in keys], s["max_new_tokens"], s["batch_size"], s["timeout_s"]
        )
        for ck, g in zip(keys, out):
            text = None if g is None else g.text
            if text is not None and parse_pair(text) is not None:
                _CACHE.put(ck, text)
            for n in todo[ck]:
                texts[n] = text
        return texts


def _group_of(items: Sequence[RewardInput], use_image: bool, answer_only: bool) -> _Group:
    first = items[0]
    images = open_images(first.images, first.id) if use_image else []
    refs = clean_reference(first.reference)
    return _Group(
        question=question_of(first),
        reference=refs[0] if refs else "",
        answers=[
            (answer_text(x.response) if answer_only else x.response.strip()) or NO_ANSWER for x in items
        ],
        images=images,
        images_key=content_key(images=images),
    )


@register_reward("arena", group=True, check=_check)
def arena(
    batch: list[RewardInput],
    *,
    model: str = "",
    engine: Literal["hf", "vllm"] = "hf",
    topology: Topology = "single_elimination",
    rubric: str = "",
    template: str = "",
    normalize: bool = True,
    answer_only: bool = True,
    truth: str = "exact_match",
    truth_options: dict = {},  # noqa: B006 - read, never mutated
    use_image: bool = False,
    chat_template_kwargs: dict = {},  # noqa: B006 - read, never mutated
    max_new_tokens: int = 16,
    batch_size: int = 16,
    timeout_s: float = 120.0,
    device: str = "auto",
    dtype: str = "auto",
    offload: bool = False,
    gpu_memory_utilization: float = 0.3,
) -> list[RewardResult]:
    """ArenaRL (module docstring). The judge options are the ``judge`` reward's and load the same single copy of a
    judge both name; ``rubric``/``template``: text or a .txt/.md file; ``normalize``: z-normalise within the group;
    ``truth``: a reward (name or module:function) scoring a response against its reference, for the logged parts
    only ("" for none), with ``truth_options``."""
    judge_model = load_judge(model, engine, device, dtype, use_image, offload, gpu_memory_utilization)
    spans = group_spans(batch)
    groups = [_group_of(batch[s.start : s.stop], use_image, answer_only) for s in spans]
    settings = {
        "chat_template_kwargs": chat_template_kwargs,
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        "timeout_s": timeout_s,
    }
    pair_judge = _PairJudge(
        judge_model,
        f"{Path(model).expanduser().resolve()}\x1f{engine}",
        groups,
        _text_or_file("template", template, DEFAULT_TEMPLATE),
        _text_or_file("rubric", rubric, DEFAULT_RUBRIC),
        settings,
    )
    standings = play_groups([len(s) for s in spans], pair_judge, topology)
    correct = _truth(batch, truth, truth_options)
    out: list[RewardResult] = []
    for span, g, st in zip(spans, groups, standings):
        rewards = rank_rewards(st.ranks)
        scores = znorm(rewards) if normalize else rewards
        common = {
            "matches": float(len(st.matches)),
            "judge_calls": float(g.judge_calls),
            "parse_failures": float(g.parse_failures),
        }
        truths = [correct[i] for i in span]
        if all(c is not None for c in truths):
            acc = order_accuracy(st.ranks, truths)  # type: ignore[arg-type]
            common |= {} if acc is None else {"order_accuracy": acc}
        for rank, score, c in zip(st.ranks, scores, truths):
            parts = common | {"rank": float(rank)} | ({} if c is None else {"true_correct": c})
            out.append(RewardResult(score=score, parts=parts))
    return out


def _truth(batch: list[RewardInput], truth: str, options: dict) -> list[float | None]:
    """The ``truth`` reward's score per response (None: no reference, no truth reward, or it failed)."""
    if not truth or all(x.reference is None for x in batch):
        return [None] * len(batch)
    spec = load_reward(truth)
    results = call_reward(spec.fn, spec.name, batch, options, group=spec.group)
    return [
        None if r.error is not None or r.score is None or x.reference is None else float(r.score)
        for x, r in zip(batch, results)
    ]


__all__ = [
    "DEFAULT_RUBRIC",
    "DEFAULT_TEMPLATE",
    "TOPOLOGIES",
    "Match",
    "Standing",
    "anchor",
    "arena",
    "both_ways",
    "bracket_order",
    "competition_ranks",
    "order_accuracy",
    "parse_pair",
    "play",
    "play_groups",
    "rank_rewards",
    "round_robin",
    "single_elimination",
    "znorm",
]
