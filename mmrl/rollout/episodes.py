"""The episode driver: multi-turn rollouts built by appending token ids (docs/agents.md#the-episode-driver).

An episode is ``prompt | completion_1 | obs_1 | completion_2 | obs_2 | ... | completion_k``. Each turn the driver
hands every live episode's whole current sequence to ONE ``engine.generate`` call, steps every live episode in the
:class:`~mmrl.envs.EnvPool` in parallel, and appends the observation's tokens
(:func:`~mmrl.rollout.observations.observation_delta`: the text the chat template writes after the assistant's
end-of-turn marker, tokenised alone, with the new images at the policy's geometry). The continuous schedule
(:class:`EpisodeDriver`) lets each episode advance on its own, and lets the next batch's episodes join the engine
calls while this batch's last ones still run. A single-turn sample is the same path, an episode of one turn whose G episodes share their prompt.

Invariants (each tested in tests/test_episodes.py):
- earlier turns are never re-tokenised: the sequence trained on is the sequence sampled, token for token, and
  :func:`trajectory_logprobs` over it equals the engine's per-turn log-probs;
- a completion that did not end with the end-of-turn marker gets it appended as an environment token (mask 0);
- earlier images are never dropped or shrunk (later turns were sampled after them): :class:`ImageBudget` acts on an
  observation's NEW images only (``downscale`` to what is left, else the episode ends with ``image_budget``);
- the media of a whole trajectory come from one processor call over all its images in order, so every family's
  batching convention is the one :meth:`Policy.encode` of the whole conversation gives;
- an episode ends on the env's ``done`` (``error`` when the step failed; the others go on), after ``max_turns``
  completions, or before a turn that could pass ``max_total_tokens``; teacher-forced episodes
  (``teacher="oracle"``) take every turn from the env's oracle, the rest of the path unchanged.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from mmrl.algos.advantages import Turn
from mmrl.config import EpisodeConfig
from mmrl.model.policy import Policy
from mmrl.model.prompt import EncodedPrompt
from mmrl.rollout.base import Completion, RolloutEngine, SamplingParams
from mmrl.rollout.observations import Delta, all_media, end_of_turn, observation_delta, prepare_images
from mmrl.types import Sample

if TYPE_CHECKING:
    from mmrl.envs.base import Observation, StepResult
    from mmrl.envs.pool import EnvPool

ENDS = ("done", "error", "max_turns", "max_tokens", "image_budget")  # how an env episode ends
POLL_S = 0.05  # EpisodeDriver: how often a waiting ``between`` is asked again while env steps run
_IDS = itertools.count()  # episode ids unique in this process: an EnvPool refuses a live id twice


# ---------------------------------------------------------------------------------------------- trajectories


@dataclass
class StepInfo:
    """One turn, for ``rollouts.jsonl``: the action as the env read it, its reward, the state it was taken in, the
    images the env answered with (shown to the next turn when it ran) and the env's info."""

    action: str
    reward: float
    state_key: str
    finish_reason: str  # the completion's: "stop" or "length"
    images: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """One episode: ``prompt`` (the first turn as encoded) and the ``response`` after it, sampled tokens (mask 1,
    with their rollout log-probs) and environment tokens (mask 0, log-prob 0); ``turns`` are the sampled spans over
    ``response`` (:class:`mmrl.algos.advantages.Turn`); ``mm``/``seq`` cover every image of every turn."""

    episode_id: str
    sample: Sample
    prompt: EncodedPrompt
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    steps: list[StepInfo] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # rendered prompt and deltas, for all_media
    images: list[Any] = field(default_factory=list)  # PIL, model size, all turns in order
    image_sizes: list[tuple[int, int]] = field(default_factory=list)
    model_image_sizes: list[tuple[int, int]] = field(default_factory=list)
    mm: dict[str, torch.Tensor] = field(default_factory=dict)
    seq_parts: list[tuple[int, dict[str, torch.Tensor]]] = field(default_factory=list)  # (length, tensors)
    completions: list[Completion] = field(default_factory=list)
    turn_media: list[dict[str, torch.Tensor]] = field(default_factory=list)  # ``mm`` as each turn saw it
    parts: list[str | list[int]] = field(default_factory=list)  # context() engine form: EncodedPrompt.parts
    end: str = ""  # done | error | max_turns | max_tokens | image_budget | single_turn
    error: str | None = None
    state_key: str = ""  # the state the next action is taken in
    response_prefix: str = ""  # what the current turn's generation prompt opened (a think block)
    _context: EncodedPrompt | None = field(default=None, repr=False)
    _scoring: EncodedPrompt | None = field(default=None, repr=False)

    @classmethod
    def start(cls, episode_id: str, sample: Sample, prompt: EncodedPrompt, state_key: str) -> Trajectory:
        return cls(
            episode_id,
            sample,
            prompt,
            texts=[prompt.text],
            parts=[prompt.text],
            images=list(prompt.images),
            image_sizes=list(prompt.image_sizes),
            model_image_sizes=list(prompt.model_image_sizes),
            mm=prompt.mm,
            seq_parts=[(len(prompt.input_ids), prompt.seq)],
            state_key=state_key,
            response_prefix=prompt.response_prefix,
            _context=prompt,
        )

    @property
    def episode_return(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def success(self) -> bool:
        """The env's verdict on its last step (``info["success"]``, which ``zoom`` and ``browser_app`` give), else a
        positive return (an outcome env's reward; with a process reward such as ``step_reward`` the return alone
        would count partial credit as success)."""
        if self.steps and "success" in self.steps[-1].info:
            return bool(self.steps[-1].info["success"])
        return self.episode_return > 0

    def last_completion(self) -> Completion:
        """The last turn's completion (an empty one when the env failed at reset): what the rewards score."""
        return self.completions[-1] if self.completions else Completion([], "", [], "stop")

    def whole_response(self) -> Completion:
        """The whole response (environment tokens included) as one completion: ``text`` and ``finish_reason`` are
        the last turn's; a one-turn episode's is its completion."""
        last = self.last_completion()
        return Completion(list(self.response), last.text, list(self.logprobs), last.finish_reason)

    @property
    def length(self) -> int:
        return len(self.prompt.input_ids) + len(self.response)

    def context(self) -> EncodedPrompt:
        """The whole sequence so far as one prompt (the engine's next input; the same object until it grows)."""
        if self._context is None:
            ids = torch.cat([self.prompt.input_ids, torch.tensor(self.response, dtype=torch.long)])
            self._context = replace(
                self.prompt,
                input_ids=ids,
                mm=self.mm,
                seq=self.seq(),
                image_sizes=list(self.image_sizes),
                model_image_sizes=list(self.model_image_sizes),
                text="",  # the sequence is ids, not a re-renderable text
                parts=list(self.parts) if self.prompt.text else [],  # placeholders unexpanded, for vLLM
                images=list(self.images),
                response_prefix=self.response_prefix,
            )
        return self._context

    def set_media(self, mm: dict[str, torch.Tensor]) -> None:
        self.mm, self._context, self._scoring = mm, None, None

    def scoring_prompt(self) -> EncodedPrompt:
        """The first prompt with the media of the whole episode, the prompt of the training row (the prompt itself,
        shared by its group, while no later turn added images)."""
        if self.mm is self.prompt.mm:
            return self.prompt
        if self._scoring is None:
            self._scoring = replace(self.prompt, mm=self.mm)
        return self._scoring

    def response_seq(self) -> dict[str, torch.Tensor]:
        """The per-token tensors of the response (the observations' ``mm_token_type_ids``...; zeros on sampled
        tokens), as ``prompt.seq`` is the prompt's."""
        P = len(self.prompt.input_ids)
        return {k: v[P:] for k, v in self.seq().items()}

    def seq(self) -> dict[str, torch.Tensor]:
        keys = sorted({k for _, part in self.seq_parts for k in part})
        out = {}
        for key in keys:
            dtype = next(p[key].dtype for _, p in self.seq_parts if key in p)
            out[key] = torch.cat(
                [p[key].to(dtype) if key in p else torch.zeros(n, dtype=dtype) for n, p in self.seq_parts]
            )
        return out

    def add_completion(self, c: Completion) -> None:
        start = len(self.response)
        self._extend(c.token_ids, 1, c.logprobs)
        self.completions.append(c)
        self.turn_media.append(self.mm)  # the same object generation read (set_media replaces, never mutates)
        self.parts.append(list(c.token_ids))
        action = hashlib.blake2b(repr(list(c.token_ids)).encode(), digest_size=8).hexdigest()
        self.turns.append(Turn(start, len(self.response), 0.0, self.state_key, action))

    def reward_last_turn(self, reward: float) -> None:
        self.turns[-1] = replace(self.turns[-1], reward=float(reward))

    def add_observation(self, delta: Delta, marker: int | None) -> None:
        """Append an observation (after the end-of-turn ``marker`` when the completion did not sample it)."""
        if marker is not None:
            self._extend([marker], 0)
            self.parts.append([marker])
        self._extend(delta.ids, 0, seq=delta.seq)
        self.texts.append(delta.text)
        self.parts.append(delta.text)
        if delta.images:
            self.images += delta.images
            self.image_sizes += delta.image_sizes
            self.model_image_sizes += delta.model_image_sizes
        self.response_prefix = delta.response_prefix

    def _extend(
        self, ids: list[int], mask: int, logps: list[float] | None = None, seq: dict | None = None
    ) -> None:
        self.response += ids
        self.mask += [mask] * len(ids)
        self.logprobs += list(logps) if logps is not None else [0.0] * len(ids)
        self.seq_parts.append((len(ids), seq or {}))
        self._context = None

    def to_record(self, out: Path | None = None) -> dict[str, Any]:
        """The episode as plain data, the one record every log of episodes holds (``rollouts.jsonl``'s ``episode``
        and ``turns``, an env benchmark's ``predictions.jsonl`` rows, ``sft_dropped.jsonl``): ``id``, ``sample_id``,
        ``correct`` (:attr:`success`), ``return``, ``end``, ``error`` (None unless the env failed), the response's
        tokens and sampled tokens, and per step ``action`` (the text the env read), ``reward``, ``state_key``,
        ``target_hit`` (the env's ``info["target_hit"]``, None where it does not say), ``finish_reason``,
        ``images`` (the observation's new files, relative to ``out`` when given) and ``info`` (the rest of the
        env's info)."""
        turns = []
        for s in self.steps:
            info = dict(s.info)
            hit = info.pop("target_hit", None)
            turns.append(
                {"action": s.action, "reward": s.reward, "state_key": s.state_key,
                 "target_hit": None if hit is None else bool(hit), "finish_reason": s.finish_reason,
                 "images": [_relative(x, out) for x in s.images], "info": info}
            )  # fmt: skip
        return {
            "id": self.episode_id,
            "sample_id": self.sample.id,
            "correct": self.success,
            "return": self.episode_return,
            "end": self.end,
            "error": self.error,
            "response_tokens": len(self.response),
            "sampled_tokens": int(sum(self.mask)),
            "turns": turns,
        }


def _relative(path: str, out: Path | None) -> str:
    """``path`` relative to ``out`` when it lies inside (episode folders do), else as it is."""
    if out is None:
        return str(path)
    try:
        return str(Path(path).resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path)


def episode_stats(records: list[dict[str, Any]]) -> dict[str, float]:
    """The statistics of episodes (their :meth:`Trajectory.to_record` records), the one set training logs as
    ``episode/*`` and evaluation as its summary: ``step_accuracy`` (the mean of ``target_hit`` over every step
    whose env reports it, pooled over steps; absent when none does), ``turns_mean`` (steps per episode; 0 for one
    the env failed at reset), ``return_mean``, ``success`` (share correct), ``invalid_frac`` (steps the env found
    malformed), ``errors`` (episodes ended by an env failure) and ``end/<how>`` for every way in :data:`ENDS` (and
    any other seen): the share of episodes that ended so."""
    if not records:
        return {}
    n = len(records)
    steps = [t for r in records for t in r["turns"]]
    hits = [float(t["target_hit"]) for t in steps if t.get("target_hit") is not None]
    out = {"step_accuracy": sum(hits) / len(hits)} if hits else {}
    out["turns_mean"] = len(steps) / n
    out["return_mean"] = sum(float(r["return"]) for r in records) / n
    out["success"] = sum(bool(r["correct"]) for r in records) / n
    out["invalid_frac"] = sum(bool((t.get("info") or {}).get("invalid")) for t in steps) / max(1, len(steps))
    ends = Counter(str(r["end"]) for r in records)
    out["errors"] = float(ends["error"])
    for how in [*ENDS, *sorted(set(ends) - set(ENDS))]:
        out[f"end/{how}"] = ends[how] / n
    return out


# ---------------------------------------------------------------------------------------------- the driver


@dataclass(frozen=True)
class ImageBudget:
    """Images in one episode's context (the prompt's included), see the module docstring: ``max_images`` (count),
    ``max_pixels`` (model-input pixels summed), ``rule``: ``downscale`` new images to fit or ``end`` the episode."""

    max_images: int | None = None
    max_pixels: int | None = None
    rule: Literal["downscale", "end"] = "downscale"

    def fit(
        self, policy: Policy, traj: Trajectory, sources: list[str]
    ) -> tuple[list[Any], list[tuple[int, int]], list[tuple[int, int]]] | None:
        """The observation's images prepared within the budget, or None when the episode must end."""
        rid = traj.sample.id
        if not sources:
            return [], [], []
        if self.max_images is not None and len(traj.images) + len(sources) > self.max_images:
            return None
        prepared = prepare_images(policy, sources, rid)
        if self.max_pixels is None:
            return prepared
        used = sum(w * h for w, h in traj.model_image_sizes)
        left = self.max_pixels - used
        if sum(w * h for w, h in prepared[2]) <= left:
            return prepared
        if self.rule == "end" or left <= 0:
            return None
        try:
            prepared = prepare_images(policy, sources, rid, max_pixels=left // len(sources))
        except ValueError:  # below the geometry's smallest size (MediaError is a ValueError)
            return None
        return prepared if sum(w * h for w, h in prepared[2]) <= left else None


def run_episodes(
    policy: Policy,
    engine: RolloutEngine,
    samples: list[Sample],
    params: SamplingParams,
    *,
    pool: EnvPool | None = None,
    env_name: str | None = None,
    settings: EpisodeConfig | None = None,
    prompts: list[EncodedPrompt] | None = None,
    teacher: str | None = None,
    on_group: Callable[[int, list[Trajectory]], None] | None = None,
) -> list[list[Trajectory]]:
    """``params.n`` episodes of each sample, ``[B][G]``. Without ``env_name`` each is one turn (the collector's
    single-turn rollout); with it, episodes of ``env_name`` run in ``pool`` as ``settings`` say (the env's options,
    ``max_turns`` completions and ``max_total_tokens`` tokens at most, observation images within the image budget,
    each observation a ``observation_role`` turn). ``prompts``: the samples already encoded (the collector's
    prompt cache). ``teacher="oracle"``: the env's oracle writes every turn instead of ``engine`` (None allowed;
    module docstring). ``on_group`` (one turn each only): called with each sample's position and its G episodes as
    soon as the engine has finished them (:meth:`RolloutEngine.generate_streaming`), so their rewards can start
    while the others generate."""
    settings = settings or EpisodeConfig()
    if on_group is not None and env_name is not None:
        raise ValueError("on_group is for one-turn episodes; a multi-turn batch ends with its last episode")
    max_turns = settings.max_turns
    if env_name is not None and pool is None:
        raise ValueError(f"env {env_name!r}: run_episodes needs an EnvPool (pool=...) to run its episodes in")
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    if teacher not in (None, "oracle") or (teacher is not None and env_name is None):
        raise ValueError(
            f"teacher={teacher!r}: the only teacher is 'oracle', the env's own (Env.oracle), so it needs env_name"
        )
    if teacher is None and engine is None:
        raise ValueError("run_episodes needs an engine to sample from (or teacher='oracle')")
    prompts = prompts if prompts is not None else [policy.encode(s) for s in samples]
    G = params.n
    if env_name is None:  # one turn each, rewarded by the run's rewards; the G episodes share their prompt
        trajs = [
            [Trajectory.start(f"{s.id}#{g}", s, p, f"{s.id}#{g}") for g in range(G)]
            for s, p in zip(samples, prompts)
        ]
        if (
            teacher is None
        ):  # the single-turn call itself: G completions of each prompt, its media encoded once

            def done(b: int, group: list[Completion]) -> None:
                for t, c in zip(trajs[b], group):
                    t.add_completion(c)
                    t.end = "single_turn"
                if on_group is not None:
                    on_group(b, trajs[b])

            if on_group is None:
                for b, group in enumerate(engine.generate(prompts, params)):
                    done(b, group)
            else:
                engine.generate_streaming(prompts, params, done)
            return trajs
    else:
        trajs = reset_episodes(policy, pool, samples, prompts, G, env_name, settings.env_options)
    limits = Limits.of(policy, settings, params)
    live = [t for row in trajs for t in row if not t.end]
    if settings.schedule == "continuous" and teacher is None:
        driver = EpisodeDriver(policy, engine, pool, params, limits, settings.min_ready)
        driver.add(live)
        driver.run()
        driver.close()  # the episodes the driver ended, if a step of another was still running
        return trajs
    turn = 0
    try:
        while live:
            turn += 1
            if teacher is None:
                for t, c in zip(live, _generate(engine, [t.context() for t in live], params)):
                    t.add_completion(c)
            else:
                live = _teach(policy, pool, live, limits.marker)
                if not live:
                    break
            results = pool.step({t.episode_id: t.response_prefix + t.completions[-1].text for t in live})
            going = [t for t in live if _after_step(policy, t, results[t.episode_id], turn, limits)]
            pool.close_episode(*[t.episode_id for t in live if t.end and t.end not in ("done", "error")])
            live = going
    finally:  # an engine failure leaves no episode open in the pool (ids no longer live are ignored)
        pool.close_episode(*[t.episode_id for t in live if not t.end])
    return trajs


class EpisodeDriver:
    """The continuous schedule (docs/agents.md#continuous-episodes): episodes advance on their own. An engine call
    takes every episode whose step is back, once they are ``min_ready`` of the unfinished ones or no step is
    running; its steps are submitted at once, and the driver collects answers as they come in. Each episode's
    turns are what the lockstep schedule would make of the same completions; only which episodes share an engine
    call differs, so sampled runs are not reproducible across env timings.

    Episodes are added under a tag (a batch: the step whose batch they are) and :meth:`run` drives until every
    episode of one tag has ended; episodes of other tags (the next batch, started by ``between`` while this one's
    slowest still run: ``rollout.episode.next_batch_at``) share its engine calls and go on in the next :meth:`run`.
    On an exception every episode still open, of any tag, is closed in the pool."""

    def __init__(
        self,
        policy: Policy,
        engine: RolloutEngine,
        pool: EnvPool,
        params: SamplingParams,
        limits: Limits,
        min_ready: float,
    ):
        if not 0.0 < min_ready <= 1.0:
            raise ValueError(f"rollout.episode.min_ready must be in (0, 1], got {min_ready}")
        self.policy, self.engine, self.pool, self.params = policy, engine, pool, params
        self.limits, self.min_ready = limits, min_ready
        self.ready: list[Trajectory] = []
        self.stepping: dict[str, Trajectory] = {}
        self.tag: dict[str, Any] = {}  # episode id -> its batch
        self.running: Counter = Counter()  # batch -> its episodes not ended
        self._ended: list[str] = []  # ended by the driver, not by the env: to close
        self._closing: list[str] = []  # their closes queued, maybe not answered yet

    def add(self, trajs: list[Trajectory], tag: Any = None) -> None:
        """Episodes just reset (those already ended at reset are left out)."""
        for t in trajs:
            if not t.end:
                self.ready.append(t)
                self.tag[t.episode_id] = tag
                self.running[tag] += 1

    def run(self, tag: Any = None, between: Callable[[], bool] | None = None) -> None:
        """Drive until every episode of ``tag`` has ended. ``between()`` is called before each engine call may
        start (it may :meth:`add` episodes); while it returns True (it waits for something outside, such as the
        staleness bound) the driver polls every ``POLL_S`` instead of blocking until an env step is back."""
        try:
            while self.running[tag]:
                again = between() if between is not None else False
                ready, stepping = self.ready, self.stepping
                if ready and (not stepping or len(ready) >= self.min_ready * (len(ready) + len(stepping))):
                    for t, c in zip(ready, _generate(self.engine, [t.context() for t in ready], self.params)):
                        t.add_completion(c)
                    self.pool.submit(
                        {t.episode_id: t.response_prefix + t.completions[-1].text for t in ready}
                    )
                    stepping.update((t.episode_id, t) for t in ready)
                    self.ready = []  # only now: after a failed call or submit, close() still finds them
                for eid, res in self.pool.collect(timeout_s=POLL_S if again else None).items():
                    t = stepping[eid]
                    going = _after_step(self.policy, t, res, len(t.completions), self.limits)
                    del stepping[eid]  # only now: an exception above leaves it to close()
                    if going:
                        self.ready.append(t)
                        continue
                    self.running[self.tag.pop(eid)] -= 1
                    if t.end not in ("done", "error"):  # the env did not end it: close it
                        self._ended.append(eid)
                if self._ended:  # queued behind the worker's running steps, not waited for
                    self.pool.close_episode(*self._ended, wait=False)
                    self._closing += self._ended
                    self._ended = []
        except BaseException:
            self.close()
            raise
        live = set(self.pool.live)
        self._closing = [e for e in self._closing if e in live]

    def close(self) -> None:
        """Close every episode still open (a step in flight is dropped), and wait for the closes queued before."""
        left = [t.episode_id for t in [*self.ready, *self.stepping.values()] if not t.end]
        self.pool.close_episode(*self._closing, *self._ended, *left)  # waits for every close
        self.ready, self.stepping, self._ended, self._closing = [], {}, [], []
        self.tag.clear()
        self.running.clear()


@dataclass(frozen=True)
class Limits:
    max_turns: int
    max_total_tokens: int | None
    max_new_tokens: int
    images: ImageBudget
    role: str
    marker: int  # the assistant's end-of-turn token

    @classmethod
    def of(cls, policy: Policy, settings: EpisodeConfig, params: SamplingParams) -> Limits:
        """What ``settings`` allow an episode (``rollout.episode``), at ``params``' completion length."""
        role = settings.observation_role
        images = ImageBudget(settings.max_images, settings.max_context_pixels, settings.image_rule)
        return cls(
            settings.max_turns, settings.max_total_tokens, params.max_new_tokens, images, role,
            end_of_turn(policy, role)[0],
        )  # fmt: skip


def reset_episodes(
    policy: Policy,
    pool: EnvPool,
    samples: list[Sample],
    prompts: list[EncodedPrompt],
    G: int,
    env_name: str,
    options: dict[str, Any],
) -> list[list[Trajectory]]:
    """Start ``G`` episodes of each sample in ``pool`` (``[B][G]``; an episode the env could not start has ended
    with ``error``); the sample's env copy carries the image sizes and frame, as rewards see them."""
    eids = [[f"{s.id}#{g}~{next(_IDS)}" for g in range(G)] for s in samples]
    env_samples = [
        replace(
            s,
            metadata={
                **s.metadata,
                "image_sizes": [list(x) for x in p.image_sizes],
                "model_image_sizes": [list(x) for x in p.model_image_sizes],
                "coordinate_frame": p.coordinate_frame,
            },
        )
        for s, p in zip(samples, prompts)
    ]
    starts = pool.reset([(eid, env_name, options, es) for row, es in zip(eids, env_samples) for eid in row])
    out: list[list[Trajectory]] = []
    for b, (s, p) in enumerate(zip(samples, prompts)):
        row = []
        for g in range(G):
            res = starts[b * G + g]
            obs = res.observation
            if res.done or obs is None:
                t = Trajectory.start(eids[b][g], s, p, "")
                t.end, t.error = "error", str(res.info.get("error", "the env ended the episode at reset"))
            else:
                first = p if not (obs.text or obs.images) else policy.encode(with_first_observation(s, obs))
                t = Trajectory.start(eids[b][g], s, first, obs.state_key)
            row.append(t)
        out.append(row)
    return out


def with_first_observation(sample: Sample, obs: Observation) -> Sample:
    """The sample with the env's first observation in its last user turn: text after the prompt's text, images
    after the prompt's images (:mod:`mmrl.envs.base`)."""
    messages = [dict(m) for m in sample.messages]
    k = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if k is None:
        messages.append({"role": "user", "content": []})
        k = len(messages) - 1
    content = messages[k]["content"]
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    at = 1 + max((i for i, p in enumerate(parts) if p.get("type") == "image"), default=-1)
    parts[at:at] = [{"type": "image"} for _ in obs.images]
    if obs.text:
        glue = "\n" if any(p.get("type") == "text" and p.get("text") for p in parts) else ""
        parts.append({"type": "text", "text": glue + obs.text})
    messages[k] = {**messages[k], "content": parts}
    return replace(sample, messages=messages, images=[*sample.images, *obs.images])


def _after_step(policy: Policy, t: Trajectory, res: StepResult, turn: int, limits: Limits) -> bool:
    """Record a step's outcome; append its observation and return True when the episode goes on."""
    c = t.completions[-1]
    t.reward_last_turn(res.reward)
    obs = res.observation
    t.steps.append(
        StepInfo(t.response_prefix + c.text, float(res.reward), t.state_key, c.finish_reason,
                 list(obs.images) if obs is not None else [], dict(res.info))
    )  # fmt: skip
    if res.done or obs is None:
        error = res.info.get("error")
        t.end, t.error = ("error", str(error)) if error else ("done", None)
        return False
    if turn >= limits.max_turns:
        t.end = "max_turns"
        return False
    try:  # an image that cannot be read or encoded (MediaError is a ValueError) ends this episode only
        prepared = limits.images.fit(policy, t, list(obs.images))
        delta = None
        if prepared is not None:
            delta = observation_delta(
                policy, obs.text, role=limits.role, record_id=t.sample.id, prepared=prepared
            )
    except ValueError as e:
        t.end, t.error = "error", f"observation of turn {turn}: {e}"
        return False
    if delta is None:
        t.end = "image_budget"
        return False
    appended = None if c.token_ids and c.token_ids[-1] == limits.marker else limits.marker
    grow = (appended is not None) + len(delta.ids) + limits.max_new_tokens
    if limits.max_total_tokens is not None and t.length + grow > limits.max_total_tokens:
        t.end = "max_tokens"
        return False
    t.add_observation(delta, appended)
    if delta.images:
        t.set_media(all_media(policy, t.texts, t.images, t.prompt))
    t.state_key = obs.state_key
    return True


def _generate(
    engine: RolloutEngine, contexts: list[EncodedPrompt], params: SamplingParams
) -> list[Completion]:
    """One engine call for all contexts, one completion each. Contexts shared (the same object) by the same number
    of episodes are sampled as that many completions of one prompt (the single-turn call; vision runs once)."""
    counts = Counter(id(c) for c in contexts)
    unique = list({id(c): c for c in contexts}.values())
    if len(set(counts.values())) == 1:
        n = next(iter(counts.values()))
        groups = engine.generate(unique, replace(params, n=n))
        pending = {id(c): list(g) for c, g in zip(unique, groups)}
        return [pending[id(c)].pop(0) for c in contexts]
    return [g[0] for g in engine.generate(contexts, replace(params, n=1))]


def _teach(policy: Policy, pool: EnvPool, live: list[Trajectory], marker: int) -> list[Trajectory]:
    """Teacher forcing (module docstring): each live episode's completion is its env's oracle text and the
    end-of-turn ``marker``; an episode whose oracle has no action ends with an error. The episodes that go on."""
    texts = pool.oracle([t.episode_id for t in live])
    going, stopped = [], []
    for t in live:
        text = texts[t.episode_id]
        if text is None:
            t.end = "error"
            t.error = (
                f"episode {t.episode_id!r}: the env's oracle has no next action but the env did not say done (an "
                "oracle that cannot finish the task from this state, or a worker restart that lost the episode)"
            )
            stopped.append(t.episode_id)
            continue
        if t.response_prefix and text.startswith(t.response_prefix):
            text = text[len(t.response_prefix) :]
        ids = policy.tokenizer(text, add_special_tokens=False).input_ids + [marker]
        t.add_completion(Completion(ids, text, [0.0] * len(ids), "stop"))
        going.append(t)
    pool.close_episode(*stopped)
    return going


# ---------------------------------------------------------------------------------------------- training forward


def trajectory_logprobs(
    policy: Policy,
    trajectories: list[Trajectory],
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    packed: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The training forward over whole trajectories, the only one the update runs: each row is the trajectory's
    first prompt and its whole response (environment tokens and every later turn's images included), scored by
    :meth:`Policy.logprobs` on the sampled tokens (mask 1) only, in its layout (prompts left-padded, responses
    right-padded, or packed). Returns ``logp [B, T]`` (0 on environment tokens and padding), the entropy (or None)
    and ``mask [B, T]`` (1 on sampled tokens), T the longest response. A one-turn episode's row is exactly its
    prompt and completion."""
    return policy.logprobs(
        [t.scoring_prompt() for t in trajectories],
        [t.response for t in trajectories],
        sampled=[t.mask for t in trajectories],
        completion_seq=[t.response_seq() for t in trajectories],
        temperature=temperature,
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
        packed=packed,
    )
