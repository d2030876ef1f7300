"""Env benchmarks: held-out tasks of a multi-turn world (:mod:`mmrl.envs`), where answering an item is an episode.

A text benchmark answers a batch of items with one ``engine.generate`` call and scores the texts; an env benchmark
(a subclass of :class:`EnvBenchmark`, naming its ``env``) runs ``--samples`` episodes per item instead (one, greedy,
by default) through :func:`mmrl.rollout.episodes.run_episodes`, in an :class:`~mmrl.envs.EnvPool` whose files (crops,
screenshots) go to ``episodes/`` in the output folder, and the env is the judge: nothing is scored from text
afterwards. Everything else is the runner's as for any benchmark (``predictions.jsonl``, resume, ``run.json``,
``metrics.json``, ``mmrl compare``). Items are a recipe's held-out records (``eval.jsonl`` as its data builder writes
it), each checked and turned into a sample by :func:`mmrl.data.validate_record` as training does, so the model sees
the prompt it was trained on.

Options (``key=value`` on the command line) are the episode settings of training's ``rollout`` config, under the
same names: ``max_turns``, ``env_options`` (the env's own, checked against its signature; YAML:
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

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from mmrl.config import ModelConfig, opt
from mmrl.eval.base import Benchmark, EvalError, EvalItem, Loaded, Score
from mmrl.eval.loading import data_files, read_records

if TYPE_CHECKING:
    from mmrl.envs import EnvPool
    from mmrl.model.policy import Policy
    from mmrl.model.prompt import EncodedPrompt
    from mmrl.rollout.base import SamplingParams
    from mmrl.rollout.episodes import Trajectory
    from mmrl.types import Sample

ENDS = ("done", "error", "max_turns", "max_tokens", "image_budget")  # how an env episode ends
EPISODE_KEYS = ("correct", "return", "end", "error", "turns")  # a row's per-episode keys


@dataclass
class EpisodeOptions:
    max_turns: int = opt("completions per episode at most (the env may end it sooner)", 8)
    env_options: dict[str, Any] = opt("the env's own options, e.g. env_options={max_calls: 2}", factory=dict)
    max_total_tokens: int | None = opt(
        "an episode's prompt + response tokens at most: a turn that could pass it does not start", None
    )
    max_images: int | None = opt("images in an episode's context at most (the prompt's included)", None)
    max_context_pixels: int | None = opt(
        "model-input pixels of all images in an episode's context at most (the prompt's included)", None
    )
    image_rule: Literal["downscale", "end"] = opt(
        "over the image budget: 'downscale' an observation's new images to fit, or 'end' the episode",
        "downscale",
    )
    observation_role: Literal["user", "tool"] = opt("the chat role of observation turns", "user")
    env_workers: int = opt("env worker processes (0: in this process, for debugging)", 2)
    env_timeout_s: float = opt("deadline of one env reset or step (the episode ends with an error)", 60.0)


def options_of(rollout: Any) -> EpisodeOptions:
    """The episode settings of a :class:`mmrl.config.RolloutConfig` (the same names)."""
    return EpisodeOptions(**{f.name: getattr(rollout, f.name) for f in dataclasses.fields(EpisodeOptions)})


def episode_pool(root: Path, opts: EpisodeOptions) -> EnvPool:
    from mmrl.envs import EnvPool

    return EnvPool(root, workers=opts.env_workers, timeout_s=opts.env_timeout_s)


def run_held_out(
    policy: Policy,
    engine: Any,
    samples: list[Sample],
    params: SamplingParams,
    pool: EnvPool,
    env: str,
    opts: EpisodeOptions,
    prompts: list[EncodedPrompt] | None = None,
) -> list[list[Trajectory]]:
    """``params.n`` episodes of env ``env`` per sample, ``[B][n]``, with the limits of ``opts``."""
    from mmrl.rollout.episodes import ImageBudget, run_episodes

    return run_episodes(
        policy,
        engine,
        samples,
        params,
        pool=pool,
        env_name=env,
        env_options=opts.env_options,
        max_turns=opts.max_turns,
        max_total_tokens=opts.max_total_tokens,
        images=ImageBudget(opts.max_images, opts.max_context_pixels, opts.image_rule),
        role=opts.observation_role,
        prompts=prompts,
    )


# ---------------------------------------------------------------------------------------------- rows and metrics


def _relative(path: str, out: Path | None) -> str:
    if out is None:
        return str(path)
    try:
        return str(Path(path).resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path)


def episode_record(t: Trajectory, out: Path | None = None) -> dict[str, Any]:
    """One episode as plain data (the module docstring's row keys); image paths relative to ``out`` if given."""
    turns = []
    for s in t.steps:
        info = dict(s.info)
        hit = info.pop("target_hit", None)
        turns.append(
            {"action": s.action, "reward": s.reward, "target_hit": None if hit is None else bool(hit),
             "finish_reason": s.finish_reason, "images": [_relative(p, out) for p in s.images], "info": info}
        )  # fmt: skip
    ret = t.episode_return
    return {"correct": t.success, "return": ret, "end": t.end, "error": t.error, "turns": turns}


def episode_row(
    item_id: str, trajectories: list[Trajectory], fields: dict[str, Any], out: Path | None = None
) -> dict[str, Any]:
    """The ``predictions.jsonl`` row of an item's episodes: per-episode keys hold a value, or a list with several."""
    recs = [episode_record(t, out) for t in trajectories]
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
    """A row's episodes, each with the per-episode keys but ``error``."""
    keys = [k for k in EPISODE_KEYS if k != "error"]
    if not isinstance(row["correct"], list):
        return [{k: row[k] for k in keys}]
    return [dict(zip(keys, values)) for values in zip(*(row[k] for k in keys))]


def episode_summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """``step_accuracy`` (when some step reports ``target_hit``), ``turns_mean``, ``return_mean`` and
    ``end/<how>`` over every episode of ``rows`` (module docstring)."""
    episodes = [e for row in rows for e in row_episodes(row)]
    if not episodes:
        return {}
    hits = [float(t["target_hit"]) for e in episodes for t in e["turns"] if t.get("target_hit") is not None]
    out = {"step_accuracy": sum(hits) / len(hits)} if hits else {}
    out["turns_mean"] = sum(len(e["turns"]) for e in episodes) / len(episodes)
    out["return_mean"] = sum(float(e["return"]) for e in episodes) / len(episodes)
    ends = Counter(str(e["end"]) for e in episodes)
    for how in [*ENDS, *sorted(set(ends) - set(ENDS))]:
        out[f"end/{how}"] = ends[how] / len(episodes)
    return out


# ---------------------------------------------------------------------------------------------- the benchmark kind


class EnvBenchmark(Benchmark):
    """A benchmark whose items are answered by episodes of ``env`` (module docstring). Subclasses set ``name``,
    ``env``, ``Options`` (an :class:`EpisodeOptions` with their defaults) and ``breakdowns`` (metadata keys)."""

    env: ClassVar[str]
    Options: ClassVar[type] = EpisodeOptions
    runtime_options = ("env_workers",)

    def __init__(self, options: dict[str, Any] | None = None, model: ModelConfig | None = None):
        super().__init__(options, model)
        o = self.opts
        for key, ok, need in (
            ("max_turns", o.max_turns >= 1, "at least 1"),
            ("env_workers", o.env_workers >= 0, "at least 0"),
            ("env_timeout_s", o.env_timeout_s > 0, "positive"),
        ):
            if not ok:
                raise EvalError(f"{self.name} option {key} must be {need}, got {getattr(o, key)!r}")
        from mmrl.envs import validate_env_options

        try:
            validate_env_options(self.env, o.env_options)
        except (ValueError, KeyError) as e:
            raise EvalError(f"{self.name} option env_options: {e.args[0]}") from None

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
        trajs = run_held_out(
            policy, engine, [it.sample for it in items], params, pool, self.env, self.opts, prompts
        )
        return [episode_row(it.id, g, it.fields, out) for it, g in zip(items, trajs)]
