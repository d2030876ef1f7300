"""Hint scaffolding for groups that teach nothing (docs/cliff.md#ghpo, docs/cliff.md#scaf-grpo): batch augmenters
(:mod:`mmrl.train.augment`) that re-pose a failed prompt with a hint from its reference, as little as needed.

A group *fails* when every reward is at most ``fail_at`` (GHPO's test: the accuracy reward <= 0 for all G samples).
The hints come from a registered hint builder (``hints``, :mod:`mmrl.train.hints`): a ladder from the least to the
most revealing. The hinted prompt is the record with the hint appended to its question (its images and videos
unchanged, :func:`mmrl.train.hints.with_hint`): it is encoded, generated from and scored like any prompt, and the
update trains the hinted responses conditioned on the hinted prompt (both papers' default), so they stay on-policy
for their context.

- ``ghpo``: every failed group is generated again, G new samples, from the hint of rung 1; groups that still fail
  from rung 2, then rung 3 (``max_rungs`` stages, GHPO's 25%, 50%, 75% of the reference with ``reference_prefix``).
  The first hinted group with a reward above ``fail_at`` replaces the original group, rewards included. A group
  that fails at every rung keeps its original samples (all-wrong either way: no gradient under GRPO).
- ``scaf``: after ``warmup_steps`` steps (the exemption period), each rung of a failed group's ladder is sampled once
  (``slots`` samples, 1 by default; all rungs of all failed groups in one engine call); the lowest rung with a reward
  reaching ``success_at`` puts its successful samples in place of the group's first responses, their rewards with
  them, so the group reads 1 right and G - 1 wrong and GRPO's advantage applies.

Stats: ``<name>/extra_samples`` (responses the hints cost this step), ``<name>/failed_groups`` (failed groups before hints), ``<name>/rescued`` (groups a hint changed), ``<name>/rung``
(mean rung used over the rescued; 1 = least revealing), ``<name>/hinted_rows`` (rows now from hinted prompts).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mmrl.config import Config
from mmrl.train.augment import AUGMENTERS, Augmenter, put_row
from mmrl.train.hints import HINTS, with_hint


class HintPass(Augmenter):
    """Shared by GHPO and Scaf-GRPO: the hint builder, the failure test, the replacement of rows."""

    name = ""

    def __init__(self, *, hints: str = "reference_prefix", fail_at: float = 0.0):
        try:
            self.hints = HINTS.get(hints)
        except KeyError as e:
            raise ValueError(
                f"augment {self.name!r}: hints: {e.args[0]} (algo.augment_options.hints)"
            ) from None
        self.hint_name, self.fail_at = hints, fail_at

    def check(self, cfg: Config) -> None:
        if cfg.rollout.placement == "separate":
            raise ValueError(
                f"algo.augment {self.name!r} re-generates in the trainer's collector, which the separate placement "
                "does not run; use rollout.placement: colocated"
            )
        if cfg.algo.dynamic_sampling:
            raise ValueError(
                f"algo.augment {self.name!r} re-poses the groups that failed, but algo.dynamic_sampling drops them "
                "before it sees them: turn one of them off"
            )

    def failed(self, got: Any) -> list[int]:
        got.resolve()
        return [b for b in range(len(got.indices)) if bool((got.rewards[b] <= self.fail_at).all())]

    def ladders(self, got: Any, groups: list[int]) -> dict[int, list[str]]:
        out = {}
        for b in groups:
            s = got.samples[b]
            try:
                out[b] = list(self.hints(s))
            except Exception as e:  # a builder's bug on one record names the record and stops the run
                raise ValueError(f"record {s.id!r}: hint builder {self.hint_name!r} failed: {e}") from e
        return out

    def stats(self, failed: int, rungs: list[int], rows: int, extra: int = 0) -> dict[str, float]:
        n = self.name
        return {
            f"{n}/extra_samples": float(extra),
            f"{n}/failed_groups": float(failed),
            f"{n}/rescued": float(len(rungs)),
            f"{n}/rung": sum(rungs) / len(rungs) if rungs else 0.0,
            f"{n}/hinted_rows": float(rows),
        }


@AUGMENTERS.register("ghpo")
class GHPOPass(HintPass):
    """GHPO: failed groups re-generated whole from hinted prompts, rung by rung, until one succeeds."""

    name = "ghpo"

    def __init__(self, *, hints: str = "reference_prefix", fail_at: float = 0.0, max_rungs: int = 3):
        super().__init__(hints=hints, fail_at=fail_at)
        if max_rungs < 1:
            raise ValueError(f"augment 'ghpo': max_rungs must be >= 1, got {max_rungs}")
        self.max_rungs = max_rungs

    def __call__(self, collector: Any, got: Any) -> Any:
        failed = self.failed(got)
        ladders = self.ladders(got, failed)
        todo, rungs, rows, extra = [b for b in failed if ladders[b]], [], 0, 0
        params = collector.sampling_params()
        for rung in range(self.max_rungs):
            todo = [b for b in todo if rung < len(ladders[b])]
            if not todo:
                break
            hinted = [with_hint(got.samples[b], ladders[b][rung]) for b in todo]
            trajs, rewards, results = collector.rollout(hinted, params)
            extra += rewards.numel()
            still = []
            G = rewards.shape[1]
            for n, (b, row, r) in enumerate(zip(todo, trajs, rewards)):
                if bool((r <= self.fail_at).all()):
                    still.append(b)
                    continue
                for g, t in enumerate(row):
                    put_row(got, b, g, t, float(r[g]), results[n * G + g])
                rungs.append(rung + 1)
                rows += len(row)
            todo = still
        got.stats = {**got.stats, **self.stats(len(failed), rungs, rows, extra)}
        return got


@AUGMENTERS.register("scaf")
class ScafPass(HintPass):
    """Scaf-GRPO: after the exemption period, the lowest hint rung that solves a failed group replaces its first
    response(s)."""

    name = "scaf"

    def __init__(
        self,
        *,
        hints: str = "reference_prefix",
        fail_at: float = 0.0,
        success_at: float = 1.0,
        warmup_steps: int = 50,
        slots: int = 1,
    ):
        super().__init__(hints=hints, fail_at=fail_at)
        if warmup_steps < 0 or slots < 1:
            raise ValueError(f"augment 'scaf': warmup_steps >= 0 and slots >= 1, got {warmup_steps}, {slots}")
        self.success_at, self.warmup, self.slots = success_at, warmup_steps, slots

    def check(self, cfg: Config) -> None:
        super().check(cfg)
        if self.slots >= cfg.rollout.n:
            raise ValueError(
                f"algo.augment 'scaf': slots ({self.slots}) must leave an unhinted response in each group of "
                f"rollout.n = {cfg.rollout.n}"
            )

    def __call__(self, collector: Any, got: Any) -> Any:
        if collector.step <= self.warmup:
            got.stats = {**got.stats, **self.stats(0, [], 0)}
            return got
        failed = self.failed(got)
        ladders = self.ladders(got, failed)
        asks = [(b, k) for b in failed for k in range(len(ladders[b]))]
        rungs, rows, extra = [], 0, len(asks) * self.slots
        if asks:
            hinted = [with_hint(got.samples[b], ladders[b][k]) for b, k in asks]
            params = replace(collector.sampling_params(), n=self.slots)
            trajs, rewards, results = collector.rollout(hinted, params)
            best: dict[int, int] = {}
            for i, (b, _) in enumerate(
                asks
            ):  # asks are in rung order within a group: the first success is lowest
                if b not in best and bool((rewards[i] >= self.success_at).any()):
                    best[b] = i
            for b, i in best.items():  # its successful samples, into the group's first slots
                right = [g for g in range(self.slots) if float(rewards[i][g]) >= self.success_at]
                for slot, g in enumerate(right):
                    put_row(got, b, slot, trajs[i][g], float(rewards[i][g]), results[i * self.slots + g])
                rungs.append(asks[i][1] + 1)
                rows += len(right)
        got.stats = {**got.stats, **self.stats(len(failed), rungs, rows, extra)}
        return got
