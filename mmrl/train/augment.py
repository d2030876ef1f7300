"""Batch augmenters (``algo.augment``): rows the collector adds to a step's batch after its rollout, with advantages of
their own. The trainer applies what the batch carries (``Collected.fixed_advantages``) and hands each step's
metrics back (:meth:`Augmenter.feedback`); it never tests a name.

``aepo`` (docs/credit.md#aepo, :mod:`mmrl.algos.aepo`): AEPO's temperature pass. After the on-policy round it samples
G more episodes of the first ``share`` of the step's prompts at T_high or T_low (from the last step's entropy against
``target_entropy``), scores them, keeps those with a GRPO advantage above ``threshold`` (advantage 1 from then on) and
puts up to ``samples`` of them (half when the entropy is above the target) in place of on-policy rows of their own
prompt's group, from the group's last row backwards, their rewards with them (so the logs and the estimator see the
batch that is trained; the released code computes the advantages before it replaces rows, a departure only for the
group's other rows). The replaced rows' pi_old must be the training forward's at the training temperature, not the
engine's at T: ``algo.old_logprobs: recompute`` is required; their rollout-correction weight is 1 and they are left
out of the engine/trainer mismatch statistics (``Collected.fixed_advantages``).

Where it departs from the released code (an EasyR1 fork): the code writes the kept samples over the first k rows of
the batch whatever their prompt; here each goes into its own prompt's group, so logs and group-reading losses see
it under its prompt (its loss term is the same: it carries its own prompt). The entropy read is the previous step's
logged ``entropy`` (the code's actor entropy metric); the first step reads 0, as the code initialises it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from mmrl.algos.aepo import kept_samples, pass_temperature, sample_count
from mmrl.config import Config
from mmrl.registry import Builtin, Registry

if TYPE_CHECKING:
    from mmrl.train.collect import Collected, Collector


class Augmenter(ABC):
    """Changes a collected batch; keeps what it learns from the trainer's metrics (``state_dict`` for a resume)."""

    def check(self, cfg: Config) -> None:
        """Pre-flight: refuse a config it cannot run under (ValueError naming the fix); all are accepted here."""
        return None

    @abstractmethod
    def __call__(self, collector: Collector, got: Collected) -> Collected: ...

    def feedback(self, metrics: dict[str, Any]) -> None:
        """The step's logged metrics, after its update; ignored here."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


AUGMENTERS: Registry[type[Augmenter]] = Registry(
    "batch augmenter",
    {
        "aepo": Builtin("mmrl.train.augment"),
        "ghpo": Builtin("mmrl.train.hinting"),
        "scaf": Builtin("mmrl.train.hinting"),
        "critique": Builtin("mmrl.train.critique"),
    },
)


def put_row(got: Collected, b: int, slot: int, traj: Any, reward: float, result: Any) -> None:
    """Row ``slot`` of group ``b`` becomes ``traj``, with its reward and reward result (what the logs show)."""
    G = len(got.trajectories[b])
    got.trajectories[b][slot] = traj
    got.groups[b][slot] = traj.whole_response()
    got.rewards[b, slot] = reward
    got.results[b * G + slot] = result


def make_augmenter(cfg: Config) -> Augmenter | None:
    """``algo.augment`` with its options; None for ``none``."""
    a = cfg.algo
    return None if a.augment == "none" else AUGMENTERS.get(a.augment)(**a.augment_options)


@AUGMENTERS.register("aepo")
class AEPOPass(Augmenter):
    """AEPO's temperature pass: correct samples from pi^T replace on-policy rows, advantage 1."""

    def __init__(
        self,
        *,
        target_entropy: float = 0.5,
        t_high: float = 1.2,
        t_low: float = 0.8,
        samples: int = 60,
        share: float = 0.25,
        threshold: float = 0.05,
    ):
        if not (t_high > 0 and t_low > 0):
            raise ValueError(f"augment 'aepo': t_high and t_low must be > 0, got {t_high}, {t_low}")
        if not 0 < share <= 1:
            raise ValueError(
                f"augment 'aepo': share must be in (0, 1] (algo.augment_options.share), got {share}"
            )
        if samples < 0 or target_entropy < 0:
            raise ValueError(
                f"augment 'aepo': samples and target_entropy must be >= 0, got {samples}, {target_entropy}"
            )
        self.target, self.t_high, self.t_low = target_entropy, t_high, t_low
        self.samples, self.share, self.threshold = samples, share, threshold
        self.entropy = 0.0  # the previous step's; 0 before the first, as the released code

    def check(self, cfg: Config) -> None:
        if cfg.algo.old_logprobs != "recompute":
            raise ValueError(
                "algo.augment 'aepo' samples at another temperature, so the rows it adds need pi_old from the "
                "training forward: set algo.old_logprobs: recompute"
            )
        if cfg.rollout.placement == "separate":
            raise ValueError(
                "algo.augment 'aepo' reads the trainer's entropy each step, which the separate placement's "
                "generating process does not receive; use rollout.placement: colocated"
            )
        if cfg.rollout.n < 2:
            raise ValueError("algo.augment 'aepo' keeps samples by their group advantage: set rollout.n >= 2")

    def __call__(self, collector: Collector, got: Collected) -> Collected:
        got.resolve()  # the round's rewards first: the composite reward is not shared between threads
        B, G = len(got.indices), len(got.trajectories[0])
        groups = list(range(max(1, round(self.share * B))))
        H = self.entropy  # read once: feedback() writes it from the training thread in an asynchronous run
        T = pass_temperature(H, self.target, self.t_high, self.t_low)
        trajs, rewards, results = collector.resample(got, groups, T)
        kept = kept_samples(rewards, self.threshold)
        k = sample_count(len(kept), self.samples, H, self.target)
        fixed: dict[int, float] = {}
        used = dict.fromkeys(groups, 0)
        for b, g in kept[:k]:
            used[b] += 1
            slot = G - used[b]  # the group's last rows first
            put_row(got, b, slot, trajs[b][g], float(rewards[b, g]), results[b * G + g])
            fixed[b * G + slot] = 1.0
        got.fixed_advantages = fixed
        got.stats = {
            **got.stats,
            "aepo/temperature": T,
            "aepo/entropy_seen": H,
            "aepo/target_entropy": self.target,
            "aepo/pass_reward_mean": rewards.mean().item(),
            "aepo/extra_samples": float(rewards.numel()),
            "aepo/kept": float(len(kept)),
            "aepo/replaced": float(len(fixed)),
        }
        return got

    def feedback(self, metrics: dict[str, Any]) -> None:
        if "entropy" in metrics:
            self.entropy = float(metrics["entropy"])

    def state_dict(self) -> dict[str, Any]:
        return {"entropy": self.entropy}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entropy = float(state.get("entropy", 0.0))
