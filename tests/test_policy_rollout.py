"""The rollout engine's log-probs equal the training forward's (fp32, 1e-5): single, batched, padded, multi-image."""

import pytest
import torch
from PIL import Image

from mmrl.config import ModelConfig
from mmrl.model.policy import Policy
from mmrl.rollout import HFEngine, SamplingParams
from mmrl.types import Sample


@pytest.fixture(scope="module")
def policy():
    return Policy.from_pretrained(
        ModelConfig(path="assets/tiny-qwen2.5-vl", min_pixels=3136, max_pixels=12544)
    )


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    Image.new("RGB", (56, 56), (255, 0, 0)).save(d / "a.png")
    Image.new("RGB", (120, 50), (0, 0, 255)).save(d / "b.png")
    Image.new("RGB", (33, 90), (0, 200, 0)).save(d / "c.png")

    def user(*parts):
        return [{"role": "user", "content": list(parts)}]

    img, txt = {"type": "image"}, lambda t: {"type": "text", "text": t}
    return [
        Sample("one", user(img, txt("What colour is the shape?")), images=[str(d / "a.png")]),
        Sample(
            "two",
            user(img, txt("and"), img, txt("How many shapes in both pictures?")),
            images=[str(d / "b.png"), str(d / "c.png")],
        ),
        Sample("text", user(txt("no image at all, a longer question to change the padding"))),
    ]


def _max_err(policy, prompts, comps):
    with torch.no_grad():
        lp, _, mask = policy.logprobs(prompts, [c.token_ids for c in comps])
    errs = []
    for i, c in enumerate(comps):
        assert mask[i].sum().item() == len(c.token_ids)
        errs.append((lp[i, : len(c.token_ids)] - torch.tensor(c.logprobs)).abs().max().item())
    return max(errs)


def test_rollout_logprobs_match_training_forward(policy, samples):
    torch.manual_seed(0)
    prompts = [policy.encode(s) for s in samples]
    assert prompts[1].mm["image_grid_thw"].shape[0] == 2  # two images in one prompt
    assert len({len(p.input_ids) for p in prompts}) == 3  # different prompt lengths -> real left padding
    engine = HFEngine(policy, batch_size=3)
    groups = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=10))
    comps = [c for g in groups for c in g]
    flat = [p for p in prompts for _ in range(3)]
    assert _max_err(policy, flat, comps) < 1e-5  # batched and padded
    for p, c in zip(flat, comps):  # single
        assert _max_err(policy, [p], [c]) < 1e-5


def test_temperature_is_applied_consistently(policy, samples):
    torch.manual_seed(1)
    prompts = [policy.encode(s) for s in samples[:2]]
    comps = [
        c
        for g in HFEngine(policy).generate(prompts, SamplingParams(n=2, temperature=0.7, max_new_tokens=6))
        for c in g
    ]
    with torch.no_grad():
        lp, _, _ = policy.logprobs(
            [p for p in prompts for _ in range(2)], [c.token_ids for c in comps], temperature=0.7
        )
    for i, c in enumerate(comps):
        assert torch.allclose(lp[i, : len(c.logprobs)], torch.tensor(c.logprobs), atol=1e-5)


def test_finish_reasons_and_stop_token(policy, samples):
    torch.manual_seed(0)
    prompts = [policy.encode(samples[0])]
    comps = HFEngine(policy).generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=3))[0]
    for c in comps:
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in policy.eos_ids
        else:
            assert len(c.token_ids) == 3 and not set(c.token_ids) & set(policy.eos_ids)


def test_entropy_is_full_vocabulary(policy, samples):
    """Entropy and log-probs are over the whole vocabulary less the suppressed vision placeholders (the support the
    engines sample from), computed chunk by chunk; here checked against a plain forward's masked logits."""
    assert {3009, 3010, 3012, 3013} <= set(
        policy.suppressed_token_ids
    )  # tiny model: vision start/end, image/video pad
    p = policy.encode(samples[0])
    with torch.no_grad():
        lp, ent, mask = policy.logprobs([p], [[5, 6, 7]])
        seq = {k: torch.cat([v, torch.zeros(3, dtype=v.dtype)])[None] for k, v in p.seq.items()}
        logits = (
            policy.model(input_ids=torch.cat([p.input_ids, torch.tensor([5, 6, 7])])[None], **p.mm, **seq)
            .logits[0, -4:-1]
            .float()
        )
        logits[:, policy.suppressed_token_ids] = float("-inf")
    dist = torch.distributions.Categorical(logits=logits)
    assert torch.allclose(ent[0], dist.entropy(), atol=1e-5)
    assert torch.allclose(lp[0], dist.log_prob(torch.tensor([5, 6, 7])), atol=1e-5)
