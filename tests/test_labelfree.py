"""Label-free rewards (TTRL, SCOPE, EMPO) on hand-computed groups, the composite's group-reward seam, and a short
run that trains on a label-free reward (docs/labelfree.md)."""

import math
from pathlib import Path

import pytest

from mmrl.rewards.base import LOGPROBS_KEY, RewardSpec, call_reward, register_reward
from mmrl.rewards.compose import CompositeReward, RewardConfig
from mmrl.rewards.labelfree import empo, pareto_choice, parse_number, scope, ttrl
from mmrl.types import RewardInput, RewardResult

ROOT = Path(__file__).resolve().parents[1]


def group(sid, answers, reference=None, logprobs=None, **metadata):
    """One group: a response per answer ("" = no <answer> tag content), the same sample id and reference."""
    out = []
    for j, a in enumerate(answers):
        meta = dict(metadata) | ({LOGPROBS_KEY: logprobs[j]} if logprobs is not None else {})
        out.append(RewardInput(sid, f"<think>t</think><answer>{a}</answer>", reference, metadata=meta))
    return out


def scores(results):
    return [r.score for r in results]


# -- TTRL ----------------------------------------------------------------------------------------------------------


def test_ttrl_majority_label_and_pseudo_label_accuracy():
    out = ttrl(group("q", ["A", "A", "B", "C"], reference="A"))
    assert scores(out) == [1.0, 1.0, 0.0, 0.0]
    assert out[0].parts == {"agreement": 0.5, "pseudo_label_correct": 1.0} == out[3].parts
    wrong = ttrl(group("q", ["A", "A", "B", "C"], reference="B"))
    assert scores(wrong) == [1.0, 1.0, 0.0, 0.0]  # the reference never changes the score
    assert wrong[0].parts["pseudo_label_correct"] == 0.0
    assert "pseudo_label_correct" not in ttrl(group("q", ["A", "A", "B"]))[0].parts  # no reference: no part


def test_ttrl_votes_ties_unanswered_and_several_groups():
    answers = ["A", "B", "B", "A", "A"]
    assert scores(ttrl(group("q", answers))) == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert scores(ttrl(group("q", answers), votes=3)) == [0.0, 1.0, 1.0, 0.0, 0.0]  # the first 3 vote B
    assert scores(ttrl(group("q", ["B", "A", "A", "B"]))) == [
        1.0,
        0.0,
        0.0,
        1.0,
    ]  # a tie: the answer seen first
    assert scores(ttrl(group("q", ["", "", "", "A"]))) == [0.0, 0.0, 0.0, 1.0]  # unanswered votes for nothing
    none = ttrl(group("q", ["", ""], reference="A"))
    assert scores(none) == [0.0, 0.0] and none[0].parts["pseudo_label_correct"] == 0.0
    two = ttrl(group("q1", ["Paris", "paris.", "Rome"]) + group("q2", ["Rome", "Rome", "Paris"]))
    assert scores(two) == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]  # each group its own label; "paris." normalises


def test_answer_kinds_letter_number_math():
    choices = ["cat", "dog", "bird"]
    letters = group("q", ["B", "(B)", "dog", "A"], reference="dog", choices=choices)
    out = ttrl(letters, answer="letter")
    assert scores(out) == [1.0, 1.0, 1.0, 0.0] and out[0].parts["pseudo_label_correct"] == 1.0
    assert parse_number("it is 1,000.50 or so") == 1000.5 and parse_number("3/4") == 0.75
    assert parse_number("none") is None
    numbers = group("q", ["1,000", "1000.0", "about 999", "x"], reference="1000")
    out = ttrl(numbers, answer="number")
    assert scores(out) == [1.0, 1.0, 0.0, 0.0] and out[0].parts["pseudo_label_correct"] == 1.0
    maths = group("q", ["\\frac{1}{2}", "0.5", "2", "1/2"], reference="$\\frac{1}{2}$")
    out = ttrl(maths, answer="math")
    assert scores(out) == [1.0, 1.0, 0.0, 1.0] and out[0].parts["pseudo_label_correct"] == 1.0


# -- EMPO ----------------------------------------------------------------------------------------------------------


