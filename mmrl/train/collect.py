"""Batch building: sample -> encode -> rollout -> reward, and DAPO's dynamic sampling around those stages.

Without dynamic sampling one round fills the batch. With ``algo.dynamic_sampling`` (DAPO, docs/algorithms.md#grpo-family) a round's
groups whose rewards are all equal carry no group-relative signal and are dropped; rounds repeat (the sampler picks
fresh prompts each time) until ``train.prompts_per_step`` informative groups are kept, for at most
``algo.max_sampling_tries`` rounds, after which the step fails with the informative fraction seen, so a run whose
prompts are all too easy or too hard stops with a reason instead of spinning. Surplus informative groups of the last
round are left out. The sampler hears about every group that was generated (VADE learns from dropped groups too).

Every rollout runs the episode driver (:func:`mmrl.rollout.episodes.run_episodes`): a single-turn sample is an episode
of one turn, its G completions one engine call as before; with ``rollout.env`` the episodes run in an
:class:`~mmrl.envs.EnvPool` (``rollout.episode.env_workers`` processes, folders under ``DIR/episodes``). Each group is G
:class:`~mmrl.rollout.episodes.Trajectory` objects (``Collected.trajectories``), and ``groups`` holds one
:class:`Completion` per trajectory (its whole response, environment tokens included, with the rollout log-probs: 0
on environment tokens). A trajectory's reward is the composite of ``rewards:`` on its LAST turn's text, plus in an env
its return R(tau) (the sum of its turn rewards; the parts log ``env_return``). Episode statistics (``episode/*``:
success share, turns, per-step correctness from the env's ``info["target_hit"]``, how episodes ended, env failures)
are in ``Collected.stats`` for env runs. Episode folders hold the observation images; the ones not logged to
rollouts.jsonl are removed after the step (:meth:`Collector.retire_episodes`).

Rewards overlap generation (``train.overlap_rewards``): the HF engine generates ``rollout.batch_size`` prompts at a
time and each chunk's rewards start when it is done; an engine that schedules the whole round itself (vLLM) gets it
at once and hands each group over as soon as it has finished it (:meth:`RolloutEngine.generate_streaming`), whose
rewards then start while the rest of the round generates.

With several processes (:mod:`mmrl.distributed`) each rank generates and rewards its share of a round's groups, and
the outcomes (trajectories, rewards, reward results) are gathered: every rank then holds the whole batch and decides
the same, while ``prompts`` are encoded only for the rank's own share (``None`` elsewhere; the gathered trajectories
carry theirs).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from mmrl.algos.advantages import groups_with_signal
from mmrl.config import Config
from mmrl.distributed import Dist
from mmrl.model.policy import Policy
from mmrl.model.prompt import EncodedPrompt
from mmrl.processors.errors import MediaError
from mmrl.rewards.base import LOGPROBS_KEY
from mmrl.rewards.compose import ComposedResult, CompositeReward
from mmrl.rollout import SamplingParams
from mmrl.rollout.base import Completion, RolloutEngine
from mmrl.rollout.episodes import (
    EpisodeDriver,
    Limits,
    Trajectory,
    episode_stats,
    reset_episodes,
    run_episodes,
)
from mmrl.rollout.prompt_cache import PromptCache
from mmrl.samplers.base import Sampler
from mmrl.types import RewardInput, Sample

ROLLOUTS_LOGGED = 2  # groups per step written to rollouts.jsonl (and kept rendered with train.keep_renders)
MAX_REDRAWS = 8  # rounds of fresh draws for records that fail to encode, before the step fails


def reward_uses_vllm(options: Any) -> bool:
    """Whether a reward's options (nested ones included: a judge inside a composite) load a model on vLLM."""
    if isinstance(options, dict):
        return options.get("engine") == "vllm" or any(reward_uses_vllm(v) for v in options.values())
    return False


class SamplingExhausted(RuntimeError):
    """Dynamic sampling found too few informative groups within its tries."""


