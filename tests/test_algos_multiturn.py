"""Multi-turn estimators (mmrl.algos.multiturn, docs/agents.md#step-level-credit) against values worked out by hand: episode-level
GRPO over turn spans, per-turn discounted returns against the same turn index, and GiGPO's anchor-state groups; the
single-turn fallback equals grpo; options are checked on the trainer's and the config's path."""

from pathlib import Path

import pytest
import torch

from mmrl.algos import ADVANTAGES, AdvantageInput, GiGPO, Turn
from mmrl.algos.advantages import dr_grpo_advantages
from mmrl.cli import main
from mmrl.config import ConfigError, load_config
from mmrl.train.checks import check_components

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "assets" / "tiny-qwen2.5-vl")
T = 8
S = 0.5773503  # 1 / sqrt(3)
H = 0.7071068  # 1 / sqrt(2)

# Two tasks (b = 0, 1), G = 3 trajectories each; per turn: (start, end, reward, state key). Rewards are chosen so
# the returns with gamma = 0.5 are short binary fractions. Task 1 reuses the key "s0", which must NOT join task 0's
# "s0" group, and visits it twice in one trajectory.
SPANS = [
    [(0, 2, 0.0, "s0"), (4, 6, 1.0, "s1")],  # tokens: a a . . b b . .
    [(0, 3, 0.0, "s0"), (5, 7, 0.0, "s2")],  # tokens: a a a . . b b .
    [(0, 1, 0.0, "s0"), (2, 4, 0.0, "s1"), (5, 8, 1.0, "s3")],  # tokens: a . b b . c c c
    [(0, 2, 0.0, "s0"), (3, 5, 1.0, "s0")],  # tokens: a a . b b . . .
    [(1, 3, 0.0, "s5")],  # tokens: . a a . . . . .
    [(0, 4, 0.5, "s5")],  # tokens: a a a a . . . .
]
REWARDS = [[1.0, 0.0, 1.0], [1.0, 0.0, 0.5]]  # R(tau): the sum of each trajectory's turn rewards
# Discounted returns, gamma = 0.5 (R_t = r_t + 0.5 R_{t+1}):
#   row 0: [0 + 0.5 * 1, 1] = [0.5, 1]     row 1: [0, 0]
#   row 2: [0 + 0.5 * 0 + 0.25 * 1, 0 + 0.5 * 1, 1] = [0.25, 0.5, 1]
#   row 3: [0 + 0.5 * 1, 1] = [0.5, 1]     row 4: [0]        row 5: [0.5]


def turns(spans=SPANS) -> list[list[Turn]]:
    return [[Turn(*t) for t in row] for row in spans]


def make_input(rewards=REWARDS, spans=SPANS, mask=None) -> AdvantageInput:
    r = torch.tensor(rewards)
    if mask is None:  # 1 on every action token, 0 on the environment's tokens and padding
        mask = torch.zeros(len(spans), T)
        for i, row in enumerate(spans):
            for s, e, _, _ in row:
                mask[i, s:e] = 1.0
    return AdvantageInput(r, list(range(r.shape[0])), -0.5 * mask, mask, turns=turns(spans))


def paint(per_turn: list[list[float]], spans=SPANS) -> torch.Tensor:
    """Hand-written per-turn values onto their spans (the layout the comments in SPANS draw)."""
    out = torch.zeros(len(spans), T)
    for i, (row, vals) in enumerate(zip(spans, per_turn)):
        for (s, e, _, _), v in zip(row, vals):
            out[i, s:e] = v
    return out


def run(name: str, inp: AdvantageInput | None = None, **options):
    return ADVANTAGES.get(name)(10, eps=1e-6, **options)(inp or make_input())


