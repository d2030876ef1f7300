"""Off-policy losses for asynchronous RL (mmrl.algos.offpolicy; docs/async.md): the proximal policy by log-linear
interpolation on hand-computed tensors, decoupled PPO as the clipped loss times the rollout-correction weights, the
staleness-0 identity with plain PPO, and BAPO's bounds search and token losses on the worked example of
docs/async.md, in one process and all-reduced over 2 real gloo processes."""

import json
import math
import os

import pytest
import torch
import torch.multiprocessing as mp

from mmrl.algos import LOSSES, proximal_logprobs, rollout_correction
from mmrl.algos.losses import clipped_surrogate
from mmrl.algos.offpolicy import bapo_loss

# --- the proximal policy ---------------------------------------------------------------------------------------

MU = [[-1.0, -2.0, -1.5, -0.5]]  # log mu: the engine's log-probs
THETA = [[-0.8, -1.0, -0.9, -0.7]]  # log pi_theta


def prox(versions, v_prox, v_theta, mu=MU, theta=THETA):
    t = torch.tensor
    return proximal_logprobs(
        t(mu, dtype=torch.float64), t(theta, dtype=torch.float64), t(versions), v_prox, v_theta
    )


def test_interpolation_three_versions_in_one_response():
    # v_prox 2, v_theta 3; tokens sampled by versions 2, 1, 0 and 3: alpha 0, 1/2, 2/3, 1
    out = prox([[2, 1, 0, 3]], 2, 3)
    expected = [[-1.0, -2.0 + 0.5 * 1.0, -1.5 + 2 / 3 * 0.6, -0.7]]
    assert torch.allclose(out, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert out[0, 0] == MU[0][0] and out[0, 3] == THETA[0][3]  # the ends are exact


def test_interpolation_edge_cases():
    # every token sampled by the proximal version: pi_prox = mu exactly
    assert torch.equal(prox([[4, 4, 4, 4]], 4, 5), torch.tensor(MU, dtype=torch.float64))
    # every token sampled by the current version (also v_t = v_prox = v_theta): pi_prox = pi_theta exactly
    assert torch.equal(prox([[5, 5, 5, 5]], 4, 5), torch.tensor(THETA, dtype=torch.float64))
    assert torch.equal(prox([[5, 5, 5, 5]], 5, 5), torch.tensor(THETA, dtype=torch.float64))
    # trained weights labelled as the proximal ones: alpha 1 for stale tokens too
    assert torch.equal(prox([[1, 3, 0, 2]], 3, 3), torch.tensor(THETA, dtype=torch.float64))
    # a token newer than v_prox (alpha (2 - 3) / (4 - 3) = -1, clamped to 0): mu
    assert prox([[3, 2, 2, 2]], 2, 4)[0, 0] == MU[0][0]
    with pytest.raises(ValueError, match="newer than the trained weights"):
        prox([[0, 0, 0, 0]], 3, 2)


def test_interpolation_detaches_pi_theta():
    theta = torch.tensor(THETA, requires_grad=True)
    out = proximal_logprobs(torch.tensor(MU), theta, torch.tensor([[0, 1, 2, 3]]), 2, 3)
    assert not out.requires_grad


# --- decoupled PPO = the clipped loss x the rollout correction's weights -----------------------------------------

MASK = torch.ones(1, 4)


@pytest.mark.parametrize(
    ("correction", "weights"),
    [
        # w = pi_prox / mu = exp(0), exp(0.5), exp(0.4), exp(-0.2); C = 1.5
        ("tis_token", [1.0, 1.5, math.exp(0.4), math.exp(-0.2)]),  # exp(0.5) = 1.65 truncated at C
        ("mask_token", [1.0, 0.0, math.exp(0.4), math.exp(-0.2)]),  # 1.65 outside [1/C, C]: dropped
    ],
)
def test_decoupled_ppo_is_clipped_times_correction(correction, weights):
    mu = torch.tensor(MU, dtype=torch.float64)
    logp = torch.tensor(THETA, dtype=torch.float64, requires_grad=True)
    p = proximal_logprobs(mu, logp, torch.tensor([[2, 1, 0, 3]]), 2, 3)  # [-1.0, -1.5, -1.1, -0.7]
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    w, _ = rollout_correction(correction, p, mu, MASK.double(), cap=1.5)
    loss, _ = clipped_surrogate(logp, p, adv, MASK)
    # rho = pi_theta / pi_prox = exp(0.2), exp(0.5), exp(0.2), 1; clip 0.2 / 0.2
    clipped = [-1.2, -1.2, math.exp(0.2), 1.0]  # A > 0: min(rho, 1.2); A < 0: max(rho, 0.8)
    expected = torch.tensor([[wt * c for wt, c in zip(weights, clipped)]], dtype=torch.float64)
    assert torch.allclose(loss * w, expected, atol=1e-12)


@pytest.mark.parametrize(("v_prox", "v_theta"), [(7, 8), (7, 7)])
def test_staleness_zero_is_plain_ppo_bit_for_bit(v_prox, v_theta):
    g = torch.Generator().manual_seed(0)
    mu = -torch.rand(3, 5, generator=g) * 3
    # (7, 8): trained weights one version ahead, already moved; (7, 7): not yet moved, so pi_theta = mu
    moved = mu + 0.3 * torch.randn(3, 5, generator=g) if v_theta > v_prox else mu.clone()
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [1.0] * 4 + [0.0]])
    adv = torch.tensor([1.0, -0.5, 2.0])
    versions = torch.full((3, 5), v_prox)

    def run(decoupled):
        logp = moved.clone().requires_grad_()
        if decoupled:
            p = proximal_logprobs(mu, logp, versions, v_prox, v_theta)
            assert torch.equal(p, mu)  # pi_prox = mu
            w, _ = rollout_correction("tis_token", p, mu, mask, cap=2.0)
            assert torch.equal(w, mask)  # w = 1 on every real token
            loss = clipped_surrogate(logp, p, adv, mask)[0] * w
        else:
            loss = clipped_surrogate(logp, mu, adv, mask)[0]
        (loss * mask).sum().backward()
        return loss.detach() * mask, logp.grad

    (a, ga), (b, gb) = run(True), run(False)
    assert torch.equal(a, b) and torch.equal(ga, gb)


