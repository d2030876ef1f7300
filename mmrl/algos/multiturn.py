"""Step-level credit for multi-turn agents (docs/agents.md#step-level-credit): token-level advantages over turn spans.

A row of the batch is one trajectory. ``AdvantageInput.turns[i]`` lists its turns in order (:class:`Turn`): each a
span ``[start, end)`` of the row's response tokens holding the action, the environment's reward r_t for it, and
the anchor-state key of the observation it was taken in. Every token of a turn's span carries that turn's
advantage (times the mask); every other token gets 0. The environment's tokens between turns must have mask 0: a
mask-1 token outside every span is an error, as it would be trained on with advantage 0 and dilute a token-mean
loss. The episode return R(tau) is ``rewards[b, g]`` (the trainer puts the sum of the turn rewards there, or an
outcome reward); R_t = sum_k gamma^k r_{t+k} is the discounted return of turn t within its own trajectory,
computed backwards over the turns. The task is the prompt's position b in the batch: turns of different tasks are
never compared, even when they share a state key or the prompt was drawn twice.

Single-turn data (``turns is None``): every row reads as one turn spanning its whole response, with reward
``rewards[b, g]`` and a state key of its own, so there is one path. ``episode_grpo`` and ``gigpo`` then give
exactly ``grpo``'s advantages on every response token (no state repeats: A_S = 0), ``discounted_turns`` the same
up to float rounding (R_0 = r, grouped over the G trajectories).

- ``episode_grpo``: A_E, the group advantage of R(tau) over the task's G trajectories (``norm: mean_std_norm`` is
  ``grpo``: unbiased std + eps, a group of one reads mean 0, std 1; ``mean_norm`` is ``dr_grpo``), on every turn.
- ``discounted_turns``: R_t against the task's returns at the SAME TURN INDEX t, over the trajectories that have a
  turn t: (R_t - mean) / F, F = unbiased std + eps (``mean_std_norm``) or 1 (``mean_norm``). Not all turns of the
  group pooled: with gamma < 1 and a sparse final reward R_t grows towards every trajectory's end, so a pooled
  baseline would punish the early turns of successful trajectories for their position alone. A turn index only one
  trajectory of the task reached (the tail of the longest) is a group of one and gets 0;
  ``discounted_turns/lone_turns`` logs the share of such turns.
- ``gigpo``: A = A_E + w A_S. A_S: all turns of the task's G trajectories grouped by identical ``state_key`` (two
  visits of one trajectory to a state fall in one group too), R_t against its anchor group, (R_t - mean) / F with
  F as above (``step_norm``); a state seen once gets A_S = 0.

Departures from GiGPO's paper and its code (verl-agent ``gigpo/core_gigpo.py``: ``episode_norm_reward``,
``build_step_group``, ``step_norm_reward``, ``compute_step_discounted_returns``; and
``agent_system/reward_manager/episode.py``; read in public forks, the upstream repository being unreachable here):
- Layout: verl-agent trains each step as its own row (the step's observation as prompt); here a row is a whole
  trajectory with its turns as spans, as docs/agents.md#step-level-credit asks of the rollout. The per-turn values are the same.
- Episode statistics: verl-agent's rows are steps, each carrying its episode's return, and by default
  (``compute_mean_std_cross_steps``) the group mean and std run over those rows, so a trajectory weighs by its
  number of steps. Here each trajectory counts once (the paper's episode-level formula, docs/agents.md#step-level-credit): A_E is
  ``grpo``.
- One normalisation option per level (``episode_norm``, ``step_norm``) where verl-agent has one ``mode`` for both;
  both default to ``mean_std_norm``, as verl-agent's example scripts (its function's default is ``mean_norm``).
  Std and groups as verl-agent: unbiased std, + eps; an episode group of one reads mean 0, std 1; a step group of
  one gives 0 (its mean is itself); equal returns give 0 (std 0, numerator 0).
- gamma 0.95 by default, the value of verl-agent's scripts; the step weight w defaults to 1, as theirs.
- Anchor groups by exact equality of the env's key within one task, as ``build_step_group`` (grouped per task
  uid). Not implemented: verl-agent's later similarity grouping (observations with a text-similarity ratio >= a
  threshold).
- Turn rewards are read as given: the trainer's reward correction and KL-in-reward penalty act on
  ``rewards [B, G]``, so on R(tau) and A_E, not on the step returns R_t (single-turn data: R_0 is the corrected
  reward).
- Scale invariance depends on the norm options, so the classes declare ``scale_invariant = False`` (the reward
  correction check then never refuses them); they are shift-invariant in ``rewards [B, G]``.

Stats: ``<name>/turns_mean`` (turns per trajectory); ``discounted_turns/lone_turns``; ``gigpo/anchor_groups``
(anchor groups of two or more steps, summed over tasks), ``gigpo/anchor_group_size`` (steps per distinct state,
singletons included, as verl-agent prints it), ``gigpo/grouped_steps`` (share of steps in a group of two or more),
``gigpo/step_adv_nonzero`` (share of steps with A_S != 0).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Hashable
from typing import Literal

import torch

from mmrl.algos.advantages import (
    ADVANTAGES,
    AdvantageEstimator,
    AdvantageInput,
    Turn,
    dr_grpo_advantages,
    grpo_advantages,
)

Norm = Literal["mean_std_norm", "mean_norm"]
# the episode level is the group trainer's own estimator: the same numbers, one implementation
EPISODE_NORMS: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "mean_std_norm": grpo_advantages,
    "mean_norm": dr_grpo_advantages,
}


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """``R_t = r_t + gamma R_{t+1}`` over one trajectory's turns (= sum_k gamma^k r_{t+k}), computed backwards."""
    out, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def group_relative(
    values: list[float], keys: list[Hashable], norm: Norm, eps: float
) -> tuple[list[float], list[int]]:
    """Each value against the others with its key: ``(v - mean) / (std + eps)`` (unbiased std) or ``v - mean``; a
    key seen once gives 0. Returns the advantages and the size of every group."""
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    out = [0.0] * len(values)
    for members in groups.values():
        if len(members) < 2:
            continue
        v = [values[i] for i in members]
        mean = math.fsum(v) / len(v)
        scale = 1.0
        if norm == "mean_std_norm":
            scale = math.sqrt(math.fsum((x - mean) ** 2 for x in v) / (len(v) - 1)) + eps
        for i, x in zip(members, v):
            out[i] = (x - mean) / scale
    return out, [len(m) for m in groups.values()]


