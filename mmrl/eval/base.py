"""What every benchmark family implements, and the registry ``mmrl eval --benchmark NAME`` looks it up in.

A benchmark reads its published layout from disk into :class:`EvalItem` records (the :class:`mmrl.types.Sample` the
model sees, plus the fields its scorer and its breakdowns need), scores raw responses the way its authors do, and
reads its own prediction-file format for ``--predictions``. Scoring is split into ``extract`` (response -> answer)
and ``judge`` (answer -> :class:`Score`) so that a prediction file that already holds the benchmark's extraction
(MathVista's ``extraction``, MATH-Vision's ``model_answer``) is judged directly, as the reference scorers do.

Env benchmarks (:class:`mmrl.eval.episodic.EnvBenchmark`: ``zoom``, ``gui_agent``) are the other kind: an item is
answered by episodes in a multi-turn env, which judges them; they add whole-set metrics through :meth:`summary`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mmrl.config import ConfigError, ModelConfig, from_dict
from mmrl.extras import MissingExtra
from mmrl.registry import Builtin, Registry
from mmrl.types import Sample

NOT_GIVEN: Any = type("NotGiven", (), {"__repr__": lambda self: "NOT_GIVEN"})()


class EvalError(ValueError):
    """A bad benchmark file, record, prediction file or option; the message names the record and the fix."""


@dataclass
class EvalItem:
    """One benchmark question: ``sample`` is what the model sees; ``fields`` (JSON values) are what the scorer and
    the per-category breakdowns read, copied into every ``predictions.jsonl`` line."""

    id: str
    sample: Sample
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Score:
    """One response's verdict: ``correct`` is a bool, or a score in [0, 1] for continuous metrics; ``parts`` are
    named sub-metrics averaged over the items that have them (e.g. TEDS-S, token F1)."""

    extracted: Any
    correct: bool | float
    parts: dict[str, float] = field(default_factory=dict)
    normalized: Any = NOT_GIVEN  # the answer as the reference scorer compares it (MathVista's ``prediction``)


@dataclass
class Loaded:
    items: list[EvalItem]
    files: list[Path]  # the record files read, hashed into metrics.json


@dataclass
class NoOptions:
    pass


class Benchmark(ABC):
    """Base class: subclasses set the class attributes and implement ``load``, ``extract`` and ``judge`` (or
    override ``score`` when scoring is batched, as rendering is)."""

    name: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    breakdowns: ClassVar[tuple[str, ...]] = ()  # field names; a list value counts the item under each entry
    continuous: ClassVar[bool] = False  # ``correct`` is a score in [0, 1], not a bool
    max_new_tokens: ClassVar[int] = 512
    extraction_key: ClassVar[str | None] = (
        None  # the prediction-file key holding an extraction to judge directly
    )
    # options that change no prediction (a pool's worker count): left out of run.json, so a resume may change them
    runtime_options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: dict[str, Any] | None = None, model: ModelConfig | None = None):
        try:
            self.opts = from_dict(self.Options, dict(options or {}), prefix=self.name)
        except ConfigError as e:
            raise EvalError(str(e)) from None
        self.model = model or ModelConfig()
        self.check_media = True  # off when only a prediction file is scored: the model never sees the media

    @abstractmethod
    def load(self, path: Path) -> Loaded: ...

    @abstractmethod
    def extract(self, item: EvalItem, response: str) -> Any: ...

    @abstractmethod
    def judge(self, item: EvalItem, extracted: Any) -> Score: ...

    def score(
        self, items: list[EvalItem], responses: list[str], given: list[Any] | None = None
    ) -> list[Score]:
        """Score ``responses[i]`` for ``items[i]``; ``given[i]``, unless it is :data:`NOT_GIVEN`, is an extraction
        taken from a prediction file and judged as it is."""
        given = given or [NOT_GIVEN] * len(items)
        return [
            self.judge(item, self.extract(item, r) if g is NOT_GIVEN else g)
            for item, r, g in zip(items, responses, given)
        ]

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, float]:
        """Metrics over the whole set of ``predictions.jsonl`` rows beyond the item means (``metrics["summary"]``,
        shown with ``accuracy``): an env benchmark's step accuracy and episode ends. None by default."""
        return {}

    def options_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.opts)


FAMILIES = ("mathvista", "mathv", "screenspot", "table", "pathvqa", "videoqa", "zoom", "gui_agent")
# each family's module, imported on first use (the optional packages its scorer or env needs: mmrl.extras)
_NEEDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mathvista": ("render", ("rapidfuzz",)),
    "mathv": ("render", ("math_verify",)),
    "table": ("render", ("lxml", "scipy", "rapidfuzz")),
    "gui_agent": ("gui", ("playwright",)),
}
BENCHMARKS: Registry[type[Benchmark]] = Registry(
    "benchmark", {f: Builtin(f"mmrl.eval.{f}", *_NEEDS.get(f, (None, None))) for f in FAMILIES}
)


def register(cls: type[Benchmark]) -> type[Benchmark]:
    return BENCHMARKS.register(cls.name)(cls)


def get_benchmark(
    name: str, options: dict[str, Any] | None = None, model: ModelConfig | None = None
) -> Benchmark:
    """The benchmark ``name`` with its options checked (unknown or mistyped options raise :class:`EvalError`, as
    does a missing optional package: the extra to install)."""
    try:
        cls = BENCHMARKS.get(name)
    except KeyError as e:
        raise EvalError(e.args[0]) from None
    except MissingExtra as e:
        raise EvalError(str(e)) from None
    return cls(options, model)