# --- BAPO ------------------------------------------------------------------------------------------------------

# docs/async.md#worked-example-bapo: row 0 positive advantages, row 1 negative; the last column is padding whose
# advantage (+-5) would meet the target at once if it were counted
ADV = [[1.0, 0.1, 0.2, 1.0, 0.5, 5.0], [-1.0, -1.0, -1.0, -0.5, -1.0, -5.0]]
RATIO = [[1.0, 1.32, 1.46, 2.5, 0.4, 1.1], [1.0, 0.72, 0.5, 0.9, 3.5, 0.7]]
BMASK = [[1.0] * 5 + [0.0], [1.0] * 5 + [0.0]]


def bapo(rows=(0, 1), mask=BMASK, **options):
    adv = torch.tensor([ADV[r] for r in rows], dtype=torch.float64)
    logp = torch.tensor([RATIO[r] for r in rows], dtype=torch.float64).log().requires_grad_()
    m = torch.tensor([mask[r] for r in rows], dtype=torch.float64)
    loss, stats = bapo_loss(logp, torch.zeros_like(logp), adv, m, **options)
    return loss, {k: float(v) for k, v in stats.items()}, logp


def test_bapo_raises_c_low_then_c_high():
    # pos at c_high 1.2: 1 + 0.2 (the tokens of ratio 1 and 0.4) = 1.2; neg at c_low 0.6: 1 + 0.72 + 0.45 = 2.17
    # c_low 0.75 drops the 0.72 token (neg 1.45); 0.8 is the max and 1.2 < 1.45 still; c_high 1.35 admits 0.1 x 1.32
    # (pos 1.332), 1.5 admits 0.2 x 1.46 (pos 1.624 >= 1.45): stop
    loss, st, _ = bapo()
    assert (st["bapo_c_low"], st["bapo_c_high"]) == (0.8, 1.5)
    assert st["bapo_pos_share"] == pytest.approx(1.624 / (1.624 + 1.45), abs=1e-12)
    expected = [[-1.0, -0.132, -0.292, -1.5, -0.2], [1.0, 0.8, 0.8, 0.45, 3.0]]
    assert torch.allclose(loss[:, :5], torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    # below c_low: 0.72 and 0.5 (A < 0); above c_high: 2.5 (A > 0); dual clip: 3.5 (A < 0); of 10 tokens
    assert st["clip_frac_low"] == pytest.approx(0.2)
    assert st["clip_frac_high"] == pytest.approx(0.1)
    assert st["clip_frac_dual"] == pytest.approx(0.1)


def test_bapo_stops_where_the_target_is_met():
    # without the -0.5 x 0.9 token: neg at c_low 0.75 is 1.0 <= pos 1.2, so c_low stops there and c_high stays
    mask = [BMASK[0], [1.0, 1.0, 1.0, 0.0, 1.0, 0.0]]
    _, st, _ = bapo(mask=mask)
    assert (st["bapo_c_low"], st["bapo_c_high"]) == (0.75, 1.2)
    # a batch already at the target (here no negative token) keeps the initial bounds
    _, st, _ = bapo(rows=(0,))
    assert (st["bapo_c_low"], st["bapo_c_high"], st["bapo_pos_share"]) == (0.6, 1.2, 1.0)
    # the maxima bound the search: a batch of negative tokens only ends at (c_low_max, c_high_max)
    _, st, _ = bapo(rows=(1,), c_low_max=0.7, c_high_max=1.3)
    assert (st["bapo_c_low"], st["bapo_c_high"], st["bapo_pos_share"]) == (0.7, 1.3, 0.0)


def test_bapo_gradient_flows_through_the_counted_tokens_only():
    loss, _, logp = bapo()
    (loss * torch.tensor(BMASK, dtype=torch.float64)).sum().backward()
    assert torch.isfinite(logp.grad).all()
    adv, r = torch.tensor(ADV, dtype=torch.float64), torch.tensor(RATIO, dtype=torch.float64)
    counted = torch.tensor(BMASK).bool() & (
        ((adv > 0) & (r <= 1.5)) | ((adv < 0) & (r >= 0.8) & (r <= 3.0))
    )  # the tokens the search counts at the bounds it found
    assert torch.equal(logp.grad != 0, counted)
    assert torch.allclose(logp.grad[counted], (-adv * r)[counted])  # d(-A rho)/d log pi = -A rho


def test_bapo_is_registered_and_checks_its_options():
    assert LOSSES.get("bapo") is bapo_loss and "bapo" in LOSSES.names()
    for bad in ({"c_low": 0.9}, {"c_high": 0.9}, {"step_low": 0.0}, {"target": -1.0}, {"dual_clip": 1.0}):
        with pytest.raises(ValueError, match="loss 'bapo'"):
            bapo(**bad)


def _rank(rank: int, store: str, out: str) -> None:
    import torch.distributed as td

    td.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    _, st, _ = bapo(rows=(rank,))  # rank 0 holds the positive row, rank 1 the negative one
    with open(f"{out}.{rank}", "w") as f:
        json.dump(st, f)
    td.barrier()
    td.destroy_process_group()
    os._exit(0)  # gloo's threads may still hold work at interpreter teardown (mmrl.distributed.Dist.exit)


@pytest.mark.slow
def test_bapo_all_reduce_over_two_gloo_processes(tmp_path):
    local = [bapo(rows=(r,))[1] for r in (0, 1)]
    assert [(s["bapo_c_low"], s["bapo_c_high"]) for s in local] == [(0.6, 1.2), (0.8, 2.0)]  # each alone
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(tmp_path / "out")), nprocs=2)
    ranks = [json.loads((tmp_path / f"out.{r}").read_text()) for r in (0, 1)]
    pooled = bapo()[1]
    for st in ranks:
        assert (
            (st["bapo_c_low"], st["bapo_c_high"])
            == (pooled["bapo_c_low"], pooled["bapo_c_high"])
            == (0.8, 1.5)
        )
        assert st["bapo_pos_share"] == pytest.approx(pooled["bapo_pos_share"], abs=1e-12)


