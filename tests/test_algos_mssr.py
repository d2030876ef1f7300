"""SPO / MSSR single-rollout estimators (docs/algorithms.md#mssr) against values worked out by hand.

Shared numbers: rho_min 0.875, rho_max 0.96 -> N0 = 1 / (1 - 0.875) = 8 pseudo-counts, so an unseen prompt starts
at alpha = beta = 4 (v = 0.5); with no KL yet the global rule uses the midpoint rho = (0.875 + 0.96) / 2 = 0.9175.
"""

import json
import math

import pytest
import torch

from mmrl.algos import ADVANTAGES, MSSR, SPO, AdvantageInput
from mmrl.algos.single_rollout import global_rho


def single(indices, rewards, logps=None, masks=None, kl=None, entropy=None) -> AdvantageInput:
    """One response per prompt; ``logps``/``masks`` per response (default: two tokens of log-prob -0.5)."""
    n = len(indices)
    logps = logps or [[-0.5, -0.5]] * n
    masks = masks or [[1.0] * len(lp) for lp in logps]
    ent = None if entropy is None else torch.tensor(entropy)
    return AdvantageInput(
        torch.tensor(rewards).reshape(n, -1), list(indices), torch.tensor(logps), torch.tensor(masks), ent, kl
    )


def test_registry_attributes():
    spo, mssr = ADVANTAGES.get("spo")(5), ADVANTAGES.get("mssr")(5)
    assert (spo.min_group_size, spo.needs_init, spo.needs_entropy) == (1, True, False)
    assert (mssr.min_group_size, mssr.needs_init, mssr.needs_entropy) == (1, True, False)
    assert MSSR(5, entropy="full").needs_entropy is True
    assert SPO(5, init=False).needs_init is False


def test_value_is_read_before_the_update_and_tracker_updates():
    est = SPO(3)
    adv, stats = est(single([0, 1], [1.0, 0.0]))
    # v = 0.5 for both; A_raw = +-0.5; batch mean 0, population var 0.25 -> A = +-1
    assert torch.allclose(adv, torch.tensor([1.0, -1.0]))
    assert stats["spo/value_mean"] == pytest.approx(0.5)
    assert stats["spo/rho"] == pytest.approx(0.9175)
    # alpha0 = 0.9175 * 4 + 1 = 4.67, beta0 = 0.9175 * 4 = 3.67; record 1 mirrored; record 2 untouched
    assert est.tracker.alpha.tolist() == pytest.approx([4.67, 3.67, 4.0])
    assert est.tracker.beta.tolist() == pytest.approx([3.67, 4.67, 4.0])
    # both correct now: v = 4.67 / 8.34 = 0.559952 and 3.67 / 8.34 = 0.440048, A_raw = 0.440048, 0.559952,
    # mean 0.5, population std 0.059952 -> A = -1, +1 (the harder prompt gets the larger advantage)
    adv, stats = est(single([0, 1], [1.0, 1.0]))
    assert torch.allclose(adv, torch.tensor([-1.0, 1.0]), atol=1e-5)
    assert stats["spo/value_mean"] == pytest.approx(0.5)
    assert est.tracker.alpha[0] == pytest.approx(0.9175 * 4.67 + 1)  # 5.284725


def test_single_response_batch_is_not_normalised():
    adv, _ = SPO(1)(single([0], [1.0]))
    assert torch.allclose(adv, torch.tensor([0.5]))  # A_raw = 1 - 0.5; a batch of one has no variance


def test_repeated_prompt_updates_in_order():
    # the same record twice in one batch (or G = 2): both read v = 0.5, then two sequential updates
    for inp in (single([0, 0], [1.0, 0.0]), AdvantageInput(torch.tensor([[1.0, 0.0]]), [0], *_two_rows())):
        est = SPO(1)
        adv, _ = est(inp)
        assert torch.allclose(adv, torch.tensor([1.0, -1.0]))
        # alpha: 0.9175 * 4 + 1 = 4.67, then * 0.9175 = 4.284725; beta: 3.67, then * 0.9175 + 1 = 4.367225
        assert (est.tracker.alpha[0], est.tracker.beta[0]) == pytest.approx((4.284725, 4.367225))


def _two_rows():
    return torch.full((2, 2), -0.5), torch.ones(2, 2)


