"""The group trainer (GRPO family, ALGORITHMS.md §1).

``fit()`` reads as named, timed stages: sample -> encode -> rollout -> reward -> ref log-probs -> advantages ->
update -> log / eval / save. Advantage and loss functions are looked up by name in ``mmrl.algos``; the sampler and
rollout engine in their registries; rewards through ``mmrl.rewards``. Old log-probs come from the rollout engine
(``algo.old_logprobs: rollout``; the HF engine's equal the training forward's to 1e-5) or a fresh forward
(``recompute``). Each rollout batch is used for ``algo.epochs`` passes of ``algo.mini_batches`` optimizer steps, each
accumulated over micro-batches so the aggregated loss equals the full mini-batch's.
"""

from __future__ import annotations

import json
import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.algos import ADVANTAGES, LOSSES, aggregate, kl_k3
from mmrl.checkpoint import latest_checkpoint, load_training_state, save_checkpoint
from mmrl.config import Config, to_dict
from mmrl.data import ensure_built, load_split
from mmrl.logging import MetricsLogger
from mmrl.policy import EncodedPrompt, Policy
from mmrl.rewards.compose import CompositeReward, RewardConfig
from mmrl.rollout import ENGINES, SamplingParams
from mmrl.samplers import SAMPLERS
from mmrl.types import RewardInput, Sample


@dataclass
class RolloutBatch:
    prompts: list[EncodedPrompt]  # [N] (each prompt repeated G times)
    completions: list[list[int]]  # [N] token ids
    old_logp: torch.Tensor  # [N, T]
    ref_logp: torch.Tensor | None  # [N, T]
    advantages: torch.Tensor  # [N]


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


def reward_inputs(
    sample: Sample, prompt: EncodedPrompt, texts: list[str], lengths: list[int]
) -> list[RewardInput]:
    meta = {
        **sample.metadata,
        "image_sizes": prompt.image_sizes,
        "model_image_sizes": prompt.model_image_sizes,
    }
    return [
        RewardInput(
            sample.id,
            t,
            sample.answer,
            sample.prompt_text,
            list(sample.images),
            {**meta, "response_tokens": n},
        )
        for t, n in zip(texts, lengths)
    ]


