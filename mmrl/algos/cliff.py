"""Advantages past the cliff of flat groups: NGRPO, DGPO and A-GRAE (docs/methods.md).

GRPO gives every response of a group whose rewards are all equal A = 0, and its std normalisation weighs a question by
sqrt(p (1 - p)). Each estimator here changes the group statistics only; the loss stays ``clipped``. For one group of G
rewards r (mu its mean, the group's accuracy with 0/1 rewards) in a batch of B groups:

    ngrpo  A_i = (r_i - mean R') / (std R' + eps),  R' = r plus K = num_virtual copies of r_max (unbiased std)
    dgpo   A_i = G (r_i - mu) / (sum_j |r_j - mu| + eps) * w * c
           w = M softmax(-mu / T) over the M groups whose rewards differ (1 for the others);
           c = response tokens of the batch / response tokens of those M groups
    agrae  A = grpo's advantage;  s = sqrt(mu);  m = mean of mu over the B groups
           A' = (1 - m) * A / (2 (1 - s + eps)) + m * A / (2 (s + eps));   A' > 0:  A' * min(1, m / alpha)

Each logs ``<name>/flat_signalled``: the share of flat groups (all rewards equal: GRPO's zero-signal groups) that it
gives a non-zero advantage (0 when the batch has none). All three read a group of one as ``grpo`` does (A = r, no
reweighting) and, like ``grpo``, refuse ``rollout.n < 2``. A response with no tokens keeps its reward in its group's
statistics and gets an advantage that its empty mask then drops, as with ``grpo``.

Choices between the papers and the authors' code (docs/methods.md says why):
- ngrpo follows the authors' code: unbiased std over G + K, K = 1, a group of one skips the virtual
  sample. Its asymmetric clipping is ``algo.clip_low: 0.16``, ``clip_high: 0.24``, ``dual_clip: null``: no new loss.
  A reward above ``r_max`` is an error (the virtual sample would no longer be the best one).
- dgpo follows the authors' code (a TRL fork): difficulty = the group's mean reward (the code reads its
  accuracy reward; mmrl passes one scalar reward). ``c`` is the code's ratio that makes a token mean average over
  informative groups' tokens only; its per-process balancing ratio is not needed, as mmrl's aggregation divides by
  the global mini-batch's units. ``eps`` is ``algo.adv_eps`` where the code has 1e-4.
- agrae implements the formula its code means to apply: the released trainer passes a mixing weight that decays from
  2 to 1, so the code's ``== 2.0`` test never fires. The curriculum reads this batch's accuracy, so no state is kept.
  Rewards must lie in [0, 1] (sqrt of the mean).
"""

from __future__ import annotations

import torch

from mmrl.algos.advantages import (
    ADVANTAGES,
    AdvantageEstimator,
    AdvantageInput,
    groups_with_signal,
    grpo_advantages,
)


def ngrpo_advantages(
    rewards: torch.Tensor, eps: float = 1e-6, *, r_max: float = 1.0, num_virtual: int = 1
) -> torch.Tensor:
    """``rewards [B, G]`` -> ``A [B, G]``: GRPO's z-score against statistics that also count ``num_virtual`` rewards
    of ``r_max`` (the virtual samples get no advantage of their own)."""
    B, G = rewards.shape
    if G == 1:
        return rewards.clone()  # grpo's group of one (mean 0, std 1), as the authors' code: no virtual sample
    pooled = torch.cat([rewards, rewards.new_full((B, num_virtual), r_max)], dim=1)  # [B, G + K]
    mean = pooled.mean(dim=1, keepdim=True)  # [B, 1]
    std = pooled.std(dim=1, keepdim=True)  # [B, 1] unbiased, over G + K values
    return (rewards - mean) / (std + eps)


def dgae_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``rewards [B, G]`` -> ``A [B, G]``, centred and divided by the mean absolute deviation: sum_i |A_i| = G."""
    G = rewards.shape[1]
    if G == 1:
        return rewards.clone()  # grpo's group of one
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # [B, G]
    return G * centred / (centred.abs().sum(dim=1, keepdim=True) + eps)


def difficulty_weights(rewards: torch.Tensor, temperature: float = 2.0) -> torch.Tensor:
    """``rewards [B, G]`` -> ``w [B]``: M * softmax(-mean / T) over the M groups with spread, 1 for flat ones.

    The weights of informative groups average 1; a lower mean reward (a harder question) weighs more."""
    w = rewards.new_ones(rewards.shape[0])  # [B]
    signal = groups_with_signal(rewards)  # [B]
    if signal.any():
        acc = rewards[signal].mean(dim=1)  # [M]
        w[signal] = signal.sum() * torch.softmax(-acc / temperature, dim=0)
    return w


def informative_token_scale(rewards: torch.Tensor, mask: torch.Tensor) -> float:
    """Response tokens of the batch / response tokens of groups with spread (1 when none): under a token mean, the
    flat groups' zero advantages then no longer dilute the informative ones. ``mask [B*G, T]``."""
    B, G = rewards.shape
    tokens = mask.to(rewards.device, rewards.dtype).sum(dim=1).reshape(B, G)  # [B, G]
    informative = tokens[groups_with_signal(rewards)].sum()
    return (tokens.sum() / informative).item() if informative > 0 else 1.0


