"""Policy losses, aggregations, KL estimators, reward corrections and presets against hand-worked values."""

import dataclasses
import inspect
import math

import pytest
import torch

from mmrl.algos import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOSSES,
    PRESETS,
    REWARD_CORRECTIONS,
    check_reward_correction,
    kl_penalised_rewards,
    reduce_stats,
)
from mmrl.config import AlgoConfig, RolloutConfig


def whole(agg_name: str, loss: torch.Tensor, mask: torch.Tensor, constant: float = 0.0) -> torch.Tensor:
    agg = AGGREGATIONS.get(agg_name)
    return agg.numerator(loss, mask, constant) / agg.units(mask)


def test_clipped_hand_values_and_stats():
    # ratios 1.5 (A>0: high clip binds), 0.5 (A>0: unclipped side), 1.5 (A<0), 5 (A<0: dual clip),
    # 0.5 (A<0: low clip binds), and a padded token with ratio 9 that no statistic may see
    old = torch.zeros(1, 6)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 5.0, 0.5, 9.0]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, st = LOSSES.get("clipped")(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    # max(-1.5, -1.2); max(-0.5, -0.8); max(1.5, 1.2); min(max(5, 1.2), 3); max(0.5, 0.8); max(-9, -1.2)
    assert torch.allclose(loss, torch.tensor([[-1.2, -0.5, 1.5, 3.0, 0.8, -1.2]]), atol=1e-6)
    assert st["clip_frac_high"].item() == pytest.approx(0.2)
    assert st["clip_frac_low"].item() == pytest.approx(0.2)
    assert st["clip_frac_dual"].item() == pytest.approx(0.2)
    assert st["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 1.5 + 5.0 + 0.5) / 5)
    assert (st["ratio_min"].item(), st["ratio_max"].item()) == pytest.approx((0.5, 5.0))


def test_clip_higher_dapo():
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


def test_on_policy_gradient_is_minus_advantage():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = LOSSES.get("clipped")(logp, logp.detach(), torch.tensor([2.0]), torch.ones(1, 2))
    whole("token-mean", loss, torch.ones(1, 2)).backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0]]))  # -A * rho / 2 tokens


def test_gspo_sequence_ratio_value_and_gradient():
    old = torch.zeros(2, 3)
    # row 0: log-ratios 0.1, 0.3 -> s = e^0.2 = 1.221403 > 1.2, A = +1: clipped, loss -1.2, no gradient
    # row 1: log-ratios -0.2, 0.5 (third token padding) -> s = e^0.15 = 1.161834, A = -1: loss s, unclipped
    logp = torch.tensor([[0.1, 0.3, 0.0], [-0.2, 0.5, 7.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    loss, st = LOSSES.get("gspo")(logp, old, torch.tensor([1.0, -1.0]), mask, clip_low=0.2, clip_high=0.2)
    assert torch.allclose(loss[:, :2], torch.tensor([[-1.2, -1.2], [1.161834, 1.161834]]), atol=1e-6)
    assert st["clip_frac_high"].item() == pytest.approx(0.5) and st["clip_frac_low"].item() == 0.0
    assert st["ratio_max"].item() == pytest.approx(1.221403, abs=1e-6)
    whole("seq-mean-token-mean", loss, mask).backward()
    # d/dlogp_t of (1/2 rows) * mean_t(s): s * (1/2 tokens) * (1/2 rows) = 1.161834 / 4 on row 1's tokens
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [0.2904585, 0.2904585, 0.0]]), atol=1e-6)


