"""ArenaRL's tournaments on hand-checked brackets (docs/arena.md has the same examples), the bidirectional judging,
the ``arena`` reward on a scripted judge (prompts, verdicts, parts, the group seam) and once on the shipped tiny
judge."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from mmrl.rewards.arena import (
    DEFAULT_RUBRIC,
    DEFAULT_TEMPLATE,
    arena,
    both_ways,
    bracket_order,
    competition_ranks,
    order_accuracy,
    parse_pair,
    play,
    play_groups,
    rank_rewards,
    znorm,
)
from mmrl.rewards.base import REWARDS
from mmrl.rewards.compose import CompositeReward, RewardConfig
from mmrl.rewards.local_model import Loaded
from mmrl.types import RewardInput

ROOT = Path(__file__).resolve().parents[1]
TINY_JUDGE = ROOT / "assets" / "tiny-judge"


def by_strength(q, upsets=None):
    """compare(i, j) = (q_i, q_j), except the pairs in ``upsets`` ({(i, j): (score_i, score_j)}, either order)."""
    upsets = upsets or {}

    def compare(i, j):
        if (i, j) in upsets:
            return upsets[i, j]
        if (j, i) in upsets:
            return upsets[j, i][::-1]
        return q[i], q[j]

    return compare


def stages(standing):
    return [m.stage for m in standing.matches]


# -- brackets ------------------------------------------------------------------------------------------------------


def test_bracket_order_keeps_the_best_seeds_apart():
    assert bracket_order(1) == [0]
    assert bracket_order(2) == [0, 1]
    assert bracket_order(4) == [0, 3, 1, 2]  # 1 vs 4, 2 vs 3
    assert bracket_order(8) == [
        0,
        7,
        3,
        4,
        1,
        6,
        2,
        5,
    ]  # 1-8, 4-5 | 2-7, 3-6: seeds 1 and 2 meet in the final


def test_single_elimination_four():
    # seeding against the anchor (response 0): r1 9, r2 2, r3 7, r0 the mean of its own points, 5
    # seeds r1 > r3 > r0 > r2; round 1: r1-r2 and r3-r0; final r1-r3
    st = play(4, by_strength([5, 9, 2, 7]))
    assert [(m.stage, m.i, m.j) for m in st.matches] == [
        ("seeding", 1, 0),
        ("seeding", 2, 0),
        ("seeding", 3, 0),
        ("round 1", 1, 2),
        ("round 1", 3, 0),
        ("round 2", 1, 3),
    ]
    assert len(st.matches) == 2 * 4 - 2
    # champion r1, finalist r3; semifinal losers r0 (mean points 5) before r2 (2)
    assert st.ranks == [2, 0, 3, 1]
    rewards = rank_rewards(st.ranks)
    assert rewards == pytest.approx([1 / 3, 1.0, 0.0, 2 / 3])
    # mean 1/2, deviations -1/6, 1/2, -1/2, 1/6; unbiased variance (2/36 + 2/4) / 3 = 5/27
    std = math.sqrt(5 / 27)
    expected = [d / (std + 1e-6) for d in (-1 / 6, 1 / 2, -1 / 2, 1 / 6)]
    assert znorm(rewards) == pytest.approx(expected, rel=1e-12)
    assert znorm(rewards)[1] == pytest.approx(1.1618923, abs=1e-6)


def test_single_elimination_five_gives_the_byes_to_the_best_seeds():
    # seeding: r1 3, r2 8, r3 1, r4 5, r0 6 -> seeds r2 > r0 > r4 > r1 > r3; a bracket of 8 with 3 byes:
    # round 1 is the only real match 4 vs 5 (r1-r3); round 2: r2-r1 and r0-r4; final r2-r0
    st = play(5, by_strength([6, 3, 8, 1, 5]))
    assert stages(st) == ["seeding"] * 4 + ["round 1"] + ["round 2"] * 2 + ["round 3"]
    assert [(m.i, m.j) for m in st.matches[4:]] == [(1, 3), (2, 1), (0, 4), (2, 0)]
    assert len(st.matches) == 2 * 5 - 2
    # champion r2, finalist r0, semifinal losers r4 (mean 5) before r1 (3), round-1 loser r3
    assert st.ranks == [1, 3, 0, 4, 2]
    assert rank_rewards(st.ranks) == pytest.approx([0.75, 0.25, 1.0, 0.0, 0.5])
    # deviations 0.25, -0.25, 0.5, -0.5, 0; unbiased variance 0.625 / 4
    assert znorm(rank_rewards(st.ranks)) == pytest.approx(
        [d / (math.sqrt(0.625 / 4) + 1e-6) for d in (0.25, -0.25, 0.5, -0.5, 0.0)]
    )


def test_single_elimination_eight_with_upsets():
    # seeding: r3 8 > r1 7 > r5 6 > r7 5 > r0 4 > r4 3 > r6 2 > r2 1; round 1: r3-r2, r7-r0, r1-r6, r5-r4
    # upsets (pairs that never meet in the seeding): r4 beats r5 6-2 in round 1 and r1 9-5 in round 2
    q = [4, 7, 1, 8, 3, 6, 2, 5]
    st = play(8, by_strength(q, {(5, 4): (2, 6), (1, 4): (5, 9)}))
    assert [(m.i, m.j) for m in st.matches[7:]] == [(3, 2), (7, 0), (1, 6), (5, 4), (3, 7), (1, 4), (3, 4)]
    assert len(st.matches) == 2 * 8 - 2
    # champion r3, finalist r4; semifinal losers r1 (7, 7, 5: 6.33) before r7 (5, 5, 5: 5); round-1 losers by mean
    # points: r5 (6, 2: 4) and r0 (4, 4: 4) tie and go by seed (r5 third, r0 fifth), then r6 (2), r2 (1)
    assert st.ranks == [5, 2, 7, 0, 1, 4, 6, 3]
    assert rank_rewards(st.ranks) == pytest.approx([2 / 7, 5 / 7, 0, 1, 6 / 7, 3 / 7, 1 / 7, 4 / 7])


def test_ties_drawn_matches_and_a_group_without_information():
    # seeds r1, r2 (7) > r0, r3 (5), equal seeding points kept in response order; round 1: r1-r3 and r2-r0;
    # the final r1-r2 is drawn 7-7 and goes to the better seed, r1; the semifinal losers r0 and r3 tie on mean
    # points (5) and are ordered by seed
    st = play(4, by_strength([5, 7, 7, 5]))
    assert [(m.i, m.j) for m in st.matches[3:]] == [(1, 3), (2, 0), (1, 2)]
    assert st.ranks == [2, 0, 1, 3]
    # every match drawn: no information, one shared place for all; z-normalised they all score 0
    flat = play(4, by_strength([5, 5, 5, 5]))
    assert len(flat.matches) == 6 and flat.ranks == [0, 0, 0, 0]
    assert znorm(rank_rewards(flat.ranks)) == [0.0] * 4
    # drawn seeding matches at different levels still separate: r1 5, r2 7, the anchor 6; then every knockout match
    # is drawn (r0-r1 0-0, the final r2-r0 7-7) and goes to the better seed
    levels = play(3, by_strength([0, 0, 0], {(1, 0): (5, 5), (2, 0): (7, 7)}))
    assert [(m.i, m.j) for m in levels.matches[2:]] == [(0, 1), (2, 0)]
    assert levels.ranks == [1, 2, 0]


def test_anchor_and_round_robin():
    q = [6, 3, 8, 3, 5]
    anchor_only = play(5, by_strength(q), "anchor")
    assert len(anchor_only.matches) == 5 - 1 and set(stages(anchor_only)) == {"anchor"}
    # points against the anchor: r0 6 (its mean), r1 3, r2 8, r3 3, r4 5; r1 and r3 share place 3
    assert anchor_only.ranks == [1, 3, 0, 3, 2]
    assert rank_rewards(anchor_only.ranks) == [0.75, 0.25, 1.0, 0.25, 0.5]
    rr = play(5, by_strength(q), "round_robin")
    assert len(rr.matches) == 5 * 4 // 2
    # wins: r2 4, r0 3, r4 2, r1 and r3 a half each (their match is drawn)
    assert rr.ranks == [1, 3, 0, 3, 2]
    assert competition_ranks([2.0, 3.0, 3.0, 1.0]) == [2, 0, 0, 3]


def test_groups_of_one_and_two():
    one = play(1, by_strength([1.0]))
    assert one.ranks == [0] and one.matches == []
    assert rank_rewards(one.ranks) == [0.5] and znorm([0.5]) == [0.0]
    two = play(2, by_strength([1.0, 2.0]))
    assert two.ranks == [1, 0] and stages(two) == ["seeding", "round 1"]
    assert znorm(rank_rewards(two.ranks)) == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], rel=1e-5)


def test_play_groups_runs_every_group_in_lockstep():
    calls = []
    q = [[5, 9, 2, 7], [6, 3, 8, 1, 5], [1.0]]

    def judge(todo):
        calls.append(todo)
        return [(q[k][i], q[k][j]) for k, i, j in todo]

    standings = play_groups([4, 5, 1], judge)
    # seeding of both, then round 1 (2 + 1 matches), round 2 (1 + 2), the five's final
    assert [len(c) for c in calls] == [3 + 4, 2 + 1, 1 + 2, 1]
    assert [s.ranks for s in standings] == [[2, 0, 3, 1], [1, 3, 0, 4, 2], [0]]


def test_order_accuracy():
    assert (
        order_accuracy([0, 1, 2, 3], [1, 0, 1, 0]) == 0.75
    )  # (r0, r1) (r0, r3) (r2, r3) right, (r2, r1) wrong
    assert order_accuracy([0, 0, 2], [1, 0, 0]) == 0.75  # a shared place counts a half
    assert order_accuracy([0, 1], [1, 1]) is None


# -- the judge's verdicts ------------------------------------------------------------------------------------------


def test_parse_pair():
    assert parse_pair("A: 7 B: 3") == (7.0, 3.0)
    assert parse_pair("<think>B is vaguer</think> a=8.5/10, b=2/10.") == (8.5, 2.0)
    assert parse_pair("A: 10; B: 0") == (10.0, 0.0)
    for bad in ("A: 11 B: 3", "YES", "A: 7", "Scores: A: 7 B: 3", "A: 7 B: 3 because"):
        assert parse_pair(bad) is None, bad


def test_both_ways_cancels_a_position_bias():
    # a judge that gives position A two extra points: (i, j) is asked as (A = i, B = j) and (A = j, B = i)
    q = [6.0, 5.0]

    def once(a, b):
        return q[a] + 2.0, q[b]

    assert both_ways(once(0, 1), once(1, 0)) == (6 + 2 + 6, 5 + 5 + 2)  # both sides got the bonus once
    assert play(2, lambda i, j: both_ways(once(i, j), once(j, i))).ranks == [0, 1]
    # asked one way only, the weaker r1 sits in position A (seeding asks (j, anchor)) and wins 7-6 twice
    assert play(2, lambda i, j: once(i, j)).ranks == [1, 0]


# -- the reward on a scripted judge --------------------------------------------------------------------------------


@dataclass
class _Text:
    text: str


class ScriptedJudge:
    """Stands in for the loaded judge model: reads the two answers off the prompt and scores each by ``quality``
    (+ ``bias`` for position A); answers in ``garbled`` make it reply something unparseable."""

    def __init__(self, quality, bias=0.0, garbled=()):
        self.quality, self.bias, self.garbled = quality, bias, set(garbled)
        self.prompts: list[str] = []
        self.calls = 0

    def render(self, text, n_images, template_kwargs):
        return text

    def generate(self, prompts, max_new_tokens, batch_size, timeout_s):
        self.calls += 1
        out = []
        for p, _ in prompts:
            self.prompts.append(p)
            a = re.search(r"Answer A: (.*)", p)[1]
            b = re.search(r"Answer B: (.*)", p)[1]
            if {a, b} & self.garbled:
                out.append(_Text("I cannot tell"))
            else:
                out.append(_Text(f"A: {min(10, self.quality[a] + self.bias)} B: {self.quality[b]}"))
        return out


@pytest.fixture
def scripted():
    """Install a scripted judge where the arena reward looks for the model named TINY_JUDGE."""
    from mmrl.rewards import arena as arena_module

    def install(judge):
        key = ("judge", str(TINY_JUDGE.resolve()), "hf", "auto", "auto", False, False)
        Loaded._items[key] = judge
        return judge

    yield install
    Loaded.clear()
    arena_module._CACHE._data.clear()


def group(sid, answers, reference=None):
    prompt = "<image>Describe the tissue and any lesion in this tile."
    return [
        RewardInput(sid, f"<think>t</think><answer>{a}</answer>", reference, prompt=prompt) for a in answers
    ]


QUALITY = {"fat with tumour": 9, "fat": 6, "stroma": 3, "glands": 1, "necrosis": 7}


def test_reward_on_a_scripted_judge(scripted):
    judge = scripted(ScriptedJudge(QUALITY, bias=1.0))
    answers = ["fat", "fat with tumour", "glands", "stroma"]
    out = arena(group("q", answers, reference="fat with tumour"), model=str(TINY_JUDGE))
    # both ways, the bias cancels: points 2q + 1 each. Seeding: r1 19, r0 13, r3 7, r2 3; round 1: r1-r2 and
    # r0-r3; final r1-r0; semifinal losers r3 (mean 7) before r2 (3)
    assert [r.parts["rank"] for r in out] == [1.0, 0.0, 3.0, 2.0]
    assert [r.score for r in out] == pytest.approx(znorm(rank_rewards([1, 0, 3, 2])))
    assert out[0].parts == {
        "matches": 6.0,
        "judge_calls": 8.0,  # 12 prompts, 4 of them cached: r0-r3 and the final r1-r0 repeat seeding matches
        "parse_failures": 0.0,
        "order_accuracy": 1.0,  # the one correct answer (by exact_match) won
        "rank": 1.0,
        "true_correct": 0.0,
    }
    assert [r.parts["true_correct"] for r in out] == [0.0, 1.0, 0.0, 0.0]
    assert judge.calls == 2 and len(judge.prompts) == 8  # seeding, semifinals; the final was a seeding match
    first = judge.prompts[0]
    assert first == DEFAULT_TEMPLATE.format(
        question="Describe the tissue and any lesion in this tile.",
        answer_a="fat with tumour",
        answer_b="fat",
        rubric=DEFAULT_RUBRIC,
        reference="",
    )
    assert "Answer A: fat\nAnswer B: fat with tumour" in judge.prompts[1]  # the same match, positions swapped
    # the cache answers the same prompts again: same scores, no new judge call
    again = arena(group("q", answers, reference="fat with tumour"), model=str(TINY_JUDGE))
    assert [r.score for r in again] == [r.score for r in out] and judge.calls == 2
    assert again[0].parts["judge_calls"] == 0.0


def test_reward_options_parse_failures_and_no_reference(scripted):
    scripted(ScriptedJudge(QUALITY, garbled={"glands"}))
    out = arena(group("q", ["fat", "glands", "stroma"]), model=str(TINY_JUDGE), normalize=False)
    # every verdict on "glands" is unparseable: 5-5 each way, its matches drawn 10-10. Seeding: r1 10, r2 6, the
    # anchor the mean of 10 and 12; seeds r0 > r1 > r2, r0 has the bye; r1 wins its drawn match against r2 as the
    # better seed, then loses the drawn final to r0: a judge that cannot read an answer hands it the seed's luck
    assert [r.score for r in out] == [1.0, 0.5, 0.0]  # 1 - rank/(G - 1), not normalised
    assert out[0].parts["parse_failures"] == 6.0 and out[0].parts["matches"] == 4.0
    assert "true_correct" not in out[0].parts and "order_accuracy" not in out[0].parts
    rr = arena(group("q", ["fat", "stroma", "necrosis"]), model=str(TINY_JUDGE), topology="round_robin")
    assert [r.parts["rank"] for r in rr] == [1.0, 2.0, 0.0] and rr[0].parts["matches"] == 3.0


def test_group_seam_hands_whole_groups(scripted):
    judge = scripted(ScriptedJudge(QUALITY))
    assert REWARDS.get("arena").group
    batch = group("a", ["fat", "stroma", "glands", "necrosis"]) + group(
        "b", ["stroma", "fat with tumour", "fat"]
    )
    config = RewardConfig("arena", options={"model": str(TINY_JUDGE), "topology": "anchor"})
    with CompositeReward([config], chunk_size=2, num_workers=1) as comp:
        out = comp(batch)
    assert [r.parts["arena/matches"] for r in out] == [3.0] * 4 + [2.0] * 3  # G - 1 per group: no split group
    assert [r.parts["arena/rank"] for r in out] == [1.0, 2.0, 3.0, 0.0, 2.0, 0.0, 1.0]
    assert judge.calls == 1  # one round: both groups in one judge call
    for span in (slice(0, 4), slice(4, 7)):
        assert statistics.fmean(r.score for r in out[span]) == pytest.approx(0.0, abs=1e-12)


def test_option_checks():
    def build(**options):
        return CompositeReward([RewardConfig("arena", options={"model": str(TINY_JUDGE)} | options)])

    with pytest.raises(ValueError, match="must be one of"):
        build(topology="swiss")
    with pytest.raises(ValueError, match=r"\{answer_a\} and \{answer_b\}"):
        build(template="Which is better, {response}?")
    with pytest.raises(ValueError, match=r"KeyError 'score'.*write a literal brace twice"):
        build(template="{answer_a} or {answer_b}? Reply {score}")
    with pytest.raises(ValueError, match="option 'truth'"):
        build(truth="no_such_reward")
    with pytest.raises(ValueError, match="unknown option 'extract'"):
        build(truth_options={"extract": True})
    with pytest.raises(ValueError, match="option 'model' is required"):
        CompositeReward([RewardConfig("arena")])


# -- the shipped tiny judge ----------------------------------------------------------------------------------------


@pytest.mark.skipif(not (TINY_JUDGE / "config.json").is_file(), reason="assets/tiny-judge is not here")
def test_tiny_judge_end_to_end():
    """The real judge on a group of 4. It was trained to answer YES/NO to a reference prompt, never to score two
    answers, so every verdict is unparseable: each match is drawn 10-10 and the group shares one place."""
    answers = ["adipose tissue with tumour", "fibrous stroma, no lesion", "fat containing a neoplasm", ""]
    batch = group("s", answers, reference=["adipose tissue with tumour", "fat containing a neoplasm"])
    try:
        out = arena(batch, model=str(TINY_JUDGE))
    finally:
        Loaded.clear()
    assert [r.score for r in out] == [0.0] * 4
    assert out[0].parts == {
        "matches": 6.0,
        "judge_calls": 12.0,
        "parse_failures": 12.0,
        "order_accuracy": 0.5,
        "rank": 0.0,
        "true_correct": 1.0,
    }
    assert [r.parts["true_correct"] for r in out] == [1.0, 0.0, 1.0, 0.0]
