"""SALT: step-level advantages from a graph of the group's trajectories (docs/credit.md#salt).

One task's G trajectories, each a list of turns (:class:`mmrl.algos.advantages.Turn`), with outcome rewards R_i:

    A_i  = (R_i - mean R) / (std R + eps)         base: grpo (unbiased std; a group of one reads A = R)
         = R_i - mean_{j != i} R_j                base: rloo
    k_it = the merge key of step t of trajectory i (below); steps of equal key are one node of the graph
    A_it = mean of A_j over the distinct trajectories j with a step in node k_it

and every token of step t's span carries A_it (times the mask), other tokens 0, as ``gigpo``. A step unique to
trajectory i keeps A_i; a step every trajectory passes through gets the group mean of A, which is 0 for both bases.
There is no renormalisation after the averaging. Tasks are never merged with each other (the prompt's position b in
the batch), even when two share state keys.

The merge key (the paper does not publish it; docs/credit.md#the-merge-key). A step is (s_t, a_t): the state key of
the observation the action was taken in and the action's identity, ``Turn.action_key`` (the episode driver records a
digest of the action's token ids). Turns without action keys (built by hand) fall back to what the trajectory shows
of the action: its number of tokens n_t and the observation s_{t+1} it led to (in a deterministic environment, equal
state and action give equal next state), the last step never merged (it shows no next observation): below, read
a_t as (n_t, s_{t+1}) for them.

- ``key: state`` (default): k_it = (s_t, a_t) alone, GiGPO-style anchor states: histories that reach the same state
  and act alike merge. A trajectory that passes a node twice counts once in its mean.
- ``key: prefix``: k_it = ((s_0, a_0), ..., (s_t, a_t)), the whole history up to and including this step: the graph
  is the prefix tree of the group's trajectories. The members of a node then share the step's whole context and
  tokens, so averaging their A keeps the node's sum and the on-policy token-mean gradient is ``episode_grpo``'s
  (docs/credit.md#salt): not the default for that reason.

Single-turn data (``turns is None``): every row is one step, its last, so ``salt`` gives exactly ``grpo`` (or ``rloo``)
on every response token.

Stats: ``salt/turns_mean`` (turns per trajectory), ``salt/merged_steps`` (share of steps whose node holds two or more
trajectories), ``salt/distinct_steps`` (nodes / steps: 1 when nothing merged), ``salt/adv_shift`` (mean over steps
of |A_it - A_i|: how far the graph moved the credit).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Literal

import torch

from mmrl.algos.advantages import (
    ADVANTAGES,
    AdvantageInput,
    Turn,
    grpo_advantages,
    rloo_advantages,
)
from mmrl.algos.multiturn import TurnEstimator, by_task

Base = Literal["grpo", "rloo"]
Key = Literal["prefix", "state"]
BASES: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
}


def step_keys(row: list[Turn], i: int, key: Key = "prefix") -> list[Hashable]:
    """The merge key of every step of trajectory ``i`` (its index within the task): (state, action) where the turns
    carry their action's key (the episode driver records a digest of its token ids); else the stand-in of the module
    docstring, the last step's key its own."""
    if row and all(turn.action_key for turn in row):
        steps: list[Hashable] = [(turn.state_key, turn.action_key) for turn in row]
    else:
        steps = [
            (turn.state_key, turn.end - turn.start, row[t + 1].state_key) for t, turn in enumerate(row[:-1])
        ]
        if row:
            steps.append(("last step of", i))  # its action shows in no later observation
    if key == "state":
        return steps
    return [tuple(steps[: t + 1]) for t in range(len(steps))]


def merged_step_advantages(
    traj_adv: list[float], keys: list[list[Hashable]]
) -> tuple[list[list[float]], list[list[int]]]:
    """One task: ``traj_adv [G]`` (A_i) and each trajectory's step keys -> each step's advantage, the mean of A_j over
    the distinct trajectories j with a step of that key, and the number of those trajectories (the node's size)."""
    members: dict[Hashable, set[int]] = {}
    for i, row in enumerate(keys):
        for k in row:
            members.setdefault(k, set()).add(i)
    node_adv = {k: math.fsum(traj_adv[j] for j in m) / len(m) for k, m in members.items()}
    return [[node_adv[k] for k in row] for row in keys], [[len(members[k]) for k in row] for row in keys]


@ADVANTAGES.register("salt")
class SALT(TurnEstimator):
    """SALT: each step's advantage is the mean trajectory advantage over the group's trajectories that share it."""

    name = "salt"
    scale_invariant = False  # rloo's advantages scale with the rewards
    shift_invariant = True  # both bases centre the rewards; the keys do not read them

    def __init__(self, num_records: int, *, eps: float = 1e-6, base: Base = "grpo", key: Key = "state"):
        super().__init__(num_records, eps=eps)
        if base not in BASES:
            raise ValueError(
                f"advantage 'salt': base must be 'grpo' or 'rloo' (algo.advantage_options.base), got {base!r}"
            )
        if key not in ("prefix", "state"):
            raise ValueError(
                f"advantage 'salt': key must be 'prefix' or 'state' (algo.advantage_options.key), got {key!r}"
            )
        self.base, self.key = base, key

    def turn_advantages(
        self, inp: AdvantageInput, turns: list[list[Turn]]
    ) -> tuple[list[list[float]], dict[str, float]]:
        G = inp.rewards.shape[1]
        a_traj = BASES[self.base](inp.rewards, self.eps).tolist()  # [B][G]
        values: list[list[float]] = []
        merged = nodes = 0
        shift = 0.0
        for b, rows in enumerate(by_task(turns, G)):
            keys = [step_keys(row, g, self.key) for g, row in enumerate(rows)]
            adv, sizes = merged_step_advantages(a_traj[b], keys)
            values += adv
            nodes += len({k for row in keys for k in row})
            merged += sum(s >= 2 for row in sizes for s in row)
            shift += sum(abs(a - a_traj[b][g]) for g, row in enumerate(adv) for a in row)
        steps = max(sum(len(row) for row in turns), 1)
        return values, {
            "salt/merged_steps": merged / steps,
            "salt/distinct_steps": nodes / steps,
            "salt/adv_shift": shift / steps,
        }
