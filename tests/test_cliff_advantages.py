"""NGRPO, DGPO and A-GRAE (mmrl/algos/cliff.py) against values worked out by hand in docs/methods.md, and a 3-step
tiny run of each through the CLI.

The hand batch: four groups of G = 4 with 0/1 rewards: mixed (1 of 4 right), mixed (2 of 4), all wrong, all right."""

import math
from pathlib import Path

import pytest
import torch
from test_algos import make_input

from mmrl.algos import ADVANTAGES
from mmrl.algos.cliff import (
    agrae_advantages,
    dgae_advantages,
    difficulty_weights,
    informative_token_scale,
    ngrpo_advantages,
)
from mmrl.cli import main
from mmrl.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("ngrpo", "dgpo", "agrae")
BATCH = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
# response lengths for DGPO's token rebalance: the 2-of-4 group has two empty responses
LENGTHS = [3, 3, 3, 3, 4, 4, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1]


def close(a: torch.Tensor, expected: list[list[float]], atol: float = 1e-5) -> bool:
    return torch.allclose(a, torch.tensor(expected), atol=atol)


# ----------------------------------------------------------------------------------------------------------- ngrpo
def test_ngrpo_hand_values():
    a = ngrpo_advantages(torch.tensor(BATCH))
    # mixed 1/4: R' = {1,0,0,0,1}: mean 0.4, unbiased var (2 * 0.36 + 3 * 0.16) / 4 = 0.3
    s = math.sqrt(0.3)
    # all wrong: R' = {0,0,0,0,1}: mean 0.2, var (0.64 + 4 * 0.04) / 4 = 0.2 -> A = -0.2 / sqrt(0.2) = -1/sqrt(5)
    wrong = -1 / math.sqrt(5)
    expected = [
        [0.6 / s, -0.4 / s, -0.4 / s, -0.4 / s],
        [0.4 / s, 0.4 / s, -0.6 / s, -0.6 / s],  # R' = {1,1,0,0,1}: mean 0.6, var 0.3
        [wrong] * 4,
        [0.0] * 4,  # all right: R' is all r_max, std 0
    ]
    assert close(a, expected)


def test_ngrpo_matches_the_paper_numbers_for_g8():
    one_right = torch.tensor([[1.0] + [0.0] * 7, [0.0] * 8])
    a = ngrpo_advantages(one_right)
    assert a[0, 0].item() == pytest.approx(1.76, abs=5e-3)  # GRPO: +2.47
    assert a[0, 1].item() == pytest.approx(-0.50, abs=5e-3)  # GRPO: -0.35
    assert torch.allclose(a[1], torch.full((8,), -1 / 3), atol=1e-5)  # mu' = 1/9, sigma' = 1/3


def test_ngrpo_options_and_bounds():
    r = torch.tensor(BATCH)
    # no virtual sample is GRPO
    assert torch.allclose(
        ngrpo_advantages(r, num_virtual=0), ADVANTAGES.get("grpo")(4)(make_input(BATCH))[0].view(4, 4)
    )
    # r_max = 2 with rewards in {0, 1}: the all-right group now has signal too (below the virtual best)
    assert (ngrpo_advantages(r, r_max=2.0)[3] < 0).all()
    with pytest.raises(ValueError, match=r"record 1 \(response 0\) has reward 1.5, above r_max = 1"):
        ADVANTAGES.get("ngrpo")(4)(make_input([[0.0, 1.0], [1.5, 0.0]]))
    with pytest.raises(ValueError, match="num_virtual must be an integer >= 0"):
        ADVANTAGES.get("ngrpo")(1, num_virtual=-1)


# ------------------------------------------------------------------------------------------------------------ dgpo
def test_dgae_hand_values():
    a = dgae_advantages(torch.tensor(BATCH))
    # mixed 1/4: centred {0.75, -0.25 x3}, sum |.| = 1.5 -> A = 4 * centred / 1.5; mixed 2/4: +-0.5, sum 2 -> +-1
    expected = [[2.0, -2 / 3, -2 / 3, -2 / 3], [1.0, 1.0, -1.0, -1.0], [0.0] * 4, [0.0] * 4]
    assert close(a, expected)
    assert torch.allclose(a.abs().sum(1), torch.tensor([4.0, 4.0, 0.0, 0.0]), atol=1e-5)  # sum |A| = G


