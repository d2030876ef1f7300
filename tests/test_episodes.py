"""The multi-turn episode driver (mmrl/rollout/episodes.py): observation turns appended as token deltas equal the whole
conversation's encoding, the HF engine's per-turn log-probs equal one training forward over the whole trajectory
(images of later turns included), spans and masks, suppression of vision placeholders, the limits that end
episodes, and failures that end one episode only.

Envs: the real ``zoom`` env (recipes/zoom tiny data) with scripted actions, and ``test_pictures``
(tests/episode_envs.py), which shows a new picture every turn whatever the model says.
"""

import copy
from dataclasses import replace
from pathlib import Path

import episode_envs  # noqa: F401  (registers test_pictures)
import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.config import EpisodeConfig, ModelConfig
from mmrl.data import load_dataset
from mmrl.envs import EnvPool
from mmrl.model.layout import is_vision_param, language_model_prefix
from mmrl.model.policy import Policy
from mmrl.rollout import HFEngine, RolloutEngine, SamplingParams
from mmrl.rollout.episodes import run_episodes, trajectory_logprobs
from mmrl.rollout.observations import all_media, end_of_turn, observation_delta
from mmrl.types import Sample

BUDGET = {"qwen2_5_vl": (4 * 28 * 28, 16 * 28 * 28), "qwen3_vl": (4 * 32 * 32, 16 * 32 * 32)}
# Families whose template renders earlier assistant turns as they were sampled: the appended ids equal a
# re-encoding of the whole conversation. Not here: Qwen3.5 (its generation prompt opens <think>, which old turns
# lose when re-rendered) and Gemma 4 (the same with its thought channel); test_a_thinking_template_differs.
EXACT = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "glm4v", "internvl", "llava_onevision", "idefics3",
         "smolvlm", "mistral3", "llama4"]  # fmt: skip


@pytest.fixture(scope="module")
def policy(tiny_family):
    cache: dict[str, Policy] = {}

    def get(family: str) -> Policy:
        if family not in cache:
            lo, hi = BUDGET.get(family, (3136, 12544))
            cfg = ModelConfig(path=str(tiny_family(family)), min_pixels=lo, max_pixels=hi)
            cache[family] = Policy.from_pretrained(cfg)
        return cache[family]

    return get


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    d = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(0)
    out = []
    for w, h in [(57, 83), (200, 120)]:
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(d / f"{w}x{h}.png")
        out.append(str(d / f"{w}x{h}.png"))
    return out


def _sample(sid: str, image: str, text: str = "What is here?", **meta) -> Sample:
    content = [{"type": "image"}, {"type": "text", "text": text}]
    return Sample(sid, [{"role": "user", "content": content}], images=[image], metadata=meta)


def _parts(m: dict) -> dict:
    return {**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m["content"], str) else m


def _as_sampled(pol: Policy, history: list[dict], text: str, marker: str) -> str:
    """What a model samples for an assistant turn the template renders as ``text``: the rendered turn after the
    generation prompt, up to the end-of-turn marker (Idefics3 writes ``Assistant: text`` after a prompt ending in
    ``Assistant:``, so the model samples the space)."""
    conv = [_parts(m) for m in history]
    prompt = pol.processor.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    turn = {"role": "assistant", "content": [{"type": "text", "text": text}]}
    whole = pol.processor.apply_chat_template(conv + [turn], tokenize=False)
    assert whole.startswith(prompt), "the template renders an old assistant turn unlike its generation prompt"
    rest = whole[len(prompt) :]
    return rest[: rest.index(marker)] if marker in rest else rest


