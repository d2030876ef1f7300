"""The continuous episode schedule (docs/agents.md#continuous-episodes): the env pool's submit/collect (answers as
they come in, behind what a worker runs, dropped when the episode closes) and the driver that lets an episode whose
step is back generate its next turn while slower steps still run. Its trajectories equal the lockstep schedule's
for an engine whose completion depends only on the context; only which episodes share an engine call differs.

Env: ``test_pictures`` (tests/episode_envs.py), whose samples with ``hang`` sleep in every step."""

from __future__ import annotations

import episode_envs  # noqa: F401  (registers test_pictures)
import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.config import EpisodeConfig, ModelConfig
from mmrl.envs import EnvPool
from mmrl.model.policy import Policy
from mmrl.rollout import RolloutEngine, SamplingParams
from mmrl.rollout.base import Completion
from mmrl.rollout.episodes import run_episodes
from mmrl.rollout.observations import end_of_turn
from mmrl.types import Sample


@pytest.fixture(scope="module")
def pol(tiny_family):
    return Policy.from_pretrained(
        ModelConfig(path=str(tiny_family("qwen2_5_vl")), min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28)
    )


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    path = tmp_path_factory.mktemp("pictures") / "p.png"
    Image.fromarray((np.random.default_rng(0).random((60, 40, 3)) * 255).astype(np.uint8)).save(path)
    return str(path)


def _sample(sid: str, image: str, **meta) -> Sample:
    content = [{"type": "image"}, {"type": "text", "text": "What is here?"}]
    return Sample(sid, [{"role": "user", "content": content}], images=[image], metadata=meta)


class _Echo(RolloutEngine):
    """Each completion is ``act <context length>`` and the end-of-turn marker: a function of the context alone, so
    both schedules give the same episodes. Records each call's sample ids and whether any step was then still
    running in the pool."""

    def __init__(self, policy: Policy, pool: EnvPool | None = None):
        self.policy, self.pool, self.calls = policy, pool, []
        self.marker = end_of_turn(policy)[0]

    def sync_weights(self) -> None:
        return None

    def generate(self, prompts, params):
        self.calls.append(len(prompts) * params.n)
        out = []
        for p in prompts:
            text = f"act {len(p.input_ids)}"
            ids = self.policy.tokenizer(text, add_special_tokens=False).input_ids + [self.marker]
            out.append([Completion(ids, text, [-0.5] * len(ids), "stop") for _ in range(params.n)])
        return out


def test_submit_collect_returns_answers_as_they_come(picture, tmp_path):
    samples = [_sample("slow", picture, hang=True), _sample("fast", picture)]
    opts = {"steps": 3, "hang_s": 1.5}
    with EnvPool(tmp_path, workers=2, timeout_s=30) as pool:
        pool.reset([(s.id, "test_pictures", opts, s) for s in samples])  # one episode per worker
        pool.submit({"slow": "a", "fast": "a"})
        assert pool.in_flight == 2
        with pytest.raises(ValueError, match="already has a step in flight"):
            pool.submit({"fast": "b"})
        first = pool.collect()
        assert list(first) == ["fast"] and first["fast"].reward == pytest.approx(0.1)
        pool.submit({"fast": "b"})  # the fast one steps again while the slow one sleeps
        second = pool.collect()
        assert list(second) == ["fast"] and second["fast"].observation.state_key == "fast:2"
        assert pool.collect(timeout_s=0.0) == {}  # nothing in yet, and no wait
        rest = pool.collect()
        assert list(rest) == ["slow"] and rest["slow"].observation.state_key == "slow:1"
        assert pool.in_flight == 0 and pool.collect() == {}
        # a step submitted and its episode closed: the result is dropped, the pool goes on
        pool.submit({"slow": "b"})
        pool.close_episode("slow")
        assert pool.in_flight == 0 and pool.live == ["fast"]
        assert pool.step({"fast": "c"})["fast"].done  # step 3 of 3


