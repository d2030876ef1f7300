"""mmrl's GRPO / Dr. GRPO / DAPO / GSPO advantages and losses against TRL's on identical tensors (within 1e-6).

Losses go through TRL's own ``GRPOTrainer._compute_loss`` (trl 1.16.0, ``trl/trainer/grpo_trainer.py``), called on a
stand-in trainer whose log-prob forward returns the test's tensor, so TRL's ratio, clipping, sequence-level
importance weights, KL term and normalisers all run as TRL ships them; the loss value, its gradient with respect to
the log-probs, and TRL's clip-ratio metrics are compared. TRL's advantages are computed inline in
``_generate_and_score_completions`` (not callable alone), so that formula is written out from its source (lines
2764-2787: group mean, ``nanstd`` with Bessel's correction, ``/ (std + 1e-4)``; ``scale_rewards="none"`` skips the
division) using TRL's own ``nanstd``.

Where the definitions differ (so mmrl's arguments are set to TRL's for the comparison):
- eps: TRL divides by ``std + 1e-4`` (line 2787), mmrl by ``std + algo.adv_eps`` (1e-6 by default).
- a group of one: TRL sets std = 0 (line 2772), so A = (r - r) / 1e-4 = 0; mmrl follows docs/algorithms.md (mean 0,
  std 1: A = r). Checked below.
- TRL's GRPO loss has no dual clip (line 3113-3118): mmrl's ``dual_clip`` is None here.
"""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import nanstd

from mmrl.algos import AGGREGATIONS, KL_ESTIMATORS, LOSSES
from mmrl.algos.advantages import dr_grpo_advantages, grpo_advantages


