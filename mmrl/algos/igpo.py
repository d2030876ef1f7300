"""IGPO: turn rewards from the policy's own information gain about the reference answer (docs/credit.md#igpo).

For trajectory i of a task with turns t = 0 .. T_i - 1, the trainer probes the policy before each turn
(:attr:`AdvantageEstimator.answer_template`, :func:`mmrl.rollout.probes.answer_probes`): with the context turn t was
generated from, followed by the template holding the record's reference answer a (L_a tokens),

    p_it = exp( (1/L_a) sum_j log pi_old(a_j | context_it, template head, a_<j) )     the length-normalised likelihood
    r_it = env_it + w (p_i,t+1 - p_it)     t < T_i - 1   (the turn's information gain; the env's reward of the turn)
    r_it = env_it + (R_i - sum_t env_it)   t = T_i - 1   (the last turn: the outcome, as IGPO's final turn; R_i is the
                                                         episode's return with any ``rewards:`` score on top)

and the turn advantages from those rewards, with ``baseline``:
- ``turn`` (default, the released code's reading): R_it = sum_{k >= t} gamma^{k-t} r_ik, A_it = R_it minus the mean
  of the task's R at the same turn index t (no std division; a turn index only one trajectory reached gets 0);
- ``pooled`` (the paper's description): every turn reward of the task's G trajectories z-scored together
  (r - mean) / (unbiased std + eps), then A_it = sum_{k >= t} gamma^{k-t} z_ik.

Every token of turn t's span carries A_it (times the mask), as ``gigpo``. Single-turn rows have one turn and no
gain (and no probe): ``turn`` is ``dr_grpo`` there (r - group mean). Tasks are never compared with each other.

Departures (docs/credit.md#igpo): the released code measures p before each turn with the rollout model during
generation; here the trainer scores the probes under pi_old with the batch's own forward (the same weights with
staleness 0; with an asynchronous run's k > 0, the newest weights). The code appends a fixed pseudo-response
("Now there's enough information to answer ... <answer> GT </answer>"); here the template is an option whose default
is the recipes' answer format, ``<answer>{answer}</answer>``. The code places the turn reward on the turn's last
token and takes a token-level reward-to-go against the group mean at the same token position; a row here is a whole
trajectory of turn spans, so the baseline is taken at the same turn index.

Stats: ``igpo/p_first`` (mean p before the first turn), ``igpo/p_last`` (mean p before the last turn),
``igpo/gain_mean`` (mean information gain over the non-final turns), ``igpo/gain_positive`` (their share > 0).
"""

from __future__ import annotations

import math
from typing import Literal

from mmrl.algos.advantages import ADVANTAGES, AdvantageInput, Turn
from mmrl.algos.multiturn import TurnEstimator, discounted_returns, group_relative, unflatten

Baseline = Literal["turn", "pooled"]


def info_gain_rewards(env: list[float], logp: list[float], weight: float = 1.0) -> list[float]:
    """One trajectory: the env's turn rewards and the probe's mean log-prob before each turn -> IGPO's turn
    rewards (the last turn keeps its env reward alone). A trajectory of one turn needs no probe."""
    if len(env) <= 1 and not logp:
        return list(env)
    if len(env) != len(logp):
        raise ValueError(f"{len(env)} turns but {len(logp)} answer probes")
    p = [math.exp(v) for v in logp]
    return [r + (weight * (p[t + 1] - p[t]) if t + 1 < len(p) else 0.0) for t, r in enumerate(env)]


def pooled_zscore(values: list[float], eps: float) -> list[float]:
    """All of a task's turn rewards against each other: (v - mean) / (unbiased std + eps); one value gives 0."""
    if len(values) < 2:
        return [0.0] * len(values)
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return [(v - mean) / (std + eps) for v in values]


@ADVANTAGES.register("igpo")
class IGPO(TurnEstimator):
    """IGPO: turn rewards are the policy's gain in likelihood of the reference answer; the last turn's the outcome."""

    name = "igpo"
    scale_invariant = False  # the gains are probabilities, not scaled with the rewards
    shift_invariant = False  # a shift of the env's rewards moves the 'turn' baseline's returns unevenly

    def __init__(
        self,
        num_records: int,
        *,
        eps: float = 1e-6,
        gamma: float = 1.0,
        gain_weight: float = 1.0,
        baseline: Baseline = "turn",
        template: str = "<answer>{answer}</answer>",
    ):
        super().__init__(num_records, eps=eps)
        if baseline not in ("turn", "pooled"):
            raise ValueError(
                f"advantage 'igpo': baseline must be 'turn' or 'pooled' (algo.advantage_options.baseline), "
                f"got {baseline!r}"
            )
        if not (math.isfinite(gain_weight) and gain_weight >= 0):
            raise ValueError(
                f"advantage 'igpo': gain_weight must be >= 0 (algo.advantage_options.gain_weight), got {gain_weight}"
            )
        if not isinstance(template, str) or template.count("{answer}") != 1:
            raise ValueError(
                f"advantage 'igpo': template must hold '{{answer}}' exactly once (algo.advantage_options.template), "
                f"got {template!r}"
            )
        self.gamma, self.w, self.baseline = self._gamma(gamma), gain_weight, baseline
        self.answer_template = template

    def turn_advantages(
        self, inp: AdvantageInput, turns: list[list[Turn]]
    ) -> tuple[list[list[float]], dict[str, float]]:
        if inp.answer_logp is None or len(inp.answer_logp) != len(turns):
            raise ValueError(
                "advantage 'igpo' needs the answer probe's log-probs, one list per response "
                "(AdvantageInput.answer_logp, which the trainer fills from answer_template)"
            )
        G = inp.rewards.shape[1]
        outcome = inp.rewards.reshape(-1).tolist()  # R(tau): the env's returns plus any `rewards:` score
        rewards = []
        for i, row in enumerate(turns):
            env = [t.reward for t in row]
            if env:  # the outcome beyond the env's turn rewards (a `rewards:` score) is the last turn's
                env[-1] += outcome[i] - math.fsum(env)
            try:
                rewards.append(info_gain_rewards(env, inp.answer_logp[i], self.w))
            except ValueError as e:
                raise ValueError(
                    f"advantage 'igpo': response {i} (record {inp.indices[i // G]}): {e}"
                ) from None
        values: list[list[float]] = []
        for b in range(0, len(turns), G):
            task, rows = rewards[b : b + G], turns[b : b + G]
            if self.baseline == "pooled":
                z = unflatten(pooled_zscore([r for row in task for r in row], self.eps), rows)
                values += [discounted_returns(row, self.gamma) for row in z]
            else:
                returns = [R for row in task for R in discounted_returns(row, self.gamma)]
                index = [t for row in rows for t in range(len(row))]
                values += unflatten(group_relative(returns, index, "mean_norm", self.eps)[0], rows)
        p = [[math.exp(v) for v in row] for row in inp.answer_logp if row]
        gains = [b - a for row in p for a, b in zip(row, row[1:])]
        return values, {
            "igpo/p_first": sum(row[0] for row in p) / max(len(p), 1),
            "igpo/p_last": sum(row[-1] for row in p) / max(len(p), 1),
            "igpo/gain_mean": sum(gains) / max(len(gains), 1),
            "igpo/gain_positive": sum(g > 0 for g in gains) / max(len(gains), 1),
        }