def _three_turns(
    pol: Policy, pictures: list[str], role: str = "user"
) -> tuple[list[int], object, list, list]:
    """Turn 1 with an image, turn 2 text only, turn 3 with an image: the ids built by appending deltas and the
    policy's encoding of the whole conversation (with the same assistant texts)."""
    tok = pol.tokenizer
    marker, _ = end_of_turn(pol, role)
    first = _sample("f", pictures[0])
    prompt = pol.encode(first)
    ids, texts, images = prompt.input_ids.tolist(), [prompt.text], list(prompt.images)
    history = list(first.messages)
    observations = [("invalid action: try again", []), ("Zoomed view of [0, 0, 20, 20]:", [pictures[1]])]
    for answer, (text, shown) in zip(["I see a picture.", "Let me look closer."], observations):
        sampled = _as_sampled(pol, history, answer, tok.convert_ids_to_tokens(marker))
        ids += tok.encode(sampled, add_special_tokens=False) + [marker]
        delta = observation_delta(pol, text, shown, role=role)
        ids, texts, images = ids + delta.ids, texts + [delta.text], images + delta.images
        content = [{"type": "text", "text": text}] + [{"type": "image"} for _ in shown]
        history += [{"role": "assistant", "content": answer}, {"role": role, "content": content}]
    whole = pol.encode(Sample("w", history, images=pictures))
    return ids, whole, texts, images


@pytest.mark.parametrize("family", EXACT)
def test_observation_deltas_equal_the_whole_conversation(family, tiny_family, pictures):
    """(1) prompt + completion + delta + completion + delta, images in turns 1 and 3: the same ids as encoding the
    whole conversation, and the same media tensors (one processor call over all images: Idefics3's single row of
    tiles and LLaVA-OneVision's per-prompt counts included)."""
    pol = Policy.from_pretrained(
        ModelConfig(path=str(tiny_family(family)), min_pixels=3136, max_pixels=12544)
    )
    roles = ["user", "tool"] if family in ("qwen2_5_vl", "qwen3_vl") else ["user"]
    for role in roles:
        ids, whole, texts, images = _three_turns(pol, pictures, role)
        assert ids == whole.input_ids.tolist(), (family, role)
        mm = all_media(pol, texts, images)
        assert mm.keys() == whole.mm.keys(), (family, role)
        assert all(torch.equal(mm[k], whole.mm[k]) for k in mm), (family, role)


def test_a_video_prompt_keeps_its_video(tiny_family, pictures):
    """A video prompt whose episode adds an image: the appended ids and the media (video and image tensors from one
    processor call) equal the whole conversation's."""
    cfg = ModelConfig(
        path=str(tiny_family("qwen2_5_vl")), min_pixels=3136, max_pixels=12544, video_max_frames=4
    )
    pol = Policy.from_pretrained(replace(cfg, video_max_pixels=3136, video_min_pixels=784))
    video = str(Path(__file__).parent / "data/video/videomme/data/fixtureClip01.mp4")
    user = {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}
    first = pol.encode(Sample("v", [user], videos=[video]))
    marker = end_of_turn(pol)[0]
    delta = observation_delta(pol, "Zoomed:", [pictures[1]])
    ids = (
        first.input_ids.tolist()
        + pol.tokenizer.encode("A ball.", add_special_tokens=False)
        + [marker]
        + delta.ids
    )
    shown = {"role": "user", "content": [{"type": "text", "text": "Zoomed:"}, {"type": "image"}]}
    history = [user, {"role": "assistant", "content": "A ball."}, shown]
    whole = pol.encode(Sample("w", history, images=[pictures[1]], videos=[video]))
    assert ids == whole.input_ids.tolist()
    mm = all_media(pol, [first.text, delta.text], delta.images, first)
    assert mm.keys() == whole.mm.keys() and {"pixel_values_videos", "pixel_values"} <= mm.keys()
    assert all(torch.equal(mm[k], whole.mm[k]) for k in mm)


def test_a_thinking_template_differs(tiny_family, pictures):
    """Qwen3.5's generation prompt opens ``<think>``, so a sampled turn holds a think block, which the template drops
    from old assistant turns when the conversation is rendered again: a re-encoding is not what was sampled, which
    is why turns are appended as ids."""
    pol = Policy.from_pretrained(
        ModelConfig(path=str(tiny_family("qwen3_5")), min_pixels=4096, max_pixels=16384)
    )
    ids, whole, _, _ = _three_turns(pol, pictures)
    ours, again = pol.tokenizer.decode(ids), pol.tokenizer.decode(whole.input_ids)
    assert ours != again and ours.count("<think>") == 3 and again.count("<think>") == 1
    assert ours.replace("<think>\n\n</think>\n\n", "") == again  # the same but for the old think blocks
    delta = observation_delta(pol, "more", [])
    assert delta.text.endswith("<|im_start|>assistant\n<think>\n") and delta.response_prefix == "<think>\n"