def test_empo_cluster_share_and_semantic_entropy():
    out = empo(group("q", ["A", "A", "B", "C"], reference="B"))
    assert scores(out) == [0.5, 0.5, 0.25, 0.25]
    # SE = -(1/2 ln 1/2 + 2 * 1/4 ln 1/4) = 1/2 ln 2 + ln 2 = 1.5 ln 2
    assert out[0].parts["semantic_entropy"] == pytest.approx(1.5 * math.log(2))
    assert out[0].parts["pseudo_label_correct"] == 0.0  # the largest cluster is A
    assert scores(empo(group("q", ["A", "B", "C", "D"]))) == [0.0] * 4  # all distinct: SE = ln G, no signal
    # an unanswered response: its own cluster (counted in G), -0.5 for free-form answers, 0 for rule-checked ones
    assert scores(empo(group("q", ["A", "A", "", "B"]))) == [0.5, 0.5, -0.5, 0.25]
    assert scores(empo(group("q", ["1", "1", "", "2"]), answer="number")) == [0.5, 0.5, 0.0, 0.25]
    assert scores(empo(group("q", ["A", "A", "", "B"]), empty_score=0.0)) == [0.5, 0.5, 0.0, 0.25]
    flat = ["A", "A", "B", "C", "D", "E", "F", "G", "H", "I", "J"]  # top cluster 2/11 < 0.2
    assert scores(empo(group("q", flat), min_top_share=0.2)) == [0.0] * 11
    assert scores(empo(group("q", flat)))[:2] == [2 / 11, 2 / 11]


# -- SCOPE ---------------------------------------------------------------------------------------------------------


def test_scope_confidence_flips_the_majority_label():
    # three unsure A's (mean log-prob -3: C = e^-3 ~ 0.05 each) against two sure B's (-0.1: C = e^-0.1 ~ 0.90 each)
    lps = [[-3.0, -3.0]] * 3 + [[-0.1]] * 2
    one = {
        "subgroup_sizes": [5],
        "votes_per_subgroup": 5,
    }  # one subgroup voted by all: no random draw matters
    weighted = scope(group("q", ["A", "A", "A", "B", "B"], "B", lps), **one)
    assert scores(weighted) == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert weighted[0].parts == {
        "agreement": 0.4,
        "subgroup_size": 5.0,
        "confidence_weighted": 1.0,
        "pseudo_label_correct": 1.0,
    }
    plain = scope(group("q", ["A", "A", "A", "B", "B"], "B"), **one)  # no log-probs: frequency votes, as TTRL
    assert scores(plain) == [1.0, 1.0, 1.0, 0.0, 0.0] == scores(ttrl(group("q", ["A", "A", "A", "B", "B"])))
    assert plain[0].parts["confidence_weighted"] == 0.0 and plain[0].parts["pseudo_label_correct"] == 0.0


def test_scope_pareto_choice_of_subgroup_size():
    # size: (R = mean pseudo-reward, D = distinct labels). 2 is dominated by 4 (higher R, same D). On the front
    # {1, 4, 8}, R spans [0.5, 1] and D [1, 4]; normalised (R~, D~): 1 -> (0, 1), 4 -> (0.5, 1/3), 8 -> (1, 0).
    cands = {1: (0.5, 4.0), 2: (0.625, 2.0), 4: (0.75, 2.0), 8: (1.0, 1.0)}
    # lam 0.7: distances 1 -> sqrt(0.7) = 0.837, 4 -> sqrt(0.7/4 + 0.3*4/9) = 0.555, 8 -> sqrt(0.3) = 0.548
    assert pareto_choice(cands, 0.7) == 8
    # lam 0.5: 1 -> sqrt(0.5) = 0.707, 4 -> sqrt(0.125 + 0.5*4/9) = 0.589, 8 -> 0.707
    assert pareto_choice(cands, 0.5) == 4
    assert pareto_choice({1: (1.0, 1.0), 2: (1.0, 1.0)}) == 1  # ties: the smaller size
    # all agree: every size gives R = 1, D = 1 and the smallest is kept
    out = scope(group("q", ["A"] * 8))
    assert scores(out) == [1.0] * 8 and out[0].parts["subgroup_size"] == 1.0


