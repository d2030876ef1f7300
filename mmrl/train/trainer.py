"""The trainer (GRPO family, DAPO, GSPO, single-rollout SPO/MSSR; docs/algorithms.md#grpo-family, docs/algorithms.md#mssr).

``fit()`` reads as named, timed stages: collect (sample -> encode -> rollout -> reward, repeated under DAPO's dynamic
sampling, :mod:`mmrl.train.collect`) -> old / ref log-probs -> advantages -> update (:mod:`mmrl.train.update`) -> sync the
engine's weights -> log / eval / save. Every method is a registered name: the advantage estimator (a small object
that may keep state, saved in checkpoints), the loss, the aggregation, the KL estimator, the reward correction, the
sampler and the engine; nothing here tests which one it is. Old log-probs come from the rollout engine
(``algo.old_logprobs: rollout``; the HF engine's equal the training forward's to 1e-5) or a fresh forward
(``recompute``); estimators that need pi_old's full-vocabulary entropy get it from that forward. When recomputed,
the engine's log-probs give the step's mismatch (``rollout/logprob_diff_*``) and the ``algo.rollout_correction``
weights of the token losses (:mod:`mmrl.algos.rollout_correction`).
"""

from __future__ import annotations

import json
import math
import random
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.algos import (
    ADVANTAGES,
    KL_ESTIMATORS,
    REWARD_CORRECTIONS,
    AdvantageInput,
    kl_penalised_rewards,
    with_fixed_advantages,
)
from mmrl.config import Config, to_dict
from mmrl.data import ensure_built, load_split
from mmrl.distributed import Dist
from mmrl.model import fsdp
from mmrl.model.policy import Policy
from mmrl.rewards.compose import CompositeReward, RewardConfig
from mmrl.rollout import ENGINES
from mmrl.rollout.episodes import run_episodes
from mmrl.run import checkpoint, rundir, trackers
from mmrl.run.checkpoint import load_training_state, rng_state
from mmrl.run.metrics import MetricsLogger
from mmrl.run.progress import progress
from mmrl.samplers import SAMPLERS
from mmrl.train import no_grad, step_stats
from mmrl.train.augment import make_augmenter
from mmrl.train.checks import check_config
from mmrl.train.collect import ROLLOUTS_LOGGED, Collected, Collector
from mmrl.train.image_check import ImageCheck
from mmrl.train.placement import Receiver, announce_start
from mmrl.train.producer import Producer, engine_options
from mmrl.train.rollout_log import append_rollouts, rollout_rows
from mmrl.train.update import PolicyUpdate, RolloutBatch
from mmrl.train.validation import Validator


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_scheduler(opt: torch.optim.Optimizer, cfg: Config) -> torch.optim.lr_scheduler.LambdaLR:
    warm, kind = cfg.optim.warmup_steps, cfg.optim.scheduler
    total = max(1, cfg.optim.schedule_steps or cfg.train.max_steps)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        frac = (step - warm) / max(1, total - warm)
        if kind == "linear":
            return max(0.0, 1.0 - frac)
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