def read_turns(inp: AdvantageInput, name: str) -> list[list[Turn]]:
    """The batch's turns, checked; ``None`` reads each row as one turn over its whole response (single-turn data)."""
    G = inp.rewards.shape[1]
    N, T = inp.mask.shape
    if inp.turns is None:
        r = inp.rewards.reshape(-1).tolist()
        return [[Turn(0, T, r[i], f"row {i}")] for i in range(N)]
    if len(inp.turns) != N:
        raise ValueError(
            f"advantage {name!r}: {len(inp.turns)} turn lists for {N} responses; AdvantageInput.turns needs one "
            "list per response, prompt-major"
        )
    for i, row in enumerate(inp.turns):
        end = 0
        for k, t in enumerate(row):
            where = f"advantage {name!r}: response {i} (record {inp.indices[i // G]}) turn {k}"
            if not isinstance(t, Turn) or not isinstance(t.state_key, str):
                raise ValueError(f"{where}: expected a Turn with a string state_key, got {t!r}")
            if not 0 <= t.start <= t.end <= T:
                raise ValueError(
                    f"{where}: span [{t.start}, {t.end}) is not inside the response's {T} tokens"
                )
            if t.start < end:
                raise ValueError(
                    f"{where}: span [{t.start}, {t.end}) starts before the previous turn ends ({end}); "
                    "list a row's turns in order, without overlap"
                )
            if not math.isfinite(t.reward):
                raise ValueError(
                    f"{where}: non-finite reward {t.reward}; check the environment's step reward"
                )
            end = t.end
    return inp.turns