# ---------------------------------------------------------------------------------------------- rollouts


class _Bias:
    """A forward hook on the output head adding +50 to the vision placeholders' logits: without suppression every
    sampled token would be one."""

    def __init__(self, pol: Policy):
        self.ids = pol.suppressed_token_ids

    def __call__(self, _module, _args, out):
        out = out.clone()
        out[..., self.ids] += 50.0
        return out


@pytest.fixture(scope="module")
def episodes(policy, pictures, tmp_path_factory):
    """3-turn episodes of test_pictures for both families (G = 2; qwen3_vl's env also shows a picture at reset, so
    its first prompts are per-episode), sampled with the placeholders' logits pushed up by +50."""
    out = {}
    for family in ("qwen2_5_vl", "qwen3_vl"):
        pol = policy(family)
        samples = [_sample("a", pictures[0]), _sample("b", pictures[1], "Describe the picture in detail.")]
        options = {"steps": 3, "reset_images": int(family == "qwen3_vl")}
        hook = pol.model.get_output_embeddings().register_forward_hook(_Bias(pol))
        torch.manual_seed(0)
        try:
            with EnvPool(tmp_path_factory.mktemp(family), workers=0) as pool:
                out[family] = run_episodes(
                    pol, HFEngine(pol), samples, SamplingParams(n=2, temperature=1.0, max_new_tokens=6),
                    pool=pool, env_name="test_pictures", settings=EpisodeConfig(max_turns=3, env_options=options),
                )  # fmt: skip
        finally:
            hook.remove()
    return out


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_turn_logprobs_equal_one_training_forward(family, packed, policy, episodes):
    """(2) Every sampled token's rollout log-prob (each turn generated from the whole sequence so far) equals the
    training forward's over the whole trajectory in one pass, to 1e-5, with every turn's images in it, in the
    update's layouts (prompt left-padded and response right-padded, or the rows packed into one without padding:
    the observations' images take their positions and rope indices there); the vision tower gets gradients."""
    pol = policy(family)
    trajs = [t for row in episodes[family] for t in row]
    merge = pol.processor.image_processor.merge_size
    image_id = pol.model.config.image_token_id
    for t in trajs:
        assert t.end == "done" and len(t.turns) == 3
        ctx = t.context()
        grid = ctx.mm["image_grid_thw"]
        assert len(grid) == len(t.images) == len(t.prompt.images) + 2
        assert int((ctx.input_ids == image_id).sum()) == int(grid.prod(-1).sum()) // merge**2
        assert int((torch.tensor(t.response) == image_id).sum()) == int(grid[-2:].prod(-1).sum()) // merge**2
    with pol.training():
        lp, _, mask = trajectory_logprobs(pol, trajs, packed=packed)
        (lp.sum() / mask.sum()).backward()
    for i, t in enumerate(trajs):
        m = torch.tensor(t.mask, dtype=torch.bool)
        assert torch.equal(mask[i, : len(t.mask)].bool(), m) and mask[i, len(t.mask) :].sum() == 0
        err = (lp[i, : len(t.mask)].detach()[m] - torch.tensor(t.logprobs)[m]).abs().max().item()
        assert err < 1e-5, (family, t.episode_id, err)
    decoder = language_model_prefix(pol.model)
    assert any(
        is_vision_param(n, decoder) and p.grad is not None and p.grad.abs().sum() > 0
        for n, p in pol.model.named_parameters()
    )
    pol.model.zero_grad(set_to_none=True)


