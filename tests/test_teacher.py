"""Teacher-forced episodes (mmrl/rollout/episodes.py, ``teacher="oracle"``): every turn is the env's oracle text and the
end-of-turn marker, through the same observation, delta and limit code as sampled turns. The real ``zoom`` env on
the tiny recipe's data (in a worker process), and ``test_pictures`` (tests/episode_envs.py) for a thinking
template's response prefix and an oracle that gives up."""

from pathlib import Path

import episode_envs  # noqa: F401  (registers test_pictures)
import pytest
import torch

from mmrl.config import EpisodeConfig, ModelConfig
from mmrl.data import load_dataset
from mmrl.envs import EnvPool
from mmrl.envs.zoom import parse_action
from mmrl.model.policy import Policy
from mmrl.rollout import SamplingParams
from mmrl.rollout.episodes import run_episodes, trajectory_logprobs
from mmrl.rollout.observations import end_of_turn
from mmrl.types import Sample

TINY = Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl"


def _sampled_texts(pol: Policy, t) -> list[str]:
    """The mask-1 spans of a trajectory, decoded with special tokens (each ends with the end-of-turn marker)."""
    return [pol.tokenizer.decode(t.response[x.start : x.end]) for x in t.turns]


def test_teacher_forced_zoom_episodes_follow_the_oracle(tmp_path):
    """The oracle zooms on the red box (the env's parsing says it hit), then answers: every episode ends ``done``
    with return 1, each step's ``target_hit`` is True, the sampled tokens decode to the oracle's texts and the
    marker, and the training forward scores them (with gradients)."""
    from mmrl.recipes.zoom.data import build_tiny

    pol = Policy.from_pretrained(ModelConfig(path=str(TINY), min_pixels=3136, max_pixels=3136))
    samples = load_dataset(build_tiny(tmp_path / "data", n_train=3, n_eval=1)["train"]).samples
    marker = pol.tokenizer.convert_ids_to_tokens(end_of_turn(pol)[0])
    with EnvPool(tmp_path / "episodes", workers=1, timeout_s=30) as pool:
        trajs = run_episodes(
            pol, None, samples, SamplingParams(n=2, max_new_tokens=64), pool=pool, env_name="zoom",
            settings=EpisodeConfig(max_turns=4, env_options={"max_calls": 2}), teacher="oracle",
        )  # fmt: skip
        assert pool.live == []
    flat = [t for row in trajs for t in row]
    for t in flat:
        assert t.end == "done" and t.episode_return == 1.0, (t.end, t.error)
        assert [s.info["target_hit"] for s in t.steps] == [True, True]
        assert t.steps[0].info["zoom_hit"] and parse_action(t.steps[0].action)[0] == "zoom"
        assert t.steps[1].action == f"<answer>{t.sample.answer}</answer>"
        assert _sampled_texts(pol, t) == [s.action + marker for s in t.steps]
        assert all(c.finish_reason == "stop" and set(c.logprobs) == {0.0} for c in t.completions)
        assert len(t.images) == 2  # the prompt's image and the crop
    lp, _, mask = trajectory_logprobs(pol, flat, temperature=1.0)
    assert mask.sum() == sum(sum(t.mask) for t in flat)
    assert torch.isfinite(lp).all() and (lp[mask.bool()] < 0).all()
    (-lp.sum()).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in pol.model.parameters())


def test_the_think_prefix_is_not_written_twice_and_an_oracle_that_gives_up_ends_the_episode(
    tiny_family, tmp_path
):
    """Qwen3.5's generation prompt opens ``<think>``: an oracle text starting with it becomes a completion without
    it, and the env still reads the whole text. An oracle with no action before the env said done ends that
    episode with an error; the others go on, and nothing stays open in the pool."""
    from PIL import Image

    pol = Policy.from_pretrained(
        ModelConfig(path=str(tiny_family("qwen3_5")), min_pixels=4096, max_pixels=16384)
    )
    Image.new("RGB", (64, 64), (200, 30, 30)).save(tmp_path / "red.png")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Look."}]}]
    oracle = "<think>\nI look at {step}.</think>step {step}"
    samples = [
        Sample("go", messages, [str(tmp_path / "red.png")], metadata={"oracle": oracle}),
        Sample("stuck", messages, [str(tmp_path / "red.png")], metadata={"oracle_steps": 1}),
    ]
    with EnvPool(tmp_path / "episodes", workers=0) as pool:
        go, stuck = run_episodes(
            pol, None, samples, SamplingParams(n=1, max_new_tokens=16), pool=pool, env_name="test_pictures",
            settings=EpisodeConfig(max_turns=4, env_options={"steps": 2}), teacher="oracle",
        )  # fmt: skip
        assert pool.live == []
    (go,), (stuck,) = go, stuck
    assert go.end == "done" and [s.action for s in go.steps] == [oracle.format(step=i) for i in range(2)]
    assert [c.text for c in go.completions] == ["I look at 0.</think>step 0", "I look at 1.</think>step 1"]
    assert [s.info["action_chars"] for s in go.steps] == [len(oracle.format(step=i)) for i in range(2)]
    assert _sampled_texts(pol, go)[0] == "I look at 0.</think>step 0<|im_end|>"
    assert stuck.end == "error" and len(stuck.turns) == 1 and "oracle has no next action" in stuck.error


def test_teacher_arguments_are_checked():
    with pytest.raises(ValueError, match="the only teacher is 'oracle'"):
        run_episodes(None, None, [], SamplingParams(), teacher="human", env_name="zoom", pool=object())
    with pytest.raises(ValueError, match="needs env_name"):
        run_episodes(None, None, [], SamplingParams(), teacher="oracle")
    with pytest.raises(ValueError, match="needs an engine"):
        run_episodes(None, None, [], SamplingParams())