def test_scope_is_deterministic_and_labels_per_subgroup():
    g = group("q", ["A", "B", "A", "C", "B", "A", "D", "B"], reference="A")
    first, again = scope(g, votes_per_subgroup=2), scope(g, votes_per_subgroup=2)
    assert [(r.score, r.parts) for r in first] == [(r.score, r.parts) for r in again]
    size = int(first[0].parts["subgroup_size"])
    assert size in (1, 2, 4, 8) and all(r.parts["subgroup_size"] == size for r in first)
    for r in first:  # a response scores 1 exactly when its answer is its own subgroup's label
        assert r.score in (0.0, 1.0) and r.parts["pseudo_label_correct"] in (0.0, 1.0)
    assert first[0].parts["agreement"] == sum(scores(first)) / 8


def test_option_checks():
    with pytest.raises(ValueError, match="must be one of"):
        CompositeReward([RewardConfig("ttrl", options={"answer": "words"})])
    with pytest.raises(ValueError, match="'subgroup_sizes' must be a list of positive integers"):
        CompositeReward([RewardConfig("scope", options={"subgroup_sizes": [0, 2]})])
    with pytest.raises(ValueError, match="'votes' must be >= 0"):
        CompositeReward([RewardConfig("ttrl", options={"votes": -1})])
    with pytest.raises(ValueError, match="'lam' must be in"):
        CompositeReward([RewardConfig("scope", options={"lam": 1.5})])


# -- the composite's group seam ------------------------------------------------------------------------------------

SEEN: list[list[str]] = []


@register_reward("test_labelfree_probe", group=True)
def probe(batch: list[RewardInput]) -> list[RewardResult]:
    """Records the ids of each call; raises on a group holding "boom"; scores the group's size; echoes whether the
    log-probs were seen."""
    SEEN.append([x.id for x in batch])
    if any("boom" in x.response for x in batch):
        raise ValueError("cannot vote on 'boom'")
    size = {x.id: sum(y.id == x.id for y in batch) for x in batch}
    return [RewardResult(float(size[x.id]), {"logprobs": float(LOGPROBS_KEY in x.metadata)}) for x in batch]


@register_reward("test_labelfree_sees_logprobs")
def per_response(batch: list[RewardInput]) -> list[RewardResult]:
    return [RewardResult(float(LOGPROBS_KEY in x.metadata)) for x in batch]


def test_group_rewards_get_whole_groups_whatever_the_chunk_size():
    SEEN.clear()
    batch = group("a", ["1", "2", "3"]) + group("b", ["1", "2", "3"]) + group("c", ["1", "2"])
    with CompositeReward([RewardConfig("test_labelfree_probe")], chunk_size=2, num_workers=1) as comp:
        out = comp(batch)
    assert scores(out) == [3.0] * 6 + [2.0] * 2  # each item saw its whole group
    assert SEEN == [["a"] * 3 + ["b"] * 3 + ["c"] * 2]
    with pytest.raises(ValueError, match="heavy=True and group=True cannot be combined"):
        RewardSpec("x", probe, heavy=True, group=True)


def test_a_raising_group_scores_zero_for_the_whole_group_and_the_others_keep_theirs():
    SEEN.clear()
    batch = group("a", ["1", "2"]) + group("b", ["1", "boom", "3"]) + group("c", ["1"])
    with CompositeReward([RewardConfig("test_labelfree_probe")]) as comp:
        out = comp(batch)
        stats = comp.stats()
    assert scores(out) == [2.0, 2.0, 0.0, 0.0, 0.0, 1.0]
    assert SEEN == [
        ["a", "a", "b", "b", "b", "c"],
        ["a", "a"],
        ["b", "b", "b"],
        ["c"],
    ]  # retried group by group
    for r in out[2:5]:
        (err,) = r.errors
        assert err["id"] == "b" and err["reward"] == "test_labelfree_probe"
        assert (
            "ValueError: cannot vote on 'boom'" in err["error"]
            and "whole group of 3 scored 0" in err["error"]
        )
    assert out[0].errors == [] and stats["errors"] == {"test_labelfree_probe": 3}
    direct = call_reward(probe, "probe", batch, {}, group=True)
    assert scores(direct) == scores(out)