class Trainer:
    def __init__(
        self,
        cfg: Config,
        output_dir: str | Path,
        *,
        resume: bool = False,
        overwrite: bool = False,
        dist: Dist | None = None,
    ):
        """Wire the run: data, policy (and reference), components, then the state of a resumed checkpoint. ``cfg`` is
        kept as given (``config.json``); what the run resolved at start-up (device, sharding, processes) goes to
        ``resolved.json``. ``dist``: the training processes (made here if not given; a separate placement's CLI makes
        it, :mod:`mmrl.train.placement`)."""
        self.cfg, self.out = cfg, Path(output_dir)
        check_config(cfg)  # before anything heavy is built
        self.dist = dist or Dist(cfg.train.dist_timeout_s)
        ckpt = self._prepare_run_dir(resume, overwrite)
        seed_everything(
            cfg.train.seed + 1000 * self.dist.rank
        )  # generation differs per process; choices do not
        self.train_data, eval_data = self._load_data()
        self.policy, self.ref = self._build_policies(ckpt)
        self._build_components(eval_data)
        if self.dist.is_main:
            (self.out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
            (self.out / "resolved.json").write_text(json.dumps(self.resolved(), indent=1))
        self.step, self.timings, self.last_kl = 0, {}, None
        if ckpt is not None:
            self._restore(ckpt)
            if hasattr(
                self.engine, "version"
            ):  # the weights it holds are the resumed step's (versions, schedules)
                self.engine.version = self.step
        if self.dist.generators:  # where the generating processes start
            announce_start(self.dist, self.step, ckpt)
        self.logger = MetricsLogger(
            self.out,
            trackers=trackers.wanted(cfg.train),
            tracker_options=cfg.train.tracker_options,
            purge_step=self.step + 1 if ckpt else None,
            enabled=self.dist.is_main,
            config=to_dict(cfg),
        )

    def _load_data(self) -> tuple[list, list]:
        """The training and held-out records, checked with the policy's processor too; bad ones listed in
        ``skipped.jsonl`` (rank 0 builds missing data)."""
        from mmrl.model.checkpoint_files import resolve_model_path

        cfg, dist = self.cfg, self.dist
        if dist.is_main:
            ensure_built(cfg.data.train, cfg.data.builder)
        dist.barrier()
        skipped = self.out / "skipped.jsonl" if dist.is_main else None
        model = resolve_model_path(cfg.model.path)
        train = load_split(cfg.data, cfg.data.train, skipped, model)
        return train, load_split(cfg.data, cfg.data.eval, skipped, model) if cfg.data.eval else []

    def _build_policies(self, ckpt: Path | None) -> tuple[Policy, Policy | None]:
        """The policy on this process's device, replicated (DDP) or sharded (FSDP2), and the frozen reference when
        the KL term needs one (with LoRA the policy itself with adapters disabled serves, :meth:`Policy.reference`)."""
        cfg, dist = self.cfg, self.dist
        model_cfg = cfg.model
        if dist.active and cfg.model.device == "auto":
            model_cfg = replace(cfg.model, device=str(dist.device))
        policy = Policy.from_pretrained(model_cfg, path=str(ckpt / "model") if ckpt else None)
        if policy.peft is not None:  # fresh adapters come from each rank's own stream: take rank 0's
            dist.broadcast([p for p in policy.model.parameters() if p.requires_grad])
        if fsdp.wanted(cfg.train.fsdp, dist.active):
            policy.shard(dist)  # before the optimizer: it holds the sharded parameters
        elif dist.active:
            policy.replicate(dist)  # DDP sums the gradients
        separate_ref = cfg.algo.kl_coef > 0 and cfg.model.lora.r == 0
        return policy, Policy.from_pretrained(model_cfg, trainable=False) if separate_ref else None

    def _build_components(self, eval_data: list) -> None:
        """The registered components the config names, the optimizer, and the stages that use them."""
        cfg, a = self.cfg, self.cfg.algo
        name, options = cfg.rollout.engine, {**cfg.rollout.engine_options, **engine_options(cfg)}
        if self.dist.generators and name == "vllm":
            # a separate placement's training processes only evaluate and check images with their engine: the hf
            # engine on the trained policy (vLLM runs in the generating processes, in a process of its own)
            name, options = "hf", {}
        self.engine = ENGINES.get(name)(self.policy, batch_size=cfg.rollout.batch_size, **options)
        self.sampler = SAMPLERS.get(cfg.sampler.name)(
            len(self.train_data), seed=cfg.train.seed, **cfg.sampler.options
        )
        self.reward = (  # none: an env's episode returns are the rewards (rollout.env)
            CompositeReward(
                [RewardConfig(r.name, r.weight, dict(r.options)) for r in cfg.rewards],
                num_workers=cfg.train.reward_workers,
                timeout_s=cfg.train.reward_timeout_s,
            )
            if cfg.rewards
            else None
        )
        self.estimator = ADVANTAGES.get(a.advantage)(
            len(self.train_data), eps=a.adv_eps, **a.advantage_options
        )
        self.correction = REWARD_CORRECTIONS.get(a.reward_correction)
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(
            params, lr=cfg.optim.lr, betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay
        )
        self.sched = build_scheduler(self.opt, cfg)
        self.updater = PolicyUpdate(
            cfg, self.policy, self.opt, self.sched, self._train_temperature(), self.dist
        )
        self.mismatch: dict[str, float] = {}  # rollout vs recomputed pi_old, set by make_batch
        self.image_check = ImageCheck(cfg, self.policy, self.engine, self._train_temperature())
        # several colocated processes running ahead: the producer's thread gathers over a group of its own, and the
        # held-out evaluation (the trainer's thread) has a collector of its own on the training group
        ahead = cfg.rollout.max_staleness > 0 and self.dist.world > 1 and not self.dist.generators

        def collector(dist: Dist, **extra: Any) -> Collector:
            return Collector(
                cfg,
                self.train_data,
                self.policy,
                self.engine,
                self.sampler,
                self.reward,
                self.stage,
                dist,
                render_root=self.out / "renders",
                episode_root=self.out / "episodes",
                **extra,
            )

        self.collector = collector(
            self.dist.own_group() if ahead else self.dist,
            skipped_path=self.out / "skipped.jsonl",
            augment=make_augmenter(cfg),
        )
        evaluator = collector(self.dist) if ahead else self.collector
        self.validator = Validator(cfg, eval_data, evaluator, out_dir=self.out)
        self.producer = (
            Receiver(self.policy, self.sampler, self.dist)
            if self.dist.generators
            else Producer(
                self.collector, self.engine, self.sampler, cfg.rollout.max_staleness, cfg.train.max_steps
            )
        )
        self._reward_counts: dict[str, int] = {}

    def _restore(self, ckpt: Path) -> None:
        """The optimizer, scheduler, sampler, estimator, loss state and step of a resumed checkpoint (the weights came
        with the policy)."""
        state = load_training_state(
            ckpt,
            self.opt,
            self.sched,
            rank=self.dist.rank,
            model=self.policy.model if self.policy.sharded else None,
            group=self.dist.group,
        )
        self.sampler.load_state_dict(state["sampler"])
        self.estimator.load_state_dict(state.get("advantage", {}))
        self.updater.load_loss_state_dict(state.get("loss", {}))
        if self.collector.augment is not None:
            self.collector.augment.load_state_dict(state.get("augment", {}))
        self.step, self.last_kl = int(state["step"]), state.get("last_kl")

    def resolved(self) -> dict[str, Any]:
        """What the run decided at start-up that the config leaves open (``resolved.json``)."""
        kl = self.cfg.algo.kl_coef > 0
        return {
            "device": str(self.policy.device),
            "processes": self.dist.world,
            "sharded": bool(self.policy.sharded),
            "replicated": self.dist.active and not self.policy.sharded,
            # the KL term's reference: a frozen copy, or the policy with its LoRA adapters off; None without KL
            "reference": (("separate" if self.ref is not None else "adapters off") if kl else None),
        }

    def _prepare_run_dir(self, resume: bool, overwrite: bool) -> Path | None:
        """Rank 0 prepares the directory (refuse / overwrite / trim for resume); the others then read it."""
        max_steps = self.cfg.train.max_steps
        ckpt = None
        if self.dist.is_main:
            ckpt = rundir.prepare(self.out, resume=resume, overwrite=overwrite, max_steps=max_steps)
        self.dist.barrier()
        if not self.dist.is_main and resume:
            ckpt = rundir.resume_point(self.out, max_steps)
        return ckpt

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        cfg, metrics = self.cfg, {}
        if self.step == 0:
            self.start()
        try:
            with progress(
                cfg.train.max_steps, self.step, cfg.train.progress and self.dist.is_main
            ) as advance:
                while self.step < cfg.train.max_steps:
                    self.timings = {}
                    got = self.producer.take(self.step + 1)  # timed inside: sample, encode, rollout, reward
                    self.timings |= got.timings  # a generating process's (separate placement)
                    with self.stage("old_logprobs"):
                        batch = self.make_batch(got)
                    with self.stage("image_check"):  # the media reach the policy and the engine
                        sanity = self.image_check(batch, self.step + 1)
                    with self.stage("ref_logprobs"):
                        batch.ref_logp = self.reference_logprobs(batch) if cfg.algo.kl_coef > 0 else None
                    got.resolve()  # rewards scored meanwhile (train.overlap_rewards): the wait is time/reward
                    with self.stage("advantages"):
                        adv_stats = self.advantages(got, batch)
                    with self.stage("update"), self.policy.training():
                        update_stats = self.updater(batch, self.step)
                    with self.stage("sync_weights"):  # separate placement: the push to the generating process
                        self.engine.sync_weights()
                        self.producer.synced()
                    self.step += 1
                    metrics = {
                        "step": self.step,
                        **self.reward_rollout_stats(got),
                        **update_stats,
                        **adv_stats,
                    }
                    metrics |= self.mismatch | sanity
                    self.last_kl = (
                        metrics["kl"] if cfg.algo.kl_coef > 0 else None
                    )  # read by MSSR's forgetting
                    metrics |= got.stats | self.sampler.stats()
                    metrics |= self.maybe_evaluate() | step_stats.throughput(
                        got, self.timings, got.tally.reward_seconds, self.updater.tokens
                    )
                    self.logger.log(metrics)
                    self.collector.feedback(metrics)
                    self._write_rollouts(got)
                    logged = got.trajectories[:ROLLOUTS_LOGGED]  # episode folders: only the logged ones stay
                    self.collector.retire_episodes(self.step, {t.episode_id for row in logged for t in row})
                    if self.step == cfg.train.max_steps or (
                        cfg.train.save_every and self.step % cfg.train.save_every == 0
                    ):
                        self.save()
                    advance(self.step, metrics)
        finally:  # also on an exception or SIGTERM (the CLI turns it into SystemExit): no orphaned reward workers
            self.producer.close()
            self.logger.close()
            self.collector.close()
            if self.validator.collector is not self.collector:
                self.validator.collector.close()
            self.validator.close()
            if self.reward is not None:
                self.reward.close()
        return metrics

    def close(self) -> None:
        """After a finished run, on every rank: the engine shuts down (vLLM tears down its process groups), then the
        ranks meet and leave the process group together."""
        self.engine.close()
        self.dist.close()

    # ------------------------------------------------------------------ stages
    @contextmanager
    def stage(self, name: str):
        t0 = time.perf_counter()
        yield
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0

    def start(self) -> None:
        """Before the first step: the held-out score of the initial policy, and the estimator's initialisation pass
        (MSSR: one response of the initial policy per training prompt)."""
        row: dict[str, Any] = {"step": 0}  # one step-0 row: a second one would replace it in read_metrics
        if self.validator:
            with self.collector.generation_weights():  # every rank evaluates its share; rank 0 aggregates
                row |= self.evaluate()
        if self.estimator.needs_init:
            row |= self._initialise_estimator()
        if len(row) > 1:
            self.logger.log(row)

    def _initialise_estimator(self) -> dict[str, Any]:
        """MSSR's initialisation pass: one response of the initial policy per training prompt."""
        c, bs, d = self.collector, self.cfg.rollout.batch_size, self.dist
        params = c.sampling_params()
        params = type(params)(1, params.temperature, params.top_p, params.top_k, params.max_new_tokens)
        mine = list(range(d.rank, len(self.train_data), d.world))
        rewards = []
        # every rank makes the same number of engine calls (a tensor-parallel vLLM group generates together)
        calls = max(d.gather(math.ceil(len(mine) / bs)))
        with c.generation_weights():
            for s in range(0, calls * bs, bs):
                samples = [self.train_data[i] for i in mine[s : s + bs]]
                trajs = run_episodes(
                    self.policy, self.engine, samples, params, prompts=[c.encode(x) for x in samples]
                )
                if samples:
                    rewards.append(c.score(samples, trajs)[0].reshape(-1))
        parts = d.gather((mine, torch.cat(rewards) if rewards else torch.zeros(0)))
        indices, init = [i for p in parts for i in p[0]], torch.cat([p[1] for p in parts])
        self.estimator.initialise(indices, init)
        return {"init/reward_mean": init.mean().item(), "init/prompts": len(init)}

    def _train_temperature(self) -> float:
        return self.cfg.rollout.temperature if self.cfg.rollout.temperature > 0 else 1.0

    def make_batch(self, got: Collected) -> RolloutBatch:
        """The batch of the collected trajectories: rows per rank; pi_old recomputed (and the rollout correction)
        or the entropies, when asked for."""
        batch = RolloutBatch.of(got.trajectories)
        batch.off_policy_rows = set(got.off_policy_rows)
        batch.placed_rows = got.off_policy_rows | set(got.fixed_advantages)
        N, G = len(batch), batch.group_size
        old = batch.old_logp
        if self.dist.active:  # the no-grad passes' rows: balanced by tokens, whole groups
            batch.rows = self.dist.balanced(*batch.blocks(list(range(N)), G))
        a, self.mismatch = self.cfg.algo, {}
        if a.old_logprobs == "recompute" or self.estimator.needs_entropy:
            logp, ent = self.forward_no_grad(self.policy, batch, with_entropy=self.estimator.needs_entropy)
            if a.old_logprobs == "recompute":  # the engine's log-probs (old) against the training forward's
                # asynchronous: the proximal policy is this step's weights (version self.step), each token's
                # sampler lags behind it by versions
                lags = self.step - batch.versions(self.step) if self.cfg.rollout.max_staleness > 0 else None
                batch.rollout_weights, self.mismatch = no_grad.correction(a, logp, old, batch, lags)
                batch.old_logp = logp
            batch.entropy = ent
        return batch

    def forward_no_grad(
        self, policy: Policy, batch: RolloutBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of this process's rows, gathered so every process holds the whole batch's."""
        return no_grad.forward(policy, batch, self.cfg, self.dist, self._train_temperature(), with_entropy)

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        if self.ref is not None:
            return self.forward_no_grad(self.ref, batch)[0]
        with self.policy.reference():
            return self.forward_no_grad(self.policy, batch)[0]

    def advantages(self, got: Collected, batch: RolloutBatch) -> dict[str, float]:
        a = self.cfg.algo
        rewards = self.correction(got.rewards, fp_rate=a.fp_rate, fn_rate=a.fn_rate)  # [B, G]
        stats: dict[str, float] = {}
        if a.kl_in == "reward" and batch.ref_logp is not None:
            kl_tok = KL_ESTIMATORS.get(a.kl_estimator)(batch.old_logp, batch.ref_logp)
            rewards = kl_penalised_rewards(rewards, kl_tok, batch.mask, a.kl_coef)
            stats["kl"] = ((kl_tok * batch.mask).sum() / batch.mask.sum().clamp(min=1)).item()
        inp = AdvantageInput(
            rewards, got.indices, batch.old_logp, batch.mask, batch.entropy, self.last_kl, turns=batch.turns
        )
        if self.estimator.answer_template is not None:
            inp.answer_logp = no_grad.answer_logprobs(
                self.policy, batch, self.estimator.answer_template, self.forward_no_grad, self.dist
            )
        batch.advantages, est_stats = self.estimator(inp)
        batch.advantages = with_fixed_advantages(batch.advantages, batch.mask, got.fixed_advantages)
        return stats | est_stats

    def reward_rollout_stats(self, got: Collected) -> dict[str, float]:
        """The step's reward and rollout statistics (:mod:`mmrl.train.step_stats`); errors go to reward_errors.jsonl."""
        errors = got.tally.errors
        pool = self.reward.stats() if self.reward is not None else {}
        env = self.collector.env_stats()
        stats, self._reward_counts = step_stats.reward_stats(got, errors, pool, self._reward_counts, env)
        counters = self.dist.sum(
            {k: v for k, v in stats.items() if k.startswith("sys/")}
        )  # a worker of any rank
        stats |= counters
        if errors and self.dist.is_main:
            step_stats.write_reward_errors(self.out / "reward_errors.jsonl", self.step, errors)
        return stats | step_stats.rollout_stats(got, self.cfg.eval.success_threshold)

    def maybe_evaluate(self) -> dict[str, float]:
        cfg = self.cfg
        if not self.validator:
            return {}
        if (cfg.eval.every and self.step % cfg.eval.every == 0) or self.step == cfg.train.max_steps:
            # every rank evaluates its share of the records; rank 0 gets the metrics
            with self.stage("eval"), self.collector.generation_weights():
                return self.evaluate()
        return {}

    # ------------------------------------------------------------------ eval / io
    def evaluate(self) -> dict[str, float]:
        return self.validator()

    def _write_rollouts(self, got: Collected, keep: int = ROLLOUTS_LOGGED) -> None:
        """Append the first ``keep`` groups of the step to rollouts.jsonl (:mod:`mmrl.train.rollout_log`) and give their
        inputs and kept renders to the trackers."""
        if not self.dist.is_main:
            return
        rows = rollout_rows(got, self.step, self.out, keep)
        append_rollouts(self.out / "rollouts.jsonl", rows)
        self.logger.log_rollout_images(self.step, rows)

    def save(self) -> Path:
        """A checkpoint (:mod:`mmrl.run.checkpoint`). Under FSDP every rank writes its optimizer shard into the staging
        folder in parallel; rank 0 writes the HF weights (gathered from the shards) and the rest."""
        root, d, sharded = self.out / "checkpoints", self.dist, bool(self.policy.sharded)
        rngs = d.gather(rng_state())  # every process's generators, written by rank 0
        if d.is_main:
            checkpoint.begin(root, self.step)
        d.barrier()
        if sharded:
            fsdp.save_sharded_optimizer(
                self.policy.model, self.opt, checkpoint.staging(root, self.step) / "optimizer", d.group
            )
        weights = self.policy.full_state_dict()  # under FSDP: gathered on rank 0 (every rank takes part)
        final = root / f"step-{self.step}"
        if d.is_main:
            state = {
                "sampler": self.producer.sampler_state(),
                "advantage": self.estimator.state_dict(),
                "loss": self.updater.loss_state_dict(),
                "augment": self.collector.augment.state_dict() if self.collector.augment else {},
                "last_kl": self.last_kl,
                "config": to_dict(self.cfg),
            }
            checkpoint.save_checkpoint(
                root,
                self.step,
                policy=self.policy,
                optimizer=None if sharded else self.opt,
                scheduler=self.sched,
                state=state,
                keep=self.cfg.train.keep_checkpoints,
                rank_rng=rngs[1:],
                weights=weights,
                staged=True,
            )
        d.barrier()
        return final
