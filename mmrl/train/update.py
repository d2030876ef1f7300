"""The update stage: ``algo.epochs`` passes over one rollout batch, each ``algo.mini_batches`` optimizer steps, each
accumulated over micro-batches of ``optim.micro_batch_size`` rows (docs/algorithms.md#grpo-family).

Every method is looked up by name and called through one shape, so nothing here branches on a method's name:
- the policy loss ``LOSSES[algo.loss](logp, old_logp, adv, mask, group_ids=..., **options)`` gives token losses
  (a loss that declares ``entropy`` also gets the forward's token entropy, detached; one registered
  ``needs_entropy_grad`` gets it with its gradient, one ``needs_turns`` each token's ``turn_index``, one
  ``needs_off_policy`` ``off_policy``: 1 on the tokens of the batch's ``off_policy_rows``);
  its options are the clip fields it declares plus ``algo.loss_options``; a loss marked ``needs_whole_groups``
  gets micro-batches that never split a prompt's group; the rollout correction's weights
  (``batch.rollout_weights``, :mod:`mmrl.algos.rollout_correction`) multiply them; a stateful loss (a class,
  :class:`mmrl.algos.losses.StatefulLoss`) is made once with its options, its step sums reach its ``end_step`` once
  per step (:meth:`PolicyUpdate.end_step`, called by the trainer) and its state rides in checkpoints;
- the aggregation ``AGGREGATIONS[algo.loss_agg]`` turns token losses into numerators and units that add up across
  micro-batches, so the accumulated gradient equals the whole mini-batch's (tested);
- the KL to the reference (``KL_ESTIMATORS[algo.kl_estimator]``) is a loss term when ``algo.kl_in: loss`` (as a
  reward penalty it is applied before the advantages, in the trainer);
- an entropy bonus subtracts ``algo.entropy_coef`` x the aggregated token entropy (with its gradient).

Mini-batches are drawn from the batch's global rows with a generator seeded by (seed, step), so every process of a
multi-process run draws the same ones and the update does not depend on the number of processes. Each mini-batch is
split over the processes afresh, balanced (:meth:`mmrl.distributed.Dist.balanced`: the same number of rows or whole
groups each, tokens spread longest first), so no rank waits on a larger share (every rank holds every row's
trajectory, gathered after the rollout). Each process back-propagates its share over the global
mini-batch's units, and gradients are summed across processes before clipping (:mod:`mmrl.distributed`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mmrl.algos import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOSSES,
    proximal_logprobs,
    reduce_stats,
    rollout_correction,
    turn_index,
)
from mmrl.algos.advantages import Turn
from mmrl.algos.losses import StatefulLoss, add_padded
from mmrl.config import Config
from mmrl.distributed import Dist
from mmrl.model.policy import Policy
from mmrl.model.prompt import EncodedPrompt
from mmrl.rollout.base import Completion
from mmrl.rollout.episodes import Trajectory, trajectory_logprobs
from mmrl.types import Sample

CLIP_FIELDS = ("clip_low", "clip_high", "dual_clip")


@dataclass
class RolloutBatch:
    """One step's rollouts, one row per trajectory (a single-turn sample is an episode of one turn), prompt-major:
    the G episodes of prompt b are rows b*G .. b*G+G-1. Every row is scored the one way
    (:func:`mmrl.rollout.episodes.trajectory_logprobs`): its first prompt, then its whole response, the sampled
    tokens (mask 1) scored, an environment's tokens (mask 0) only read."""

    trajectories: list[Trajectory]  # [N]
    group_size: int  # G
    old_logp: torch.Tensor  # [N, T]
    ref_logp: torch.Tensor | None = None  # [N, T]
    entropy: torch.Tensor | None = None  # [N, T] under pi_old, for estimators that need it
    advantages: torch.Tensor | None = None  # [N] or [N, T]
    rows: list[int] | None = None  # the rows this process scores in the no-grad passes (None: all)
    rollout_weights: torch.Tensor | None = None  # [N, T] detached token-loss weights (rollout correction)
    off_policy_rows: set[int] = field(default_factory=set)  # rows generated from another context (augmenters)
    placed_rows: set[int] = field(
        default_factory=set
    )  # every row an augmenter placed (off-policy or fixed advantage)

    @classmethod
    def of(cls, trajectories: list[list[Trajectory]]) -> RolloutBatch:
        """The batch of ``[B][G]`` trajectories, pi_old the rollout log-probs (0 on environment tokens)."""
        flat = [t for row in trajectories for t in row]
        old = torch.zeros(len(flat), max(1, max((len(t.response) for t in flat), default=0)))
        for i, t in enumerate(flat):
            old[i, : len(t.logprobs)] = torch.tensor(t.logprobs)
        return cls(flat, len(trajectories[0]), old)

    @classmethod
    def one_turn(
        cls,
        prompts: list[EncodedPrompt],
        completions: list[list[int]],
        group_size: int,
        old_logp: torch.Tensor,
        **fields: Any,
    ) -> RolloutBatch:
        """A batch of one-turn episodes, row i ``prompts[i]`` answered by ``completions[i]`` (a prompt object shared by
        rows shares its media encoding, as a group's does), with ``old_logp`` and any other field given: for
        callers that hold encoded prompts rather than a rollout (benchmarks, tests)."""
        trajs = []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            t = Trajectory.start(f"row-{i}", Sample(f"row-{i // group_size}", []), p, f"row-{i}")
            n = len(c)
            t.add_completion(Completion(list(c), "", old_logp[i, :n].tolist(), "stop"))
            t.end = "single_turn"
            trajs.append(t)
        return cls(trajs, group_size, old_logp, **fields)

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def local_rows(self) -> list[int]:
        return list(range(len(self))) if self.rows is None else self.rows

    def tokens(self, row: int) -> int:
        """Prompt + response tokens of ``row``."""
        return self.trajectories[row].length

    def blocks(self, rows: list[int], unit: int) -> tuple[list[list[int]], list[float]]:
        """``rows`` in blocks of ``unit`` and each block's tokens."""
        blocks = [rows[i : i + unit] for i in range(0, len(rows), unit)]
        return blocks, [float(sum(self.tokens(r) for r in b)) for b in blocks]

    def versions(self, default: int) -> torch.Tensor:
        """``[N, T]`` the policy version that sampled each response token (``Completion.versions``; ``default`` for
        a completion whose engine records none, and on the environment's tokens and padding)."""
        out = torch.full(self.old_logp.shape, default, dtype=torch.long)
        for i, t in enumerate(self.trajectories):
            sampled = [j for j, m in enumerate(t.mask) if m]
            vs = [v for c in t.completions for v in (c.versions or [default] * len(c.token_ids))]
            if len(vs) == len(sampled):
                out[i, sampled] = torch.tensor(vs, dtype=torch.long)
        return out

    @property
    def turns(self) -> list[list[Turn]] | None:
        """Each row's turns, for the multi-turn estimators; None when no row stepped an environment: each row is
        then one turn over its whole response, rewarded by the run's rewards (:func:`mmrl.algos.multiturn.read_turns`)."""
        if not any(t.steps for t in self.trajectories):
            return None
        return [list(t.turns) for t in self.trajectories]

    @property
    def mask(self) -> torch.Tensor:  # [N, T]: 1 on sampled tokens (not on padding, not on the env's tokens)
        T = self.old_logp.shape[1]
        # made from the host-side masks in one factory call (a planner's fake-tensor run keeps a real copy of it)
        return torch.tensor(
            [t.mask + [0] * (T - len(t.mask)) for t in self.trajectories], dtype=torch.bool
        ).float()

    def logprobs(
        self, policy: Policy, rows: list[int], **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The training forward of ``rows``: ``(logp, entropy, mask)``, each ``[len(rows), T]`` with T the longest
        of their responses."""
        kwargs.setdefault("with_entropy", True)
        return trajectory_logprobs(policy, [self.trajectories[j] for j in rows], **kwargs)


def loss_options(cfg: Config) -> dict[str, Any]:
    """The clip fields the loss declares, plus ``algo.loss_options``."""
    params = inspect.signature(LOSSES.get(cfg.algo.loss)).parameters
    opts = {k: getattr(cfg.algo, k) for k in CLIP_FIELDS if k in params}
    return opts | dict(cfg.algo.loss_options)


def micro_batches(batch: RolloutBatch, rows: list[int], unit: int, cfg: Config) -> list[list[int]]:
    """This process's ``rows`` in micro-batches, blocks of ``unit`` rows (whole groups when a loss needs them) kept
    together. ``optim.micro_batch_size`` rows in draw order; or, with ``optim.micro_batch_tokens``, blocks sorted by
    length (prompt + completion tokens) and packed first-fit into micro-batches of at most that many tokens (a
    longer block alone), so rows of like length share a micro-batch (little padding where the family cannot pack)
    and a packed micro-batch holds a steady number of tokens."""
    budget = cfg.optim.micro_batch_tokens
    if budget <= 0:
        size = max(unit, cfg.optim.micro_batch_size // unit * unit)
        return [rows[s : s + size] for s in range(0, len(rows), size)]
    blocks, costs = batch.blocks(rows, unit)
    bins: list[tuple[float, list[int]]] = []
    for b in sorted(range(len(blocks)), key=lambda b: (-costs[b], b)):
        block, n = blocks[b], costs[b]
        for k, (used, members) in enumerate(bins):
            if used + n <= budget:
                bins[k] = (used + n, members + block)
                break
        else:
            bins.append((n, list(block)))
    return [members for _, members in bins]


class PolicyUpdate:
    def __init__(
        self,
        cfg: Config,
        policy: Policy,
        opt: torch.optim.Optimizer,
        sched: Any,
        temperature: float,
        dist: Dist | None = None,
    ):
        a = cfg.algo
        self.cfg, self.policy, self.opt, self.sched, self.temperature = cfg, policy, opt, sched, temperature
        self.dist = dist or Dist()
        if self.dist.active and not policy.distributed:
            raise ValueError(
                f"a process group of {self.dist.world} but the policy is neither replicated nor sharded: call "
                "policy.replicate(dist) (DDP sums the gradients) or policy.shard() (FSDP2) before the update"
            )
        entry, self.loss_kwargs = LOSSES.get(a.loss), loss_options(cfg)
        if inspect.isclass(entry):  # a stateful loss: one per run, made with its options
            entry, self.loss_kwargs = entry(**self.loss_kwargs), {}
        self.loss_fn: Callable = entry
        self.agg = AGGREGATIONS.get(a.loss_agg)
        self.constant = a.loss_agg_constant or float(cfg.rollout.max_new_tokens)
        self.kl_fn = KL_ESTIMATORS.get(a.kl_estimator) if a.kl_coef > 0 and a.kl_in == "loss" else None
        self.whole_groups = bool(getattr(self.loss_fn, "needs_whole_groups", False))
        self.collective_loss = bool(getattr(self.loss_fn, "collective", False))
        # a loss that declares ``entropy`` gets the training forward's token entropy, with its gradient if it asks
        self.entropy_grad = bool(getattr(self.loss_fn, "needs_entropy_grad", False))
        self.loss_reads_entropy = "entropy" in inspect.signature(self.loss_fn).parameters
        self.loss_reads_turns = bool(getattr(self.loss_fn, "needs_turns", False))
        self.loss_reads_off_policy = bool(getattr(self.loss_fn, "needs_off_policy", False))
        self.token_turns: torch.Tensor | None = None  # [N, T] this step's turn indices, when read
        self.sums: dict[str, torch.Tensor] = {}  # this step's sums of the loss's 1-D stats (this rank's)
        self.tokens = 0  # tokens through the training forward in the last call (for tokens/s)

    def __call__(self, batch: RolloutBatch, step: int = 0) -> dict[str, float]:
        """Update on ``batch``, the weights of version ``step`` (the trainer's steps so far) becoming ``step + 1``."""
        a, N = self.cfg.algo, len(batch)
        self._version = step  # v_prox of algo.old_logprobs: interpolate
        lr = self.sched.get_last_lr()[0]  # the rate this update uses (the scheduler steps after it)
        unit = batch.group_size if self.whole_groups else 1  # rows move in blocks of whole groups when needed
        gen = torch.Generator().manual_seed(self.cfg.train.seed * 1_000_003 + step)  # same on every process
        steps: list[dict[str, float]] = []
        self.tokens, self.sums = 0, {}
        if self.loss_reads_turns:  # a single-turn row is one turn over its whole response
            T = batch.old_logp.shape[1]
            self.token_turns = turn_index(batch.turns or [[Turn(0, T, 0.0, "")]] * N, T)
        for _ in range(a.epochs):
            blocks = torch.randperm(N // unit, generator=gen).tolist()
            per_step = math.ceil(len(blocks) / a.mini_batches)
            for s in range(0, len(blocks), per_step):
                rows = [b * unit + j for b in blocks[s : s + per_step] for j in range(unit)]
                steps.append(self._optimizer_step(batch, rows, unit))
        out = {k: sum(st[k] for st in steps) / len(steps) for k in steps[0]}
        return out | {"lr": lr} | self.end_step()

    def end_step(self) -> dict[str, float]:
        """At the end of each update (``__call__``), on every rank: a stateful loss folds the step into its state from its
        step sums over every rank's micro-batches (added in rank order: the same numbers on every rank); its stats.
        Nothing for a loss function."""
        if not isinstance(self.loss_fn, StatefulLoss):
            return {}
        total: dict[str, torch.Tensor] = {}
        for sums in self.dist.gather(self.sums):
            for k, v in sums.items():
                total[k] = add_padded(total.get(k), v)
        return self.loss_fn.end_step(total)

    def loss_state_dict(self) -> dict[str, Any]:
        """The loss's state across steps, for the checkpoint (a loss function keeps none)."""
        return self.loss_fn.state_dict() if isinstance(self.loss_fn, StatefulLoss) else {}

    def load_loss_state_dict(self, state: dict[str, Any]) -> None:
        if isinstance(self.loss_fn, StatefulLoss):
            self.loss_fn.load_state_dict(state)
        elif state:
            raise ValueError(
                f"loss {self.cfg.algo.loss!r} keeps no state, but the checkpoint holds {sorted(state)}"
            )

    def _optimizer_step(self, batch: RolloutBatch, rows: list[int], unit: int) -> dict[str, float]:
        pol = self.policy
        full_mask = batch.mask
        # the global mini-batch's denominator (every aggregation's units add up over any split of the rows)
        units = self.agg.units(full_mask[rows])
        # balanced ranks: this mini-batch's blocks split over the ranks by tokens, equal counts (the mini-batch
        # itself is drawn from the global rows, so the update does not depend on the number of processes)
        mine = self.dist.balanced(*batch.blocks(rows, unit)) if self.dist.active else rows
        micros = micro_batches(batch, mine, unit, self.cfg)
        weights = [1.0] * len(micros)
        # zero-weight padding micro-batches: under FSDP every forward is a collective, as is a collective loss's
        # call (pad to the most any rank has); under DDP every rank runs the one synchronising backward (pad a rank
        # with no rows to one)
        equal = pol.sharded or (self.collective_loss and self.dist.active)
        most = max(self.dist.gather(len(micros))) if equal else max(len(micros), int(pol.distributed))
        pad = (mine or batch.local_rows)[:unit]
        micros, weights = micros + [pad] * (most - len(micros)), weights + [0.0] * (most - len(micros))
        self.opt.zero_grad(set_to_none=True)
        acc = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "entropy": 0.0}
        parts: list[tuple[dict[str, Any], float]] = []
        for i, (part, weight) in enumerate(zip(micros, weights)):
            with pol.grad_sync(i == len(micros) - 1):  # DDP reduces once, in the last micro-batch's backward
                st, n_tok = self._micro_step(batch, part, weight, units, acc)
            if weight:
                self.tokens += int(n_tok)
                parts.append((st, n_tok))
        params = [p for p in pol.model.parameters() if p.requires_grad]
        clip = self.cfg.optim.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        if hasattr(norm, "full_tensor"):  # a DTensor under FSDP
            norm = norm.full_tensor()
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)  # gradients are not kept through generation and the weight sync
        all_parts = [x for ps in self.dist.gather(parts) for x in ps]
        return self.dist.sum(acc) | reduce_stats(all_parts) | {"grad_norm": float(norm)}

    def _micro_step(
        self, batch: RolloutBatch, part: list[int], weight: float, units: float, acc: dict[str, float]
    ) -> tuple[dict[str, float], float]:
        """Forward and backward of one micro-batch; adds its share to ``acc``; returns its loss statistics and
        token count (a zero-weight padding micro-batch runs both passes and counts nothing)."""
        a, dev, pol = self.cfg.algo, self.policy.device, self.policy
        logp, ent, mask = batch.logprobs(
            pol, part, temperature=self.temperature, entropy_grad=a.entropy_coef != 0 or self.entropy_grad
        )
        T = logp.shape[1]
        adv = batch.advantages[part]
        adv = (adv[:, :T] if adv.dim() == 2 else adv).to(dev)
        group_ids = torch.tensor([i // batch.group_size for i in part], device=dev)
        extra = {"entropy": ent if self.entropy_grad else ent.detach()} if self.loss_reads_entropy else {}
        if self.loss_reads_turns:
            extra["turn_index"] = self.token_turns[part, :T].to(dev)
        if self.loss_reads_off_policy:
            off = torch.tensor([float(j in batch.off_policy_rows) for j in part], device=dev)
            extra["off_policy"] = off[:, None] * mask
        old = batch.old_logp[part, :T].to(dev)
        rollout_weights = None if batch.rollout_weights is None else batch.rollout_weights[part, :T].to(dev)
        if a.old_logprobs == "interpolate":  # pi_prox per token from mu, pi_theta and each token's version
            v = self._version
            versions = batch.versions(v)[part, :T].to(dev)
            mu, old = old, proximal_logprobs(old, logp, versions, v_prox=v, v_theta=v + 1)
            rollout_weights, _ = rollout_correction(
                a.rollout_correction, old, mu, mask, cap=a.rollout_correction_cap
            )
        tok_loss, st = self.loss_fn(logp, old, adv, mask, group_ids=group_ids, **self.loss_kwargs, **extra)
        vectors = [k for k, v in st.items() if torch.is_tensor(v) and v.dim() > 0]  # step sums, not logged
        sums = {k: st.pop(k) for k in vectors}
        if rollout_weights is not None:  # algo.rollout_correction: pi_old / pi_rollout, capped/masked
            tok_loss = tok_loss * rollout_weights
        pg = self.agg.numerator(tok_loss, mask, self.constant) / units
        loss = pg
        if self.kl_fn is not None and batch.ref_logp is not None:
            kl = self.agg.numerator(self.kl_fn(logp, batch.ref_logp[part, :T].to(dev)), mask, self.constant)
            loss = loss + a.kl_coef * kl / units
            acc["kl"] += weight * kl.item() / units
        ent_term = self.agg.numerator(ent, mask, self.constant) / units
        if a.entropy_coef:
            loss = loss - a.entropy_coef * ent_term
        if not weight:  # padding (FSDP, DDP): the forward and backward run, nothing is counted
            (loss * 0.0).backward()
            return {}, 0.0
        # FSDP averages gradients over ranks; the loss is already divided by the global units: undo the mean
        (loss * self.dist.world if pol.sharded else loss).backward()
        for k, v in sums.items():
            self.sums[k] = add_padded(self.sums.get(k), v)
        acc["loss"] += loss.item()
        acc["pg_loss"] += pg.item()
        acc["entropy"] += ent_term.item()
        return {k: float(v) for k, v in st.items()}, float(mask.sum())
