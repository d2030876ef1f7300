"""The image check (mmrl/train/image_check.py): the media must reach the policy and the rollout engine.

Each failure is made on purpose and the run refused: a vision tower that never gets the pixels, a processor output
without them, an engine that samples without them, an engine that scores without them. Every model family's tiny
checkpoint passes through the real scoring path, and a 2-step ``mmrl train`` logs the check at step 1.
"""

import importlib.util
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.cli import main
from mmrl.config import Config, ConfigError, ModelConfig
from mmrl.model.geometry import vision_geometry
from mmrl.model.policy import Policy
from mmrl.rollout import HFEngine, SamplingParams
from mmrl.rollout.episodes import run_episodes
from mmrl.run.metrics import read_metrics
from mmrl.tiny.build import FAMILIES
from mmrl.train.image_check import ImageCheck, MediaNotSeen, blank_engine_prompt, blank_media
from mmrl.train.update import RolloutBatch
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"
BUDGET = {28: (4 * 28 * 28, 16 * 28 * 28), 32: (4 * 32 * 32, 16 * 32 * 32)}
CFG = Config()


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """Two non-square images (two colours, and a uniform grey one, which a blank must still differ from) and a
    short clip."""
    import cv2

    d = tmp_path_factory.mktemp("media")
    a = np.zeros((83, 57, 3), np.uint8)
    a[:, :28], a[:, 28:] = (230, 20, 20), (20, 20, 230)
    Image.fromarray(a).save(d / "halves.png")
    Image.new("RGB", (120, 64), (128, 128, 128)).save(d / "grey.png")
    writer = cv2.VideoWriter(str(d / "clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (90, 50))
    for i in range(15):
        writer.write(np.full((50, 90, 3), 12 * i, np.uint8))
    writer.release()
    return {"halves": str(d / "halves.png"), "grey": str(d / "grey.png"), "clip": str(d / "clip.avi")}


def _policy(path: Path) -> Policy:
    from transformers import AutoProcessor

    lo, hi = BUDGET.get(vision_geometry(AutoProcessor.from_pretrained(path)).factor, (3136, 12544))
    return Policy.from_pretrained(ModelConfig(path=str(path), min_pixels=lo, max_pixels=hi))


def _samples(media, video: bool) -> list[Sample]:
    def ask(sid, part, **kw):
        content = [{"type": part}, {"type": "text", "text": "What colour is it?"}]
        return Sample(sid, [{"role": "user", "content": content}], **kw)

    out = [ask("halves", "image", images=[media["halves"]]), ask("grey", "image", images=[media["grey"]])]
    out.append(Sample("text", [{"role": "user", "content": "no image here"}]))
    return out + ([ask("clip", "video", videos=[media["clip"]])] if video else [])


def _batch(policy: Policy, samples: list[Sample], engine=None, tokens: int = 4) -> RolloutBatch:
    torch.manual_seed(0)
    engine = engine or HFEngine(policy, batch_size=4)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=tokens)
    return RolloutBatch.of(run_episodes(policy, engine, samples, params))


def _check(policy, engine=None, rows: int = 8) -> ImageCheck:
    cfg = replace(CFG, train=replace(CFG.train, image_check_rows=rows))
    return ImageCheck(cfg, policy, engine or HFEngine(policy), temperature=1.0)


@pytest.fixture(scope="module")
def qwen():
    return _policy(TINY)


def test_blank_media_keeps_the_layout_and_the_padding():
    tiles = torch.rand(1, 3, 3, 4, 4) * 2 - 1
    tiles[0, 2] = 0  # a padding tile
    mm = {
        "pixel_values": tiles,
        "pixel_attention_mask": torch.ones(1, 3, 4, 4, dtype=torch.long),
        "image_grid_thw": torch.tensor([[1, 2, 2]]),
        "pixel_values_videos": torch.full((6, 8), -1.0),  # uniform: a blank must differ, and not be 0
    }
    out = blank_media(mm)
    assert out["pixel_values"].shape == tiles.shape and torch.equal(out["pixel_values"][0, 2], tiles[0, 2])
    real = out["pixel_values"][0, :2]
    assert real.unique().numel() == 1 and real.flatten()[0] != 0
    assert out["pixel_values_videos"].unique().tolist() not in ([-1.0], [0.0])
    assert (
        out["image_grid_thw"] is mm["image_grid_thw"]
        and out["pixel_attention_mask"] is mm["pixel_attention_mask"]
    )
    grey = Image.new("RGB", (5, 3), (128, 128, 128))
    from mmrl.model.prompt import EncodedPrompt

    p = blank_engine_prompt(EncodedPrompt("x", torch.tensor([1]), images=[grey, Image.new("L", (2, 2), 7)]))
    assert [i.size for i in p.images] == [(5, 3), (2, 2)] and p.images[0].getextrema() == ((0, 0),) * 3


def test_the_rows_and_the_steps_it_checks(qwen, media):
    batch = _batch(qwen, _samples(media, video=False), tokens=2)
    check = _check(qwen, rows=3)
    state = torch.get_rng_state()
    rows = check.pick(batch, 1)
    assert torch.equal(torch.get_rng_state(), state)  # the run's own generator is left as it was
    assert rows == check.pick(batch, 1) and len(rows) == 3  # the same rows on every rank
    assert {r // 2 for r in rows} == {0, 1}  # rows with images only (group 2 is text), one per prompt first
    assert [s for s in range(1, 201) if check.due(s)] == [1, 50, 100, 150, 200]
    assert check(batch, 2) == {}
    off = ImageCheck(replace(CFG, train=replace(CFG.train, image_check_every=0)), qwen, None, 1.0)
    assert not any(off.due(s) for s in range(1, 100))
    with pytest.raises(ConfigError, match="image_check_rows"):
        ImageCheck(replace(CFG, train=replace(CFG.train, image_check_rows=0)), qwen, None, 1.0)
    text_only = _batch(qwen, _samples(media, video=False)[2:], tokens=2)
    assert check(text_only, 1) == {}  # nothing to check in a batch without media


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_sees_its_media(family, tiny_family, media):
    """(c) The check passes on each family's tiny checkpoint through the training forward and the HF engine: a batch
    of images, and one of videos where the family takes them (apart: transformers' GLM-4.1V/4.5V forward cannot
    take both at once, as its video frames use the image token)."""
    pol = _policy(tiny_family(family))
    samples = _samples(media, video=pol.geometry.video_factor is not None)
    stats = _check(pol)(_batch(pol, samples[:3]), 1)
    if len(samples) > 3:
        videos = _check(pol)(_batch(pol, samples[2:]), 1)
        stats["sanity/image_sensitivity/video"] = videos["sanity/image_sensitivity/video"]
        assert "sanity/image_sensitivity/image" not in videos
    print(family, {k.removeprefix("sanity/"): f"{v:.3g}" for k, v in stats.items()})
    assert stats["sanity/image_sensitivity"] > 1e-6
    assert stats["sanity/image_sensitivity/image"] == stats["sanity/image_sensitivity"]
    assert (stats.get("sanity/image_sensitivity/video", 0.0) > 1e-6) == (len(samples) > 3)
    # the HF engine is the policy: |engine - real| ~ 1e-7, so the gap is the sensitivity itself
    assert stats["sanity/engine_media_gap"] == pytest.approx(stats["sanity/image_sensitivity"], rel=1e-2)


def _zero_pixels(policy: Policy):
    """The vision tower gets zeros instead of the pixels it is handed (its features no longer depend on them)."""
    tower = policy.model.model.visual

    def hook(_module, args, kwargs):
        return (torch.zeros_like(args[0]), *args[1:]), kwargs

    return tower.register_forward_pre_hook(hook, with_kwargs=True)


def test_a_tower_that_never_gets_the_pixels_stops_the_run(qwen, media):
    """(a) The model never sees the pixels: sensitivity exactly 0, the run refused, naming the check and the rows."""
    handle = _zero_pixels(qwen)
    try:
        batch = _batch(qwen, _samples(media, video=False), tokens=3)
        with pytest.raises(MediaNotSeen) as e:
            _check(qwen)(batch, 1)
    finally:
        handle.remove()
    msg = str(e.value)
    assert "image check at step 1 (train.image_check_every)" in msg and "do not reach the policy" in msg
    assert "sample 'halves'" in msg and "sample 'grey'" in msg and "0.00e+00" in msg
    assert "vision tower" in msg and "pixel_values" in msg


def test_a_processor_output_without_pixels_stops_the_run(qwen, media, monkeypatch):
    """(a) The encoded prompt lost its pixels (the placeholders stay, read as text): refused, naming what is left."""
    encode = Policy.encode

    def lossy(self, sample, *args, **kwargs):
        p = encode(self, sample, *args, **kwargs)
        return replace(
            p, mm={k: v for k, v in p.mm.items() if not k.startswith(("pixel_values", "image_grid"))}
        )

    monkeypatch.setattr(Policy, "encode", lossy)
    batch = _batch(qwen, _samples(media, video=False), tokens=3)
    with pytest.raises(MediaNotSeen, match=r"do not reach the policy.*media tensors: none"):
        _check(qwen)(batch, 1)


class _TextOnlyEngine(HFEngine):
    """Samples with the media blanked, as an engine that drops them would (its placeholders still expanded)."""

    def generate(self, prompts, params):
        return super().generate([replace(p, mm=blank_media(p.mm)) for p in prompts], params)


class _NoisyEngine(HFEngine):
    """Samples with the media but records its log-probs with noise far above what the media do (as a bf16 engine
    might on a model that barely looks at its images)."""

    def generate(self, prompts, params):
        groups = super().generate(prompts, params)
        gen = torch.Generator().manual_seed(1)
        for c in (c for g in groups for c in g):
            c.logprobs = (torch.tensor(c.logprobs) + torch.randn(len(c.logprobs), generator=gen)).tolist()
        return groups


class _ScoringEngine(HFEngine):
    """An engine that scores given tokens (as vLLM's prompt log-probs do) with the policy; ``see``: with the media."""

    def __init__(self, policy, see: bool):
        super().__init__(policy)
        self.see = see

    @torch.no_grad()
    def score(self, contexts, tails):
        out = []
        for ctx, n in zip(contexts, tails):
            mm = ctx.mm if self.see else {k: v * 0 if k == "pixel_values" else v for k, v in ctx.mm.items()}
            seq = {k: v[:-n] for k, v in ctx.seq.items()}
            prompt = replace(ctx, input_ids=ctx.input_ids[:-n], mm=mm, seq=seq)
            completion_seq = [{k: v[-n:] for k, v in ctx.seq.items()}]
            lp, _, _ = self.policy.logprobs(
                [prompt], [ctx.input_ids[-n:].tolist()], completion_seq=completion_seq
            )
            out.append(lp[0].tolist())
        return out


def test_an_engine_that_samples_without_the_media_stops_the_run(qwen, media):
    """(b) The engine's log-probs are the blanked scoring's: refused as a text-only engine."""
    engine = _TextOnlyEngine(qwen)
    batch = _batch(qwen, _samples(media, video=False), engine=engine, tokens=4)
    with pytest.raises(MediaNotSeen) as e:
        _check(qwen, engine)(batch, 1)
    msg = str(e.value)
    assert (
        "the rollout engine (_TextOnlyEngine) sampled rows" in msg
        and "as if it did not see their media" in msg
    )
    to_blank, to_real = (
        float(x) for x in re.findall(r"mean \|engine - (?:blanked|real)\| ([-+.e0-9]+)", msg)
    )
    assert to_blank < 1e-5 < 1e-2 < to_real and "sample 'halves'" in msg


def test_a_right_but_noisy_engine_is_not_refused(qwen, media, caplog):
    """An engine whose mismatch to the policy is as large as what the media do cannot be told apart: a warning says
    so, and the run goes on."""
    engine = _NoisyEngine(qwen)
    stats = _check(qwen, engine)(_batch(qwen, _samples(media, video=False), engine=engine, tokens=4), 1)
    assert abs(stats["sanity/engine_media_gap"]) < stats["sanity/image_sensitivity"]
    assert "cannot tell whether the rollout engine sees the media" in caplog.text


def test_an_engine_that_scores_without_the_media_stops_the_run(qwen, media):
    """(b) An engine that can score given tokens is checked itself: with its media it passes, without it is refused."""
    batch = _batch(qwen, _samples(media, video=False), tokens=3)
    stats = _check(qwen, _ScoringEngine(qwen, see=True))(batch, 1)
    assert stats["sanity/engine_image_sensitivity"] == pytest.approx(
        stats["sanity/image_sensitivity"], rel=1e-3
    )
    with pytest.raises(
        MediaNotSeen, match=r"rollout engine \(_ScoringEngine\) scores the sampled tokens of rows"
    ):
        _check(qwen, _ScoringEngine(qwen, see=False))(batch, 1)


@pytest.fixture
def recipe(tmp_path):
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=8, n_eval=4, seed=5)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl}}
rollout: {{n: 2, max_new_tokens: 3, batch_size: 4}}
optim: {{lr: 0.001, micro_batch_size: 4}}
rewards: [{{name: exact_match}}]
train: {{prompts_per_step: 2, progress: false, seed: 3}}
"""
    )
    return cfg


def test_a_training_run_logs_the_check_at_step_1(recipe, tmp_path):
    out = tmp_path / "run"
    assert main(["train", str(recipe), "--output-dir", str(out), "--max-steps", "2"]) == 0
    rows = read_metrics(out / "metrics.jsonl")
    first, second = (r for r in rows if r["step"] in (1, 2))
    assert first["sanity/image_sensitivity"] > 1e-6 and first["sanity/image_sensitivity/image"] > 1e-6
    assert first["sanity/engine_media_gap"] > 0
    assert not any(k.startswith("sanity/") for k in second)  # the next check is at step 50


def test_a_training_run_whose_model_never_sees_the_pixels_is_stopped(recipe, tmp_path, monkeypatch):
    load = Policy.from_pretrained.__func__

    def blind(cls, *args, **kwargs):
        policy = load(cls, *args, **kwargs)
        _zero_pixels(policy)
        return policy

    monkeypatch.setattr(Policy, "from_pretrained", classmethod(blind))
    with pytest.raises(MediaNotSeen, match=r"image check at step 1 .* do not reach the policy"):
        main(["train", str(recipe), "--output-dir", str(tmp_path / "run"), "--max-steps", "2"])


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")
def test_the_vllm_engine_scores_with_its_media(qwen, media):
    """vLLM's own log-probs of the sampled tokens (its prompt log-probs) change with its media; the check passes."""
    from mmrl.rollout import ENGINES

    engine = ENGINES.get("vllm")(qwen, batch_size=4)
    try:
        batch = _batch(qwen, _samples(media, video=True), engine=engine, tokens=4)
        stats = _check(qwen, engine)(batch, 1)
        trajs = [t for t in batch.trajectories if t.images][:2]
        scored = engine.score([t.context() for t in trajs], [len(t.response) for t in trajs])
    finally:
        engine.close()
    print({k: f"{v:.3g}" for k, v in stats.items()})
    assert stats["sanity/engine_image_sensitivity"] > 1e-6 and stats["sanity/engine_media_gap"] > 0
    assert stats["sanity/image_sensitivity/video"] > 1e-6
    # raw log-probs (no placeholder mask) of the tokens vLLM sampled: close to the processed ones it recorded
    for t, lp in zip(trajs, scored):
        assert len(lp) == len(t.response)
        assert np.allclose(lp, t.logprobs, atol=0.05), (lp, t.logprobs)
