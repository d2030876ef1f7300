"""Batch building: sample -> encode -> rollout -> reward, and DAPO's dynamic sampling around those stages.

Without dynamic sampling one round fills the batch. With ``algo.dynamic_sampling`` (DAPO, ALGORITHMS.md §1) a round's
groups whose rewards are all equal carry no group-relative signal and are dropped; rounds repeat (the sampler picks
fresh prompts each time) until ``train.prompts_per_step`` informative groups are kept, for at most
``algo.max_sampling_tries`` rounds, after which the step fails with the informative fraction seen, so a run whose
prompts are all too easy or too hard stops with a reason instead of spinning. Surplus informative groups of the last
round are left out. The sampler hears about every group that was generated (VADE learns from dropped groups too).

With several processes (:mod:`mmrl.distributed`) each rank generates and rewards its share of a round's groups, and
the outcomes (completions, rewards, reward results) are gathered: every rank then holds the whole batch and decides
the same, while ``prompts`` are encoded only for the rank's own share (``None`` elsewhere).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmrl.config import Config
from mmrl.distributed import Dist
from mmrl.policy import EncodedPrompt, Policy
from mmrl.prompt_cache import PromptCache
from mmrl.rewards.compose import CompositeReward
from mmrl.rollout import SamplingParams
from mmrl.rollout.base import Completion
from mmrl.types import RewardInput, Sample

ROLLOUTS_LOGGED = 2  # groups per step written to rollouts.jsonl (and kept rendered with train.keep_renders)


class SamplingExhausted(RuntimeError):
    """Dynamic sampling found too few informative groups within its tries."""


def reward_inputs(
    sample: Sample,
    prompt: EncodedPrompt,
    texts: list[str],
    lengths: list[int],
    render_dir: Path | None = None,
) -> list[RewardInput]:
    """What the rewards see for one group; with ``render_dir``, response j's renders go to ``render_dir-j``."""
    meta = {
        **sample.metadata,
        "image_sizes": prompt.image_sizes,
        "model_image_sizes": prompt.model_image_sizes,
        "coordinate_frame": prompt.coordinate_frame,
    }
    return [
        RewardInput(
            sample.id,
            prompt.response_prefix + t,
            sample.answer,
            sample.prompt_text,
            list(sample.images),
            {**meta, "response_tokens": n} | ({"render_dir": f"{render_dir}-{j}"} if render_dir else {}),
        )
        for j, (t, n) in enumerate(zip(texts, lengths))
    ]


@dataclass
class Collected:
    indices: list[int]  # [B] dataset indices
    samples: list[Sample]
    prompts: list[EncodedPrompt | None]  # this rank's share encoded, None elsewhere
    groups: list[list[Completion]]  # [B][G]
    rewards: torch.Tensor | None  # [B, G]; None until resolve() while rewards are still being computed
    results: list[Any]  # [B*G] reward results (parts, errors)
    stats: dict[str, float] = field(default_factory=dict)
    pending: Callable[[], tuple[torch.Tensor, list[Any]]] | None = None

    def resolve(self) -> Collected:
        """Wait for rewards still being computed (``train.overlap_rewards``); a no-op once they are in. Call it on
        every rank: the ranks' rewards are gathered here."""
        if self.pending is not None:
            self.rewards, self.results = self.pending()
            self.pending = None
        return self