def test_gigpo_hand_values_mean_std_norm():
    adv, stats = run("gigpo", gamma=0.5)
    # A_E, task 0: R = [1, 0, 1], mean 2/3, unbiased var ((1/3)^2 + (2/3)^2 + (1/3)^2) / 2 = 1/3, std 1/sqrt(3)
    #   -> [S, -2S, S];  task 1: R = [1, 0, 0.5], mean 0.5, var (0.25 + 0.25 + 0) / 2 = 0.25, std 0.5 -> [1, -1, 0]
    # A_S, task 0: s0 = {0.5, 0, 0.25}: mean 0.25, var (0.0625 + 0.0625 + 0) / 2 = 0.0625, std 0.25 -> [1, -1, 0]
    #              s1 = {1 (row 0), 0.5 (row 2)}: mean 0.75, var 2 * 0.0625 / 1 = 0.125, std 0.35355 -> [H, -H]
    #              s2 (row 1), s3 (row 2): seen once -> 0
    #      task 1: s0 = {0.5, 1} (row 3 twice; task 0's s0 stays apart): mean 0.75 -> [-H, H]
    #              s5 = {0 (row 4), 0.5 (row 5)}: mean 0.25 -> [-H, H]
    expected = [
        [S + 1, S + H],  # 1.57735, 1.28446
        [-2 * S - 1, -2 * S + 0],  # -2.15470, -1.15470
        [S + 0, S - H, S + 0],  # 0.57735, -0.12976, 0.57735
        [1 - H, 1 + H],  # 0.29289, 1.70711
        [-1 - H],
        [0 + H],
    ]
    assert adv.shape == (6, T)
    assert torch.allclose(adv, paint(expected), atol=1e-5)
    assert stats["gigpo/turns_mean"] == pytest.approx(11 / 6)
    # groups per task: {s0: 3, s1: 2, s2: 1, s3: 1} and {s0: 2, s5: 2}; 11 steps
    assert stats["gigpo/anchor_groups"] == 4
    assert stats["gigpo/anchor_group_size"] == pytest.approx(11 / 6)
    assert stats["gigpo/grouped_steps"] == pytest.approx(9 / 11)
    assert stats["gigpo/step_adv_nonzero"] == pytest.approx(8 / 11)  # the median of task 0's s0 gets 0


def test_gigpo_hand_values_mean_norm_weighted_written_out():
    adv, _ = run("gigpo", gamma=0.5, step_weight=2.0, episode_norm="mean_norm", step_norm="mean_norm")
    # A_E = R - mean: task 0 [1/3, -2/3, 1/3], task 1 [0.5, -0.5, 0]
    # A_S = R_t - mean: task 0 s0 [0.25, -0.25, 0], s1 [0.25, -0.25]; task 1 s0 [-0.25, 0.25], s5 [-0.25, 0.25]
    # A = A_E + 2 A_S, every token of the turn's span; 0 on the environment's tokens and padding
    a, b = 1 / 3 + 0.5, -2 / 3 - 0.5
    expected = torch.tensor(
        [
            [a, a, 0, 0, a, a, 0, 0],  # 1/3 + 2 * 0.25 on both turns
            [b, b, b, 0, 0, -2 / 3, -2 / 3, 0],  # s2 seen once: A_E alone
            [1 / 3, 0, 1 / 3 - 0.5, 1 / 3 - 0.5, 0, 1 / 3, 1 / 3, 1 / 3],
            [0, 0, 0, 1, 1, 0, 0, 0],  # 0.5 - 0.5, 0.5 + 0.5
            [0, -1, -1, 0, 0, 0, 0, 0],  # -0.5 - 0.5
            [0.5, 0.5, 0.5, 0.5, 0, 0, 0, 0],  # 0 + 0.5
        ]
    )
    assert torch.allclose(adv, expected, atol=1e-6)


def test_discounted_turns_hand_values():
    adv, stats = run("discounted_turns", gamma=0.5)
    # baseline: the same turn index within the task
    # task 0, t=0: {0.5, 0, 0.25} -> [1, -1, 0] (as s0 above); t=1: {1, 0, 0.5}: mean 0.5, var 0.25, std 0.5
    #   -> [1, -1, 0]; t=2: row 2 alone -> 0
    # task 1, t=0: {0.5, 0, 0.5}: mean 1/3, var ((1/6)^2 + (1/3)^2 + (1/6)^2) / 2 = 1/12, std 0.288675
    #   -> [(1/6) / 0.288675, -(1/3) / 0.288675, ...] = [S, -2S, S]; t=1: row 3 alone -> 0
    expected = [[1, 1], [-1, -1], [0, 0, 0], [S, 0], [-2 * S], [S]]
    assert torch.allclose(adv, paint(expected), atol=1e-5)
    assert stats["discounted_turns/lone_turns"] == pytest.approx(2 / 11)
    adv, _ = run("discounted_turns", gamma=0.5, norm="mean_norm")
    # task 0, t=0: [0.5, 0, 0.25] - 0.25; t=1: [1, 0, 0.5] - 0.5; task 1, t=0: [0.5, 0, 0.5] - 1/3
    expected = [[0.25, 0.5], [-0.25, -0.5], [0, 0, 0], [1 / 6, 0], [-1 / 3], [1 / 6]]
    assert torch.allclose(adv, paint(expected), atol=1e-6)
    # gamma = 1: every turn's return is the rest of the trajectory's reward
    adv, _ = run("discounted_turns", gamma=1.0, norm="mean_norm")
    # row returns: [1, 1], [0, 0], [1, 1, 1], [1, 1], [0], [0.5]; task 0 t=0 and t=1: [1, 0, 1] - 2/3;
    # task 1 t=0: [1, 0, 0.5] - 0.5
    expected = [[1 / 3, 1 / 3], [-2 / 3, -2 / 3], [1 / 3, 1 / 3, 0], [0.5, 0], [-0.5], [0]]
    assert torch.allclose(adv, paint(expected), atol=1e-6)