def test_initialisation_pass():
    est = SPO(4)
    # record 0 seen twice (1, 0): v0 = 0.5; record 1 wrong: v0 = 0; record 2 scored 0.7 -> outcome 1 -> v0 = 1
    est.initialise([0, 1, 2, 0], torch.tensor([1.0, 0.0, 0.7, 0.0]))
    assert est.tracker.alpha.tolist() == [4.0, 0.0, 8.0, 4.0]  # N0 * v0; record 3 unseen keeps v_init 0.5
    assert est.tracker.beta.tolist() == [4.0, 8.0, 0.0, 4.0]
    _, stats = est(single([1, 2], [0.0, 1.0]))
    assert stats["spo/value_mean"] == pytest.approx(0.5)  # (0 + 1) / 2, read before the update
    with pytest.raises(ValueError, match="record index 7 is outside"):
        est.initialise([7], torch.tensor([1.0]))


def test_outcome_score_counts_fractional_rewards():
    est = SPO(1, outcome="score")
    est(single([0], [0.7]))
    assert (est.tracker.alpha[0], est.tracker.beta[0]) == pytest.approx((0.9175 * 4 + 0.7, 0.9175 * 4 + 0.3))
    with pytest.raises(ValueError, match="record 0 has reward 1.5 outside"):
        est(single([0], [1.5]))


@pytest.mark.parametrize(
    "m, paper, code",
    [
        (None, 0.9175, 0.9175),  # empty window: midpoint
        (0.0, 0.96, 0.875),  # policy at the reference: paper forgets slowest, the authors' code fastest
        (0.0025, 0.96 - 0.25 * 0.085, 0.875 + 0.25 * 0.085),  # 0.93875 / 0.89625
        (0.01, 0.875, 0.96),  # m = tau (not above): the code's rule peaks here
        (0.02, 0.875, 0.875),  # above tau: rho_min for both
        (-0.001, 0.96, 0.875),  # a negative (k1) estimate counts as 0
    ],
)
def test_global_rho_rules(m, paper, code):
    assert global_rho(m, rule="paper") == pytest.approx(paper)
    assert global_rho(m, rule="code") == pytest.approx(code)


def test_global_rho_window_in_the_estimator():
    est = SPO(1, rho_rule="paper", window=2)
    rhos = [est(single([0], [1.0], kl=kl))[1]["spo/rho"] for kl in (0.004, 0.0, 0.002, None)]
    # windows [0.004] -> m 0.004; [0.004, 0] -> 0.002; [0, 0.002] -> 0.001; None adds nothing -> 0.001
    assert rhos == pytest.approx([0.96 - 0.4 * 0.085, 0.96 - 0.2 * 0.085, 0.96 - 0.1 * 0.085, 0.9515])
    assert est.tracker.alpha[0] == pytest.approx(((0.926 * 4 + 1) * 0.943 + 1) * 0.9515 * 0.9515 + 0.9515 + 1)
    code = SPO(1, rho_rule="code", window=2)
    assert code(single([0], [1.0], kl=0.004))[1]["spo/rho"] == pytest.approx(0.875 + 0.4 * 0.085)  # 0.909


def test_per_prompt_rho():
    est = SPO(2, rho="per_prompt")
    # first visit: rho_max; mean sampled-token log-prob -1.0
    assert est(single([0], [1.0], logps=[[-0.5, -1.5]]))[1]["spo/rho"] == pytest.approx(0.96)
    assert (est.tracker.alpha[0], est.tracker.beta[0]) == pytest.approx((0.96 * 4 + 1, 0.96 * 4))
    # second visit, mean -1.006 (the padded third token does not count): D = 0.006 -> 2^(-0.1) = 0.933033
    r2 = est(single([0], [1.0], logps=[[-1.006, -1.006, -9.0]], masks=[[1, 1, 0]]))[1]["spo/rho"]
    assert r2 == pytest.approx(0.9330330, abs=1e-6)
    # third visit, D = 0.06 -> 2^(-1) = 0.5, clipped to rho_min; another prompt's first visit gets rho_max
    _, stats = est(single([0, 1], [1.0, 0.0], logps=[[-1.066, -1.066], [-0.2, -0.2]]))
    assert stats["spo/rho"] == pytest.approx((0.875 + 0.96) / 2)