def test_steps_for_a_busy_worker_wait_on_this_side(picture, tmp_path):
    """A worker reads a message only between batches: steps submitted while it runs one are held here and sent
    when it is done. Sent at once, 60 actions of 10 KB (more than a pipe holds) would block submit() until the
    hanging step ended, so the step would already be in when submit() returned."""
    slow = _sample("slow", picture, hang=True)
    fast = [_sample(f"f{i}", picture) for i in range(60)]
    with EnvPool(tmp_path, workers=1, timeout_s=30) as pool:
        pool.reset([(s.id, "test_pictures", {"hang_s": 2.0}, s) for s in [slow, *fast]])
        pool.submit({"slow": "a"})
        pool.submit({s.id: "x" * 10_000 for s in fast})
        assert pool.collect(timeout_s=0.0) == {} and pool.in_flight == 61
        with pytest.raises(ValueError, match="in flight"):
            pool.step({"f0": "b"})  # a second step of an episode whose first is not back
        got = {}
        while pool.in_flight:
            got |= pool.collect()
        assert sorted(got) == sorted(["slow", *[s.id for s in fast]])
        assert all(r.observation.state_key == f"{eid}:1" for eid, r in got.items())
        assert all(r.info["action_chars"] == 10_000 for eid, r in got.items() if eid != "slow")


def test_a_step_past_its_deadline_comes_back_as_an_error(picture, tmp_path):
    samples = [_sample("slow", picture, hang=True), _sample("fast", picture)]
    with EnvPool(tmp_path, workers=2, timeout_s=1.0) as pool:
        pool.reset([(s.id, "test_pictures", {"hang_s": 5.0}, s) for s in samples])
        pool.submit({"slow": "a", "fast": "a"})
        got = {}
        while pool.in_flight:
            got |= pool.collect()
        assert got["slow"].done and got["slow"].info["error"] == "timeout" and not got["fast"].done
        assert pool.stats()["timeouts"] == 1 and pool.stats()["restarts"] == 1


def _episodes(pol, picture, tmp_path, schedule, **kw):
    samples = [_sample("slow", picture, hang=True), _sample("fast", picture)]
    settings = EpisodeConfig(max_turns=5, env_options={"steps": 3, "hang_s": 1.0}, schedule=schedule, **kw)
    with EnvPool(tmp_path, workers=4, timeout_s=30) as pool:  # every episode its own worker
        engine = _Echo(pol, pool)
        trajs = run_episodes(
            pol, engine, samples, SamplingParams(n=2, max_new_tokens=8), pool=pool,
            env_name="test_pictures", settings=settings,
        )  # fmt: skip
        assert pool.live == [] and pool.in_flight == 0
    return trajs, engine.calls


def test_continuous_episodes_equal_lockstep_ones_and_do_not_wait_for_the_slowest(pol, picture, tmp_path):
    lock, lock_calls = _episodes(pol, picture, tmp_path / "lock", "lockstep")
    cont, cont_calls = _episodes(pol, picture, tmp_path / "cont", "continuous")
    assert lock_calls == [4, 4, 4]  # every turn waits for the slow episodes' steps
    # the fast episodes' turns 2 and 3 run while the slow ones' first step sleeps; the slow ones follow
    assert cont_calls[:3] == [4, 2, 2] and sum(cont_calls) == 12
    for a, b in zip([t for row in lock for t in row], [t for row in cont for t in row]):
        assert a.end == b.end == "done" and a.episode_return == b.episode_return == pytest.approx(1.3)
        assert a.response == b.response and a.mask == b.mask and a.logprobs == b.logprobs
        assert [(x.start, x.end, x.reward) for x in a.turns] == [(x.start, x.end, x.reward) for x in b.turns]
        assert [s.state_key for s in a.steps] == [s.state_key for s in b.steps]
        assert len(a.images) == len(b.images) == 3
        assert torch.equal(a.context().mm["pixel_values"], b.context().mm["pixel_values"])


def test_min_ready_waits_for_more_episodes(pol, picture, tmp_path):
    _, calls = _episodes(pol, picture, tmp_path, "continuous", min_ready=1.0)
    assert calls == [4, 4, 4]  # a call only once every unfinished episode waits for it: lockstep again
    with pytest.raises(ValueError, match="min_ready"):
        _episodes(pol, picture, tmp_path / "bad", "continuous", min_ready=0.0)


def test_an_engine_failure_closes_every_episode(pol, picture, tmp_path):
    class _Fails(_Echo):
        def generate(self, prompts, params):
            if self.calls:
                raise RuntimeError("engine died")
            return super().generate(prompts, params)

    samples = [_sample("slow", picture, hang=True), _sample("fast", picture)]
    settings = EpisodeConfig(max_turns=5, env_options={"hang_s": 0.5}, schedule="continuous")
    with EnvPool(tmp_path, workers=2, timeout_s=30) as pool:
        with pytest.raises(RuntimeError, match="engine died"):
            run_episodes(
                pol, _Fails(pol), samples, SamplingParams(n=1, max_new_tokens=8), pool=pool,
                env_name="test_pictures", settings=settings,
            )  # fmt: skip
        assert pool.live == [] and pool.in_flight == 0