def test_episode_grpo_hand_values():
    adv, stats = run("episode_grpo")
    # the task's episode returns only, on every turn: task 0 [S, -2S, S], task 1 [1, -1, 0] (see above)
    expected = [[S, S], [-2 * S, -2 * S], [S, S, S], [1, 1], [-1], [0]]
    assert torch.allclose(adv, paint(expected), atol=1e-5)
    assert stats["episode_grpo/turns_mean"] == pytest.approx(11 / 6)
    adv, _ = run("episode_grpo", norm="mean_norm")
    expected = [[1 / 3] * 2, [-2 / 3] * 2, [1 / 3] * 3, [0.5] * 2, [-0.5], [0]]
    assert torch.allclose(adv, paint(expected), atol=1e-6)


def test_masked_tokens_in_a_span_get_zero_and_loss_tokens_outside_spans_are_refused():
    mask = make_input().mask.clone()
    mask[0, 1] = 0.0  # an action token left out of the loss (row 0, first turn's second token)
    adv, _ = run("gigpo", make_input(mask=mask), gamma=0.5)
    assert adv[0, 1] == 0 and adv[0, 0] != 0
    assert torch.equal(adv[mask == 0], torch.zeros(int((mask == 0).sum())))
    mask[2, 1] = 1.0  # row 2's environment token between its first two turns, left in the loss
    with pytest.raises(ValueError, match=r"response 2 \(record 0\) has 1 loss tokens \(mask 1\) outside"):
        run("gigpo", make_input(mask=mask))


def test_single_turn_fallback_is_grpo():
    torch.manual_seed(0)
    rewards = torch.rand(3, 4).round(decimals=1)
    rewards[1] = 0.5  # a group with equal rewards
    lengths = torch.tensor([5, 3, 1, 6, 0, 2, 4, 6, 6, 1, 2, 3])
    mask = (torch.arange(6)[None] < lengths[:, None]).float()  # [12, 6]
    inp = AdvantageInput(rewards, [7, 8, 9], -0.5 * mask, mask)
    grpo, _ = ADVANTAGES.get("grpo")(10)(inp)  # [12]
    broadcast = grpo[:, None] * mask
    for name in ("episode_grpo", "gigpo"):
        adv, _ = ADVANTAGES.get(name)(10)(inp)
        assert torch.equal(adv, broadcast), name
    adv, stats = ADVANTAGES.get("gigpo")(10)(inp)
    assert stats["gigpo/anchor_groups"] == 0 and stats["gigpo/step_adv_nonzero"] == 0
    adv, _ = ADVANTAGES.get("discounted_turns")(10)(inp)  # R_0 = r against the G trajectories' R_0
    assert torch.allclose(adv, broadcast, atol=1e-6)
    adv, _ = ADVANTAGES.get("gigpo")(10, episode_norm="mean_norm")(inp)
    assert torch.equal(adv, dr_grpo_advantages(rewards).reshape(-1, 1) * mask)


def test_gigpo_without_repeated_states_is_the_episode_term():
    unique = [[(s, e, r, f"{i}-{k}") for k, (s, e, r, _) in enumerate(row)] for i, row in enumerate(SPANS)]
    episode, _ = run("episode_grpo", make_input(spans=unique))
    adv, stats = run("gigpo", make_input(spans=unique), gamma=0.5)
    assert torch.equal(adv, episode)
    assert stats["gigpo/anchor_groups"] == 0
    adv, _ = run("gigpo", gamma=0.5, step_weight=0.0)  # repeated states, but no weight on them
    assert torch.equal(adv, run("episode_grpo")[0])


def test_turn_validation_names_the_response():
    inp = make_input()
    inp.turns = inp.turns[:5]
    with pytest.raises(ValueError, match="5 turn lists for 6 responses"):
        run("gigpo", inp)
    bad = [row[:] for row in SPANS]
    bad[4] = [(1, 9, 0.0, "s5")]
    with pytest.raises(ValueError, match=r"response 4 \(record 1\) turn 0: span \[1, 9\) is not inside"):
        run("gigpo", make_input(spans=bad, mask=make_input().mask))
    bad[4] = [(1, 3, 0.0, "s5"), (2, 4, 0.0, "s6")]
    with pytest.raises(ValueError, match="turn 1: span .* starts before the previous turn ends"):
        run("discounted_turns", make_input(spans=bad))
    bad[4] = [(1, 3, float("nan"), "s5")]
    with pytest.raises(ValueError, match="non-finite reward nan"):
        run("gigpo", make_input(spans=bad))
    inp = make_input()
    inp.turns[0][0] = (0, 2, 0.0, "s0")
    with pytest.raises(ValueError, match="response 0 .* expected a Turn"):
        run("episode_grpo", inp)


