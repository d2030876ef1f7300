"""DHPO's loss (mmrl.algos.dhpo) and EPO's entropy regulariser (mmrl.algos.epo) against values worked out by hand in
docs/credit.md: per-branch clipping before the mix, the averaged and entropy-guided weights, the gradients; EPO's band
penalty (0 inside, linear outside), its per-turn history and that history's round trip through JSON; a 2-step run of
``dhpo`` through the CLI. The stateful-loss seam EPO trains through: the update hands a loss the entropy with its
gradient and the turn indices, folds its step sums in once per step, alike on 2 ranks; ``epo`` on the zoom agent
recipe for 2 steps, then resumed, its history carried by the checkpoint.

The DHPO hand batch: two responses, T = 3, clip widths token [0.8, 1.28], sequence [0.95, 1.05]:

    row 0   A = +1   r = [1.5, 0.5, 1.0]          s = (1.5 * 0.5 * 1.0)^(1/3) = 0.75^(1/3) = 0.908560
    row 1   A = -1   r = [0.9, 0.9, (masked)]     s = 0.9
"""

import json
import math
import os
from pathlib import Path

import pytest
import torch

from mmrl.algos import LOSSES, EPOLoss, Turn, dhpo_loss
from mmrl.algos.dhpo import dhpo_token_loss, entropy_weights
from mmrl.algos.epo import EntropyHistory, epo_regulariser, smoothing_penalty, turn_index, turn_sums
from mmrl.algos.losses import StatefulLoss, clipped_surrogate, gspo_loss
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
    assert float(st["epo/below_band"]) == pytest.approx(1 / 3)
    assert float(st["epo/above_band"]) == pytest.approx(1 / 3)
    assert float(st["epo/out_of_band"]) == pytest.approx(2 / 3)
    assert float(st["epo/banded"]) == pytest.approx(1.0)
    assert float(st["epo/penalty"]) == pytest.approx(0.5)  # (0.5 + 0 + 1) / 3
    assert float(st["epo/entropy"]) == pytest.approx(6.5 / 3)


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


def test_entropy_history_folds_step_sums_as_update_does():
    """The step sums a run adds up over micro-batches and ranks fold in as the whole step's tensors would."""
    index = turn_index(HIST_TURNS, 6)
    h = torch.tensor([[1.0, 3.0, 9.0, 4.0, 2.0, 9.0], [2.0, 9, 9, 9, 9, 9]])
    sums, tokens = turn_sums(h, HIST_MASK, index)
    assert sums.tolist() == [6.0, 6.0] and tokens.tolist() == [3.0, 2.0]
    (s0, n0), (s1, n1) = (
        turn_sums(h[:1], HIST_MASK[:1], index[:1]),
        turn_sums(h[1:], HIST_MASK[1:], index[1:]),
    )
    assert (s1.tolist(), n1.tolist()) == ([2.0], [1.0])  # row 1 reaches turn 0 only: K = 1
    folded = EntropyHistory()
    folded.fold(s0 + torch.nn.functional.pad(s1, (0, 1)), n0 + torch.nn.functional.pad(n1, (0, 1)))
    updated = EntropyHistory()
    updated.update(h, HIST_MASK, index)
    assert folded.state_dict() == updated.state_dict() == {"mean": [2.0, 3.0], "count": [1, 1]}


EPO_CFG = [f"model.path={TINY}", "data.train=x.jsonl", "rewards=[{name: exact_match}]", "algo.loss=epo"]