def trl_advantages(rewards: torch.Tensor, scale: bool) -> torch.Tensor:
    """TRL's ``sum_then_normalize`` advantage, grpo_trainer.py lines 2764-2787 (one reward function)."""
    G = rewards.shape[1]
    flat = rewards.reshape(-1)
    mean = torch.nanmean(flat.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    std = nanstd(flat.view(-1, G), dim=1).repeat_interleave(G, dim=0) if G > 1 else torch.zeros_like(flat)
    adv = flat - mean
    return adv / (std + 1e-4) if scale else adv


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


def trl_loss(
    logp, old, adv, mask, *, loss_type, level="token", eps_low=0.2, eps_high=0.2, beta=0.0, ref=None
):
    """Run TRL's ``_compute_loss`` on the given tensors; returns (loss, TRL's metrics)."""
    B, T = logp.shape
    stub = SimpleNamespace(
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=T,
        accelerator=_Accelerator(),
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    loss = GRPOTrainer._compute_loss(stub, None, inputs)
    return loss, stub._metrics["train"]


def batch(seed: int, spread: float):
    """8 responses x 6 tokens: varied lengths (one response a single token), log-ratios of size ``spread``."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 1, 4, 6, 3, 5, 2, 6])
    mask = (torch.arange(6)[None] < lengths[:, None]).float()
    logp = (-torch.rand(8, 6, generator=g) * 3).requires_grad_(True)
    old = logp.detach() + spread * torch.randn(8, 6, generator=g)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.9, 0.5, 0.5]])
    return logp, old, rewards, mask


def mmrl_loss(name, logp, old, adv, mask, agg, constant=0.0, kl_coef=0.0, ref=None, **opts):
    tok, stats = LOSSES.get(name)(logp, old, adv, mask, **opts)
    a = AGGREGATIONS.get(agg)
    loss = a.numerator(tok, mask, constant) / a.units(mask)
    if kl_coef:
        loss = loss + kl_coef * a.numerator(KL_ESTIMATORS.get("k3")(logp, ref), mask, constant) / a.units(
            mask
        )
    return loss, stats


def compare(ours, theirs, logp):
    (l1, st), (l2, metrics) = ours, theirs
    g1 = torch.autograd.grad(l1, logp, retain_graph=True)[0]
    g2 = torch.autograd.grad(l2, logp)[0]
    assert l1.item() == pytest.approx(l2.item(), abs=1e-6)
    assert torch.allclose(g1, g2, atol=1e-6)
    return st, metrics


def test_grpo_advantages_match_trl():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.9, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0]])
    assert torch.allclose(grpo_advantages(r, eps=1e-4).reshape(-1), trl_advantages(r, scale=True), atol=1e-6)
    assert torch.allclose(dr_grpo_advantages(r).reshape(-1), trl_advantages(r, scale=False), atol=1e-6)


def test_group_of_one_differs_from_trl_as_documented():
    r = torch.tensor([[0.7], [0.0]])
    assert torch.equal(trl_advantages(r, scale=True), torch.zeros(2))  # TRL: std := 0 for one generation
    assert torch.equal(
        grpo_advantages(r, eps=1e-4), r
    )  # mmrl: mean 0, std 1 (docs/algorithms.md#grpo-family)


def test_grpo_loss_matches_trl():
    logp, old, rewards, mask = batch(0, spread=0.3)
    adv = grpo_advantages(rewards, eps=1e-4).reshape(-1)
    ours = mmrl_loss(
        "clipped", logp, old, adv, mask, "seq-mean-token-mean", clip_low=0.2, clip_high=0.2, dual_clip=None
    )
    st, metrics = compare(ours, trl_loss(logp, old, adv, mask, loss_type="grpo"), logp)
    assert st["clip_frac_low"].item() == pytest.approx(metrics["clip_ratio/low_mean"][0], abs=1e-6)
    assert st["clip_frac_high"].item() == pytest.approx(metrics["clip_ratio/high_mean"][0], abs=1e-6)
    assert (
        metrics["clip_ratio/low_mean"][0] > 0 and metrics["clip_ratio/high_mean"][0] > 0
    )  # both branches used


def test_grpo_loss_with_k3_kl_matches_trl():
    logp, old, rewards, mask = batch(1, spread=0.3)
    ref = logp.detach() + 0.5 * torch.randn(8, 6, generator=torch.Generator().manual_seed(5))
    adv = grpo_advantages(rewards, eps=1e-4).reshape(-1)
    ours = mmrl_loss(
        "clipped",
        logp,
        old,
        adv,
        mask,
        "seq-mean-token-mean",
        kl_coef=0.04,
        ref=ref,
        clip_low=0.2,
        clip_high=0.2,
        dual_clip=None,
    )
    compare(ours, trl_loss(logp, old, adv, mask, loss_type="grpo", beta=0.04, ref=ref), logp)


def test_dr_grpo_loss_matches_trl():
    logp, old, rewards, mask = batch(2, spread=0.3)
    adv = dr_grpo_advantages(rewards).reshape(-1)
    ours = mmrl_loss(
        "clipped",
        logp,
        old,
        adv,
        mask,
        "seq-mean-token-sum-norm",
        constant=6.0,
        clip_low=0.2,
        clip_high=0.2,
        dual_clip=None,
    )
    compare(
        ours, trl_loss(logp, old, adv, mask, loss_type="dr_grpo"), logp
    )  # TRL: / (B * max_completion_length)


def test_dapo_loss_matches_trl():
    logp, old, rewards, mask = batch(3, spread=0.3)
    adv = grpo_advantages(rewards, eps=1e-4).reshape(-1)
    ours = mmrl_loss(
        "clipped", logp, old, adv, mask, "token-mean", clip_low=0.2, clip_high=0.28, dual_clip=None
    )
    st, metrics = compare(ours, trl_loss(logp, old, adv, mask, loss_type="dapo", eps_high=0.28), logp)
    assert st["clip_frac_high"].item() == pytest.approx(metrics["clip_ratio/high_mean"][0], abs=1e-6)


def test_gspo_loss_matches_trl_sequence_level():
    # log-ratios of ~3e-4 so that some sequence ratios sit inside GSPO's 3e-4 / 4e-4 clip range and some outside
    logp, old, rewards, mask = batch(4, spread=6e-4)
    adv = grpo_advantages(rewards, eps=1e-4).reshape(-1)
    ours = mmrl_loss("gspo", logp, old, adv, mask, "seq-mean-token-mean", clip_low=3e-4, clip_high=4e-4)
    theirs = trl_loss(logp, old, adv, mask, loss_type="grpo", level="sequence", eps_low=3e-4, eps_high=4e-4)
    compare(ours, theirs, logp)
    seq = ((logp.detach() - old) * mask).sum(-1) / mask.sum(-1)
    inside = ((seq > torch.log1p(torch.tensor(-3e-4))) & (seq < torch.log1p(torch.tensor(4e-4)))).sum().item()
    assert 0 < inside < 8