def test_empty_turns_and_a_row_without_turns():
    spans = [row[:] for row in SPANS]
    spans[1] = []  # a trajectory that ended before its first action: counts in A_E, trains no token
    spans[5] = [(0, 0, 0.5, "s5"), (0, 4, 0.0, "s6")]  # an empty first action span, then the action on 0..3
    rewards = [[1.0, 0.0, 1.0], [1.0, 0.0, 1.0]]  # task 1's A_E: [S, -2S, S] as task 0's
    adv, _ = run("gigpo", make_input(rewards, spans), gamma=0.5, step_norm="mean_norm")
    assert torch.equal(adv[1], torch.zeros(T))
    # task 1 returns: row 3 [0.5, 1], row 4 [0], row 5 [0.5 + 0.5 * 0, 0] = [0.5, 0]
    # s5 = {0 (row 4), 0.5 (row 5's empty turn)}: mean 0.25 -> [-0.25, 0.25]; the empty turn's value is on no token
    # s6 seen once -> 0, so row 5's action tokens carry A_E = S alone
    assert torch.allclose(adv[5], torch.tensor([S, S, S, S, 0, 0, 0, 0]), atol=1e-5)
    assert torch.allclose(adv[4], torch.tensor([0, -2 * S - 0.25, -2 * S - 0.25, 0, 0, 0, 0, 0]), atol=1e-5)


def test_interface_state_and_registration():
    assert ADVANTAGES.get("gigpo") is GiGPO
    assert {"episode_grpo", "discounted_turns", "gigpo"} <= set(ADVANTAGES.names())
    for name in ("episode_grpo", "discounted_turns", "gigpo"):
        est = ADVANTAGES.get(name)(10, eps=1e-6)
        assert (est.min_group_size, est.needs_entropy, est.needs_init) == (2, False, False)
        assert est.state_dict() == {}
        est.load_state_dict(est.state_dict())
        with pytest.raises(ValueError, match="keeps no state"):
            est.load_state_dict({"groups": {}})
        with pytest.raises(ValueError, match="set rollout.n >= 2"):
            est(make_input(rewards=[[1.0], [0.0]], spans=[[(0, 1, 1.0, "a")], [(0, 1, 0.0, "a")]]))


def test_options_checked_on_the_trainers_path():
    # as the trainer builds it:
    # ADVANTAGES.get(algo.advantage)(num_records, eps=algo.adv_eps, **algo.advantage_options)
    est = ADVANTAGES.get("gigpo")(10, eps=1e-6, gamma=0.9, step_weight=0.5, step_norm="mean_norm")
    assert (est.gamma, est.w, est.episode_norm, est.step_norm) == (0.9, 0.5, "mean_std_norm", "mean_norm")
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\] \(algo.advantage_options.gamma\)"):
        ADVANTAGES.get("gigpo")(10, gamma=1.5)
    with pytest.raises(ValueError, match=r"step_weight must be >= 0"):
        ADVANTAGES.get("gigpo")(10, step_weight=-1.0)
    with pytest.raises(ValueError, match=r"'discounted_turns': norm must be 'mean_std_norm' or 'mean_norm'"):
        ADVANTAGES.get("discounted_turns")(10, norm="std")


def _cfg(*overrides):
    return load_config(
        None, [f"model.path={TINY}", "data.train=x.jsonl", "rewards=[{name: exact_match}]", *overrides]
    )


def test_config_accepts_the_names_and_checks_their_options(capsys):
    check_components(_cfg("algo.advantage=gigpo"))
    check_components(
        _cfg(
            "algo.advantage=gigpo",
            "algo.advantage_options={gamma: 0.9, step_weight: 0.5, step_norm: mean_norm}",
        )
    )
    check_components(_cfg("algo.advantage=discounted_turns", "algo.advantage_options={norm: mean_norm}"))
    check_components(_cfg("algo.advantage=episode_grpo"))
    with pytest.raises(ConfigError, match=r"unknown option 'step_weigth'; did you mean 'step_weight'"):
        check_components(_cfg("algo.advantage=gigpo", "algo.advantage_options={step_weigth: 2}"))
    with pytest.raises(ConfigError, match=r"option 'gamma' expects a number"):
        check_components(_cfg("algo.advantage=gigpo", "algo.advantage_options={gamma: high}"))
    with pytest.raises(ConfigError, match=r"episode_norm must be 'mean_std_norm' or 'mean_norm'"):
        check_components(_cfg("algo.advantage=gigpo", "algo.advantage_options={episode_norm: std}"))
    with pytest.raises(ConfigError, match=r"needs at least 2 responses per prompt"):
        check_components(_cfg("algo.advantage=gigpo", "rollout.n=1"))
    assert main(["list"]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("advantage estimators"))
    assert all(name in line for name in ("episode_grpo", "discounted_turns", "gigpo"))