def test_dgpo_difficulty_weights_and_token_scale():
    r = torch.tensor(BATCH)
    w = difficulty_weights(r, temperature=2.0)
    # M = 2 informative groups, accuracies 0.25 and 0.5: w = 2 softmax(-0.125, -0.25) = 2 sigmoid(+-0.125)
    sig = 1 / (1 + math.exp(-0.125))
    assert torch.allclose(w, torch.tensor([2 * sig, 2 * (1 - sig), 1.0, 1.0]), atol=1e-6)
    assert w[:2].mean().item() == pytest.approx(1.0)  # the informative groups' weights average 1
    # tokens: 12 + 8 + 16 + 4 = 40 in the batch, 12 + 8 = 20 in informative groups
    mask = make_input(BATCH, LENGTHS).mask
    assert informative_token_scale(r, mask) == pytest.approx(2.0)
    flat = torch.zeros(2, 4)
    assert informative_token_scale(flat, torch.ones(8, 3)) == 1.0  # no informative tokens: no rescaling
    assert torch.equal(difficulty_weights(flat), torch.ones(2))


def test_dgpo_estimator_hand_values():
    adv, stats = ADVANTAGES.get("dgpo")(4)(make_input(BATCH, LENGTHS))
    sig = 1 / (1 + math.exp(-0.125))
    w1, w2, c = 2 * sig, 2 * (1 - sig), 2.0
    expected = [
        [2.0 * w1 * c, -2 / 3 * w1 * c, -2 / 3 * w1 * c, -2 / 3 * w1 * c],
        [
            w2 * c,
            w2 * c,
            -w2 * c,
            -w2 * c,
        ],  # the two empty responses keep their advantage; their mask drops it
        [0.0] * 4,
        [0.0] * 4,
    ]
    assert close(adv.view(4, 4), expected)
    assert stats["dgpo/flat_signalled"] == 0.0 and stats["dgpo/token_scale"] == pytest.approx(2.0)
    assert stats["dgpo/weight_max"] == pytest.approx(w1, abs=1e-6)
    plain, _ = ADVANTAGES.get("dgpo")(4, dqw=False, rebalance=False)(make_input(BATCH, LENGTHS))
    assert close(plain.view(4, 4), dgae_advantages(torch.tensor(BATCH)).tolist())
    with pytest.raises(ValueError, match="temperature must be > 0"):
        ADVANTAGES.get("dgpo")(1, temperature=0.0)


# ----------------------------------------------------------------------------------------------------------- agrae
def test_agrae_hand_values():
    a = agrae_advantages(torch.tensor(BATCH))
    m = (0.25 + 0.5 + 0.0 + 1.0) / 4  # batch accuracy 0.4375; positives are scaled by min(1, m / 1)
    # mixed 1/4: GRPO A = {1.5, -0.5 x3}; s = sqrt(0.25) = 0.5, so both focus factors are 0.5 / 0.5 = 1
    # mixed 2/4: GRPO A = +-0.5 / sqrt(1/3); s = sqrt(0.5):
    #   easy 0.5 / (1 - s), hard 0.5 / s, mixed (1 - m) * easy + m * hard
    s = math.sqrt(0.5)
    mix = (1 - m) * 0.5 / (1 - s) + m * 0.5 / s
    g2 = 0.5 / math.sqrt(1 / 3) * mix
    expected = [[1.5 * m, -0.5, -0.5, -0.5], [g2 * m, g2 * m, -g2, -g2], [0.0] * 4, [0.0] * 4]
    assert close(a, expected)