def test_epo_is_a_registered_stateful_loss_with_checked_options():
    loss = LOSSES.get("epo")
    assert loss is EPOLoss and issubclass(loss, StatefulLoss) and "epo" in LOSSES.names()
    assert (
        loss.needs_entropy_grad and loss.needs_turns and not loss.needs_whole_groups and not loss.collective
    )
    check_components(load_config(None, [*EPO_CFG, "algo.loss_options={kappa_l: 0.4, from_turn: 1}"]))
    with pytest.raises(ConfigError, match="unknown option 'kappa'"):
        check_components(load_config(None, [*EPO_CFG, "algo.loss_options={kappa: 0.4}"]))
    with pytest.raises(ValueError, match="need 0 <= kappa_l <= kappa_r"):
        EPOLoss(kappa_l=2.0, kappa_r=1.5)
    with pytest.raises(ValueError, match=r"algo.clip_low/clip_high"):
        EPOLoss(clip_low=1.0)
    # L = clipped + the regulariser; a direct call without the seam's inputs is refused
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.5]])).requires_grad_()
    old, adv, mask = logp.detach().clone(), torch.tensor([1.0]), torch.ones(1, 3)
    h, index = torch.tensor([[0.5, 2.0, 4.0]]), torch.zeros(1, 3, dtype=torch.long)
    epo = EPOLoss(entropy_coeff=0.1)
    epo.load_state_dict({"mean": [2.0], "count": [1]})
    tok, st = epo(logp, old, adv, mask, entropy=h, turn_index=index)
    assert torch.allclose(tok, -1.0 + torch.tensor([[0.0, -0.2, -0.3]]))  # -A rho = -1, term as by hand
    assert st["epo_turn_entropy"].tolist() == [6.5] and st["epo_turn_tokens"].tolist() == [3.0]
    h_bar = (2.0 + 6.5 / 3) / 2  # the past step's 2 and this one's mean entropy, one value each
    sums = {k: st[k] for k in ("epo_turn_entropy", "epo_turn_tokens")}
    assert epo.end_step(sums) == {"epo/history_turns": 1.0, "epo/h_bar": pytest.approx(h_bar)}
    assert epo.state_dict() == {"mean": [pytest.approx(h_bar)], "count": [2]}
    with pytest.raises(ValueError, match="needs the token entropy"):
        epo(logp, old, adv, mask)


class SeamProbe(StatefulLoss):
    """Token loss = the entropy itself (so only its gradient can move the weights); records what the update gave."""

    needs_whole_groups = collective = False
    needs_entropy_grad = needs_turns = True

    def __init__(self):
        self.calls, self.ended = [], []

    def __call__(self, logp, old_logp, adv, mask, *, group_ids=None, entropy=None, turn_index=None):
        self.calls.append((entropy.requires_grad, turn_index.cpu(), mask.cpu()))
        sums, tokens = turn_sums(entropy, mask, turn_index)
        return entropy, {"probe": torch.tensor(1.0), "sums": sums, "tokens": tokens}

    def end_step(self, sums):
        self.ended.append({k: v.tolist() for k, v in sums.items()})
        return {"probe/ended": float(len(self.ended))}


def _seam_batch(pol):
    """4 rows: row 0 an episode of two turns (response tokens 0-1 and 3-4; token 2 the env's), the others one turn."""
    from mmrl.rollout.episodes import StepInfo
    from mmrl.train.update import RolloutBatch
    from mmrl.types import Sample

    p = pol.encode(Sample("s", [{"role": "user", "content": [{"type": "text", "text": "Colour?"}]}]))
    comps = [[10, 11, 12, 13, 14], [13, 14], [15, 16, 17], [18]]
    batch = RolloutBatch.one_turn(
        [p] * 4, comps, 2, torch.zeros(4, 5), advantages=torch.tensor([1.0, -1, 1, -1])
    )
    t = batch.trajectories[0]
    t.mask = [1, 1, 0, 1, 1]
    t.turns = [Turn(0, 2, 0.0, "a"), Turn(3, 5, 1.0, "b")]
    t.steps = [StepInfo("zoom", 0.0, "a", "stop"), StepInfo("answer", 1.0, "b", "stop")]
    return batch