def test_a_later_image_is_seen_where_it_was_shown(policy, episodes):
    """Changing the last observation's pixels changes the forward's log-probs of the turn after it and of no token
    before it: the images of later turns sit where they were shown."""
    pol = policy("qwen2_5_vl")
    t = episodes["qwen2_5_vl"][0][0]
    changed = copy.copy(t)
    last = int(t.mm["image_grid_thw"][-1].prod())  # the last image's patch rows
    pixels = t.mm["pixel_values"].clone()
    pixels[-last:] = torch.randn(last, pixels.shape[1])
    changed.set_media({**t.mm, "pixel_values": pixels})
    with torch.no_grad():
        before, _, _ = trajectory_logprobs(pol, [t])
        after, _, _ = trajectory_logprobs(pol, [changed])
    third = t.turns[2]
    assert torch.equal(before[0, : t.turns[1].end], after[0, : t.turns[1].end])
    assert (before[0, third.start : third.end] - after[0, third.start : third.end]).abs().max() > 1e-4


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_spans_masks_and_placeholders(family, policy, episodes):
    """(3) Observation tokens have mask 0 and log-prob 0 and lie outside every turn; the turns tile the sampled
    tokens, carry the env's rewards and the state each action was taken in. (4) No vision placeholder is sampled
    although the context holds images of later turns and the head favours placeholders by +50; the scoring refuses
    a trajectory holding one."""
    pol = policy(family)
    for t in (t for row in episodes[family] for t in row):
        spans = {j for turn in t.turns for j in range(turn.start, turn.end)}
        assert spans == {j for j, m in enumerate(t.mask) if m}
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.mask) if not m)
        assert [turn.reward for turn in t.turns] == [0.1, 0.2, 1.0] and t.episode_return == pytest.approx(1.3)
        assert [turn.state_key for turn in t.turns] == [f"{t.sample.id}:{k}" for k in range(3)]
        marker = end_of_turn(pol)[0]
        for a, b, c in zip(t.turns, t.turns[1:], t.completions):
            assert a.end < b.start and not any(t.mask[a.end : b.start])
            # a completion cut by length (or ended by another stop id) gets the marker as an env token
            assert marker in (t.response[a.end - 1], t.response[a.end])
            assert (t.response[a.end] == marker) == (c.token_ids[-1] != marker)
        sampled = [tok for tok, m in zip(t.response, t.mask) if m]
        assert not set(sampled) & set(pol.suppressed_token_ids)
        assert set(t.response) & set(pol.suppressed_token_ids)  # the observations' images
        record = t.to_record()
        assert [s["reward"] for s in record["turns"]] == [0.1, 0.2, 1.0]
        assert len(record["turns"][0]["images"]) == 1
    t = episodes[family][0][0]
    j = t.turns[0].start
    t.response[j], old = pol.suppressed_token_ids[0], t.response[j]
    try:
        with pytest.raises(ValueError, match="vision placeholder"):
            trajectory_logprobs(pol, [t])
    finally:
        t.response[j] = old


