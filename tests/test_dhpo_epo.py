"""DHPO's loss (mmrl.algos.dhpo) and EPO's entropy regulariser (mmrl.algos.epo) against values worked out by hand in
docs/credit.md: per-branch clipping before the mix, the averaged and entropy-guided weights, the gradients; EPO's band
penalty (0 inside, linear outside), its per-turn history and that history's round trip through JSON; a 2-step run of
``dhpo`` through the CLI.

The DHPO hand batch: two responses, T = 3, clip widths token [0.8, 1.28], sequence [0.95, 1.05]:

    row 0   A = +1   r = [1.5, 0.5, 1.0]          s = (1.5 * 0.5 * 1.0)^(1/3) = 0.75^(1/3) = 0.908560
    row 1   A = -1   r = [0.9, 0.9, (masked)]     s = 0.9
"""

import json
import math
from pathlib import Path

import pytest
import torch

from mmrl.algos import LOSSES, Turn, dhpo_loss
from mmrl.algos.dhpo import dhpo_token_loss, entropy_weights
from mmrl.algos.epo import EntropyHistory, epo_regulariser, smoothing_penalty, turn_index
from mmrl.algos.losses import clipped_surrogate, gspo_loss
from mmrl.cli import main
from mmrl.config import ConfigError, load_config
from mmrl.run.metrics import read_metrics
from mmrl.train.checks import check_components

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "assets" / "tiny-qwen2.5-vl")
S = 0.75 ** (1 / 3)  # row 0's sequence ratio
RATIOS = [[1.5, 0.5, 1.0], [0.9, 0.9, 1.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
ADV = [1.0, -1.0]
CLIPS = {"clip_low": 0.2, "clip_high": 0.28, "seq_clip_low": 0.05, "seq_clip_high": 0.05}


def dhpo(**options):
    """The loss on the hand batch; returns (token loss, stats, logp with its gradient after sum(loss * mask))."""
    old = torch.full((2, 3), -1.0, dtype=torch.float64)
    logp = (old + torch.tensor(RATIOS, dtype=torch.float64).log()).requires_grad_()
    mask = torch.tensor(MASK, dtype=torch.float64)
    loss, st = dhpo_loss(logp, old, torch.tensor(ADV, dtype=torch.float64), mask, **(CLIPS | options))
    (loss * mask).sum().backward()
    return loss.detach(), {k: float(v) for k, v in st.items()}, logp


def test_dhpo_mean_mix_hand_values():
    loss, st, logp = dhpo()
    # row 0 (A = +1): token branch max(-r, -clip(r)) = [-1.28 (clipped), -0.5 (the min keeps r), -1];
    #   sequence branch max(-s, -clip(s)) = -s (s = 0.90856 < 0.95: the min keeps s); mixed 1/2 : 1/2
    # row 1 (A = -1): token branch max(r, clip(r)) = 0.9; sequence branch max(0.9, 0.95) = 0.95 (clipped)
    expected = [[(-1.28 - S) / 2, (-0.5 - S) / 2, (-1.0 - S) / 2], [(0.9 + 0.95) / 2, (0.9 + 0.95) / 2, 0.0]]
    assert torch.allclose(loss * torch.tensor(MASK), torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    # d/d log pi_t: token branch 1/2 * (-A r_t) where unclipped; sequence branch (token form) 1/2 * (-A s)
    #   row 0: t0 token clipped -> -s/2; t1 -0.5/2 - s/2; t2 -1/2 - s/2
    #   row 1: token 0.9/2 = 0.45; sequence clipped -> 0; the masked token 0
    grad = [[-S / 2, -0.25 - S / 2, -0.5 - S / 2], [0.45, 0.45, 0.0]]
    assert torch.allclose(logp.grad, torch.tensor(grad, dtype=torch.float64), atol=1e-12)
    # 5 unmasked tokens: row 0's t0 clips high in the token branch; row 1's two clip low in the sequence branch
    assert st["clip_frac_high"] == pytest.approx(1 / 5) and st["clip_frac_low"] == 0.0
    assert st["dhpo_seq_clip_frac_low"] == pytest.approx(2 / 5) and st["dhpo_seq_clip_frac_high"] == 0.0
    assert st["dhpo_seq_ratio_mean"] == pytest.approx((3 * S + 2 * 0.9) / 5)
    assert st["dhpo_token_weight"] == pytest.approx(0.5)
    assert st["ratio_max"] == pytest.approx(1.5) and st["ratio_min"] == pytest.approx(0.5)


def test_dhpo_clips_each_branch_before_mixing():
    """Row 0's t0: the mixed ratio (1.5 + 0.9086) / 2 = 1.204 is inside the token trust region, so clipping after the
    mix would keep its gradient; clipped per branch, the outlier's own ratio is cut at 1.28 and only the sequence
    branch moves it."""
    r_mix = (1.5 + S) / 2
    assert 1 - 0.2 < r_mix < 1 + 0.28
    _, _, logp = dhpo()
    assert logp.grad[0, 0].item() == pytest.approx(-S / 2)  # mix-then-clip would give -r_mix: -1.204
    # the extremes of the mix are the two losses it mixes
    old = torch.full((2, 3), -1.0, dtype=torch.float64)
    lp = old + torch.tensor(RATIOS, dtype=torch.float64).log()
    mask, adv = torch.tensor(MASK, dtype=torch.float64), torch.tensor(ADV, dtype=torch.float64)[:, None]
    only_tok, _, _ = dhpo_token_loss(lp, old, adv, mask, 1.0, **CLIPS)
    only_seq, _, _ = dhpo_token_loss(lp, old, adv, mask, 0.0, **CLIPS)
    assert torch.equal(
        only_tok, clipped_surrogate(lp, old, adv[:, 0], mask, clip_low=0.2, clip_high=0.28, dual_clip=None)[0]
    )
    assert torch.equal(only_seq, gspo_loss(lp, old, adv[:, 0], mask, clip_low=0.05, clip_high=0.05)[0])


def test_dhpo_entropy_mix_hand_values():
    entropy = torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor(MASK, dtype=torch.float64)
    w = entropy_weights(entropy, mask)
    # row 0: H / max H = [0.5, 1, 0.25]; row 1: its unmasked tokens have entropy 0 -> the averaged mix, 1/2
    assert torch.equal(w, torch.tensor([[0.5, 1.0, 0.25], [0.5, 0.5, 0.5]], dtype=torch.float64))
    loss, st, _ = dhpo(mix="entropy", entropy=entropy)
    # row 0: t0 0.5 * -1.28 + 0.5 * -s; t1 1.0 * -0.5; t2 0.25 * -1 + 0.75 * -s;  row 1 as the mean mix
    expected = [[0.5 * -1.28 - 0.5 * S, -0.5, -0.25 - 0.75 * S], [0.925, 0.925, 0.0]]
    assert torch.allclose(loss * mask, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert st["dhpo_token_weight"] == pytest.approx((0.5 + 1.0 + 0.25 + 0.5 + 0.5) / 5)
    # the weight is a stop-gradient: no gradient reaches the entropy
    h = entropy.clone().requires_grad_()
    assert not entropy_weights(h, mask).requires_grad


def test_dhpo_options_and_registration():
    assert LOSSES.get("dhpo") is dhpo_loss and "dhpo" in LOSSES.names()
    with pytest.raises(ValueError, match="mix 'entropy' needs the token entropy"):
        dhpo(mix="entropy")
    with pytest.raises(ValueError, match=r"mix must be 'mean' or 'entropy'"):
        dhpo(mix="geometric")
    with pytest.raises(ValueError, match=r"algo.loss_options.seq_clip_low/seq_clip_high"):
        dhpo(seq_clip_low=1.0)
    with pytest.raises(ValueError, match=r"algo.clip_low/clip_high"):
        dhpo(clip_high=-0.1)
    cfg = [f"model.path={TINY}", "data.train=x.jsonl", "rewards=[{name: exact_match}]", "algo.loss=dhpo"]
    check_components(load_config(None, [*cfg, "algo.loss_options={seq_clip_low: 0.001, mix: mean}"]))
    with pytest.raises(ConfigError, match="unknown option 'seq_clip'"):
        check_components(load_config(None, [*cfg, "algo.loss_options={seq_clip: 0.001}"]))


@pytest.mark.parametrize("mix", ["mean", "entropy"])
def test_dhpo_two_steps(tmp_path, mix):
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=8, n_eval=4, seed=5)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl}}
rollout: {{n: 4, max_new_tokens: 4, batch_size: 8}}
rewards: [{{name: exact_match}}]
algo: {{loss: dhpo, clip_high: 0.28, loss_agg: seq-mean-token-mean, loss_options: {{mix: {mix}}}}}
optim: {{lr: 0.001, micro_batch_size: 8}}
train: {{prompts_per_step: 2, progress: false, seed: 3, save_every: 0}}
"""
    )
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "2"]) == 0
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["loss"]) and math.isfinite(r["dhpo_seq_ratio_mean"])
        if mix == "mean":
            assert r["dhpo_token_weight"] == pytest.approx(0.5)
        else:  # the update passed the forward's entropy: weights H / max H, inside (0, 1]
            assert 0.0 < r["dhpo_token_weight"] <= 1.0 and r["dhpo_token_weight"] != pytest.approx(0.5)


# ------------------------------------------------------------------------------------------------------------ EPO
def test_smoothing_penalty_zero_inside_the_band_linear_outside():
    # H_bar = 2, kappa_l 0.5, kappa_r 1.5: the band is [1, 3]
    h = torch.tensor([0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0], requires_grad=True)
    p = smoothing_penalty(h, torch.full_like(h, 2.0), 0.5, 1.5)
    assert torch.equal(p.detach(), torch.tensor([0.75, 0.5, 0.0, 0.0, 0.0, 1.0, 2.0]))
    p.sum().backward()
    # slope -1 below, +1 above, 0 inside and at the edges (relu's gradient at 0)
    assert torch.equal(h.grad, torch.tensor([-1.0, -1.0, 0.0, 0.0, 0.0, 1.0, 1.0]))


def test_turn_index_from_spans():
    turns = [[Turn(0, 2, 0.0, "a"), Turn(3, 5, 1.0, "b")], [Turn(1, 2, 0.0, "a")], []]
    expected = [[0, 0, -1, 1, 1, -1], [-1, 0, -1, -1, -1, -1], [-1] * 6]
    assert torch.equal(turn_index(turns, 6), torch.tensor(expected))


HIST_TURNS = [[Turn(0, 2, 0.0, "a"), Turn(3, 5, 1.0, "b")], [Turn(0, 1, 0.0, "a")]]
HIST_MASK = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])


def filled_history() -> EntropyHistory:
    hist, index = EntropyHistory(), turn_index(HIST_TURNS, 6)
    # step 1: turn 0 tokens 1, 3 (row 0) and 2 (row 1) -> mean 2; turn 1 tokens 4, 2 -> mean 3 (9 is masked)
    hist.update(torch.tensor([[1.0, 3.0, 9.0, 4.0, 2.0, 9.0], [2.0, 9, 9, 9, 9, 9]]), HIST_MASK, index)
    # step 2: only turn 0 is reached (row 0's second turn masked out), mean 1
    mask = HIST_MASK.clone()
    mask[0, 3:5] = 0.0
    hist.update(torch.ones(2, 6), mask, index)
    return hist


def test_entropy_history_is_a_per_turn_mean_of_step_means():
    hist = filled_history()
    assert hist.mean == [1.5, 3.0] and hist.count == [2, 1]  # turn 0: (2 + 1) / 2; turn 1: 3 from step 1 only
    h_bar, known = hist.reference(torch.tensor([[0, 1, 2, -1]]))
    assert torch.equal(h_bar, torch.tensor([[1.5, 3.0, 0.0, 0.0]]))
    assert known.tolist() == [[True, True, False, False]]


def test_entropy_history_round_trip_and_refusal():
    hist = filled_history()
    again = EntropyHistory()
    # as it would travel in a checkpoint's state.json
    again.load_state_dict(json.loads(json.dumps(hist.state_dict())))
    index = torch.tensor([[0, 1, 1, 5]])
    assert all(torch.equal(a, b) for a, b in zip(again.reference(index), hist.reference(index)))
    assert again.state_dict() == hist.state_dict()
    with pytest.raises(ValueError, match="'mean' and 'count' lists of one length"):
        again.load_state_dict({"mean": [1.0], "count": []})


def test_epo_regulariser_hand_values_and_gradient():
    hist = EntropyHistory()
    hist.load_state_dict({"mean": [2.0], "count": [1]})  # H_bar = 2 at turn 0: band [1, 3]
    h = torch.tensor([[0.5, 2.0, 4.0, 7.0]], requires_grad=True)
    mask, index = torch.tensor([[1.0, 1.0, 1.0, 0.0]]), torch.tensor([[0, 0, 0, -1]])
    term, st = epo_regulariser(h, mask, index, hist, entropy_coeff=0.1, smooth_coeff=1.0)
    # P = [0.5, 0, 1, (no turn: 0)]; term = -0.1 (H - P) = [0, -0.2, -0.3, -0.7]
    assert torch.allclose(term.detach(), torch.tensor([[0.0, -0.2, -0.3, -0.7]]))
    (term * mask).sum().backward()
    # d term / dH = -0.1 (1 - dP/dH): below the band -0.2 (twice the bonus), inside -0.1, above 0 (beta = 1)
    assert torch.allclose(h.grad, torch.tensor([[-0.2, -0.1, 0.0, 0.0]]))
    assert float(st["epo_below_band"]) == pytest.approx(1 / 3)
    assert float(st["epo_above_band"]) == pytest.approx(1 / 3)
    assert float(st["epo_penalty"]) == pytest.approx(0.5)  # (0.5 + 0 + 1) / 3


def test_epo_without_band_is_the_entropy_bonus():
    h = torch.tensor([[0.5, 2.0, 4.0]])
    mask, index = torch.ones(1, 3), torch.zeros(1, 3, dtype=torch.long)
    bonus = -0.001 * h
    assert torch.equal(epo_regulariser(h, mask, index, EntropyHistory())[0], bonus)  # no history yet: no band
    hist = EntropyHistory()
    hist.load_state_dict({"mean": [2.0], "count": [1]})
    assert torch.equal(epo_regulariser(h, mask, index, hist, from_turn=1)[0], bonus)  # band from turn 1 only
    assert torch.equal(epo_regulariser(h, mask, index, hist, smooth_coeff=0.0)[0], bonus)
    with pytest.raises(ValueError, match="need 0 <= kappa_l <= kappa_r"):
        epo_regulariser(h, mask, index, hist, kappa_l=2.0, kappa_r=1.5)