def test_update_hands_a_loss_entropy_with_grad_turns_and_folds_its_sums_once(monkeypatch):
    from mmrl.model.policy import Policy
    from mmrl.train.update import PolicyUpdate

    monkeypatch.setitem(LOSSES._items, "seam_probe", SeamProbe)
    cfg = load_config(None, [f"model.path={TINY}", "algo.loss=seam_probe", "optim.micro_batch_size=2"])
    pol = Policy.from_pretrained(cfg.model)
    opt = torch.optim.SGD(pol.model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
    batch = _seam_batch(pol)
    with torch.no_grad():
        _, ent, mask = batch.logprobs(pol, [0, 1, 2, 3], temperature=1.0)
    upd = PolicyUpdate(cfg, pol, opt, sched, 1.0)
    with pol.training():
        stats = upd(batch)
    probe = upd.loss_fn
    assert isinstance(probe, SeamProbe) and len(probe.calls) == 2  # one object, two micro-batches of 2 rows
    assert all(grad for grad, _, _ in probe.calls)  # the entropy came with its gradient ...
    assert stats["grad_norm"] > 0  # ... and it alone moved the weights
    assert stats["probe"] == 1.0 and "sums" not in stats and "tokens" not in stats  # 1-D stats are not logged
    index = {}
    for _, ti, m in probe.calls:  # each micro-batch's rows, identified by their masks
        for row, row_mask in zip(ti.tolist(), m.tolist()):
            index[tuple(row_mask)] = row
    assert index[(1.0, 1.0, 0.0, 1.0, 1.0)] == [0, 0, -1, 1, 1]  # row 0: two turns, the env's token outside
    assert index[(1.0, 1.0, 0.0, 0.0, 0.0)][:2] == [0, 0]  # a one-turn row: turn 0 over its response
    assert len(probe.ended) == 1 and stats["probe/ended"] == 1.0  # the update folded the step in, once
    sums, tokens = turn_sums(ent, mask, turn_index(batch.turns, 5))  # lr 0: the update's forwards saw these
    assert (
        probe.ended[0]["sums"] == pytest.approx(sums.tolist()) and probe.ended[0]["tokens"] == tokens.tolist()
    )
    assert probe.ended[0]["tokens"] == [2 + 2 + 3 + 1, 2]


def test_a_loss_function_keeps_no_state():
    from mmrl.model.policy import Policy
    from mmrl.train.update import PolicyUpdate

    cfg = load_config(None, [f"model.path={TINY}"])
    pol = Policy.from_pretrained(cfg.model)
    opt = torch.optim.SGD(pol.model.parameters(), lr=0.0)
    upd = PolicyUpdate(cfg, pol, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0), 1.0)
    assert upd.loss_fn is clipped_surrogate and upd.loss_kwargs["clip_low"] == 0.2
    assert upd.end_step() == {} and upd.loss_state_dict() == {}  # nothing to fold, nothing to save
    upd.load_loss_state_dict({})
    with pytest.raises(ValueError, match="keeps no state, but the checkpoint holds"):
        upd.load_loss_state_dict({"mean": [1.0], "count": [1]})


ZOOM = [
    "train.prompts_per_step=2",
    "rollout.n=4",
    "eval.max_samples=4",
    "eval.every=0",
    "train.progress=false",
    "algo.loss=epo",
]


def _zoom(out: Path, *args: str) -> None:
    """The zoom agent recipe (episodes of up to 2 turns, no browser) under ``epo``, run from the checkout (its paths
    are relative to it)."""
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert main(["train", "recipes/zoom/tiny.yaml", "--output-dir", str(out), *args, *ZOOM]) == 0
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def epo_run(tmp_path_factory):
    """2 steps, then resumed for a 3rd from the step-2 checkpoint."""
    out = tmp_path_factory.mktemp("epo") / "run"
    _zoom(out, "--max-steps", "2")
    two = read_metrics(out / "metrics.jsonl")
    saved = json.loads((out / "checkpoints" / "step-2" / "state.json").read_text())["loss"]
    _zoom(out, "--max-steps", "3", "--resume")
    return out, two, saved


EPO_METRICS = (
    "epo/entropy",
    "epo/penalty",
    "epo/out_of_band",
    "epo/banded",
    "epo/h_bar",
    "epo/history_turns",
)