def reward_inputs(
    sample: Sample,
    prompt: EncodedPrompt,
    texts: list[str],
    lengths: list[int],
    render_dir: Path | None = None,
    logprobs: list[list[float]] | None = None,
) -> list[RewardInput]:
    """What the rewards see for one group; with ``render_dir``, response j's renders go to ``render_dir-j``; with
    ``logprobs`` (the engine's, per response), response j's are ``metadata["response_logprobs"]`` (group rewards
    only: :mod:`mmrl.rewards.compose`)."""
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
            {**meta, "response_tokens": n}
            | ({"render_dir": f"{render_dir}-{j}"} if render_dir else {})
            | ({LOGPROBS_KEY: logprobs[j]} if logprobs is not None else {}),
        )
        for j, (t, n) in enumerate(zip(texts, lengths))
    ]


@dataclass
class Tally:
    """What one step's collection counted while its rewards were scored: the reward failures and the scoring time
    (in the background thread, for ``time/reward_compute``). It travels with the step's :class:`Collected`, so a
    batch produced ahead of training (:mod:`mmrl.train.producer`) keeps its own."""

    errors: list[dict[str, Any]] = field(default_factory=list)
    reward_seconds: float = 0.0


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
    trajectories: list[list[Trajectory]] = field(default_factory=list)  # [B][G]: the groups' episodes
    tally: Tally = field(default_factory=lambda: Tally())  # the step's reward errors and scoring time
    # made in another process (a separate placement's generating one, mmrl.train.placement): its stage timings and
    # the sampler's state after this batch's draw and rewards
    timings: dict[str, float] = field(default_factory=dict)
    sampler_after: dict[str, Any] | None = None
    # rows (b * G + g) whose advantage an augmenter fixed (mmrl.train.augment): the estimator's value is replaced
    fixed_advantages: dict[int, float] = field(default_factory=dict)
    # rows (b * G + g) an augmenter generated from another context and placed under the group's prompt
    off_policy_rows: set[int] = field(default_factory=set)

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
        engine: RolloutEngine,
        sampler: Sampler,
        reward: CompositeReward | None,
        stage: Callable[[str], AbstractContextManager],
        dist: Dist,
        render_root: Path | None = None,
        episode_root: Path | None = None,
        skipped_path: Path | None = None,
        augment: Any = None,
    ):
        self.cfg, self.data, self.policy, self.engine = cfg, data, policy, engine
        self.sampler, self.reward, self.stage, self.dist = sampler, reward, stage, dist
        self.cache = PromptCache(cfg.train.prompt_cache_mb * 2**20)
        self.render_root = render_root  # DIR/renders, for train.keep_renders
        self.step = 0  # the step being collected
        self.tally = Tally()  # the step being collected: its reward failures and scoring time
        self._thread: ThreadPoolExecutor | None = None
        self.episode_root = episode_root  # DIR/episodes: the env pool's folders (rollout.env)
        self._pool: Any = None
        # this rank's episode folders by the step whose batch made them (a producer running ahead makes later ones)
        self._episode_dirs: dict[int, list[Path]] = {}
        self._collecting = 0  # the step whose batch is being collected
        self.skipped_path = (
            skipped_path  # DIR/skipped.jsonl: records that failed to encode are added (rank 0)
        )
        self.bad: set[int] = (
            set()
        )  # dataset indices whose media failed to encode: never drawn into a batch again
        self.augment = augment  # algo.augment (mmrl.train.augment): changes each collected batch
        # rollout.episode.next_batch_at: whether batch t may start now (the producer's staleness bound, set by it),
        # the driver whose episodes span batches, and the batches started early: step -> (idx, prompts, samples,
        # this rank's trajectories)
        self.gate: Callable[[int], bool] | None = None
        self._driver: EpisodeDriver | None = None
        self._early: dict[
            int, tuple[list[int], list[EncodedPrompt | None], list[Sample], list[list[Trajectory]]]
        ] = {}

    @property
    def multi_turn(self) -> bool:
        return bool(self.cfg.rollout.env)

    @property
    def across(self) -> bool:
        """Whether episodes run across batches (``rollout.episode.next_batch_at``; docs/async.md#episodes-across-batches):
        the next batch's episodes start while this batch's last ones still run."""
        return self.multi_turn and self.cfg.rollout.episode.next_batch_at > 0 and self.gate is not None

    def started(self, step: int) -> bool:
        """Whether step ``step``'s batch was started early (its draw made, its episodes running)."""
        return step in self._early

    @property
    def judges_in_process(self) -> bool:
        """Whether a reward runs a vLLM engine in this process (a judge): it must not run while the policy's vLLM
        engine steps (vLLM keeps one forward context per process, and one allocator that its sleep walks whole)."""
        return any(reward_uses_vllm(r.options) for r in self.cfg.rewards)

    def pool(self) -> Any:
        """The env pool (started on first use): ``rollout.episode.env_workers`` processes, folders under DIR/episodes."""
        if self._pool is None:
            import tempfile

            from mmrl.envs import EnvPool

            root = self.episode_root or Path(tempfile.mkdtemp(prefix="mmrl-episodes-"))
            if self.dist.active:
                root = root / f"rank-{self.dist.rank}"
            self._pool = EnvPool.for_episodes(root, self.cfg.rollout.episode)
        return self._pool

    def env_stats(self) -> dict[str, int]:
        """This rank's env pool counters (:meth:`mmrl.envs.EnvPool.stats`); empty before the pool starts."""
        return self._pool.stats() if self._pool is not None else {}

    def run_episodes(
        self,
        samples: list[Sample],
        prompts: list[EncodedPrompt],
        params: SamplingParams,
        on_group: Callable[[int, list[Trajectory]], None] | None = None,
    ) -> list[list[Trajectory]]:
        """``params.n`` episodes of each sample (``[B][G]`` trajectories): one turn each (``on_group``: called with
        each group as soon as it is generated), or in the run's env (``rollout.env``) in the env pool as
        ``rollout.episode`` says."""
        r = self.cfg.rollout
        if not self.multi_turn:
            return run_episodes(self.policy, self.engine, samples, params, prompts=prompts, on_group=on_group)
        pool = self.pool()
        trajs = run_episodes(
            self.policy,
            self.engine,
            samples,
            params,
            pool=pool,
            env_name=r.env,
            settings=r.episode,
            prompts=prompts,
        )
        dirs = self._episode_dirs.setdefault(self._collecting, [])
        dirs += [pool.episode_dir(t.episode_id) for row in trajs for t in row]
        return trajs

    def retire_episodes(self, step: int, keep: set[str]) -> None:
        """Remove this rank's episode folders of step ``step``'s batch (and of any earlier one) but those of the
        episodes in ``keep`` (logged to rollouts.jsonl, whose turns name their images); the folders of batches a
        producer made ahead stay. Call it on every rank after the step is logged."""
        keep_dirs = {self._pool.episode_dir(e) for e in keep} if self._pool is not None else set()
        for t in [t for t in list(self._episode_dirs) if t <= step]:
            for d in self._episode_dirs.pop(t):
                if d not in keep_dirs:
                    shutil.rmtree(d, ignore_errors=True)

    def generation_weights(self):
        """Around generation: under FSDP the policy's full weights, gathered once on every rank (no per-token
        collectives) for an engine that generates with them (HF); an engine that keeps its own copy (vLLM,
        ``owns_weights``) needs no gather. Call it on every rank."""
        return nullcontext() if self.engine.owns_weights else self.policy.full_weights()

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
        trajs: list[list[Trajectory]],
        render_dirs: list[Path | None] | None = None,
    ) -> tuple[torch.Tensor, list]:
        """Each trajectory's reward ``[k, G]``: the composite of ``rewards:`` on its last turn's text (a one-turn
        episode's only completion), plus in an env its return (module docstring); and the results (parts, errors)."""
        G = len(trajs[0]) if trajs else 0
        flat = [t for row in trajs for t in row]
        returns = torch.tensor([t.episode_return for t in flat], dtype=torch.float32).view(len(samples), G)
        if self.reward is None:  # an env's returns alone
            results = [
                ComposedResult(float(t.episode_return), {"env_return": t.episode_return}) for t in flat
            ]
            return returns, results
        dirs = render_dirs or [None] * len(samples)
        inputs = [
            ri
            for s, row, d in zip(samples, trajs, dirs)
            for ri in reward_inputs(
                s,
                row[0].prompt,
                [t.last_completion().text for t in row],
                [len(t.last_completion().token_ids) for t in row],
                d,
                [t.last_completion().logprobs for t in row],
            )
        ]
        composed = self.reward(inputs)
        scores = torch.tensor([r.score for r in composed], dtype=torch.float32).view(len(samples), -1)
        if not self.multi_turn:
            return scores, composed
        results = [
            ComposedResult(
                float(t.episode_return) + r.score, {**r.parts, "env_return": t.episode_return}, r.errors
            )
            for t, r in zip(flat, composed)
        ]
        return returns + scores, results

    def render_dir(self, b: int, sample: Sample) -> Path | None:
        """Where group b's renders go (``DIR/renders/step-N/<id>``, plus ``-j`` per response), when
        ``train.keep_renders``: the first groups of each round, which are the ones rollouts.jsonl logs (under dynamic
        sampling the logged groups may come from later rounds; keyed by id, a render never lands on another row)."""
        if not self.cfg.train.keep_renders or self.render_root is None or b >= ROLLOUTS_LOGGED:
            return None
        from mmrl.types import render_stem

        return self.render_root / f"step-{self.step}" / render_stem(sample.id)

    def one_round(self, k: int, overlap: bool = False) -> Collected:
        """One round of ``k`` groups. The rewards of each chunk of groups start (in a background thread, heavy ones
        in the reward pool) as soon as the chunk is generated, overlapping the next chunk's generation; with
        ``overlap`` they may still be running when this returns (the trainer's old/reference log-prob passes overlap
        them; :meth:`Collected.resolve` waits), else they are waited for here."""
        mine, tally = self.dist.share(k), self.tally
        if self.across:
            return self._across_round(k, mine, tally, overlap)
        idx, prompts, samples = self._draw(k, mine)
        local = [prompts[b] for b in mine]
        # chunks: the HF engine generates batch_size prompts at a time anyway; an engine that schedules the whole
        # batch itself (vLLM) gets it at once, and each group's rewards start as soon as the engine has finished it
        # (``stream``); episodes batch every live episode of the round at each turn: one chunk
        overlapped = self.cfg.train.overlap_rewards  # (``overlap`` is whether the caller waits for them)
        whole = self.engine.owns_weights or not overlapped or self.multi_turn
        stream = (
            self.engine.owns_weights and overlapped and not self.multi_turn and not self.judges_in_process
        )
        chunk = len(local) if whole else max(1, self.engine.batch_size)
        trajs_local: list[list[Trajectory]] = []
        futures: list[Future] = []
        self.engine.take_stats()  # what an evaluation in between counted is not this round's
        with self.stage("rollout"):
            with self.generation_weights():
                for s in range(0, len(local), max(1, chunk)):
                    bs = list(mine)[s : s + chunk]
                    dirs = [self.render_dir(b, samples[b]) for b in bs]
                    mine_samples = [samples[b] for b in bs]
                    if stream:
                        trajs, slots = self._streamed(mine_samples, local[s : s + chunk], dirs, tally)
                        futures += slots
                        trajs_local += trajs
                        continue
                    trajs = self.run_episodes(mine_samples, local[s : s + chunk], self.sampling_params())
                    trajs_local += trajs
                    futures.append(
                        self._reward_thread().submit(
                            self._timed, tally, self.score, mine_samples, trajs, dirs
                        )
                    )

        return self._gathered(idx, samples, prompts, trajs_local, futures, tally, overlap)

    def _gathered(
        self,
        idx: list[int],
        samples: list[Sample],
        prompts: list[EncodedPrompt | None],
        trajs_local: list[list[Trajectory]],
        futures: list[Future],
        tally: Tally,
        overlap: bool,
    ) -> Collected:
        """A round's batch from this rank's trajectories and reward futures: the trajectories gathered from every
        rank now, the rewards when :meth:`Collected.resolve` waits for them (``overlap``) or here."""

        def finish() -> tuple[torch.Tensor, list[Any]]:
            with self.stage("reward"):  # the wait: rewards computed meanwhile do not count here
                done = [f.result() for f in futures]
                G = self.cfg.rollout.n
                rewards_local = torch.cat([d[0] for d in done]) if done else torch.zeros(0, G)
                results_local = [r for d in done for r in d[1]]
                parts = self.dist.gather((rewards_local, results_local))
            rewards = torch.cat([part[0] for part in parts])  # [k, G]
            results = [r for part in parts for r in part[1]]
            tally.errors += [e for r in results for e in r.errors]
            self.sampler.update(idx, rewards)
            return rewards, results

        # the trajectories (and through them the completions) from every rank
        trajs_all = [row for part in self.dist.gather(trajs_local) for row in part]
        groups = [[t.whole_response() for t in row] for row in trajs_all]
        got = Collected(idx, samples, prompts, groups, None, [], pending=finish, trajectories=trajs_all)
        if self.multi_turn:
            got.stats = episode_metrics(trajs_all)
        got.stats |= self.engine.take_stats()
        got.tally = tally
        return got if overlap else got.resolve()

    def _draw(
        self, k: int, mine: Any, step: int | None = None
    ) -> tuple[list[int], list[EncodedPrompt | None], list[Sample]]:
        """A round's ``k`` records (every rank picks the same), this rank's share encoded, for ``step`` (default: the
        step being collected)."""
        with self.stage("sample"):
            idx = self.sampler.select(k)
        with self.stage("encode"):
            idx, prompts = self._encode_round(idx, mine, self.step if step is None else step)
        return idx, prompts, [self.data[i] for i in idx]

    def _across_round(self, k: int, mine: Any, tally: Tally, overlap: bool) -> Collected:
        """Step ``self.step``'s round with episodes across batches (:attr:`across`): its episodes, started now or
        while the previous batch's last ones ran, are driven until all have ended; meanwhile, once at most
        ``rollout.episode.next_batch_at`` of them still run and the producer's staleness bound lets it
        (:attr:`gate`), the next batch is drawn and its episodes join the engine calls."""
        step, at = self.step, self.cfg.rollout.episode.next_batch_at
        self.engine.take_stats()
        early = step in self._early
        idx, prompts, samples, trajs = self._early.pop(step, None) or self._start(step, k, mine)
        total = sum(len(row) for row in trajs)
        driver = self._driver
        assert driver is not None and self.gate is not None

        def between() -> bool:  # True while the next batch waits for the staleness bound: ask again soon
            nxt = step + 1
            if nxt in self._early or driver.running[step] > at * total:
                return False
            if not self.gate(nxt):
                return nxt <= self.cfg.train.max_steps
            self._early[nxt] = self._start(nxt, k, mine)
            return False

        with self.stage("rollout"), self.generation_weights():
            driver.run(step, between)
        mine_samples = [samples[b] for b in mine]
        dirs = [self.render_dir(b, samples[b]) for b in mine]
        futures = [self._reward_thread().submit(self._timed, tally, self.score, mine_samples, trajs, dirs)]
        got = self._gathered(idx, samples, prompts, trajs, futures, tally, overlap)
        got.stats["async/started_early"] = float(early)  # its episodes started while the previous batch's ran
        return got

    def _start(
        self, step: int, k: int, mine: Any
    ) -> tuple[list[int], list[EncodedPrompt | None], list[Sample], list[list[Trajectory]]]:
        """Draw step ``step``'s records and start their episodes in the driver, tagged ``step``."""
        r = self.cfg.rollout
        idx, prompts, samples = self._draw(k, mine, step)
        local = [samples[b] for b in mine]
        pool, params = self.pool(), self.sampling_params()
        if self._driver is None:
            limits = Limits.of(self.policy, r.episode, params)
            self._driver = EpisodeDriver(self.policy, self.engine, pool, params, limits, r.episode.min_ready)
        trajs = reset_episodes(
            self.policy, pool, local, [prompts[b] for b in mine], params.n, r.env, r.episode.env_options
        )
        self._driver.add([t for row in trajs for t in row], step)
        self._episode_dirs.setdefault(step, []).extend(
            pool.episode_dir(t.episode_id) for row in trajs for t in row
        )
        return idx, prompts, samples, trajs

    def _streamed(
        self, samples: list[Sample], prompts: list[EncodedPrompt], dirs: list[Path | None], tally: Tally
    ) -> tuple[list[list[Trajectory]], list[Future]]:
        """The groups of ``samples`` generated at once, each group's rewards submitted as soon as the engine has
        finished it; the futures in the samples' order."""
        slots: list[Future | None] = [None] * len(samples)

        def submit(b: int, row: list[Trajectory]) -> None:
            slots[b] = self._reward_thread().submit(
                self._timed, tally, self.score, [samples[b]], [row], [dirs[b]]
            )

        trajs = self.run_episodes(samples, prompts, self.sampling_params(), on_group=submit)
        missing = [samples[b].id for b, f in enumerate(slots) if f is None]
        if missing:
            raise RuntimeError(f"the engine returned without finishing the groups of {missing}")
        return trajs, slots  # type: ignore[return-value]

    def _encode_round(
        self, idx: list[int], mine: list[int], step: int
    ) -> tuple[list[int], list[EncodedPrompt | None]]:
        """The round's prompts, this rank's share encoded. A record whose media fail to encode only now (a video
        decoder, an image the load-time checks passed: :class:`MediaError`) is skipped at this step with its reason
        (``skipped.jsonl``), never drawn again, and replaced by a fresh draw; every rank learns which failed, so all
        replace the same. After ``MAX_REDRAWS`` rounds of failures the step fails with the reasons."""
        why: dict[int, str] = {}
        for _ in range(MAX_REDRAWS):
            prompts: list[EncodedPrompt | None] = [None] * len(idx)
            failed: dict[int, str] = {}
            for b in mine:
                try:
                    prompts[b] = self.encode(self.data[idx[b]])
                except MediaError as e:
                    failed[b] = str(e)
            failed = {b: w for part in self.dist.gather(failed) for b, w in part.items()}
            if not failed:
                return idx, prompts
            new = {idx[b]: w for b, w in failed.items() if idx[b] not in self.bad}
            self.bad |= set(new)
            why |= new
            self._log_skipped(new, step)
            fresh = iter(self.sampler.select(len(failed)))
            idx = [next(fresh) if b in failed else i for b, i in enumerate(idx)]
        raise RuntimeError(
            f"step {step}: records kept failing to encode in {MAX_REDRAWS} draws ({len(self.bad)} bad so far, "
            f"e.g. {next(iter(why.values()), '?')}); see {self.skipped_path or 'skipped.jsonl'} and fix the data"
        )

    def _log_skipped(self, failed: dict[int, str], step: int) -> None:
        """Append the records that failed to encode to ``skipped.jsonl`` (rank 0), as the load-time checks do."""
        if not failed or self.skipped_path is None or not self.dist.is_main:
            return
        with self.skipped_path.open("a") as f:
            for i, reason in failed.items():
                row = {"where": f"step {step} encode", "id": self.data[i].id, "kind": "encode_failed"}
                f.write(json.dumps(row | {"reason": reason}) + "\n")

    @staticmethod
    def _timed(
        tally: Tally, score: Callable[..., tuple[torch.Tensor, list]], *args: Any
    ) -> tuple[torch.Tensor, list]:
        """``score(*args)``, its time added to the step's tally."""
        t0 = time.perf_counter()
        try:
            return score(*args)
        finally:
            tally.reward_seconds += time.perf_counter() - t0

    def _reward_thread(self) -> ThreadPoolExecutor:
        """One background thread: rewards are scored in order, one chunk at a time (the composite reward and its
        pool are not shared between threads)."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmrl-reward")
        return self._thread

    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None
        self._early.clear()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def collect(self, step: int) -> Collected:
        """Step ``step``'s batch of ``train.prompts_per_step`` groups (only informative ones under dynamic sampling),
        then what ``algo.augment`` adds."""
        self._collecting = step
        got = self._collect(step)
        return got if self.augment is None else self.augment(self, got)

    def feedback(self, metrics: dict[str, Any]) -> None:
        """A step's logged metrics, for the augmenter."""
        if self.augment is not None:
            self.augment.feedback(metrics)

    def resample(
        self, got: Collected, groups: list[int], temperature: float
    ) -> tuple[list[list[Trajectory]], torch.Tensor, list[Any]]:
        """G fresh episodes of each of ``groups`` (positions in ``got``) at ``temperature``, scored, as
        :meth:`rollout` gives them (in the order of ``groups``, the same on every rank)."""
        params = replace(self.sampling_params(), temperature=temperature)
        return self.rollout([got.samples[b] for b in groups], params)

    def rollout(
        self, samples: list[Sample], params: SamplingParams, *, cache: bool = True
    ) -> tuple[list[list[Trajectory]], torch.Tensor, list[Any]]:
        """``params.n`` episodes of each of ``samples`` (records of the dataset, or hinted copies of them), scored
        like the step's round: ``[b][n]`` trajectories, rewards ``[b, n]`` and the ``b * n`` reward results in
        order, the same on every rank (each rank generates its share; an engine with weights of its own, vLLM, is
        called on every rank, with no prompts where a rank has none, so a tensor-parallel group calls together).
        ``cache``: encode through the prompt cache (False for one-off prompts, which would evict the dataset's). The
        caller waits for the round's rewards first (:meth:`Collected.resolve`): the composite reward is not shared
        between threads."""
        mine = range(self.dist.rank, len(samples), self.dist.world)  # any number of samples: strided
        local = [samples[b] for b in mine]
        trajs: list[list[Trajectory]] = []
        rewards, results = torch.zeros(0, params.n), []
        encode = self.encode if cache else self.policy.encode
        with self.stage("rollout"), self.generation_weights():
            if local or (self.engine.owns_weights and not self.multi_turn):
                trajs = self.run_episodes(local, [encode(s) for s in local], params)
        if local:
            with self.stage("reward"):
                rewards, results = self.score(local, trajs)
        parts = self.dist.gather((list(mine), trajs, rewards, results))
        at = {}
        for idx, tr, rw, rs in parts:
            for j, b in enumerate(idx):
                at[b] = (tr[j], rw[j], rs[j * params.n : (j + 1) * params.n])
        order = range(len(samples))
        return (
            [at[b][0] for b in order],
            torch.stack([at[b][1] for b in order]) if samples else torch.zeros(0, params.n),
            [r for b in order for r in at[b][2]],
        )

    def _collect(self, step: int) -> Collected:
        k, a = self.cfg.train.prompts_per_step, self.cfg.algo
        self.tally, self.step = Tally(), step
        if not a.dynamic_sampling:  # rewards may still be running: the trainer resolves them
            got = self.one_round(k, overlap=self.cfg.train.overlap_rewards)
            got.stats |= {"rollout/groups_generated": float(k), "rollout/sampling_rounds": 1.0}
            return got
        kept: list[Collected] = []
        generated = informative = 0
        engine_stats: dict[str, float] = {}
        for rounds in range(1, a.max_sampling_tries + 1):
            got = self.one_round(k)
            engine_stats |= {key: v for key, v in got.stats.items() if not key.startswith("episode/")}
            keep = groups_with_signal(got.rewards).nonzero().flatten().tolist()  # max > min: std() of equal
            # floats such as 8 x 0.1 is ~8e-9, not 0, and would keep a flat group
            generated, informative = generated + k, informative + len(keep)
            kept.append(_select(got, keep))
            if informative >= k:
                out = _select(_concat(kept), list(range(k)))
                out.tally = self.tally
                out.stats = (
                    engine_stats
                    | (episode_metrics(out.trajectories) if self.multi_turn else {})
                    | {
                        "rollout/groups_generated": float(generated),
                        "rollout/sampling_rounds": float(rounds),
                    }
                )
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
        trajectories=[c.trajectories[b] for b in keep],
    )


def _concat(parts: list[Collected]) -> Collected:
    return Collected(
        [i for p in parts for i in p.indices],
        [s for p in parts for s in p.samples],
        [x for p in parts for x in p.prompts],
        [g for p in parts for g in p.groups],
        torch.cat([p.rewards for p in parts]),
        [r for p in parts for r in p.results],
        trajectories=[t for p in parts for t in p.trajectories],
    )


def episode_metrics(trajs: list[list[Trajectory]]) -> dict[str, float]:
    """``episode/*``: :func:`mmrl.rollout.episodes.episode_stats` of the batch's episodes."""
    return {
        f"episode/{k}": v for k, v in episode_stats([t.to_record() for row in trajs for t in row]).items()
    }