def agrae_advantages(rewards: torch.Tensor, eps: float = 1e-6, *, alpha: float = 1.0) -> torch.Tensor:
    """``rewards [B, G]`` in [0, 1] -> ``A [B, G]``: GRPO's advantage reweighted from easy to hard questions as the
    batch accuracy rises, positive advantages scaled by min(1, batch accuracy / alpha)."""
    if rewards.shape[1] == 1:
        return rewards.clone()  # grpo's group of one; no accuracy to weigh it by
    adv = grpo_advantages(rewards, eps)  # [B, G]
    acc = rewards.mean(dim=1, keepdim=True)  # [B, 1] the question's accuracy
    batch_acc = acc.mean()  # over the B questions
    root = acc.sqrt()
    easy = 0.5 * adv / (1.0 - root + eps)  # larger for questions the policy mostly solves
    hard = 0.5 * adv / (root + eps)  # larger for questions it mostly fails
    mixed = (1.0 - batch_acc) * easy + batch_acc * hard
    return torch.where(mixed > 0, mixed * torch.clamp(batch_acc / alpha, max=1.0), mixed)


def flat_signalled(rewards: torch.Tensor, adv: torch.Tensor) -> float:
    """Share of flat groups (rewards all equal) given any non-zero advantage; 0 when there are none. ``adv [B, G]``."""
    flat = ~groups_with_signal(rewards)  # [B]
    if not flat.any():
        return 0.0
    return (adv[flat] != 0).any(dim=1).float().mean().item()


def _check_range(name: str, inp: AdvantageInput, low: float, high: float, what: str) -> None:
    r = inp.rewards
    bad = torch.nonzero((r < low) | (r > high))
    if len(bad):
        b, g = (int(x) for x in bad[0])
        raise ValueError(
            f"advantage {name!r}: record {inp.indices[b]} (response {g}) has reward {r[b, g].item():g}, {what}"
        )


@ADVANTAGES.register("ngrpo")
class NGRPO(AdvantageEstimator):
    """NGRPO's advantage calibration: a virtual ``r_max`` reward in every group's statistics (docs/methods.md#ngrpo)."""

    name = "ngrpo"
    shift_invariant = False  # r_max does not move with the rewards
    scale_invariant = False

    def __init__(self, num_records: int, *, eps: float = 1e-6, r_max: float = 1.0, num_virtual: int = 1):
        super().__init__(num_records, eps=eps)
        if not isinstance(num_virtual, int) or num_virtual < 0:
            raise ValueError(f"advantage 'ngrpo': num_virtual must be an integer >= 0, got {num_virtual!r}")
        self.r_max, self.num_virtual = float(r_max), num_virtual

    def compute(self, inp: AdvantageInput) -> tuple[torch.Tensor, dict[str, float]]:
        _check_range(
            self.name,
            inp,
            float("-inf"),
            self.r_max,
            f"above r_max = {self.r_max:g}; set algo.advantage_options.r_max to the reward's upper bound",
        )
        r = inp.rewards
        adv = ngrpo_advantages(r, self.eps, r_max=self.r_max, num_virtual=self.num_virtual)  # [B, G]
        return adv.reshape(-1), {"ngrpo/flat_signalled": flat_signalled(r, adv)}


@ADVANTAGES.register("dgpo")
class DGPO(AdvantageEstimator):
    """DGPO: mean-absolute-deviation group advantages, harder questions weighted up (docs/methods.md#dgpo)."""

    name = "dgpo"
    shift_invariant = True  # the centring removes it, and a softmax ignores a shift of its inputs
    scale_invariant = False  # the difficulty softmax sees the reward's scale

    def __init__(
        self,
        num_records: int,
        *,
        eps: float = 1e-6,
        temperature: float = 2.0,
        dqw: bool = True,
        rebalance: bool = True,
    ):
        super().__init__(num_records, eps=eps)
        if not temperature > 0:
            raise ValueError(f"advantage 'dgpo': temperature must be > 0, got {temperature}")
        self.temperature, self.dqw, self.rebalance = float(temperature), dqw, rebalance

    def compute(self, inp: AdvantageInput) -> tuple[torch.Tensor, dict[str, float]]:
        r = inp.rewards
        adv = dgae_advantages(r, self.eps)  # [B, G]
        w = difficulty_weights(r, self.temperature) if self.dqw else r.new_ones(r.shape[0])  # [B]
        scale = informative_token_scale(r, inp.mask) if self.rebalance else 1.0
        adv = adv * w[:, None] * scale
        return adv.reshape(-1), {
            "dgpo/flat_signalled": flat_signalled(r, adv),
            "dgpo/weight_max": w.max().item(),
            "dgpo/weight_min": w.min().item(),
            "dgpo/token_scale": scale,
        }


@ADVANTAGES.register("agrae")
class AGRAE(AdvantageEstimator):
    """A-GRAE: GRPO's advantage with an easy-to-hard curriculum and suppressed positives (docs/methods.md#a-grae)."""

    name = "agrae"
    shift_invariant = False  # the accuracy weights read the rewards themselves
    scale_invariant = False

    def __init__(self, num_records: int, *, eps: float = 1e-6, alpha: float = 1.0):
        super().__init__(num_records, eps=eps)
        if not alpha > 0:
            raise ValueError(f"advantage 'agrae': alpha must be > 0, got {alpha}")
        self.alpha = float(alpha)

    def compute(self, inp: AdvantageInput) -> tuple[torch.Tensor, dict[str, float]]:
        r = inp.rewards
        _check_range(
            self.name,
            inp,
            0.0,
            1.0,
            "outside [0, 1]; agrae reads a group's mean reward as its accuracy: rescale the reward (rewards.N.weight)",
        )
        adv = agrae_advantages(r, self.eps, alpha=self.alpha)  # [B, G]
        batch_acc = r.mean().item()  # the mean of the groups' accuracies: every group has G responses
        return adv.reshape(-1), {
            "agrae/flat_signalled": flat_signalled(r, adv),
            "agrae/batch_accuracy": batch_acc,
            "agrae/positive_scale": min(1.0, batch_acc / self.alpha),
        }
