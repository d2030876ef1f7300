"""Policy options: gradient checkpointing gives the same gradients, bf16 loads and scores, vision can be frozen;
the metrics logger writes TensorBoard events when asked."""

import math

import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mmrl.config import ModelConfig
from mmrl.model.policy import Policy
from mmrl.run.metrics import MetricsLogger, read_metrics
from mmrl.types import Sample


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    p = tmp_path_factory.mktemp("img") / "a.png"
    Image.new("RGB", (56, 56), (0, 0, 255)).save(p)
    return Sample(
        "s", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}], [str(p)]
    )


def _grads(cfg, sample):
    torch.manual_seed(0)
    pol = Policy.from_pretrained(cfg)
    assert pol.model.is_gradient_checkpointing == cfg.gradient_checkpointing
    pol.model.train()
    logp, _, mask = pol.logprobs([pol.encode(sample)], [[5, 6, 7, 8]])
    (-(logp * mask).sum()).backward()
    return {n: p.grad.clone() for n, p in pol.model.named_parameters() if p.grad is not None}, logp.detach()


def test_gradient_checkpointing_gives_the_same_gradients(sample):
    base = ModelConfig(max_pixels=3136)
    g0, lp0 = _grads(base, sample)
    g1, lp1 = _grads(ModelConfig(max_pixels=3136, gradient_checkpointing=True), sample)
    assert torch.allclose(lp0, lp1, atol=1e-6)
    assert g0.keys() == g1.keys() and len(g0) > 20
    assert all(torch.allclose(g0[k], g1[k], atol=1e-5, rtol=1e-4) for k in g0)


def test_freeze_vision_leaves_only_language_params_trainable(sample):
    full, _ = _grads(ModelConfig(max_pixels=3136), sample)
    frozen, _ = _grads(ModelConfig(max_pixels=3136, freeze_vision=True), sample)
    language = {k for k in full if ".visual." not in f".{k}"}
    assert len(language) > 10 and len(full) > len(language)  # both towers got gradients unfrozen
    assert frozen.keys() == language
    # freezing the vision tower changes no language-side gradient
    assert all(torch.equal(frozen[k], full[k]) for k in language)


def test_bf16_keeps_fp32_master_weights_and_scores_close_to_fp32(sample):
    lps = []
    for dtype in ("float32", "bfloat16"):
        pol = Policy.from_pretrained(ModelConfig(max_pixels=3136, dtype=dtype))
        assert pol.model.dtype == torch.float32  # trainable parameters are the fp32 master weights
        assert pol.compute_dtype == getattr(torch, dtype)
        with torch.no_grad():
            lps.append(pol.logprobs([pol.encode(sample)], [[5, 6, 7, 8]])[0])
    assert lps[1].dtype == torch.float32  # log-probs are always computed in fp32
    assert 0 < (lps[0] - lps[1]).abs().max() < 0.1  # bf16 compute really ran, and stays close
    frozen = Policy.from_pretrained(ModelConfig(max_pixels=3136, dtype="bfloat16"), trainable=False)
    assert frozen.model.dtype == torch.bfloat16 and not any(
        p.requires_grad for p in frozen.model.parameters()
    )


def test_metrics_logger_writes_tensorboard_and_appends(tmp_path):
    log = MetricsLogger(tmp_path, trackers=["tensorboard"])
    log.log({"step": 1, "reward/mean": 0.5, "loss": float("nan")})
    log.log({"step": 2, "reward/mean": 0.75})
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["loss", "reward/mean"]
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.5), (2, 0.75)]
    [loss] = events.Scalars("loss")
    assert loss.step == 1 and math.isnan(loss.value)  # TensorBoard keeps the NaN; the jsonl row says null
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["reward/mean"] for r in rows] == [0.5, 0.75] and rows[0]["loss"] is None  # NaN logged as null