def test_mssr_shaping_hand_values():
    # A = +1 / -1 (as in the first test). Sampled-token entropy H = -p log p:
    # row 0: p = 0.5, 0.9 -> 0.346574, 0.094824 (third token padding); row 1: p = 0.2 -> 0.321888
    # psi = min(0.4 H, |A| / 2 = 0.5) = 0.138629, 0.037930 | 0.128755
    logps = [[math.log(0.5), math.log(0.9), 0.0], [math.log(0.2), 0.0, 0.0]]
    adv, stats = MSSR(2)(single([0, 1], [1.0, 0.0], logps=logps, masks=[[1, 1, 0], [1, 0, 0]]))
    expected = torch.tensor([[1.138629, 1.037930, 0.0], [-1 + 0.128755, 0.0, 0.0]])
    assert adv.shape == (2, 3)
    assert torch.allclose(adv, expected, atol=1e-6)
    assert stats["mssr/shaping_mean"] == pytest.approx((0.138629 + 0.037930 + 0.128755) / 3, abs=1e-6)
    assert stats["mssr/rho"] == pytest.approx(0.9175) and stats["mssr/value_mean"] == pytest.approx(0.5)


def test_mssr_full_entropy_is_capped_at_half_the_advantage():
    # entropy 3.0 -> 0.4 * 3 = 1.2 > |A| / 2 = 0.5: psi = 0.5, so -1 becomes -0.5 (never positive)
    inp = single([0, 1], [1.0, 0.0], entropy=[[3.0, 0.1], [3.0, 3.0]], masks=[[1, 1], [1, 0]])
    adv, _ = MSSR(2, entropy="full")(inp)
    assert torch.allclose(adv, torch.tensor([[1.5, 1.04], [-0.5, 0.0]]))
    inp.entropy = None
    with pytest.raises(ValueError, match="full-vocabulary entropy"):
        MSSR(2, entropy="full")(inp)


def test_mssr_shaping_preserves_sign_and_zeroes_padding():
    g = torch.Generator().manual_seed(0)
    n, T = 64, 7
    rewards = (torch.rand(n, generator=g) > 0.5).float().tolist()
    logps = (-torch.rand(n, T, generator=g) * 4).tolist()
    masks = (torch.rand(n, T, generator=g) > 0.3).float()
    masks[5] = 0.0  # a fully masked row
    init = (
        list(range(n)) * 3,
        torch.rand(3 * n, generator=g),
    )  # three draws per prompt: v0 in {0, 1/3, 2/3, 1}
    spo, mssr = SPO(n), MSSR(n)
    spo.initialise(*init)
    mssr.initialise(*init)
    inp = single(range(n), rewards, logps, masks.tolist())
    base, _ = spo(inp)  # the unshaped A ...
    shaped, _ = mssr(inp)  # ... and the shaped one, from equal trackers
    assert (base != 0).all() and len(set(spo.tracker.mean().round(6).tolist())) > 2
    m = masks.bool()
    a = base[:, None].expand(n, T)
    assert torch.all(torch.sign(shaped[m]) == torch.sign(a[m]))
    assert torch.all((shaped - a)[m] >= 0) and torch.all((shaped - a)[m] <= a.abs()[m] / 2 + 1e-7)
    assert torch.all(shaped[~m] == 0) and torch.all(shaped[5] == 0)


@pytest.mark.parametrize("options", [{}, {"rho": "per_prompt"}, {"rho_rule": "code", "window": 3}])
def test_state_dict_round_trip_gives_identical_next_outputs(options):
    g = torch.Generator().manual_seed(1)

    def batch(kl):
        idx = torch.randperm(6, generator=g)[:4].tolist()
        rewards = (torch.rand(4, generator=g) > 0.4).float().tolist()
        logps = (-torch.rand(4, 3, generator=g)).tolist()
        return single(idx, rewards, logps, kl=kl)

    a = MSSR(6, **options)
    a.initialise(list(range(6)), (torch.rand(6, generator=g) > 0.5).float())
    for kl in (0.003, None, 0.02):
        a(batch(kl))
    b = MSSR(6, **options)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    nxt = batch(0.001)
    (adv_a, st_a), (adv_b, st_b) = a(nxt), b(nxt)
    assert torch.equal(adv_a, adv_b) and st_a == st_b
    assert a.state_dict() == b.state_dict()
    with pytest.raises(ValueError, match="dataset now has 7"):
        MSSR(7).load_state_dict(a.state_dict())


def test_option_errors_name_the_option():
    with pytest.raises(ValueError, match="rho_rule must be"):
        SPO(3, rho_rule="inverse")
    with pytest.raises(ValueError, match="rho_min <= rho_max"):
        SPO(3, rho_min=0.99, rho_max=0.9)
    with pytest.raises(ValueError, match="entropy_kappa > 1"):
        MSSR(3, entropy_kappa=1.0)