# --- algo.old_logprobs: interpolate, in the update -------------------------------------------------------------


def test_batch_versions_follow_the_sampled_tokens():
    from mmrl.model.prompt import EncodedPrompt
    from mmrl.rollout.base import Completion
    from mmrl.train.update import RolloutBatch

    old = torch.zeros(2, 4)
    p = EncodedPrompt("s", torch.tensor([1, 2]))
    batch = RolloutBatch.one_turn([p, p], [[5, 6, 7], [8, 9]], 2, old)
    batch.trajectories[0].completions[0] = Completion([5, 6, 7], "", [0.0] * 3, "stop", versions=[3, 3, 4])
    # row 0: each token its version, padding the default; row 1: an engine that records none -> the default
    assert batch.versions(9).tolist() == [[3, 3, 4, 9], [9, 9, 9, 9]]


def _shapes_run(tmp_path, name: str, *overrides: str) -> list[dict]:
    from mmrl.cli import main
    from mmrl.recipes.shapes.data import build
    from mmrl.run.metrics import read_metrics

    if not (tmp_path / "data").exists():
        build(tmp_path / "data", n_train=8, n_eval=4, seed=5)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {root}/assets/shapes-sft/model, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl}}
rollout: {{n: 4, max_new_tokens: 4, batch_size: 8}}
rewards: [{{name: exact_match}}]
algo: {{mini_batches: 2}}
optim: {{lr: 0.001, micro_batch_size: 4}}
train: {{prompts_per_step: 2, progress: false, seed: 3, save_every: 0}}
"""
    )
    out = tmp_path / name
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "3", *overrides]) == 0
    return [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]


@pytest.mark.slow
def test_interpolated_proximal_policy_in_training(tmp_path):
    """Synchronous (every token of version v_prox): pi_prox = mu exactly, so the run is the rollout-pi_old run's
    loss for loss, over two optimizer steps per batch (the second after the weights moved). Run ahead by one version
    (k = 1, the tokens one update old): it trains with pi_prox between mu and pi_theta and w = pi_prox / mu."""
    plain = _shapes_run(tmp_path, "rollout")
    interp = _shapes_run(tmp_path, "interp", "algo.old_logprobs=interpolate")
    assert [r["loss"] for r in interp] == [r["loss"] for r in plain]
    assert [r["grad_norm"] for r in interp] == [r["grad_norm"] for r in plain]
    ahead = _shapes_run(
        tmp_path,
        "ahead",
        "rollout.max_staleness=1",
        "algo.old_logprobs=interpolate",
        "algo.rollout_correction=tis_token",
    )
    assert [r["step"] for r in ahead] == [1, 2, 3]
    assert max(r["async/staleness_max"] for r in ahead) == 1
    assert all(math.isfinite(r["loss"]) for r in ahead)