def test_agrae_alpha_and_reward_range():
    adv, stats = ADVANTAGES.get("agrae")(4, alpha=0.5)(make_input(BATCH))
    assert stats["agrae/batch_accuracy"] == pytest.approx(0.4375)
    assert stats["agrae/positive_scale"] == pytest.approx(0.875)  # 0.4375 / 0.5
    assert adv[0].item() == pytest.approx(1.5 * 0.875, abs=1e-5)
    assert adv[1].item() == pytest.approx(-0.5, abs=1e-5)  # negatives untouched
    # batch accuracy 0.75 >= alpha: positives unscaled; the all-right group (s = 1) stays 0, not 0 / eps
    adv, stats = ADVANTAGES.get("agrae")(2, alpha=0.5)(make_input([[1.0, 1.0], [1.0, 0.0]]))
    s = math.sqrt(0.5)
    g = 0.5 / math.sqrt(0.5) * (0.25 * 0.5 / (1 - s) + 0.75 * 0.5 / s)
    assert stats["agrae/positive_scale"] == 1.0
    assert torch.allclose(adv, torch.tensor([0.0, 0.0, g, -g]), atol=1e-5)
    with pytest.raises(ValueError, match=r"record 0 \(response 1\) has reward -0.5, outside \[0, 1\]"):
        ADVANTAGES.get("agrae")(2)(make_input([[1.0, -0.5], [1.0, 0.0]]))
    with pytest.raises(ValueError, match="alpha must be > 0"):
        ADVANTAGES.get("agrae")(1, alpha=0.0)


# ------------------------------------------------------------------------------------------------------ all three
def test_registered_and_stateless():
    for name in NAMES:
        est = ADVANTAGES.get(name)(4)
        assert est.min_group_size == 2 and est.state_dict() == {}
        est.load_state_dict(est.state_dict())
        with pytest.raises(ValueError, match="keeps no state"):
            est.load_state_dict({"step": 3})


def test_flat_groups_signalled():
    """Only NGRPO turns a flat group into signal: the all-wrong group, not the all-right one."""
    inp = make_input(BATCH)
    expected = {"ngrpo": 0.5, "dgpo": 0.0, "agrae": 0.0}
    for name in NAMES:
        adv, stats = ADVANTAGES.get(name)(4)(inp)
        assert stats[f"{name}/flat_signalled"] == expected[name], name
        assert torch.equal(adv.view(4, 4)[3], torch.zeros(4)), name  # all right: 0 for all three
        assert {"advantage/mean", "advantage/std", "advantage/min", "advantage/max"} <= stats.keys()


def test_group_of_one():
    r = torch.tensor([[0.7], [0.0]])
    for fn in (ngrpo_advantages, dgae_advantages, agrae_advantages):
        assert torch.equal(fn(r), r)  # grpo's group of one: mean 0, scale 1
    for name in NAMES:
        with pytest.raises(ValueError, match="set rollout.n >= 2"):
            ADVANTAGES.get(name)(2)(make_input([[0.7], [0.0]]))


def test_all_equal_batch():
    for rewards in ([[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]], [[0.5, 0.5], [0.5, 0.5]]):
        for name in ("dgpo", "agrae"):
            adv, _ = ADVANTAGES.get(name)(2)(make_input(rewards))
            assert torch.equal(adv, torch.zeros(4)), (name, rewards)
    adv, _ = ADVANTAGES.get("ngrpo")(2)(make_input([[0.5, 0.5], [0.5, 0.5]]))
    assert torch.allclose(
        adv, torch.full((4,), -1 / math.sqrt(3)), atol=1e-5
    )  # {.5,.5,1}: mean 2/3, std sqrt(1/12)


@pytest.fixture(scope="module")
def shapes_data(tmp_path_factory):
    return tmp_path_factory.mktemp("shapes-data")  # built by the recipe's builder on the first run


@pytest.mark.parametrize("name", NAMES)
def test_tiny_run_three_steps(name, shapes_data, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = [
        "train",
        "recipes/shapes/tiny.yaml",
        "--output-dir",
        str(tmp_path / "run"),
        "--max-steps",
        "3",
        f"algo.advantage={name}",
        f"data.train={shapes_data / 'train.jsonl'}",
        f"data.eval={shapes_data / 'eval.jsonl'}",
        "eval.max_samples=8",
        "train.progress=false",
        "train.save_every=0",
    ]
    assert main(args) == 0
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and f"{name}/flat_signalled" in r for r in rows)