class Trainer:
    def __init__(self, cfg: Config, output_dir: str | Path, *, resume: bool = False):
        self.cfg, self.out = cfg, Path(output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        seed_everything(cfg.train.seed)
        ensure_built(cfg.data.train, cfg.data.builder)
        skipped = self.out / "skipped.jsonl"
        self.train_data = load_split(cfg.data, cfg.data.train, skipped)
        self.eval_data: list[Sample] = []
        if cfg.data.eval:
            self.eval_data = load_split(cfg.data, cfg.data.eval, skipped)[: cfg.eval.max_samples]
        ckpt = self._resume_point() if resume else None
        self.policy = Policy.from_pretrained(cfg.model, path=str(ckpt / "model") if ckpt else None)
        self.ref = Policy.from_pretrained(cfg.model) if cfg.algo.kl_coef > 0 else None
        if self.ref is not None:
            self.ref.model.eval().requires_grad_(False)
        self.engine = ENGINES.get(cfg.rollout.engine)(self.policy, batch_size=cfg.rollout.batch_size)
        self.sampler = SAMPLERS.get(cfg.sampler.name)(
            len(self.train_data), seed=cfg.train.seed, **cfg.sampler.options
        )
        self.reward = CompositeReward(
            [RewardConfig(r.name, r.weight, dict(r.options)) for r in cfg.rewards],
            num_workers=cfg.train.reward_workers,
            timeout_s=cfg.train.reward_timeout_s,
        )
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(
            params, lr=cfg.optim.lr, betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay
        )
        self.sched = build_scheduler(self.opt, cfg)
        self.adv_fn, self.loss_fn = ADVANTAGES.get(cfg.algo.advantage), LOSSES.get(cfg.algo.loss)
        self.logger = MetricsLogger(self.out, tensorboard=cfg.train.tensorboard)
        self.step, self._cache, self.timings, self._last_results = 0, {}, {}, []
        self._reward_counts: dict[str, int] = {}
        (self.out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
        if ckpt is not None:
            state = load_training_state(ckpt, self.opt, self.sched)
            self.sampler.load_state_dict(state["sampler"])
            self.step = int(state["step"])

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.step == 0 and self.eval_data:
            self.logger.log({"step": 0, **self.evaluate()})
        with self._progress() as advance:
            while self.step < cfg.train.max_steps:
                self.timings = {}
                with self.stage("sample"):
                    idx = self.sampler.select(cfg.train.prompts_per_step)
                    samples = [self.train_data[i] for i in idx]
                with self.stage("encode"):
                    prompts = [self.encode(s) for s in samples]
                with self.stage("rollout"):
                    groups = self.engine.generate(prompts, self.sampling_params())
                with self.stage("reward"):
                    rewards, reward_stats = self.score(samples, prompts, groups)  # [B, G]
                with self.stage("advantages"):
                    adv = self.adv_fn(rewards, eps=cfg.algo.adv_eps)  # [B, G]
                    batch = self.make_batch(prompts, groups, adv)
                with self.stage("ref_logprobs"):
                    batch.ref_logp = self.ref_logprobs(batch)
                with self.stage("update"):
                    update_stats = self.update(batch)
                self.sampler.update(idx, rewards)
                self.step += 1
                metrics = {
                    "step": self.step,
                    **reward_stats,
                    **update_stats,
                    **self.rollout_stats(groups, rewards),
                }
                if self.eval_data and cfg.eval.every and self.step % cfg.eval.every == 0:
                    with self.stage("eval"):
                        metrics.update(self.evaluate())
                if self.eval_data and self.step == cfg.train.max_steps and "eval/accuracy" not in metrics:
                    metrics.update(self.evaluate())
                metrics.update({f"time/{k}": v for k, v in self.timings.items()})
                self.logger.log(metrics)
                self._write_rollouts(samples, groups)
                if self.step == cfg.train.max_steps or (
                    cfg.train.save_every and self.step % cfg.train.save_every == 0
                ):
                    self.save()
                advance(metrics)
        self.logger.close()
        self.reward.close()
        return metrics

    # ------------------------------------------------------------------ stages
    @contextmanager
    def stage(self, name: str):
        t0 = time.perf_counter()
        yield
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0

    def sampling_params(self, eval_mode: bool = False) -> SamplingParams:
        r, e = self.cfg.rollout, self.cfg.eval
        if eval_mode:
            return SamplingParams(
                n=1,
                temperature=e.temperature,
                top_p=r.top_p,
                top_k=r.top_k,
                max_new_tokens=e.max_new_tokens or r.max_new_tokens,
            )
        return SamplingParams(
            n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens
        )

    def encode(self, sample: Sample) -> EncodedPrompt:
        if sample.id not in self._cache:
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[sample.id] = self.policy.encode(sample)
        return self._cache[sample.id]

    def score(self, samples, prompts, groups) -> tuple[torch.Tensor, dict[str, float]]:
        inputs = [
            ri
            for s, p, g in zip(samples, prompts, groups)
            for ri in reward_inputs(s, p, [c.text for c in g], [len(c.token_ids) for c in g])
        ]
        results = self._last_results = self.reward(inputs)
        scores = torch.tensor([r.score for r in results], dtype=torch.float32).view(len(samples), -1)
        stats: dict[str, float] = {"reward/mean": scores.mean().item(), "reward/std": scores.std().item()}
        parts: dict[str, list[float]] = {}
        for r in results:
            for k, v in r.parts.items():
                parts.setdefault(f"reward/{k}", []).append(float(v))
        stats.update({k: sum(v) / len(v) for k, v in parts.items()})
        errors = [e for r in results for e in r.errors]
        stats["reward/errors"] = len(errors)
        # process diagnostics (the reward cache is not checkpointed): per-step counts under sys/, like time/*
        pool, prev = self.reward.stats(), self._reward_counts
        self._reward_counts = {
            k: pool[k] for k in ("cache_hits", "cache_misses", "timeouts", "pool_restarts")
        }
        stats |= {f"sys/reward_{k}": v - prev.get(k, 0) for k, v in self._reward_counts.items()}
        if errors:
            with (self.out / "reward_errors.jsonl").open("a") as f:
                for e in errors:
                    f.write(json.dumps({"step": self.step + 1, **e}) + "\n")
        return scores, stats

    def make_batch(self, prompts, groups, adv: torch.Tensor) -> RolloutBatch:
        flat_prompts = [p for p, g in zip(prompts, groups) for _ in g]
        comps = [c for g in groups for c in g]
        T = max(len(c.token_ids) for c in comps)
        old = torch.zeros(len(comps), T)
        for i, c in enumerate(comps):
            old[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
        batch = RolloutBatch(flat_prompts, [c.token_ids for c in comps], old, None, adv.reshape(-1))
        if self.cfg.algo.old_logprobs == "recompute":
            batch.old_logp = self._forward_no_grad(self.policy, batch)
        return batch

    @torch.no_grad()
    def _forward_no_grad(self, policy: Policy, batch: RolloutBatch) -> torch.Tensor:
        out = torch.zeros_like(batch.old_logp)
        mb = self.cfg.optim.micro_batch_size
        for i in range(0, len(batch.prompts), mb):
            lp, _, _ = policy.logprobs(
                batch.prompts[i : i + mb],
                batch.completions[i : i + mb],
                temperature=self._train_temperature(),
                with_entropy=False,
            )
            out[i : i + mb, : lp.shape[1]] = lp.float().cpu()
        return out

    def ref_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        return None if self.ref is None else self._forward_no_grad(self.ref, batch)

    def _train_temperature(self) -> float:
        return self.cfg.rollout.temperature if self.cfg.rollout.temperature > 0 else 1.0

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        a, N = self.cfg.algo, len(batch.prompts)
        totals: dict[str, float] = {}
        count = 0
        for _ in range(a.epochs):
            perm = torch.randperm(N).tolist()
            size = math.ceil(N / a.mini_batches)
            for start in range(0, N, size):
                stats = self._optimizer_step(batch, perm[start : start + size])
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
                count += 1
        return {k: v / count for k, v in totals.items()} | {"lr": self.sched.get_last_lr()[0]}

    def _optimizer_step(self, batch: RolloutBatch, rows: list[int]) -> dict[str, float]:
        a, dev = self.cfg.algo, self.policy.device
        lengths = [len(batch.completions[i]) for i in rows]
        denom = sum(lengths) if a.loss_agg == "token-mean" else len(rows)
        const = a.loss_agg_constant or float(self.cfg.rollout.max_new_tokens)
        self.opt.zero_grad(set_to_none=True)
        acc = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0}
        mb = self.cfg.optim.micro_batch_size
        for s in range(0, len(rows), mb):
            part = rows[s : s + mb]
            logp, ent, mask = self.policy.logprobs(
                [batch.prompts[i] for i in part],
                [batch.completions[i] for i in part],
                temperature=self._train_temperature(),
            )
            T = logp.shape[1]
            old = batch.old_logp[part, :T].to(dev)
            tok_loss, st = self.loss_fn(
                logp,
                old,
                batch.advantages[part].to(dev),
                mask,
                clip_low=a.clip_low,
                clip_high=a.clip_high,
                dual_clip=a.dual_clip,
            )
            weight = (mask.sum().item() if a.loss_agg == "token-mean" else len(part)) / denom
            pg = aggregate(tok_loss, mask, a.loss_agg, const) * weight
            loss = pg
            if batch.ref_logp is not None:
                kl = (
                    aggregate(kl_k3(logp, batch.ref_logp[part, :T].to(dev)), mask, a.loss_agg, const) * weight
                )
                loss = loss + a.kl_coef * kl
                acc["kl"] += kl.item()
            loss.backward()
            ntok = mask.sum().clamp(min=1)
            acc["loss"] += loss.item()
            acc["pg_loss"] += pg.item()
            acc["entropy"] += ((ent * mask).sum() / ntok).item() * weight
            acc["clip_frac"] += st["clip_frac"].item() * weight
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        clip = self.cfg.optim.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        self.opt.step()
        self.sched.step()
        return acc | {"grad_norm": float(norm)}

    def rollout_stats(self, groups, rewards: torch.Tensor) -> dict[str, float]:
        lens = [len(c.token_ids) for g in groups for c in g]
        return {
            "response_length/mean": sum(lens) / len(lens),
            "response_length/max": max(lens),
            "rollout/truncated_frac": sum(c.finish_reason == "length" for g in groups for c in g) / len(lens),
            "rollout/groups_with_signal": (rewards.std(dim=1) > 0).float().mean().item()
            if rewards.shape[1] > 1
            else 1.0,
        }

    # ------------------------------------------------------------------ eval / io
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Score the held-out records; runs on a forked RNG so evaluating never changes the training run."""
        prompts = [self.encode(s) for s in self.eval_data]
        devices = [self.policy.device] if self.policy.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.cfg.train.seed + 7919)
            groups = self.engine.generate(prompts, self.sampling_params(eval_mode=True))
        inputs = [
            ri
            for s, p, g in zip(self.eval_data, prompts, groups)
            for ri in reward_inputs(s, p, [c.text for c in g], [len(c.token_ids) for c in g])
        ]
        scores = [r.score for r in self.reward(inputs)]
        ok = [sc >= self.cfg.eval.success_threshold - 1e-6 for sc in scores]
        out = {"eval/accuracy": sum(ok) / len(ok), "eval/reward_mean": sum(scores) / len(scores)}
        key = self.cfg.eval.group_by
        if key:
            groups_ok: dict[str, list[bool]] = {}
            for s, good in zip(self.eval_data, ok):
                groups_ok.setdefault(str(s.metadata.get(key, "none")), []).append(good)
            out |= {f"eval/accuracy/{g}": sum(v) / len(v) for g, v in sorted(groups_ok.items())}
        return out

    def _write_rollouts(self, samples, groups, keep: int = 2) -> None:
        """Append the first ``keep`` groups of the step, each response with its reward and reward parts."""
        G = len(groups[0])
        with (self.out / "rollouts.jsonl").open("a") as f:
            for b, (s, g) in enumerate(list(zip(samples, groups))[:keep]):
                results = self._last_results[b * G : (b + 1) * G]
                row = {
                    "step": self.step,
                    "id": s.id,
                    "answer": s.answer,
                    "responses": [
                        {"text": c.text, "finish": c.finish_reason, "reward": r.score, "parts": r.parts}
                        for c, r in zip(g, results)
                    ],
                }
                f.write(json.dumps(row) + "\n")

    def save(self) -> Path:
        state = {"sampler": self.sampler.state_dict(), "config": to_dict(self.cfg)}
        return save_checkpoint(
            self.out / "checkpoints",
            self.step,
            policy=self.policy,
            optimizer=self.opt,
            scheduler=self.sched,
            state=state,
            keep=self.cfg.train.keep_checkpoints,
        )

    def _resume_point(self) -> Path:
        ckpt = latest_checkpoint(self.out / "checkpoints")
        if ckpt is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint under {self.out / 'checkpoints'}")
        return ckpt

    @contextmanager
    def _progress(self):
        if not self.cfg.train.progress:
            yield lambda m: None
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        cols = [
            TextColumn("[bold]train"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
        ]
        with Progress(*cols, transient=False) as prog:
            task = prog.add_task("train", total=self.cfg.train.max_steps, completed=self.step, info="")

            def advance(m: dict[str, Any]) -> None:
                info = f"reward {m['reward/mean']:.3f}"
                if "eval/accuracy" in m:
                    info += f" eval acc {m['eval/accuracy']:.3f}"
                prog.update(task, completed=self.step, info=info)

            yield advance
