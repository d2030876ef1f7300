"""Policy-gradient math as registered pure functions and small stateful objects: advantage estimators (single- and
multi-turn), policy losses, loss aggregations, KL estimators, noisy-verifier reward corrections, rollout/training
mismatch corrections, off-policy pieces for asynchronous RL, and algorithm presets."""

from mmrl.algos.advantages import (
    ADVANTAGES,
    AdvantageEstimator,
    AdvantageInput,
    Turn,
    advantage_stats,
    group_advantage,
    groups_with_signal,
)
from mmrl.algos.aepo import with_fixed_advantages
from mmrl.algos.cliff import AGRAE, DGPO, NGRPO
from mmrl.algos.corrections import REWARD_CORRECTIONS, check_reward_correction
from mmrl.algos.critique import critique_loss
from mmrl.algos.dhpo import dhpo_loss
from mmrl.algos.epo import EPOLoss, turn_index
from mmrl.algos.igpo import IGPO
from mmrl.algos.kl import KL_ESTIMATORS, kl_penalised_rewards
from mmrl.algos.losses import AGGREGATIONS, LOSSES, Aggregation, reduce_stats, register_loss
from mmrl.algos.multiturn import DiscountedTurns, EpisodeGRPO, GiGPO
from mmrl.algos.offpolicy import proximal_logprobs
from mmrl.algos.rollout_correction import ROLLOUT_CORRECTIONS, check_rollout_correction, rollout_correction
from mmrl.algos.salt import SALT
from mmrl.algos.single_rollout import MSSR, SPO
from mmrl.presets import PRESETS

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "AGRAE",
    "DGPO",
    "KL_ESTIMATORS",
    "LOSSES",
    "MSSR",
    "NGRPO",
    "PRESETS",
    "REWARD_CORRECTIONS",
    "ROLLOUT_CORRECTIONS",
    "SALT",
    "SPO",
    "AdvantageEstimator",
    "AdvantageInput",
    "Aggregation",
    "DiscountedTurns",
    "EPOLoss",
    "EpisodeGRPO",
    "GiGPO",
    "IGPO",
    "Turn",
    "advantage_stats",
    "check_reward_correction",
    "check_rollout_correction",
    "critique_loss",
    "dhpo_loss",
    "group_advantage",
    "groups_with_signal",
    "kl_penalised_rewards",
    "proximal_logprobs",
    "reduce_stats",
    "register_loss",
    "rollout_correction",
    "turn_index",
    "with_fixed_advantages",
]
