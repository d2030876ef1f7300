"""``mmrl eval``: batched generation through a rollout engine, scoring, and the output folder, resumable.

Flow: load the benchmark's items (``--limit`` keeps the first N) -> skip the items already in
``DIR/predictions.jsonl`` -> for each batch of the rest: encode, generate K responses per item (greedy by default),
score, append the rows and flush -> metrics over the selected items -> ``metrics.json``, ``metrics.md``, plots.
For an env benchmark (:mod:`mmrl.eval.episodic`) "generate and score" is K episodes per item in an env pool whose
files go to ``DIR/episodes/``, judged by the env; the rest of the flow is the same.

Resume: a killed run leaves whole lines plus at most one cut-off line; the cut-off line is dropped and those items
are generated again, every complete line is kept and its item is not regenerated. ``DIR/run.json`` records what
the predictions depend on (model, benchmark, data hash, samples, generation, model and benchmark settings); a rerun
with different values stops with an error instead of mixing two runs in one file (options that change no
prediction, :attr:`Benchmark.runtime_options`, are left out). Sampled runs (temperature > 0) seed each batch with
``seed + index of its first item``, so a resumed run draws the same samples for the batches it regenerates as long
as the batch boundaries are the same.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import time
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mmrl.config import ConfigError, ModelConfig, from_dict, opt, to_dict
from mmrl.eval.base import Benchmark, EvalError, EvalItem, get_benchmark
from mmrl.eval.episodic import EnvBenchmark
from mmrl.eval.loading import sha256_files
from mmrl.eval.report import write_outputs
from mmrl.eval.scoring import aggregate, read_predictions, score_rows
from mmrl.eval.screening import screen
from mmrl.rollout.base import RolloutEngine

# Qwen2.5-VL's own processor default (the resolution its reported benchmark numbers use), not the training default.
EVAL_MODEL_DEFAULTS: dict[str, Any] = {"max_pixels": 12845056}


# The model settings that change what the model sees (and so its responses); the device and kernels may change on a
# resume without invalidating the rows already written.
OUTPUT_MODEL_KEYS = (
    "dtype",
    "min_pixels",
    "max_pixels",
    "video_min_pixels",
    "video_max_pixels",
    "video_fps",
    "video_max_frames",
)


@dataclass
class Generation:
    temperature: float | None = opt("0 = greedy; None = greedy for one sample, 1.0 for --samples > 1", None)
    top_p: float = opt("nucleus sampling threshold", 1.0)
    top_k: int = opt("top-k sampling (0 = off)", 0)
    max_new_tokens: int | None = opt("longest response in tokens (None = the benchmark's default)", None)
    seed: int = opt("sampling seed (each batch uses seed + the index of its first item)", 0)
    system_prompt: str | None = opt("a system message put before every item's prompt", None)


@dataclass
class EvalRequest:
    benchmark: str
    data: str
    output_dir: str
    model: str | None = None
    predictions: str | None = None
    limit: int | None = None
    samples: int = 1
    engine: str = "hf"
    batch_size: int = 8
    overrides: list[str] = dataclasses.field(default_factory=list)
    progress: bool = True


def split_overrides(pairs: list[str], bench: type[Benchmark]) -> tuple[dict, dict, dict]:
    """``key=value`` settings routed to generation, model or benchmark options, by name (names never overlap)."""
    groups: dict[str, tuple[type, dict]] = {
        "generation": (Generation, {}),
        "model": (ModelConfig, {}),
        f"{bench.name} options": (bench.Options, {}),
    }
    hints = {name: typing.get_type_hints(cls) for name, (cls, _) in groups.items()}
    hints["model"].pop("path")  # the model is --model
    for item in pairs:
        key, eq, raw = item.partition("=")
        if not eq:
            raise EvalError(f"setting {item!r} must look like key=value")
        group = next((g for g, h in hints.items() if key in h), None)
        if group is None:
            known = [k for h in hints.values() for k in h]
            near = difflib.get_close_matches(key, known, n=1)
            listing = "; ".join(f"{g}: {', '.join(h)}" for g, h in hints.items())
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise EvalError(f"unknown setting {key!r}; {hint}({listing})")
        tp = hints[group][key]
        if tp in (str, str | None):  # text settings stay text: a prompt template is not YAML
            value: Any = None if raw in ("null", "None", "~") and tp is not str else raw
        else:
            try:
                value = yaml.safe_load(raw) if raw else ""
            except yaml.YAMLError as e:
                raise EvalError(f"setting {key}: cannot read {raw!r} ({e.problem})") from None
        groups[group][1][key] = value
    return groups["generation"][1], groups["model"][1], groups[f"{bench.name} options"][1]


def run_eval(req: EvalRequest) -> dict[str, Any]:
    """Run or resume one evaluation; returns the metrics written to ``DIR/metrics.json``."""
    bench, gen, model = resolve(req)
    data = Path(req.data)
    if not data.exists():
        raise EvalError(f"data not found: {data}")
    loaded = bench.load(data)
    items = loaded.items[: req.limit] if req.limit else loaded.items
    if not items:
        raise EvalError(f"{data}: no records")
    _check_unique(items, data)
    out = Path(req.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = screen(items, model, out / "skipped.jsonl") if req.model else items  # mmrl.eval.screening
    identity = {
        "benchmark": bench.name,
        "model": req.model,
        "predictions": str(Path(req.predictions).resolve()) if req.predictions else None,
        "data_sha256": sha256_files(loaded.files),
        "samples": req.samples,
        "generation": dataclasses.asdict(gen),
        "model_settings": {k: v for k, v in to_dict(model).items() if k in OUTPUT_MODEL_KEYS},
        "options": {k: v for k, v in bench.options_dict().items() if k not in bench.runtime_options},
    }
    _claim(out, identity)
    t0 = time.perf_counter()
    if req.predictions:
        responses, given = read_predictions(Path(req.predictions), bench, items)
        new_rows = score_rows(bench, items, responses, given)
        _write_rows(out / "predictions.jsonl", new_rows, mode="w")
        done = {r["id"]: r for r in new_rows}
    else:
        done = read_done(out / "predictions.jsonl")
        pending = [it for it in items if it.id not in done]
        new_rows = (
            generate(bench, items, pending, model, gen, req, out / "predictions.jsonl") if pending else []
        )
        done |= {r["id"]: r for r in new_rows}
    seconds = time.perf_counter() - t0
    rows = [done[it.id] for it in items]
    metrics = {
        "benchmark": bench.name,
        "model": req.model,
        "predictions": identity["predictions"],
        "data": {"path": str(data.resolve()), "sha256": identity["data_sha256"]},
        **aggregate(bench, rows),
        "settings": {
            **identity,
            "model_settings": {k: v for k, v in to_dict(model).items() if k != "path"},
            "options": bench.options_dict(),
            "limit": req.limit,
            "engine": req.engine,
            "batch_size": req.batch_size,
        },
        "throughput": {
            "items": len(new_rows),
            "seconds": seconds,
            "items_per_s": len(new_rows) / seconds if new_rows and seconds > 0 else None,
        },
    }
    write_outputs(out, metrics, rows, bench.continuous)
    return metrics


def resolve(req: EvalRequest) -> tuple[Benchmark, Generation, ModelConfig]:
    """The benchmark (options checked), generation settings (temperature resolved) and model settings."""
    if (req.model is None) == (req.predictions is None):
        raise EvalError(
            "give --model PATH (generate with a model) or --predictions FILE (score a file), one of them"
        )
    for name, value in (("--samples", req.samples), ("--batch-size", req.batch_size), ("--limit", req.limit)):
        if value is not None and value < 1:
            raise EvalError(f"{name} must be at least 1, got {value}")
    gen_over, model_over, options = split_overrides(req.overrides, type(get_benchmark(req.benchmark)))
    try:
        gen = from_dict(Generation, gen_over)
        model = from_dict(ModelConfig, {**EVAL_MODEL_DEFAULTS, **model_over, "path": req.model or ""})
    except ConfigError as e:
        raise EvalError(str(e)) from None
    if gen.temperature is None:
        gen = dataclasses.replace(gen, temperature=1.0 if req.samples > 1 else 0.0)
    bench = get_benchmark(req.benchmark, options, model)
    if req.predictions and isinstance(bench, EnvBenchmark):
        raise EvalError(bench.unscorable())
    bench.check_media = req.predictions is None
    return bench, gen, model


def _check_unique(items: list[EvalItem], data: Path) -> None:
    seen: set[str] = set()
    for it in items:
        if it.id in seen:
            raise EvalError(f"{data}: duplicate item id {it.id!r} (ids must be unique to match predictions)")
        seen.add(it.id)


def _claim(out: Path, identity: dict[str, Any]) -> None:
    """Write ``run.json``, or check that the one already there describes the same evaluation."""
    path = out / "run.json"
    if path.is_file():
        before = json.loads(path.read_text())
        changed = sorted(k for k in identity if before.get(k) != identity[k])
        if changed:
            raise EvalError(
                f"{out} holds an evaluation with different {', '.join(changed)} (see {path}); "
                "use a new --output-dir, or delete the folder to start over"
            )
        return
    path.write_text(json.dumps(identity, indent=1) + "\n")


def read_done(path: Path) -> dict[str, dict[str, Any]]:
    """Rows already written; a cut-off last line (a killed run) is dropped and the file rewritten without it."""
    if not path.is_file():
        return {}
    lines = path.read_text(encoding="utf-8").split("\n")
    rows, bad = [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            bad.append(n)
    last = max((n for n, ln in enumerate(lines, 1) if ln.strip()), default=0)
    if any(n != last for n in bad):
        raise EvalError(f"{path}: line {bad[0]} is not JSON; only a cut-off last line is repaired on resume")
    if bad or not path.read_text(encoding="utf-8").endswith("\n"):
        _write_rows(path, rows, mode="w")
    return {r["id"]: r for r in rows}


def _write_rows(path: Path, rows: list[dict[str, Any]], mode: str) -> None:
    with path.open(mode, encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def make_engine(name: str, policy: Any, batch_size: int) -> Any:
    """The rollout engine ``name``; an engine living in ``mmrl.rollout.<name>`` is imported on first use."""
    import importlib

    from mmrl.rollout import ENGINES

    if name not in ENGINES:
        try:
            importlib.import_module(f"mmrl.rollout.{name}")
        except ImportError as e:
            raise EvalError(
                f"rollout engine {name!r} is not available here ({e}); use --engine hf, or run in an "
                f"environment with its dependencies (vLLM: pip install 'mmrl[vllm]')"
            ) from None
    try:
        return ENGINES.get(name)(policy, batch_size=batch_size)
    except KeyError as e:
        raise EvalError(e.args[0]) from None


def generate(
    bench: Benchmark,
    items: list[EvalItem],
    pending: list[EvalItem],
    model: ModelConfig,
    gen: Generation,
    req: EvalRequest,
    path: Path,
) -> list[dict[str, Any]]:
    """Generate, score and append rows for ``pending``, one batch at a time; returns the new rows."""
    import torch

    from mmrl.model.policy import Policy
    from mmrl.processors.errors import MediaError
    from mmrl.rollout import SamplingParams

    policy = Policy.from_pretrained(model)
    engine = make_engine(req.engine, policy, req.batch_size)
    params = SamplingParams(
        n=req.samples,
        temperature=gen.temperature,
        top_p=gen.top_p,
        top_k=gen.top_k,
        max_new_tokens=gen.max_new_tokens or bench.max_new_tokens,
    )
    position = {it.id: i for i, it in enumerate(items)}
    new: list[dict[str, Any]] = []
    with (
        closing_engine(engine),
        _responder(bench, policy, engine, params, path.parent) as respond,
        _progress(len(items), len(items) - len(pending), bench.name, req.progress) as advance,
    ):
        for start in range(0, len(pending), req.batch_size):
            chunk = [_with_system(it, gen.system_prompt) for it in pending[start : start + req.batch_size]]
            torch.manual_seed(gen.seed + position[chunk[0].id])
            try:
                prompts = [policy.encode(it.sample) for it in chunk]
            except MediaError as e:
                raise EvalError(str(e)) from None
            rows = respond(chunk, prompts)
            _write_rows(path, rows, mode="a")
            new += rows
            advance(len(chunk))
    return new


Respond = Callable[[list[EvalItem], list[Any]], list[dict[str, Any]]]


@contextmanager
def closing_engine(engine: RolloutEngine) -> Iterator[RolloutEngine]:
    """Shut an engine that has ``close`` down on the way out (a vLLM engine left to the garbage collector shuts down
    whenever it is collected, destroying the parallel groups of whichever engine is alive then)."""
    try:
        yield engine
    finally:
        engine.close()


@contextmanager
def _responder(
    bench: Benchmark, policy: Any, engine: RolloutEngine, params: Any, out: Path
) -> Iterator[Respond]:
    """``respond(items, prompts)``: the scored rows of a batch. A text benchmark makes one engine call and scores
    the responses; an env benchmark runs ``params.n`` episodes per item in an env pool under ``out/episodes``,
    closed on the way out."""
    if isinstance(bench, EnvBenchmark):
        from mmrl.envs import EnvPool

        with EnvPool.for_episodes(out / "episodes", bench.opts) as pool:
            yield lambda items, prompts: bench.respond(policy, engine, items, prompts, params, pool, out)
        return

    def respond(items: list[EvalItem], prompts: list[Any]) -> list[dict[str, Any]]:
        groups = engine.generate(prompts, params)
        many = params.n > 1
        rows = score_rows(bench, items, [[c.text for c in g] if many else g[0].text for g in groups])
        for row, g in zip(rows, groups):
            reasons = [c.finish_reason for c in g]
            row["finish_reason"] = reasons if many else reasons[0]
        return rows

    yield respond


def _with_system(item: EvalItem, system: str | None) -> EvalItem:
    if not system or item.sample.messages[0].get("role") == "system":
        return item
    sample = dataclasses.replace(
        item.sample, messages=[{"role": "system", "content": system}, *item.sample.messages]
    )
    return dataclasses.replace(item, sample=sample)


@contextmanager
def _progress(total: int, completed: int, name: str, enabled: bool) -> Iterator[Any]:
    """A rich progress bar on stderr with items/s; ``advance(n)`` moves it."""
    if not enabled:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class ItemsPerSecond(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:.2f} items/s" if speed else "- items/s")

    columns = [
        TextColumn(f"eval {name}"),
        BarColumn(),
        MofNCompleteColumn(),
        ItemsPerSecond(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task(name, total=total, completed=completed)
        yield lambda n: progress.advance(task, n)