def spread(
    values: list[list[float]], turns: list[list[Turn]], inp: AdvantageInput, name: str
) -> torch.Tensor:
    """One value per turn -> ``[N, T]``: every token of a turn's span carries it (times the mask), others 0."""
    N, T = inp.mask.shape
    spans = [(i, t.start, t.end) for i, row in enumerate(turns) for t in row]
    flat = [v for vals in values for v in vals]
    row, start, end = torch.tensor(spans, dtype=torch.long).reshape(-1, 3).unbind(1)  # [turns] each
    ids = torch.arange(1, len(spans) + 1)  # 1 + each turn's number in the batch
    marks = torch.zeros(N, T + 1, dtype=torch.long)  # +id where a span opens, -id where it closes
    marks.index_put_((row, start), ids, accumulate=True)
    marks.index_put_((row, end), -ids, accumulate=True)
    which = marks.cumsum(1)[:, :T]  # [N, T] 1 + the token's turn, 0 outside every span (spans do not overlap)
    mask = inp.mask.detach().to("cpu", torch.float64)  # [N, T]
    stray = (mask != 0) & (which == 0)
    if stray.any():
        i = int(stray.any(1).nonzero()[0, 0])
        raise ValueError(
            f"advantage {name!r}: response {i} (record {inp.indices[i // inp.rewards.shape[1]]}) has "
            f"{int(stray[i].sum())} loss tokens (mask 1) outside every turn's span; the environment's tokens "
            "between turns must have mask 0"
        )
    per_turn = torch.tensor([0.0, *flat], dtype=torch.float64)  # [1 + turns]; index 0: outside every span
    return (per_turn[which] * mask).to(inp.rewards.device, inp.rewards.dtype)


class TurnEstimator(AdvantageEstimator):
    """Shared by the multi-turn estimators: reads the turns, asks :meth:`turn_advantages` for one value per turn
    and spreads each over its turn's tokens."""

    def compute(self, inp: AdvantageInput) -> tuple[torch.Tensor, dict[str, float]]:
        turns = read_turns(inp, self.name)
        values, stats = self.turn_advantages(inp, turns)
        n_turns = sum(len(row) for row in turns)
        return spread(values, turns, inp, self.name), {
            f"{self.name}/turns_mean": n_turns / len(turns),
            **stats,
        }

    @abstractmethod
    def turn_advantages(
        self, inp: AdvantageInput, turns: list[list[Turn]]
    ) -> tuple[list[list[float]], dict[str, float]]:
        """One advantage per turn, row by row, and the stats to log."""

    def _norm(self, option: str, value: str) -> str:
        if value not in EPISODE_NORMS:
            raise ValueError(
                f"advantage {self.name!r}: {option} must be 'mean_std_norm' or 'mean_norm' "
                f"(algo.advantage_options.{option}), got {value!r}"
            )
        return value

    def _gamma(self, gamma: float) -> float:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(
                f"advantage {self.name!r}: gamma must be in [0, 1] (algo.advantage_options.gamma), got {gamma}"
            )
        return gamma


def by_task(turns: list[list[Turn]], G: int) -> list[list[list[Turn]]]:
    """Rows grouped per task (prompt-major): ``[B][G]`` lists of turns."""
    return [turns[b : b + G] for b in range(0, len(turns), G)]


def unflatten(flat: list[float], rows: list[list[Turn]]) -> list[list[float]]:
    out, k = [], 0
    for row in rows:
        out.append(flat[k : k + len(row)])
        k += len(row)
    return out


