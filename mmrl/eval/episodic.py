"""Env benchmarks: held-out tasks of a multi-turn world (:mod:`mmrl.envs`), where answering an item is an episode.

A text benchmark answers a batch of items with one ``engine.generate`` call and scores the texts; an env benchmark
(a subclass of :class:`EnvBenchmark`, naming its ``env``) runs ``--samples`` episodes per item instead (one, greedy,
by default) through :func:`mmrl.rollout.episodes.run_episodes`, in an :class:`~mmrl.envs.EnvPool` whose files (crops,
screenshots) go to ``episodes/`` in the output folder, and the env is the judge: nothing is scored from text
afterwards. Everything else is the runner's as for any benchmark (``predictions.jsonl``, resume, ``run.json``,
``metrics.json``, ``mmrl compare``). Items are a recipe's held-out records (``eval.jsonl`` as its data builder writes
it), each checked and turned into a sample by :func:`mmrl.data.validate_record` as training does, so the model sees
the prompt it was trained on.

Options (``key=value`` on the command line) are the episode settings (:class:`mmrl.config.EpisodeConfig`, training's
``rollout.episode``), under the same names: ``max_turns``, ``env_options`` (the env's own, checked against its signature; YAML:
``env_options={max_calls: 2}``), ``max_total_tokens``, ``max_images``, ``max_context_pixels``, ``image_rule``,
``observation_role``, ``env_workers`` and ``env_timeout_s``. ``env_workers`` changes no prediction, so a resumed run
may change it; the others are part of what ``run.json`` pins.

Success and metrics. The envs here are outcome envs: reward 1 (less a zoom's call penalty, floored at 0) on the last
step when the task is done, 0 otherwise. An episode succeeds when the env's last step says so (``info["success"]``),
else when its return is > 0 (:attr:`mmrl.rollout.episodes.Trajectory.success`), and ``accuracy`` is the success
rate (``mmrl compare``'s per-item score). ``summary`` adds, over all episodes:

- ``step_accuracy``: the mean of ``info["target_hit"]`` over every step whose env reports it (browser: the action
  was the oracle's next one; zoom: the zoom held the target, or the answer was right). Pooled over steps, so long
  episodes weigh more; absent when no step reports it;
- ``turns_mean`` (steps per episode; 0 for an episode whose env failed at reset) and ``return_mean``;
- ``end/<how>``: the share of episodes that ended each way (:data:`ENDS`, as :class:`mmrl.rollout.episodes.Trajectory`).

Rows (``predictions.jsonl``): ``id``, ``correct`` (success), ``return``, ``end``, ``error`` (only when some episode
ended by one) and ``turns``: per step ``action`` (the text the env read), ``reward``, ``target_hit`` (None where the
env does not say), ``finish_reason``, ``images`` (the observation's new files, relative to the output folder) and
``info`` (the rest of the env's info); then the item's breakdown fields. With K samples each of these per-episode
keys holds a list of K. A prediction file alone cannot be scored (``--predictions``): rerunning the same command on
the same folder recomputes the metrics from its rows without generating.

In-training validation (:mod:`mmrl.train.validation`) runs the same episodes with :func:`run_held_out` and turns them into
the same rows and metrics with :func:`episode_row` and :func:`episode_summary`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from mmrl.config import EpisodeConfig, ModelConfig, opt
from mmrl.eval.base import Benchmark, EvalError, EvalItem, Loaded, Score
from mmrl.eval.loading import data_files, read_records

if TYPE_CHECKING:
    from mmrl.envs import EnvPool
    from mmrl.model.policy import Policy
    from mmrl.model.prompt import EncodedPrompt
    from mmrl.rollout.base import SamplingParams
    from mmrl.rollout.episodes import Trajectory

EPISODE_KEYS = ("correct", "return", "end", "error", "turns")  # a row's per-episode keys


@dataclass
class EpisodeOptions(EpisodeConfig):
    """An env benchmark's options: the episode settings (:class:`mmrl.config.EpisodeConfig`, training's
    ``rollout.episode``), with room for an answer after several steps."""

    max_turns: int = opt("completions per episode at most (the env may end it sooner)", 8)


# ---------------------------------------------------------------------------------------------- rows and metrics


def episode_row(
    item_id: str, trajectories: list[Trajectory], fields: dict[str, Any], out: Path | None = None
) -> dict[str, Any]:
    """The ``predictions.jsonl`` row of an item's episodes: per-episode keys hold a value, or a list with several."""
    recs = [t.to_record(out) for t in trajectories]
    many = len(recs) > 1
    row: dict[str, Any] = {"id": item_id}
    for key in EPISODE_KEYS:
        values = [r[key] for r in recs]
        if key != "error" or any(values):
            row[key] = values if many else values[0]
    for key, value in fields.items():
        if value is not None:
            row.setdefault(key, value)
    return row