class _Script:
    """Forces this turn's tokens after the recorder (the recorded log-probs stay the model's own)."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.start = tokens, None

    def __call__(self, input_ids, scores):
        self.start = input_ids.shape[1] if self.start is None else self.start
        out = torch.full_like(scores, float("-inf"))
        out[:, self.tokens[min(input_ids.shape[1] - self.start, len(self.tokens) - 1)]] = 0.0
        return out


class ScriptedEngine(HFEngine):
    """The HF engine with each call's (each turn's) action text forced, so the tiny model drives the zoom env."""

    def __init__(self, policy: Policy, actions: list[str]):
        super().__init__(policy)
        marker = end_of_turn(policy)[0]
        self.scripts = [policy.tokenizer.encode(a, add_special_tokens=False) + [marker] for a in actions]
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        return super().generate(prompts, params)

    def _processors(self, params):
        chain, recorder = super()._processors(params)
        return [*chain, _Script(self.scripts[self.calls - 1])], recorder


def test_zoom_episodes_through_the_hf_engine(policy, tmp_path):
    """The real zoom env: zoom on the red box, zoom again, answer. The crops come back as new images in turns 2 and
    3 (boxes mapped from the model's frame with the sizes the driver put in the sample's metadata), the answer
    scores 1, and the log-probs equal the training forward's. A sample the env cannot start (no answer) ends at
    reset with an error and no turns; the batch goes on."""
    from mmrl.recipes.zoom.data import build_tiny

    pol = policy("qwen2_5_vl")
    paths = build_tiny(tmp_path / "data", n_train=1, n_eval=1)
    sample = load_dataset(paths["train"]).samples[0]
    encoded = pol.encode(sample)
    s = encoded.model_image_sizes[0][0] / encoded.image_sizes[0][0]  # model px per original px
    x1, y1, x2, y2 = sample.metadata["target_box"]
    box = [round(x1 * s) - 2, round(y1 * s) - 2, round(x2 * s) + 2, round(y2 * s) + 2]
    actions = [f"zoom({', '.join(map(str, box))})", "zoom(0, 0, 30, 30)", f"<answer>{sample.answer}</answer>"]
    engine = ScriptedEngine(pol, actions)
    broken = Sample("broken", sample.messages, sample.images)  # no answer: the zoom env refuses to start
    torch.manual_seed(0)
    with EnvPool(tmp_path / "episodes", workers=1, timeout_s=30) as pool:
        trajs = run_episodes(
            pol, engine, [sample, broken], SamplingParams(n=2, temperature=1.0, max_new_tokens=32),
            pool=pool, env_name="zoom", settings=EpisodeConfig(max_turns=4, env_options={"max_calls": 3}),
        )  # fmt: skip
    assert engine.calls == 3
    for t in trajs[1]:
        assert t.end == "error" and "answer" in t.error and t.turns == [] and t.response == []
    good = trajs[0]
    for t in good:
        assert t.end == "done" and t.episode_return == 1.0 and [x.reward for x in t.turns] == [0.0, 0.0, 1.0]
        assert [s.action for s in t.steps] == actions and t.steps[0].info["zoom_hit"]
        assert len(t.images) == 3 and len(t.context().mm["image_grid_thw"]) == 3
    with torch.no_grad():
        lp, _, _ = trajectory_logprobs(pol, good)
    for i, t in enumerate(good):
        m = torch.tensor(t.mask, dtype=torch.bool)
        assert (lp[i, : len(t.mask)][m] - torch.tensor(t.logprobs)[m]).abs().max() < 1e-5


# ---------------------------------------------------------------------------------------------- paths and limits


class _Recording(RolloutEngine):
    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def sync_weights(self) -> None:
        return None

    def generate(self, prompts, params):
        self.calls.append((len(prompts), params.n, len({id(p) for p in prompts})))
        return self.engine.generate(prompts, params)


def test_a_single_turn_sample_is_todays_call(policy, pictures):
    """No env: one engine call with the encoded prompts and n = G, the same completions as calling the engine
    directly; each episode is one turn over its whole completion, scored like Policy.logprobs."""
    pol = policy("qwen2_5_vl")
    samples = [_sample("a", pictures[0]), _sample("b", pictures[1])]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=5)
    engine = _Recording(HFEngine(pol))
    torch.manual_seed(3)
    trajs = run_episodes(pol, engine, samples, params)
    torch.manual_seed(3)
    direct = HFEngine(pol).generate([pol.encode(s) for s in samples], params)
    assert engine.calls == [(2, 2, 2)]
    flat = [t for row in trajs for t in row]
    for t, c in zip(flat, [c for g in direct for c in g]):
        assert t.response == c.token_ids and t.mask == [1] * len(c.token_ids) and t.end == "single_turn"
        assert [(x.start, x.end) for x in t.turns] == [(0, len(c.token_ids))]
    with torch.no_grad():
        lp, _, mask = trajectory_logprobs(pol, flat)
        ref, _, ref_mask = pol.logprobs([t.prompt for t in flat], [t.response for t in flat], packed=False)
    assert torch.equal(mask, ref_mask) and (lp - ref).abs().max() < 1e-5


def _run(pol, tmp, samples, *, n=1, pool_kw=None, **kw):
    torch.manual_seed(0)
    with EnvPool(tmp, **(pool_kw or {"workers": 0})) as pool:
        trajs = run_episodes(
            pol, HFEngine(pol), samples, SamplingParams(n=n, temperature=1.0, max_new_tokens=4),
            pool=pool, env_name="test_pictures", settings=EpisodeConfig(**kw),
        )  # fmt: skip
        assert pool.live == []  # episodes the driver ended were closed in the pool
    return [t for row in trajs for t in row]


def test_limits_end_episodes(policy, pictures, tmp_path):
    """(5) max_turns, the token budget and the image budget (count; pixels: the new image downscaled to what is
    left, then the end) each end an episode; the sequence never exceeds the token budget."""
    pol = policy("qwen2_5_vl")
    samples = [_sample("a", pictures[0])]
    many = {"steps": 10}
    (t,) = _run(pol, tmp_path / "turns", samples, env_options=many, max_turns=2)
    assert t.end == "max_turns" and len(t.turns) == 2 and len(t.steps) == 2
    P = len(pol.encode(samples[0]).input_ids)
    (t,) = _run(pol, tmp_path / "t1", samples, env_options=many, max_turns=9, max_total_tokens=P + 4 + 10)
    assert t.end == "max_tokens" and len(t.turns) == 1
    budget = P + 3 * 40
    (t,) = _run(pol, tmp_path / "t2", samples, env_options=many, max_turns=9, max_total_tokens=budget)
    assert t.end == "max_tokens" and len(t.turns) >= 2 and t.length <= budget
    (t,) = _run(pol, tmp_path / "n", samples, env_options=many, max_turns=9, max_images=2)
    assert t.end == "image_budget" and len(t.turns) == 2 and len(t.images) == 2
    w, h = pol.geometry.model_size(40, 60, pol.cfg.min_pixels, pol.cfg.max_pixels)
    first = sum(a * b for a, b in pol.encode(samples[0]).model_image_sizes)
    pixels = first + w * h + 28 * 28 * 2
    (t,) = _run(pol, tmp_path / "px", samples, env_options=many, max_turns=9, max_context_pixels=pixels)
    assert t.end == "image_budget" and len(t.turns) == 3
    (w1, h1), (w2, h2) = t.model_image_sizes[1:]
    assert (w1, h1) == (w, h) and w2 * h2 <= 28 * 28 * 2 < w * h  # the second one downscaled to what was left
    assert len(t.context().mm["image_grid_thw"]) == 3
    end = {"max_context_pixels": pixels, "image_rule": "end"}
    (t,) = _run(pol, tmp_path / "px-end", samples, env_options=many, max_turns=9, **end)
    assert t.end == "image_budget" and len(t.turns) == 2


def test_an_env_timeout_ends_that_episode_only(policy, pictures, tmp_path):
    """(6) A step past the pool's deadline ends its episode with the error; the other episodes of the batch (in
    worker processes) run to the end."""
    pol = policy("qwen2_5_vl")
    samples = [_sample("slow", pictures[0], hang=True), _sample("fast", pictures[1])]
    trajs = _run(
        pol, tmp_path / "pool", samples, n=2, pool_kw={"workers": 2, "timeout_s": 1.5},
        env_options={"steps": 3, "hang_s": 5.0}, max_turns=3,
    )  # fmt: skip
    slow, fast = trajs[:2], trajs[2:]
    for t in slow:
        assert t.end == "error" and t.error == "timeout" and len(t.turns) == 1 and t.turns[0].reward == 0.0
    for t in fast:
        assert t.end == "done" and len(t.turns) == 3 and t.episode_return == pytest.approx(1.3)


def test_episode_arguments_are_checked(policy, pictures):
    pol = policy("qwen2_5_vl")
    with pytest.raises(ValueError, match="needs an EnvPool"):
        run_episodes(
            pol, HFEngine(pol), [_sample("a", pictures[0])], SamplingParams(), env_name="test_pictures"
        )
    assert end_of_turn(pol)[0] == pol.tokenizer.convert_tokens_to_ids("<|im_end|>")