@ADVANTAGES.register("episode_grpo")
class EpisodeGRPO(TurnEstimator):
    """Trajectory-level group advantage A_E of R(tau) over the task's G trajectories, on every action token."""

    name = "episode_grpo"

    def __init__(self, num_records: int, *, eps: float = 1e-6, norm: Norm = "mean_std_norm"):
        super().__init__(num_records, eps=eps)
        self.norm = self._norm("norm", norm)

    def turn_advantages(
        self, inp: AdvantageInput, turns: list[list[Turn]]
    ) -> tuple[list[list[float]], dict[str, float]]:
        a_e = EPISODE_NORMS[self.norm](inp.rewards, self.eps).reshape(-1).tolist()  # [B*G]
        return [[a_e[i]] * len(row) for i, row in enumerate(turns)], {}


@ADVANTAGES.register("discounted_turns")
class DiscountedTurns(TurnEstimator):
    """Per-turn discounted returns R_t against the task's returns at the same turn index."""

    name = "discounted_turns"

    def __init__(
        self, num_records: int, *, eps: float = 1e-6, gamma: float = 0.95, norm: Norm = "mean_std_norm"
    ):
        super().__init__(num_records, eps=eps)
        self.gamma, self.norm = self._gamma(gamma), self._norm("norm", norm)

    def turn_advantages(
        self, inp: AdvantageInput, turns: list[list[Turn]]
    ) -> tuple[list[list[float]], dict[str, float]]:
        values: list[list[float]] = []
        lone = total = 0
        for rows in by_task(turns, inp.rewards.shape[1]):
            returns = [R for row in rows for R in discounted_returns([t.reward for t in row], self.gamma)]
            index = [t for row in rows for t in range(len(row))]  # the baseline's key: the turn index
            adv, sizes = group_relative(returns, index, self.norm, self.eps)
            values += unflatten(adv, rows)
            lone, total = lone + sizes.count(1), total + len(returns)
        return values, {f"{self.name}/lone_turns": lone / max(total, 1)}


@ADVANTAGES.register("gigpo")
class GiGPO(TurnEstimator):
    """GiGPO: A = A_E + w A_S, the episode term plus the step term of the turn's anchor-state group."""

    name = "gigpo"

    def __init__(
        self,
        num_records: int,
        *,
        eps: float = 1e-6,
        gamma: float = 0.95,
        step_weight: float = 1.0,
        episode_norm: Norm = "mean_std_norm",
        step_norm: Norm = "mean_std_norm",
    ):
        super().__init__(num_records, eps=eps)
        if not (math.isfinite(step_weight) and step_weight >= 0):
            raise ValueError(
                f"advantage {self.name!r}: step_weight must be >= 0 (algo.advantage_options.step_weight), "
                f"got {step_weight}"
            )
        self.gamma, self.w = self._gamma(gamma), step_weight
        self.episode_norm = self._norm("episode_norm", episode_norm)
        self.step_norm = self._norm("step_norm", step_norm)

    def turn_advantages(
        self, inp: AdvantageInput, turns: list[list[Turn]]
    ) -> tuple[list[list[float]], dict[str, float]]:
        G = inp.rewards.shape[1]
        a_e = EPISODE_NORMS[self.episode_norm](inp.rewards, self.eps).reshape(-1).tolist()  # [B*G]
        values: list[list[float]] = []
        sizes: list[int] = []
        nonzero = 0
        for b, rows in enumerate(by_task(turns, G)):
            returns = [R for row in rows for R in discounted_returns([t.reward for t in row], self.gamma)]
            keys = [t.state_key for row in rows for t in row]  # anchor states of this task only
            a_s, task_sizes = group_relative(returns, keys, self.step_norm, self.eps)
            sizes += task_sizes
            nonzero += sum(a != 0.0 for a in a_s)
            for g, row_a_s in enumerate(unflatten(a_s, rows)):
                values.append([a_e[b * G + g] + self.w * a for a in row_a_s])
        steps = sum(sizes)
        return values, {
            "gigpo/anchor_groups": float(sum(s >= 2 for s in sizes)),
            "gigpo/anchor_group_size": steps / max(len(sizes), 1),
            "gigpo/grouped_steps": sum(s for s in sizes if s >= 2) / max(steps, 1),
            "gigpo/step_adv_nonzero": nonzero / max(steps, 1),
        }
