"""The trainer's no-grad passes over a batch (pi_old, the reference, the answer probes): this process's rows in
micro-batches, gathered so every process holds the whole batch's."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mmrl.algos import rollout_correction
from mmrl.config import AlgoConfig, Config
from mmrl.distributed import Dist
from mmrl.model.policy import Policy
from mmrl.rollout.probes import answer_probes
from mmrl.train.update import RolloutBatch, micro_batches


@torch.no_grad()
def forward(
    policy: Policy,
    batch: RolloutBatch,
    cfg: Config,
    dist: Dist,
    temperature: float,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[N, T]`` (and entropies) of ``batch.local_rows``, gathered from every process."""
    logp = torch.zeros_like(batch.old_logp)
    ent = torch.zeros_like(batch.old_logp) if with_entropy else None
    rows = batch.local_rows
    micros = micro_batches(batch, rows, 1, cfg)
    # under FSDP every forward is a collective: as many as the rank with the most (the extra ones dropped)
    if policy.sharded:
        most = max(dist.gather(len(micros)))
        micros += [rows[:1]] * (most - len(micros))
    done: set[int] = set()
    for part in micros:
        if done.issuperset(part):
            batch.logprobs(policy, part)
            continue
        done.update(part)
        lp, e, _ = batch.logprobs(policy, part, temperature=temperature, with_entropy=with_entropy)
        logp[part, : lp.shape[1]] = lp.float().cpu()
        if ent is not None:
            ent[part, : e.shape[1]] = e.float().cpu()
    if dist.active:
        for r, lp, e in dist.gather((rows, logp[rows], None if ent is None else ent[rows])):
            logp[r] = lp
            if ent is not None:
                ent[r] = e
    return logp, ent


def answer_logprobs(
    policy: Policy,
    batch: RolloutBatch,
    template: str,
    score: Callable[[Policy, RolloutBatch], tuple[torch.Tensor, torch.Tensor | None]],
    dist: Dist,
) -> list[list[float]]:
    """Per row, per turn: the mean log-prob of the record's reference answer before the turn
    (:func:`mmrl.rollout.probes.answer_probes`), the probes scored by ``score`` (the trainer's no-grad forward,
    under pi_old) like the batch's rows, balanced over the processes."""
    probes, owners = answer_probes(policy, batch.trajectories, template)
    out: list[list[float]] = [[] for _ in batch.trajectories]
    if probes:
        pb = RolloutBatch(probes, 1, torch.zeros(len(probes), max(len(p.response) for p in probes)))
        if dist.active:
            pb.rows = dist.balanced(*pb.blocks(list(range(len(pb))), 1))
        logp, mask = score(policy, pb)[0], pb.mask  # [P, T] each
        mean = (logp * mask).sum(1) / mask.sum(1).clamp(min=1)  # [P]
        for i, v in zip(owners, mean.tolist()):
            out[i].append(v)
    return out


def correction(
    a: AlgoConfig,
    logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    batch: RolloutBatch,
    lags: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """``algo.rollout_correction`` of the engine's log-probs against the recomputed ones, and the mismatch numbers;
    the rows an augmenter placed (``batch.placed_rows``: another prompt's or temperature's log-probs) are no
    mismatch: left out of the numbers, weight 1. ``lags`` ``[N, T]`` (asynchronous rollouts: how many versions
    older than the proximal policy each token's sampler was) adds the mismatch per lag,
    ``rollout/logprob_diff_mean/lag<L>``: how far the behaviour policy drifts from the proximal one as it ages."""
    placed = sorted(batch.placed_rows)
    mask = batch.mask
    if placed:
        mask = mask.clone()
        mask[placed] = 0
    weights, stats = rollout_correction(
        a.rollout_correction, logp, rollout_logp, mask, cap=a.rollout_correction_cap
    )
    if lags is not None:
        stats |= mismatch_by_lag(logp, rollout_logp, mask, lags)
    if weights is not None and placed:
        weights[placed] = batch.mask[placed]
    return weights, stats


def mismatch_by_lag(
    logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, lags: torch.Tensor
) -> dict[str, float]:
    """Mean |log pi_prox - log mu| over the real tokens of each lag present (``[N, T]`` each)."""
    real = mask.bool()
    diff, lag = (logp - rollout_logp).abs()[real], lags.to(real.device)[real]
    return {
        f"rollout/logprob_diff_mean/lag{int(v)}": diff[lag == v].mean().item()
        for v in torch.unique(lag).tolist()
    }
