"""GRPO-family functions against values computed by hand (ALGORITHMS.md §1)."""

import math

import torch

from mmrl.algos import ADVANTAGES, LOSSES, aggregate, kl_k3


def test_grpo_advantage_hand_values():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    a = ADVANTAGES.get("grpo")(r, eps=1e-6)
    # group 1: mean 0.5, unbiased std sqrt(1/3) = 0.57735
    s = math.sqrt(1 / 3)
    expected = torch.tensor(
        [[0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6)], [0.0] * 4]
    )
    assert torch.allclose(a, expected, atol=1e-6)


def test_group_of_one_keeps_reward():
    r = torch.tensor([[0.7], [0.0]])
    assert torch.equal(ADVANTAGES.get("grpo")(r), r)


def test_drgrpo_has_no_std():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(ADVANTAGES.get("drgrpo")(r), torch.tensor([[0.75, -0.25, -0.25, -0.25]]))


def test_clipped_surrogate_hand_values():
    # four tokens: ratio 1.5 (A>0, clipped to 1.2), ratio 0.5 (A>0, unclipped side wins), ratio 1.5 with A<0,
    # ratio 5 with A<0 (dual clip at c=3 bounds the loss to 3 * |A|)
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 5.0]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, stats = LOSSES.get("clipped")(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    # token 1: max(-1.5, -1.2) = -1.2; token 2: max(-0.5, -0.8) = -0.5; token 3: max(1.5, 1.2) = 1.5;
    # token 4: max(5, 1.2) = 5 -> min(5, 3) = 3
    assert torch.allclose(loss, torch.tensor([[-1.2, -0.5, 1.5, 3.0]]), atol=1e-6)
    assert abs(stats["clip_frac"].item() - 0.25) < 1e-6  # only token 1 takes the clipped branch of the max


def test_asymmetric_clip_dapo():
    logp = torch.log(torch.tensor([[1.3]]))
    loss, _ = LOSSES.get("clipped")(
        logp,
        torch.zeros(1, 1),
        torch.tensor([1.0]),
        torch.ones(1, 1),
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=None,
    )
    assert torch.allclose(loss, torch.tensor([[-1.28]]))


def test_ratio_is_one_on_policy_and_gradient_is_minus_advantage():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = LOSSES.get("clipped")(logp, logp.detach(), torch.tensor([2.0]), torch.ones(1, 2))
    aggregate(loss, torch.ones(1, 2), "token-mean").backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0]]))  # d(-A*rho)/dlogp = -A * rho / 2 tokens


def test_aggregation_modes_hand_values():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(loss, mask, "token-mean").item() == (1 + 2 + 3 + 4) / 4
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == (2.0 + 4.0) / 2
    assert aggregate(loss, mask, "seq-mean-token-sum", constant=10).item() == (6 / 10 + 4 / 10) / 2


def test_k3_kl_hand_values():
    logp = torch.tensor([0.0, -1.0])
    ref = torch.tensor([0.0, 0.0])
    # d = ref - logp = [0, 1]: exp(d) - d - 1 = [0, e - 2]
    assert torch.allclose(kl_k3(logp, ref), torch.tensor([0.0, math.e - 2]))
    assert kl_k3(torch.tensor([-30.0]), torch.tensor([0.0])).item() == 10.0  # clamped