def test_reg_grpo_hand_values():
    # one token per response; group 0 log-ratios 0.1, 0.2, 0.6: mean 0.3, unbiased var 0.14 / 2 = 0.07
    logp = torch.tensor([[0.1], [0.2], [0.6], [0.4]], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    ids = torch.tensor([0, 0, 0, 1])
    fn = LOSSES.get("reg_grpo")
    assert fn.needs_whole_groups is True and LOSSES.get("clipped").needs_whole_groups is False
    loss, st = fn(logp, torch.zeros(4, 1), adv, torch.ones(4, 1), group_ids=ids, eps=1e-6)
    s = math.sqrt(0.07 + 1e-6)
    # z = -0.2/s, -0.1/s, 0.3/s = -0.755929, -0.377964, 1.133893; group 1 has one response: z = 0
    expected = [(1 + 0.2 / s) ** 2, (-1 + 0.1 / s) ** 2, (0.5 - 0.3 / s) ** 2, 4.0]
    assert loss[:, 0].tolist() == pytest.approx(expected, abs=1e-5)
    assert st["clip_frac_low"].item() == 0.0 and st["clip_frac_high"].item() == 0.0  # no clipping
    with pytest.raises(ValueError, match="needs group_ids"):
        fn(logp, torch.zeros(4, 1), adv, torch.ones(4, 1))


def test_reg_grpo_first_update_has_a_finite_gradient():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7], [-3.0, -0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    loss, _ = LOSSES.get("reg_grpo")(
        logp, logp.detach(), torch.tensor([1.0, -0.5, -0.5]), mask, group_ids=torch.tensor([3, 3, 3])
    )
    whole("seq-mean-token-mean", loss, mask).backward()
    assert torch.isfinite(logp.grad).all() and logp.grad.abs().sum() > 0


def test_aggregation_hand_values():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert whole("token-mean", loss, mask).item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert whole("seq-mean-token-mean", loss, mask).item() == pytest.approx((2.0 + 4.0) / 2)
    assert whole("seq-mean-token-sum-norm", loss, mask, 10.0).item() == pytest.approx((6 / 10 + 4 / 10) / 2)
    with pytest.raises(ValueError, match="loss_agg_constant"):
        whole("seq-mean-token-sum-norm", loss, mask, 0.0)


@pytest.mark.parametrize("name", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_is_exact_over_micro_batches(name):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(7, 5, generator=g)
    lengths = torch.tensor([5, 1, 0, 3, 5, 2, 4])  # row 2 fully masked
    mask = (torch.arange(5)[None] < lengths[:, None]).float()
    agg = AGGREGATIONS.get(name)
    parts = [slice(0, 2), slice(2, 3), slice(3, 7)]  # the fully masked row alone in its micro-batch
    split = sum(agg.numerator(loss[p], mask[p], 8.0) for p in parts) / sum(agg.units(mask[p]) for p in parts)
    per_seq_sum = (loss * mask).sum(-1)
    expected = {
        "token-mean": per_seq_sum.sum() / lengths.sum(),
        "seq-mean-token-mean": (per_seq_sum / lengths.clamp(min=1)).mean(),
        "seq-mean-token-sum-norm": (per_seq_sum / 8.0).mean(),
    }[name]
    assert split.item() == pytest.approx(expected.item(), abs=1e-6)
    assert split.item() == pytest.approx(whole(name, loss, mask, 8.0).item(), abs=1e-6)


def test_reduce_stats_across_micro_batches():
    parts = [
        ({"clip_frac_low": 0.5, "ratio_min": 0.8, "ratio_max": 1.1}, 2.0),
        ({"clip_frac_low": torch.tensor(0.0), "ratio_min": 0.9, "ratio_max": 1.5}, 6.0),
        ({"clip_frac_low": 0.0, "ratio_min": float("inf"), "ratio_max": float("-inf")}, 0.0),  # no tokens
    ]
    assert reduce_stats(parts) == pytest.approx({"clip_frac_low": 0.125, "ratio_min": 0.8, "ratio_max": 1.5})


def test_kl_estimators_hand_values():
    logp = torch.tensor([0.0, -1.0, -1.0])
    ref = torch.tensor([0.0, 0.0, -3.0])  # d = ref - logp = 0, 1, -2
    assert torch.allclose(KL_ESTIMATORS.get("k1")(logp, ref), torch.tensor([0.0, -1.0, 2.0]))
    assert torch.allclose(KL_ESTIMATORS.get("k2")(logp, ref), torch.tensor([0.0, 0.5, 2.0]))
    # exp(d) - d - 1: 0, e - 2 = 0.718282, e^-2 + 1 = 1.135335
    assert torch.allclose(
        KL_ESTIMATORS.get("k3")(logp, ref), torch.tensor([0.0, 0.718282, 1.135335]), atol=1e-6
    )
    assert KL_ESTIMATORS.get("k3")(torch.tensor([-30.0]), torch.tensor([0.0])).item() == 10.0  # clamped


def test_kl_as_a_reward_penalty():
    kl = torch.tensor([[0.1, 0.2, 5.0], [0.3, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = kl_penalised_rewards(torch.tensor([[1.0, 0.0]]), kl, mask, coef=0.5)
    assert torch.allclose(out, torch.tensor([[1.0 - 0.5 * 0.3, 0.0 - 0.5 * 0.3]]))


def test_backward_correction_is_unbiased():
    fn = REWARD_CORRECTIONS.get("backward")
    out = fn(torch.tensor([[1.0, 0.0]]), fp_rate=0.1, fn_rate=0.2)
    hi, lo = 0.9 / 0.7, -0.1 / 0.7  # 1.285714, -0.142857
    assert torch.allclose(out, torch.tensor([[hi, lo]]))
    assert 0.8 * hi + 0.2 * lo == pytest.approx(1.0)  # clean R = 1 is observed as 1 w.p. 1 - fn_rate
    assert 0.1 * hi + 0.9 * lo == pytest.approx(0.0)  # clean R = 0 is observed as 1 w.p. fp_rate
    with pytest.raises(ValueError, match="fp_rate \\+ fn_rate < 1"):
        fn(torch.tensor([[1.0]]), fp_rate=0.6, fn_rate=0.5)


def test_forward_correction_weights():
    out = REWARD_CORRECTIONS.get("forward")(torch.tensor([[1.0, 0.0]]), fp_rate=0.1, fn_rate=0.2)
    assert torch.allclose(out, torch.tensor([[0.2, -0.8]]))  # w = fn_rate for R~ = 1, fn_rate - 1 for R~ = 0
    # E[w | R = 1] = 0.8 * 0.2 + 0.2 * (-0.8) = 0; E[w | R = 0] = 0.1 * 0.2 + 0.9 * (-0.8) = -(1 - 0.1 - 0.2)
    assert 0.8 * 0.2 + 0.2 * -0.8 == pytest.approx(0.0) and 0.1 * 0.2 + 0.9 * -0.8 == pytest.approx(-0.7)
    assert torch.equal(REWARD_CORRECTIONS.get("none")(torch.tensor([[0.3]])), torch.tensor([[0.3]]))


def test_corrections_that_would_change_nothing_are_refused():
    check_reward_correction("forward", "reinforce")
    check_reward_correction("backward", "dr_grpo")
    check_reward_correction("backward", "mssr")
    check_reward_correction("none", "grpo")
    for corr, adv in [
        ("forward", "grpo"),
        ("forward", "mssr"),
        ("backward", "grpo"),
        ("backward", "reinforce_pp"),
    ]:
        with pytest.raises(ValueError, match=f"advantage {adv!r}"):
            check_reward_correction(corr, adv)


def test_presets_resolve_and_bind():
    assert sorted(PRESETS) == ["dapo", "dr_grpo", "grpo", "gspo", "mssr", "spo"]
    assert PRESETS["mssr"]["rollout"]["n"] == 1 and PRESETS["dapo"]["algo"]["clip_high"] == 0.28
    logp = torch.zeros(2, 3, requires_grad=True)
    algo_fields = {f.name for f in dataclasses.fields(AlgoConfig)}
    rollout_fields = {f.name for f in dataclasses.fields(RolloutConfig)}
    for name, preset in PRESETS.items():
        a = preset["algo"]
        assert set(a) <= algo_fields and set(preset["rollout"]) <= rollout_fields, name
        est = ADVANTAGES.get(a["advantage"])(4, **a.get("advantage_options", {}))
        assert est.min_group_size <= preset["rollout"]["n"], name
        AGGREGATIONS.get(a["loss_agg"])
        if a.get("kl_coef", 0.0) > 0:
            KL_ESTIMATORS.get(a["kl_estimator"])
        fn = LOSSES.get(a["loss"])
        clip = {
            k: a[k] for k in ("clip_low", "clip_high", "dual_clip") if k in inspect.signature(fn).parameters
        }
        loss, _ = fn(logp, logp.detach(), torch.tensor([1.0, -1.0]), torch.ones(2, 3), **clip)
        assert loss.shape == (2, 3), name