class Collector:
    def __init__(
        self,
        cfg: Config,
        data: list[Sample],
        policy: Policy,
        engine: Any,
        sampler: Any,
        reward: CompositeReward,
        stage: Callable[[str], AbstractContextManager],
        dist: Dist,
        render_root: Path | None = None,
    ):
        self.cfg, self.data, self.policy, self.engine = cfg, data, policy, engine
        self.sampler, self.reward, self.stage, self.dist = sampler, reward, stage, dist
        self.cache = PromptCache(cfg.train.prompt_cache_mb * 2**20)
        self.render_root = render_root  # DIR/renders, for train.keep_renders
        self.step = 0  # the step being collected
        self.errors: list[dict[str, Any]] = []  # reward failures of the current step
        self.reward_seconds = (
            0.0  # time spent scoring this step (in the background thread), for time/reward_compute
        )
        self._thread: ThreadPoolExecutor | None = None

    def generation_weights(self):
        """Around generation: under FSDP the policy's full weights, gathered once on every rank (no per-token
        collectives) for an engine that generates with them (HF); an engine that keeps its own copy (vLLM,
        ``owns_weights``) needs no gather. Call it on every rank."""
        return nullcontext() if getattr(self.engine, "owns_weights", False) else self.policy.full_weights()

    def encode(self, sample: Sample) -> EncodedPrompt:
        return self.cache.get(sample, self.policy.encode)

    def sampling_params(self, eval_mode: bool = False) -> SamplingParams:
        r, e = self.cfg.rollout, self.cfg.eval
        if eval_mode:
            max_new = e.max_new_tokens or r.max_new_tokens
            return SamplingParams(1, e.temperature, r.top_p, r.top_k, max_new)
        return SamplingParams(r.n, r.temperature, r.top_p, r.top_k, r.max_new_tokens)

    def score(
        self,
        samples: list[Sample],
        prompts: list[EncodedPrompt],
        groups,
        render_dirs: list[Path | None] | None = None,
    ) -> tuple[torch.Tensor, list]:
        dirs = render_dirs or [None] * len(samples)
        inputs = [
            ri
            for s, p, g, d in zip(samples, prompts, groups, dirs)
            for ri in reward_inputs(s, p, [c.text for c in g], [len(c.token_ids) for c in g], d)
        ]
        results = self.reward(inputs)
        return torch.tensor([r.score for r in results], dtype=torch.float32).view(len(samples), -1), results

    def render_dir(self, b: int, sample: Sample) -> Path | None:
        """Where group b's renders go (``DIR/renders/step-N/<id>``, plus ``-j`` per response), when
        ``train.keep_renders``: the first groups of each round, which are the ones rollouts.jsonl logs (under dynamic
        sampling the logged groups may come from later rounds; keyed by id, a render never lands on another row)."""
        if not self.cfg.train.keep_renders or self.render_root is None or b >= ROLLOUTS_LOGGED:
            return None
        from mmrl.rewards.latex_table import render_stem

        return self.render_root / f"step-{self.step}" / render_stem(sample.id)

    def one_round(self, k: int, overlap: bool = False) -> Collected:
        """One round of ``k`` groups. The rewards of each chunk of groups start (in a background thread, heavy ones
        in the reward pool) as soon as the chunk is generated, overlapping the next chunk's generation; with
        ``overlap`` they may still be running when this returns (the trainer's old/reference log-prob passes overlap
        them; :meth:`Collected.resolve` waits), else they are waited for here."""
        mine = self.dist.share(k)
        with self.stage("sample"):
            idx = self.sampler.select(k)  # global: every rank picks the same
            samples = [self.data[i] for i in idx]
        with self.stage("encode"):
            prompts: list[EncodedPrompt | None] = [
                self.encode(s) if b in mine else None for b, s in enumerate(samples)
            ]
        local = [prompts[b] for b in mine]
        # chunks: the HF engine generates batch_size prompts at a time anyway; an engine that schedules the whole
        # batch itself (vLLM) gets it at once
        whole = getattr(self.engine, "owns_weights", False) or not self.cfg.train.overlap_rewards
        chunk = len(local) if whole else max(1, int(getattr(self.engine, "batch_size", len(local) or 1)))
        groups_local: list[list[Completion]] = []
        futures: list[Future] = []
        with self.stage("rollout"):
            with self.generation_weights():
                for s in range(0, len(local), max(1, chunk)):
                    part = self.engine.generate(local[s : s + chunk], self.sampling_params())
                    groups_local += part
                    bs = list(mine)[s : s + chunk]
                    futures.append(
                        self._reward_thread().submit(
                            self._timed_score,
                            [samples[b] for b in bs],
                            local[s : s + chunk],
                            part,
                            [self.render_dir(b, samples[b]) for b in bs],
                        )
                    )

        def finish() -> tuple[torch.Tensor, list[Any]]:
            with self.stage("reward"):  # the wait: rewards computed meanwhile do not count here
                done = [f.result() for f in futures]
                G = self.cfg.rollout.n
                rewards_local = torch.cat([d[0] for d in done]) if done else torch.zeros(0, G)
                results_local = [r for d in done for r in d[1]]
                parts = self.dist.gather((rewards_local, results_local))
            rewards = torch.cat([part[0] for part in parts])  # [k, G]
            results = [r for part in parts for r in part[1]]
            self.errors += [e for r in results for e in r.errors]
            self.sampler.update(idx, rewards)
            return rewards, results

        groups = [g for part in self.dist.gather(groups_local) for g in part]
        got = Collected(idx, samples, prompts, groups, None, [], pending=finish)
        return got if overlap else got.resolve()

    def _timed_score(self, *args: Any) -> tuple[torch.Tensor, list]:
        t0 = time.perf_counter()
        try:
            return self.score(*args)
        finally:
            self.reward_seconds += time.perf_counter() - t0

    def _reward_thread(self) -> ThreadPoolExecutor:
        """One background thread: rewards are scored in order, one chunk at a time (the composite reward and its
        pool are not shared between threads)."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmrl-reward")
        return self._thread

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def collect(self, step: int) -> Collected:
        """Step ``step``'s batch of ``train.prompts_per_step`` groups (only informative ones under dynamic sampling)."""
        k, a = self.cfg.train.prompts_per_step, self.cfg.algo
        self.errors, self.step, self.reward_seconds = [], step, 0.0
        if not a.dynamic_sampling:  # rewards may still be running: the trainer resolves them
            got = self.one_round(k, overlap=self.cfg.train.overlap_rewards)
            got.stats = {"rollout/groups_generated": float(k), "rollout/sampling_rounds": 1.0}
            return got
        kept: list[Collected] = []
        generated = informative = 0
        for rounds in range(1, a.max_sampling_tries + 1):
            got = self.one_round(k)
            keep = [b for b in range(k) if bool(got.rewards[b].std() > 0)] if got.rewards.shape[1] > 1 else []
            generated, informative = generated + k, informative + len(keep)
            kept.append(_select(got, keep))
            if informative >= k:
                out = _select(_concat(kept), list(range(k)))
                out.stats = {
                    "rollout/groups_generated": float(generated),
                    "rollout/sampling_rounds": float(rounds),
                }
                return out
        raise SamplingExhausted(
            f"dynamic sampling kept {informative} informative groups (rewards not all equal) of {generated} generated "
            f"in {a.max_sampling_tries} rounds, {informative / generated:.1%}, but a batch needs {k}: the prompts are "
            "too easy or too hard for the policy, or rollout.n is 1; raise algo.max_sampling_tries, change the data, "
            "or turn algo.dynamic_sampling off"
        )


def _select(c: Collected, keep: list[int]) -> Collected:
    G = c.rewards.shape[1]
    return Collected(
        [c.indices[b] for b in keep],
        [c.samples[b] for b in keep],
        [c.prompts[b] for b in keep],
        [c.groups[b] for b in keep],
        c.rewards[keep],
        [r for b in keep for r in c.results[b * G : (b + 1) * G]],
    )


def _concat(parts: list[Collected]) -> Collected:
    return Collected(
        [i for p in parts for i in p.indices],
        [s for p in parts for s in p.samples],
        [x for p in parts for x in p.prompts],
        [g for p in parts for g in p.groups],
        torch.cat([p.rewards for p in parts]),
        [r for p in parts for r in p.results],
    )