def test_group_scores_are_not_cached_per_response_and_only_group_rewards_see_logprobs():
    # the same response text, id, reference and metadata in two calls: agreed with first, outvoted second
    first = group("q", ["A", "A", "B"], "A")
    second = group("q", ["A", "B", "B"], "A")
    configs = [RewardConfig("ttrl"), RewardConfig("exact_match")]
    with CompositeReward(configs) as comp:
        one, two = comp(first), comp(second)
        stats = comp.stats()
    assert [r.parts["ttrl"] for r in one] == [1.0, 1.0, 0.0]
    assert [r.parts["ttrl"] for r in two] == [0.0, 1.0, 1.0]
    assert stats["cache_misses"] == 2 and stats["cache_hits"] == 4  # exact_match's only: "A" and "B", reused
    lps = [[-0.5]] * 3
    with CompositeReward(
        [RewardConfig("test_labelfree_probe"), RewardConfig("test_labelfree_sees_logprobs")]
    ) as c:
        out = c(group("q", ["A", "A", "B"], None, lps))
    assert [r.parts["test_labelfree_probe/logprobs"] for r in out] == [1.0] * 3
    assert [r.parts["test_labelfree_sees_logprobs"] for r in out] == [0.0] * 3


def test_reward_inputs_carry_the_engine_logprobs():
    from types import SimpleNamespace

    from mmrl.train.collect import reward_inputs
    from mmrl.types import Sample

    sample = Sample(id="s", messages=[{"role": "user", "content": "q?"}], answer="a")
    prompt = SimpleNamespace(
        response_prefix="", image_sizes=[], model_image_sizes=[], coordinate_frame="model_pixels"
    )
    with_lp = reward_inputs(sample, prompt, ["x", "y"], [1, 2], logprobs=[[-0.1], [-0.2, -0.3]])
    assert [x.metadata[LOGPROBS_KEY] for x in with_lp] == [[-0.1], [-0.2, -0.3]]
    assert LOGPROBS_KEY not in reward_inputs(sample, prompt, ["x"], [1])[0].metadata


# -- a run that trains on a label-free reward ----------------------------------------------------------------------


@pytest.mark.parametrize("reward", ["ttrl", "scope"])
def test_tiny_run_trains_on_a_label_free_reward(reward, tmp_path_factory, tmp_path, monkeypatch):
    from mmrl.cli import main
    from mmrl.run.metrics import read_metrics

    data = (
        tmp_path_factory.getbasetemp() / "labelfree-shapes"
    )  # built by the recipe's builder on the first run
    monkeypatch.chdir(ROOT)
    args = ["train", "recipes/shapes/tiny.yaml", "--output-dir", str(tmp_path / "run"), "--max-steps", "2"]
    args += [f"rewards=[{{name: {reward}}}]", f"data.train={data / 'train.jsonl'}"]
    args += [
        f"data.eval={data / 'eval.jsonl'}",
        "eval.max_samples=8",
        "train.progress=false",
        "train.save_every=0",
        "eval.rewards=[{name: exact_match}]",  # the held-out score against the labels the training never saw
    ]
    assert main(args) == 0
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0.0 <= r[f"reward/{reward}/pseudo_label_correct"] <= 1.0
        assert r[f"reward/{reward}/agreement"] == pytest.approx(r["reward/mean"])
    evals = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "eval/accuracy" in r]
    assert len(evals) == 2  # start and end
    for r in evals:  # scored by exact_match, not by the label-free reward (which would give a lone answer 1)
        assert r["eval/accuracy"] == pytest.approx(r["eval/part/exact_match"]) and r["eval/accuracy"] < 1.0
        assert f"eval/part/{reward}" not in r
    if reward == "scope":  # the engine's log-probs reached the reward: confidence-weighted votes
        assert all(r["reward/scope/confidence_weighted"] == 1.0 for r in rows)


def test_eval_rewards_are_checked_at_pre_flight():
    from mmrl.config import ConfigError, load_config
    from mmrl.train.checks import check_rewards

    check_rewards(load_config(None, ["rewards=[{name: ttrl}]", "eval.rewards=[{name: exact_match}]"]))
    with pytest.raises(ConfigError, match=r"eval.rewards\[0\] \('exact_mach'\)"):
        check_rewards(load_config(None, ["rewards=[{name: ttrl}]", "eval.rewards=[{name: exact_mach}]"]))
