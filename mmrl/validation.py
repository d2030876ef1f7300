"""In-training validation: greedy responses to held-out records, scored either by the run's own rewards or by a
benchmark's published scorer (the one ``mmrl eval`` uses, :mod:`mmrl.eval`).

- ``data.eval`` records: the composite reward scores each response; ``eval/accuracy`` is the share reaching
  ``eval.success_threshold``, with ``eval/accuracy/<value>`` per ``eval.group_by`` metadata value.
- ``eval.benchmark`` + ``eval.benchmark_data``: the benchmark's items, scored by its authors' rules, so the curve
  logged during training is the number ``mmrl eval`` reports for the checkpoint: ``eval/accuracy``, ``eval/<part>``
  and ``eval/accuracy/<key>=<value>`` for its breakdowns (subject, level, platform, ...).

Generation runs on a forked RNG with a fixed seed, so evaluating never changes the training run. With several
processes every rank generates and scores its contiguous share of the held-out records and rank 0 aggregates the
gathered results (the others return ``{}``): no rank waits in a collective while another evaluates alone.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrl.collect import Collector, reward_inputs
from mmrl.config import Config
from mmrl.types import Sample


class Validator:
    def __init__(self, cfg: Config, samples: list[Sample], collector: Collector):
        self.cfg, self.collector = cfg, collector
        self.items: list[Any] = []
        e = cfg.eval
        if e.benchmark:
            from mmrl.eval import load_benchmark

            self.items = load_benchmark(e.benchmark, e.benchmark_data, e.benchmark_options, model=cfg.model)
            self.items = self.items[: e.max_samples]
            samples = [it.sample for it in self.items]
        self.samples = samples[: e.max_samples]

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
        with torch.random.fork_rng(
            devices=devices
        ):  # also with no records here: engines may generate together
            torch.manual_seed(self.cfg.train.seed + 7919)
            groups = c.engine.generate(prompts, c.sampling_params(eval_mode=True))
        if self.items:
            texts = [t for part in d.gather([g[0].text for g in groups]) for t in part]
            return self.benchmark_scores(texts) if d.is_main else {}
        inputs = [
            ri
            for s, p, g in zip(samples, prompts, groups)
            for ri in reward_inputs(s, p, [x.text for x in g], [len(x.token_ids) for x in g])
        ]
        results = [r for part in d.gather(self.collector.reward(inputs) if inputs else []) for r in part]
        return self.reward_scores(results) if d.is_main else {}

    def benchmark_scores(self, responses: list[str]) -> dict[str, float]:
        from mmrl.eval import score_predictions

        e = self.cfg.eval
        _, m = score_predictions(
            e.benchmark, self.items, responses, options=e.benchmark_options, model=self.cfg.model
        )
        out = {"eval/accuracy": float(m["accuracy"])}
        out |= {f"eval/{k}": float(v) for k, v in (m.get("parts") or {}).items()}
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
        key = self.cfg.eval.group_by
        if key:
            groups_ok: dict[str, list[bool]] = {}
            for s, good in zip(self.samples, ok):
                groups_ok.setdefault(str(s.metadata.get(key, "none")), []).append(good)
            out |= {f"eval/accuracy/{g}": sum(v) / len(v) for g, v in sorted(groups_ok.items())}
        return out
