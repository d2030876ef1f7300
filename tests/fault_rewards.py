"""A heavy reward for tests/test_faults.py: it runs in the reward worker pool and takes long enough per item
(``seconds``) that a worker can be killed while it scores. The score (the response's length, even or odd) depends on
the response only, so a re-scored item gets the score it would have had."""

import time

from mmrl.rewards.base import register_reward
from mmrl.types import RewardInput, RewardResult


@register_reward("fault_slow_parity", heavy=True)
def slow_parity(batch: list[RewardInput], *, seconds: float = 0.1) -> list[RewardResult]:
    out = []
    for x in batch:
        time.sleep(seconds)
        out.append(RewardResult(score=float(len(x.response) % 2)))
    return out
