"""AEPO's pieces as pure functions (docs/credit.md#aepo): which temperature the extra pass samples at, which of its
samples join the batch, and how many.

AEPO steers the policy's entropy H towards a target H* without an entropy bonus: besides the on-policy batch it
samples G responses of a share of the step's prompts from the temperature-adjusted policy pi^T and adds REINFORCE
on the correct ones, grad J = grad J_GRPO + E_{o ~ pi^T, A > tau}[grad log pi(o|q)] (advantage fixed at 1):

    T   = T_high  if H < H*   else  T_low             (H: the previous step's mean token entropy; 0 before the first)
    A   = GRPO's advantage of the pass's rewards [b, G]; kept = the samples with A > tau, in row order
    k   = min(K, |kept|)       if H <= H*             (K: the most samples per step)
        = min(K, |kept|) // 2  otherwise

Hotter samples that were right pull the policy towards its tails and raise H; colder ones sharpen it. Only positive
samples are used, so the regulariser never pushes against the reward.
"""

from __future__ import annotations

import torch

from mmrl.algos.advantages import grpo_advantages


def pass_temperature(entropy: float, target: float, t_high: float, t_low: float) -> float:
    """T_high below the target entropy, T_low at or above it."""
    return t_high if entropy < target else t_low


def kept_samples(rewards: torch.Tensor, threshold: float, eps: float = 1e-6) -> list[tuple[int, int]]:
    """``rewards [b, G]`` of the pass -> the (group, sample) pairs whose GRPO advantage exceeds ``threshold``, in
    row order (the correct samples of groups whose rewards differ)."""
    adv = grpo_advantages(rewards, eps)
    return [(int(b), int(g)) for b, g in (adv > threshold).nonzero().tolist()]


def sample_count(kept: int, most: int, entropy: float, target: float) -> int:
    """How many kept samples join the batch: all (up to ``most``) at or below the target entropy, half above it."""
    k = min(most, kept)
    return k if entropy <= target else k // 2


def with_fixed_advantages(adv: torch.Tensor, mask: torch.Tensor, fixed: dict[int, float]) -> torch.Tensor:
    """``adv [N]`` or ``[N, T]`` with the rows of ``fixed`` set to their value (times the mask, per token)."""
    if not fixed:
        return adv
    out = adv.clone()
    rows = torch.tensor(sorted(fixed))
    values = torch.tensor([fixed[r] for r in sorted(fixed)], dtype=adv.dtype)
    out[rows] = values if adv.dim() == 1 else values[:, None] * mask[rows, : adv.shape[1]].to(adv.dtype)
    return out
