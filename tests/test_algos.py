"""Group-baseline and REINFORCE-family advantage estimators against values worked out by hand (docs/algorithms.md#grpo-family)."""

import math

import pytest
import torch

from mmrl.algos import ADVANTAGES, AdvantageInput, groups_with_signal
from mmrl.algos.advantages import (
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_advantages,
    rloo_advantages,
)


def make_input(rewards: list[list[float]], lengths: list[int] | None = None) -> AdvantageInput:
    r = torch.tensor(rewards)
    B, G = r.shape
    lengths = lengths or [3] * (B * G)
    T = max(max(lengths), 1)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()
    return AdvantageInput(r, list(range(B)), torch.full((B * G, T), -0.5) * mask, mask)


def test_grpo_hand_values():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    a = grpo_advantages(r, eps=1e-6)
    # group 1: mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = 0.577350
    # group 2: mean 0.25, unbiased std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    s1, s2 = 0.5773503 + 1e-6, 0.5 + 1e-6
    expected = torch.tensor(
        [[0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1], [0.75 / s2, -0.25 / s2, -0.25 / s2, -0.25 / s2]]
    )
    assert torch.allclose(a, expected, atol=1e-6)


def test_dr_grpo_has_no_std_and_rloo_leaves_one_out():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(dr_grpo_advantages(r), torch.tensor([[0.75, -0.25, -0.25, -0.25]]))
    # RLOO: response 1's baseline is the mean of the other three (0); the others' is 1/3
    assert torch.allclose(rloo_advantages(r), torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]]))


def test_all_equal_rewards_give_zero_advantage():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    for fn in (grpo_advantages, dr_grpo_advantages, rloo_advantages):
        assert torch.equal(fn(r, 1e-6), torch.zeros(2, 3))
    adv, _ = ADVANTAGES.get("reinforce_pp")(2)(make_input([[1.0], [1.0]]))
    assert torch.equal(adv, torch.zeros(2))


def test_group_of_one():
    r = torch.tensor([[0.7], [0.0]])
    assert torch.equal(
        grpo_advantages(r), r
    )  # mean 0, std 1 for a group of one (docs/algorithms.md#grpo-family)
    assert torch.equal(dr_grpo_advantages(r), torch.zeros(2, 1))
    assert torch.equal(reinforce_advantages(r), r)
    with pytest.raises(ValueError, match="rollout.n >= 2"):
        rloo_advantages(r)
    # the estimators refuse what they are not defined for before computing anything
    for name in ("grpo", "dr_grpo", "rloo"):
        with pytest.raises(ValueError, match="set rollout.n >= 2"):
            ADVANTAGES.get(name)(2)(make_input([[0.7], [0.0]]))
    adv, _ = ADVANTAGES.get("reinforce")(2)(make_input([[0.7], [0.0]]))
    assert torch.equal(adv, torch.tensor([0.7, 0.0]))


def test_reinforce_pp_whitens_over_tokens_and_ignores_masked_rows():
    # rewards 1, 0, 0 with 2, 1, 1 tokens, plus a fully masked row whose reward (1) must not count
    inp = make_input([[1.0], [0.0], [0.0], [1.0]], lengths=[2, 1, 1, 0])
    adv, stats = ADVANTAGES.get("reinforce_pp")(4, eps=1e-6)(inp)
    # token-weighted mean = 2 / 4 = 0.5; unbiased var = (2 * 0.25 + 0.25 + 0.25) / 3 = 1 / 3
    a = 0.5 / math.sqrt(1 / 3 + 1e-6)
    assert torch.allclose(adv, torch.tensor([a, -a, -a, a]), atol=1e-6)
    assert stats["advantage/max"] == pytest.approx(a, abs=1e-6)


def test_reinforce_pp_needs_two_tokens():
    with pytest.raises(ValueError, match="at least 2"):
        ADVANTAGES.get("reinforce_pp")(1)(make_input([[1.0]], lengths=[1]))


def test_estimator_interface_and_stats():
    est = ADVANTAGES.get("grpo")(10, eps=1e-6)
    assert (est.min_group_size, est.needs_entropy, est.needs_init) == (2, False, False)
    adv, stats = est(make_input([[1.0, 0.0, 0.0, 1.0]]))
    a = 0.5 / (0.5773503 + 1e-6)
    assert adv.shape == (4,)
    assert torch.allclose(adv, torch.tensor([a, -a, -a, a]), atol=1e-6)
    assert stats["advantage/mean"] == pytest.approx(0.0, abs=1e-7)
    assert stats["advantage/std"] == pytest.approx(a, abs=1e-6)  # population std of +-a
    assert (stats["advantage/min"], stats["advantage/max"]) == pytest.approx((-a, a), abs=1e-6)
    assert est.state_dict() == {}
    with pytest.raises(ValueError, match="keeps no state"):
        est.load_state_dict({"tracker": {}})


def test_input_validation_names_the_problem():
    est = ADVANTAGES.get("grpo")(10)
    inp = make_input([[1.0, 0.0]])
    inp.rewards = torch.tensor([[1.0, float("nan")]])
    with pytest.raises(ValueError, match="non-finite reward for record 0"):
        est(inp)
    bad = make_input([[1.0, 0.0]])
    bad.indices = [0, 1]
    with pytest.raises(ValueError, match="2 indices for 1 prompts"):
        est(bad)
    with pytest.raises(ValueError, match="eps must be > 0"):
        ADVANTAGES.get("grpo")(10, eps=0.0)


def test_groups_with_signal():
    r = torch.tensor([[1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [0.0, 0.0, 0.2]])
    assert groups_with_signal(r).tolist() == [True, False, True]
    assert groups_with_signal(torch.tensor([[1.0]])).tolist() == [False]


def test_rollout_stats_counts_solved_groups_apart_from_signal():
    """A group with differing rewards but no response at the success threshold carries signal and is unsolved (the
    cliff on a continuous reward); an all-right group is solved with no signal."""
    from mmrl.rollout import Completion
    from mmrl.train.collect import Collected
    from mmrl.train.step_stats import rollout_stats

    rewards = torch.tensor([[0.2, 0.6], [0.9, 0.9], [0.1, 0.1], [0.9, 0.3]])
    comp = Completion([1, 2], "a", [0.0, 0.0], "stop")
    got = Collected(list(range(4)), [None] * 4, [None] * 4, [[comp, comp]] * 4, rewards, [])
    stats = rollout_stats(got, success_at=0.9)
    assert stats["rollout/groups_with_signal"] == 0.5  # groups 0 and 3
    assert stats["rollout/groups_solved"] == 0.5  # groups 1 and 3
    assert rollout_stats(got, success_at=0.95)["rollout/groups_solved"] == 0.0
