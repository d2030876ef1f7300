"""In-training validation: greedy responses to held-out records, scored either by the run's own rewards or by a
benchmark's published scorer (the one ``mmrl eval`` uses, :mod:`mmrl.eval`), or greedy episodes judged by an env.

- ``data.eval`` records: the composite reward (``eval.rewards``, or the run's) scores each response; ``eval/accuracy`` is the share reaching
  ``eval.success_threshold``, with ``eval/accuracy/<value>`` per ``eval.group_by`` metadata value.
- ``data.eval`` records with ``rollout.env`` set: each record is one greedy episode (G = 1, ``eval.temperature``,
  ``eval.max_new_tokens`` per turn, the rollout's turn, token and image limits) in that env, which judges it:
  ``eval/accuracy`` is the success rate (return > 0), plus ``eval/step_accuracy`` (the mean of
  ``info["target_hit"]`` over all steps that report it), ``eval/turns_mean``, ``eval/return_mean``,
  ``eval/end/<how>`` (the share of episodes ending each way) and ``eval/accuracy/<value>`` per ``eval.group_by``
  value: the metrics of ``mmrl eval``'s env benchmarks (:mod:`mmrl.eval.episodic`).
- ``eval.benchmark`` + ``eval.benchmark_data``: the benchmark's items, scored by its authors' rules, so the curve
  logged during training is the number ``mmrl eval`` reports for the checkpoint: ``eval/accuracy``, ``eval/<part>``,
  ``eval/<summary metric>`` and ``eval/accuracy/<key>=<value>`` for its breakdowns (subject, level, platform, ...).
  An env benchmark (``zoom``, ``gui_agent``) runs its episodes with its own options, as ``mmrl eval`` does.

Episodes run in an env pool made at the first evaluation under the run folder's ``episodes-eval/`` (one subfolder
per rank with several processes; a temporary folder when no run folder is given); each evaluation first clears the
previous one's files, so the folder holds the latest evaluation's crops and screenshots. :meth:`Validator.close`
stops the pool.

Generation runs on a forked RNG with a fixed seed, so evaluating never changes the training run. With several
processes every rank generates and scores its contiguous share of the held-out records and rank 0 aggregates the
gathered results (the others return ``{}``): no rank waits in a collective while another evaluates alone.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from mmrl.config import Config, EpisodeConfig
from mmrl.eval.episodic import EnvBenchmark, episode_row, episode_summary
from mmrl.eval.scoring import aggregate, item_score
from mmrl.rollout.episodes import run_episodes
from mmrl.train.collect import Collector, reward_inputs
from mmrl.types import Sample


class Validator:
    def __init__(self, cfg: Config, samples: list[Sample], collector: Collector, out_dir: Path | None = None):
        self.cfg, self.collector, self.out_dir = cfg, collector, out_dir
        self.reward: Any = None  # eval.rewards' own composite (None: the run's rewards)
        if cfg.eval.rewards:
            from mmrl.rewards.compose import CompositeReward, RewardConfig

            self.reward = CompositeReward(
                [RewardConfig(r.name, r.weight, dict(r.options)) for r in cfg.eval.rewards],
                num_workers=cfg.train.reward_workers,
                timeout_s=cfg.train.reward_timeout_s,
            )
        self.bench: Any = None
        self.items: list[Any] = []
        e = cfg.eval
        if e.benchmark:
            from mmrl.eval import get_benchmark
            from mmrl.eval.screening import screen

            self.bench = get_benchmark(e.benchmark, e.benchmark_options, cfg.model)
            # the benchmark's items pass the checks `mmrl eval` applies (every rank keeps the same ones; rank 0
            # lists the others in eval_skipped.jsonl), then the first eval.max_samples are kept
            main = out_dir is not None and collector.dist.is_main
            loaded = self.bench.load(Path(e.benchmark_data)).items
            listed = out_dir / "eval_skipped.jsonl" if main else None
            self.items = screen(loaded, cfg.model, listed)[: e.max_samples]
            samples = [it.sample for it in self.items]
        self.samples = samples[: e.max_samples]
        # the env that judges held-out episodes and their settings; None: single responses
        self.env: str | None = None
        self.episode_opts: EpisodeConfig | None = None
        if isinstance(self.bench, EnvBenchmark):
            self.env, self.episode_opts = self.bench.env, self.bench.opts
        elif self.bench is None and cfg.rollout.env:
            self.env, self.episode_opts = cfg.rollout.env, cfg.rollout.episode
        self.pool: Any = None
        self._tmp: Path | None = None  # the pool's folder when no run folder was given

    def __bool__(self) -> bool:
        return bool(self.samples)

    @torch.no_grad()
    def __call__(self) -> dict[str, float]:
        """The held-out metrics on rank 0 (``{}`` on the others); call it on every rank."""
        c, d = self.collector, self.collector.dist
        mine = d.split(len(self.samples))
        samples = [self.samples[i] for i in mine]
        prompts = [c.encode(s) for s in samples]
        devices = [c.policy.device] if c.policy.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.cfg.train.seed + 7919)
            # episodes differ in turns, so the ranks' engine calls cannot line up: a rank without records waits
            # in the gather; single responses are generated also with no records here (engines may generate together)
            if self.env is not None:
                fields = [self.items[i].fields for i in mine] if self.items else [{} for _ in mine]
                rows = self.episode_rows(samples, prompts, fields) if samples else []
            else:
                groups = c.engine.generate(prompts, c.sampling_params(eval_mode=True))
        if self.env is not None:
            rows = [r for part in d.gather(rows) for r in part]
            return self.episode_scores(rows) if d.is_main else {}
        if self.items:
            texts = [t for part in d.gather([g[0].text for g in groups]) for t in part]
            return self.benchmark_scores(texts) if d.is_main else {}
        inputs = [
            ri
            for s, p, g in zip(samples, prompts, groups)
            for ri in reward_inputs(s, p, [x.text for x in g], [len(x.token_ids) for x in g])
        ]
        reward = self.reward or self.collector.reward
        results = [r for part in d.gather(reward(inputs) if inputs else []) for r in part]
        return self.reward_scores(results) if d.is_main else {}

    def episode_rows(
        self, samples: list[Sample], prompts: list[Any], fields: list[dict]
    ) -> list[dict[str, Any]]:
        """One greedy episode per sample, as ``mmrl eval``'s ``predictions.jsonl`` rows."""
        c = self.collector
        pool = self._pool()
        shutil.rmtree(pool.root, ignore_errors=True)  # the previous evaluation's files
        params = c.sampling_params(eval_mode=True)
        trajs = run_episodes(
            c.policy,
            c.engine,
            samples,
            params,
            pool=pool,
            env_name=self.env,
            settings=self.episode_opts,
            prompts=prompts,
        )
        return [episode_row(s.id, g, f) for s, g, f in zip(samples, trajs, fields)]

    def _pool(self) -> Any:
        if self.pool is None:
            if self.out_dir is None:
                self._tmp = Path(tempfile.mkdtemp(prefix="mmrl-episodes-eval-"))
            d = self.collector.dist
            root = Path(self.out_dir or self._tmp) / "episodes-eval"
            from mmrl.envs import EnvPool

            self.pool = EnvPool.for_episodes(
                root / f"rank-{d.rank}" if d.world > 1 else root, self.episode_opts
            )
        return self.pool

    def close(self) -> None:
        """Stop the episodes' env pool (and remove its temporary folder) and eval.rewards' workers; the validator may
        be used again."""
        if self.reward is not None:
            self.reward.close()
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def episode_scores(self, rows: list[dict[str, Any]]) -> dict[str, float]:
        if self.bench is not None:
            return self.metrics_of(aggregate(self.bench, rows))
        ok = [item_score(r) for r in rows]
        out = {"eval/accuracy": sum(ok) / len(ok)}
        out |= {f"eval/{k}": v for k, v in episode_summary(rows).items()}
        return out | self.grouped(ok)

    def benchmark_scores(self, responses: list[str]) -> dict[str, float]:
        from mmrl.eval import score_predictions

        _, m = score_predictions(self.bench, self.items, responses)
        return self.metrics_of(m)

    @staticmethod
    def metrics_of(m: dict[str, Any]) -> dict[str, float]:
        """``eval/...`` names for a benchmark's metrics (:func:`mmrl.eval.scoring.aggregate`)."""
        out = {"eval/accuracy": float(m["accuracy"])}
        out |= {f"eval/{k}": float(v) for k, v in (m.get("parts") or {}).items()}
        out |= {f"eval/{k}": float(v) for k, v in (m.get("summary") or {}).items()}
        for key, values in (m.get("breakdowns") or {}).items():
            out |= {f"eval/accuracy/{key}={v}": float(r["accuracy"]) for v, r in values.items()}
        return out

    def reward_scores(self, results: list[Any]) -> dict[str, float]:
        scores = [r.score for r in results]
        ok = [sc >= self.cfg.eval.success_threshold - 1e-6 for sc in scores]
        out = {"eval/accuracy": sum(ok) / len(ok), "eval/reward_mean": sum(scores) / len(scores)}
        # each reward part's held-out mean (a click's coordinate part, ...)
        parts: dict[str, list[float]] = {}
        for r in results:
            for k, v in (r.parts or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    parts.setdefault(k, []).append(float(v))
        out |= {f"eval/part/{k}": sum(v) / len(v) for k, v in sorted(parts.items())}
        return out | self.grouped(ok)

    def grouped(self, ok: list[bool] | list[float]) -> dict[str, float]:
        """``eval/accuracy/<value>`` per value of the ``eval.group_by`` metadata key (``ok[i]`` for record i)."""
        key = self.cfg.eval.group_by
        groups: dict[str, list[float]] = {}
        for s, good in zip(self.samples, ok) if key else ():
            groups.setdefault(str(s.metadata.get(key, "none")), []).append(float(good))
        return {f"eval/accuracy/{g}": sum(v) / len(v) for g, v in sorted(groups.items())}