def test_epo_trains_two_steps_on_the_zoom_agent(epo_run):
    _, two, saved = epo_run
    rows = [r for r in two if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(math.isfinite(r[k]) for k in ("loss", "pg_loss", "entropy", *EPO_METRICS))
        assert r["epo/entropy"] == pytest.approx(r["entropy"])  # token-mean: the one mean entropy
        assert 0.0 <= r["epo/out_of_band"] <= r["epo/banded"] <= 1.0
    # the first step has no history, so no band; the second has the first's, at every turn index it reached
    assert rows[0]["epo/banded"] == 0.0 and rows[0]["epo/penalty"] == 0.0 and rows[1]["epo/banded"] > 0.0
    assert rows[0]["episode/turns_mean"] > 1.0  # multi-turn: the history has one entry per turn index
    assert saved["count"][0] == 2 and 1 <= len(saved["mean"]) <= 2 and max(saved["count"]) == 2
    assert rows[1]["epo/history_turns"] == len(saved["mean"])
    assert rows[1]["epo/h_bar"] == pytest.approx(sum(saved["mean"]) / len(saved["mean"]))


def test_epo_history_survives_a_resume(epo_run):
    out, two, saved = epo_run
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[:2] == [r for r in two if "loss" in r]  # appended to, not rewritten
    # a fresh history would give the resumed process's first step no band, and count it as the first
    assert rows[2]["epo/banded"] > 0.0
    state = json.loads((out / "checkpoints" / "step-3" / "state.json").read_text())["loss"]
    assert state["count"][0] == 3 and len(state["mean"]) >= len(saved["mean"])


RANKS_WORKER = r"""
import json, sys, torch
from mmrl.algos import Turn
from mmrl.config import load_config
from mmrl.distributed import Dist
from mmrl.model.policy import Policy
from mmrl.rollout.episodes import StepInfo
from mmrl.train.update import PolicyUpdate, RolloutBatch
from mmrl.types import Sample

out, tiny = sys.argv[1], sys.argv[2]
dist = Dist()
cfg = load_config(None, [f"model.path={tiny}", "algo.loss=epo", "rollout.n=2", "optim.micro_batch_size=1",
                         "algo.mini_batches=2", "train.seed=5", "algo.loss_options={entropy_coeff: 0.1}"])
torch.manual_seed(0)
pol = Policy.from_pretrained(cfg.model)
if dist.active:
    pol.replicate(dist)
p = pol.encode(Sample("q", [{"role": "user", "content": [{"type": "text", "text": "?"}]}]))
comps = [[5, 6, 7, 8, 9], [8], [9, 10, 11, 12, 13], [14, 15], [16, 17, 18, 19], [20], [21, 22], [23, 24, 25]]
rows = list(range(dist.rank * 8 // dist.world, (dist.rank + 1) * 8 // dist.world))
adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.3, 0.6])
batch = RolloutBatch.one_turn([p] * 8, comps, 2, torch.full((8, 5), -1.0), advantages=adv, rows=rows)
for i in (0, 2):  # two episodes of two turns
    t = batch.trajectories[i]
    t.mask, t.turns = [1, 1, 0, 1, 1], [Turn(0, 2, 0.0, "a"), Turn(3, 5, 1.0, "b")]
    t.steps = [StepInfo("a", 0.0, "a", "stop"), StepInfo("b", 1.0, "b", "stop")]
opt = torch.optim.AdamW([q for q in pol.model.parameters() if q.requires_grad], lr=1e-3)
upd = PolicyUpdate(cfg, pol, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0), 1.0, dist)
steps = []
for step in range(3):
    with pol.training():
        st = upd(batch, step=step)
    steps.append({k: v for k, v in st.items() if k.startswith("epo/")})
json.dump({"steps": steps, "history": upd.loss_state_dict()}, open(f"{out}/r{dist.world}-{dist.rank}.json", "w"))
dist.exit()
"""


def test_epo_history_is_the_same_on_every_rank_and_as_one_rank(tmp_path):
    """2 ranks each score half of every mini-batch; end_step folds the sums of both, so the ranks' histories are
    identical, and equal one rank's up to the order of the sums."""
    from multiproc import torchrun

    worker = tmp_path / "worker.py"
    worker.write_text(RANKS_WORKER)
    for nproc in (1, 2):
        torchrun(nproc, str(worker), str(tmp_path), TINY, cwd=tmp_path)
    one, r0, r1 = (json.loads((tmp_path / f"r{n}.json").read_text()) for n in ("1-0", "2-0", "2-1"))
    assert r0 == r1
    assert one["history"]["count"] == r0["history"]["count"] == [3, 3]
    assert one["history"]["mean"] == pytest.approx(r0["history"]["mean"], rel=1e-6)
    assert [s["epo/banded"] for s in r0["steps"]] == [
        0.0,
        1.0,
        1.0,
    ]  # from the 2nd step on, every token has a band
    for a, b in zip(one["steps"], r0["steps"]):
        assert a == pytest.approx(b, rel=1e-5)


def test_epo_option_ranges_are_checked_at_pre_flight():
    check_components(load_config(None, ["algo.loss=epo"]))
    with pytest.raises(ConfigError, match="kappa_l <= kappa_r"):
        check_components(load_config(None, ["algo.loss=epo", "algo.loss_options={kappa_l: 2.0}"]))