def row_episodes(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row's episodes, each with the per-episode keys (``error`` None where the row has none)."""
    many = isinstance(row["correct"], list)
    n = len(row["correct"]) if many else 1
    columns = {k: row.get(k, [None] * n if many else None) for k in EPISODE_KEYS}
    if not many:
        return [columns]
    return [dict(zip(EPISODE_KEYS, values)) for values in zip(*columns.values())]


def episode_summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """:func:`mmrl.rollout.episodes.episode_stats` over every episode of ``rows`` (the module docstring)."""
    from mmrl.rollout.episodes import episode_stats

    return episode_stats([e for row in rows for e in row_episodes(row)])


# ---------------------------------------------------------------------------------------------- the benchmark kind


class EnvBenchmark(Benchmark):
    """A benchmark whose items are answered by episodes of ``env`` (module docstring). Subclasses set ``name``,
    ``env``, ``Options`` (an :class:`EpisodeOptions` with their defaults) and ``breakdowns`` (metadata keys)."""

    env: ClassVar[str]
    Options: ClassVar[type] = EpisodeOptions
    runtime_options = ("env_workers",)

    def __init__(self, options: dict[str, Any] | None = None, model: ModelConfig | None = None):
        super().__init__(options, model)
        from mmrl.envs import validate_episode_settings

        try:
            validate_episode_settings(self.env, self.opts)
        except (ValueError, KeyError) as e:
            raise EvalError(f"{self.name} option {e.args[0]}") from None

    def load(self, path: Path) -> Loaded:
        from mmrl.data import DataError, validate_record

        base = path if path.is_dir() else path.parent
        items = []
        for rec in read_records(path):
            try:  # the record as training reads it
                s = validate_record(rec.data, rec.where, base, check_media=self.check_media)
            except DataError as e:
                raise EvalError(
                    f"{e} ({rec.where}; the {self.name} benchmark reads its recipe's eval.jsonl)"
                ) from None
            items.append(EvalItem(s.id, s, {k: s.metadata.get(k) for k in self.breakdowns}))
        return Loaded(items, data_files(path))

    def extract(self, item: EvalItem, response: str) -> Any:
        raise EvalError(self.unscorable())

    def judge(self, item: EvalItem, extracted: Any) -> Score:
        raise EvalError(self.unscorable())

    def unscorable(self) -> str:
        """Why a response text cannot be scored here (``--predictions``, :meth:`extract`, :meth:`judge`)."""
        return (
            f"benchmark {self.name!r} is judged by its env {self.env!r} during episodes, not from response texts: "
            "evaluate a model with --model (rerunning on an output folder recomputes its metrics from its rows)"
        )

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, float]:
        return episode_summary(rows)

    def respond(
        self,
        policy: Policy,
        engine: Any,
        items: list[EvalItem],
        prompts: list[EncodedPrompt],
        params: SamplingParams,
        pool: EnvPool,
        out: Path,
    ) -> list[dict[str, Any]]:
        """The rows of ``items``: ``params.n`` episodes each, run in ``pool``; image paths relative to ``out``."""
        from mmrl.rollout.episodes import run_episodes

        samples = [it.sample for it in items]
        trajs = run_episodes(
            policy, engine, samples, params, pool=pool, env_name=self.env, settings=self.opts, prompts=prompts
        )
        return [episode_row(it.id, g, it.fields, out) for it, g in zip(items, trajs)]
