"""The bodies of the GPU check's path tests (issue 35 §5), each a function of the device it runs on:
tests/test_gpu.py runs them on CUDA (marker ``gpu``), tests/test_gpu_paths_cpu.py on the CPU in the main suite, so
the code paths are proven here and a failure on a GPU is a GPU failure. The CUDA-only parts (memory left on the GPU,
CUDA contexts, the probe's total against the driver's) run only on CUDA. Not collected (no ``test_`` prefix).

- :func:`multi_turn_logprobs`: zoom episodes (3 turns, crops shown as new images) through the HF engine; each turn's
  recorded log-probs equal the training forward's over the whole trajectory, padded and packed;
- :func:`judge_agrees_with_cpu`: the HF judge on the device gives the CPU judge's verdicts; with ``offload`` its
  weights leave the GPU after the call;
- :func:`image_check_sees_media`: the image check on a policy on the device: nonzero sensitivity, and a vision tower
  fed zeros refused;
- :func:`device_probe`: pre-flight's GPU memory probe, in a fresh process: the device's total memory, and no CUDA
  context opened where none was.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.config import EpisodeConfig, ModelConfig
from mmrl.model.policy import Policy

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"
JUDGE = str(ROOT / "assets" / "tiny-judge")
# engine vs training forward, as test_gpu.py's single-turn check: fp32 rounding; bf16 backbone kernels (cached decoding
# vs one full forward; 1.0e-3 measured on the CPU, tests/test_logprobs_bf16.py)
TOL = {"float32": 1e-5, "bfloat16": 2e-2}
# a judge verdict can flip only where a greedy step's top-2 logit gap is within twice the logit error of the
# device's run. fp32: CUDA's kernels round differently from the CPU's (~1e-5 at the tiny judge's |logit| <= 15;
# matmuls without TF32, torch's default), 1e-3 is 50x that; bf16 (the judge's default dtype on CUDA): the weights
# rounded to bf16 moved the tiny judge's logits by up to 0.26 on the CPU, a gap by up to 0.52, and 2.0 is 4x that
MARGIN = {"float32": 1e-3, "bfloat16": 2.0}


def tiny_policy(device: str, dtype: str) -> Policy:
    """The bundled tiny Qwen2.5-VL at test_episodes.py's pixel budget, on ``device`` in ``dtype``."""
    cfg = ModelConfig(path=str(TINY), device=device, dtype=dtype, min_pixels=3136, max_pixels=12544)
    policy = Policy.from_pretrained(cfg)
    assert policy.device.type == torch.device(device).type
    return policy


# ---------------------------------------------------------------------------------------------- (a) multi-turn


def multi_turn_logprobs(device: str, dtype: str, tmp: Path) -> dict[int, float]:
    """The zoom world's episodes on ``device``: zoom on the red box, zoom again, answer (the HF engine scripted as in
    test_episodes.py: the recorded log-probs are the model's own). Every turn's recorded log-probs equal the
    training forward's over the whole trajectory (both later crops in it), padded and packed, to ``TOL[dtype]``.
    Returns the largest difference per turn."""
    from test_episodes import ScriptedEngine

    from mmrl.data import load_dataset
    from mmrl.envs import EnvPool
    from mmrl.recipes.zoom.data import build_tiny
    from mmrl.rollout import SamplingParams
    from mmrl.rollout.episodes import run_episodes, trajectory_logprobs

    pol = tiny_policy(device, dtype)
    sample = load_dataset(build_tiny(tmp / "data", n_train=1, n_eval=1)["train"]).samples[0]
    encoded = pol.encode(sample)
    s = encoded.model_image_sizes[0][0] / encoded.image_sizes[0][0]  # model px per original px
    x1, y1, x2, y2 = sample.metadata["target_box"]
    box = [round(x1 * s) - 2, round(y1 * s) - 2, round(x2 * s) + 2, round(y2 * s) + 2]
    actions = [f"zoom({', '.join(map(str, box))})", "zoom(0, 0, 30, 30)", f"<answer>{sample.answer}</answer>"]
    torch.manual_seed(0)
    with EnvPool(tmp / "episodes", workers=0) as pool:
        (trajs,) = run_episodes(
            pol, ScriptedEngine(pol, actions), [sample], SamplingParams(n=2, temperature=1.0, max_new_tokens=32),
            pool=pool, env_name="zoom", settings=EpisodeConfig(max_turns=4, env_options={"max_calls": 3}),
        )  # fmt: skip
    for t in trajs:
        assert t.end == "done" and t.episode_return == 1.0 and len(t.turns) == 3, (t.end, t.error)
        assert len(t.images) == 3 and len(t.context().mm["image_grid_thw"]) == 3
    worst: dict[int, float] = {}
    for packed in (False, True):
        with torch.no_grad():
            lp, _, _ = trajectory_logprobs(pol, trajs, packed=packed)
        lp = lp.float().cpu()
        for i, t in enumerate(trajs):
            m = torch.tensor(t.mask, dtype=torch.bool)
            for k, turn in enumerate(t.turns):
                span = slice(turn.start, turn.end)
                err = (lp[i, span][m[span]] - torch.tensor(t.logprobs[span])[m[span]]).abs().max().item()
                worst[k] = max(worst.get(k, 0.0), err)
    assert all(err < TOL[dtype] for err in worst.values()), (device, dtype, worst)
    return worst


# ---------------------------------------------------------------------------------------------- (b) the judge


def judge_agrees_with_cpu(device: str, dtype: str, n: int = 32) -> dict[str, float]:
    """The HF judge (assets/tiny-judge, held-apart medvqa pairs) on ``device`` in ``dtype``, offloaded between calls,
    gives the fp32 CPU judge's verdicts, each decided by a margin above ``MARGIN[dtype]`` (the smallest is about 5
    here); on CUDA, after the call no judge tensor is left on the GPU and the memory
    allocated is back at its value before, while the call's peak held the weights. The content cache is bypassed, so
    both judges really run. Returns the smallest margin and the memory figures (bytes)."""
    from test_reward_models import held_apart_pairs

    from mmrl.rewards import judge as judge_module
    from mmrl.rewards.local_model import LRU, Loaded

    inputs, _ = held_apart_pairs(n)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    Loaded.clear()
    try:
        with mock.patch.object(judge_module, "_CACHE", LRU(0)):
            ref = judge_module.judge(inputs, model=JUDGE, device="cpu", dtype="float32")
            margins = _greedy_margins(_loaded_judge("cpu", "float32", offload=False), inputs)
            if cuda:
                torch.cuda.synchronize(dev)
                before = torch.cuda.memory_allocated(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            got = judge_module.judge(inputs, model=JUDGE, device=device, dtype=dtype, offload=True)
        assert all(r.error is None for r in ref), [r.error for r in ref if r.error][:3]
        # every verdict is decided by more than rounding can move: a different one is the device's error
        assert min(margins) > MARGIN[dtype], (min(margins), MARGIN[dtype])
        assert [r.score for r in got] == [r.score for r in ref]
        out = {"min_margin": min(margins)}
        j = _loaded_judge(device, dtype, offload=True)
        tensors = [*j.model.parameters(), *j.model.buffers()]
        assert all(t.device.type == "cpu" for t in tensors)  # offloaded: back on the host
        if cuda:  # memory_allocated is CUDA's: on the CPU there is no device memory to leave behind
            torch.cuda.synchronize(dev)
            after, peak = torch.cuda.memory_allocated(dev), torch.cuda.max_memory_allocated(dev)
            weights = sum(t.numel() * t.element_size() for t in tensors)
            out |= {"weights": weights, "peak_over_before": peak - before, "left": after - before}
            assert peak - before >= weights, out  # the call ran with the weights on the GPU
            # nothing of the call stays allocated (its KV cache and activations freed); 1% of the weights leaves
            # room for a few bytes of generate()'s own, not for a weight matrix (the smallest is 1.4% of them)
            if out["left"] >= weights // 100:  # for the message: what a garbage collection would give back
                gc.collect()
                out["left_after_gc"] = torch.cuda.memory_allocated(dev) - before
            assert out["left"] < weights // 100, out
        return out
    finally:
        Loaded.clear()


def _loaded_judge(device: str, dtype: str, offload: bool):
    from mmrl.rewards.local_model import Loaded

    # Loaded's key: ("judge", path, engine, device, dtype, use_image, offload)
    return next(
        v for k, v in Loaded._items.items() if k[0] == "judge" and k[3:] == (device, dtype, False, offload)
    )


def _greedy_margins(j, inputs) -> list[float]:
    """Per row, the smallest top-2 logit gap over the CPU judge's greedy steps up to its end token: a device whose
    logits differ by less than half of it writes the same verdict."""
    from mmrl.rewards.judge import DEFAULT_TEMPLATE, question_of
    from mmrl.rewards.local_model import clean_reference
    from mmrl.rewards.text import answer_text

    texts = [
        j.render(
            DEFAULT_TEMPLATE.format(
                question=question_of(x),
                reference=clean_reference(x.reference)[0],
                response=answer_text(x.response),
            ),
            0,
            {},
        )
        for x in inputs
    ]
    enc = j.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = j.model.generate(
            **enc, max_new_tokens=8, do_sample=False, output_scores=True, return_dict_in_generate=True,
            pad_token_id=j.pad_id, eos_token_id=sorted(j.eos_ids),
        )  # fmt: skip
    top = torch.stack([s.float().topk(2, -1).values for s in out.scores], 1)  # [B, steps, 2]
    gap = top[..., 0] - top[..., 1]
    new = out.sequences[:, enc["input_ids"].shape[1] :]  # [B, steps]
    ended = torch.tensor([[t in j.eos_ids for t in row] for row in new.tolist()])
    live = (ended.cumsum(1) - ended.long()) == 0  # up to and including the first end token
    return gap.masked_fill(~live, float("inf")).min(1).values.tolist()


# ---------------------------------------------------------------------------------------------- (c) the image check


def image_check_sees_media(device: str, dtype: str, tmp: Path) -> dict[str, float]:
    """The image check (mmrl/train/image_check.py) at step 1 on a batch sampled by the HF engine on ``device``:
    ``sanity/image_sensitivity`` is nonzero (and, in fp32, the engine's gap is the sensitivity itself, the engine
    being the policy); with the vision tower fed zeros the run is refused. Returns the check's metrics."""
    from test_image_check import _batch, _check, _zero_pixels

    from mmrl.train.image_check import SENSITIVITY_FLOOR, MediaNotSeen

    a = np.zeros((83, 57, 3), np.uint8)
    a[:, :28], a[:, 28:] = (230, 20, 20), (20, 20, 230)
    Image.fromarray(a).save(tmp / "halves.png")
    Image.new("RGB", (120, 64), (128, 128, 128)).save(tmp / "grey.png")
    pol = tiny_policy(device, dtype)
    samples = [_ask("halves", tmp / "halves.png"), _ask("grey", tmp / "grey.png")]
    stats = _check(pol)(_batch(pol, samples), 1)
    assert stats["sanity/image_sensitivity"] > SENSITIVITY_FLOOR, stats
    if dtype == "float32":
        assert stats["sanity/engine_media_gap"] == pytest.approx(stats["sanity/image_sensitivity"], rel=1e-2)
    handle = _zero_pixels(pol)
    try:
        with pytest.raises(MediaNotSeen, match="do not reach the policy"):
            _check(pol)(_batch(pol, samples, tokens=3), 1)
    finally:
        handle.remove()
    return stats


def _ask(sid: str, image: Path):
    from mmrl.types import Sample

    content = [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]
    return Sample(sid, [{"role": "user", "content": content}], images=[str(image)])


# ---------------------------------------------------------------------------------------------- (d) the device probe

PROBE = r"""
import ctypes, json, sys

def contexts():
    # the driver's own record of each visible GPU's primary context (the one the CUDA runtime, and so torch, opens):
    # cuInit opens none; None where there is no driver or no GPU
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cu.cuInit(0) != 0:
        return None
    n = ctypes.c_int()
    assert cu.cuDeviceGetCount(ctypes.byref(n)) == 0
    active = []
    for i in range(n.value):
        dev, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        assert cu.cuDeviceGet(ctypes.byref(dev), i) == 0
        assert cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(on)) == 0
        active.append(on.value)
    return active

from mmrl.config import load_config
from mmrl.plan import preflight

before = contexts()
cfg = load_config(sys.argv[1], [f"model.path={sys.argv[2]}", f"model.device={sys.argv[3]}"])
plan = preflight.preflight(cfg, force=True)
print("RESULT " + json.dumps({"before": before, "after": contexts(),
                              "gib": None if plan is None else plan.setup.hw.gpu_gib}), flush=True)
"""


def device_probe(device: str, tmp: Path) -> dict:
    """Pre-flight's memory probe (mmrl.plan.preflight.preflight, as ``mmrl train`` runs it before any model loads) in a
    fresh process with ``model.device=device``. On CUDA: the planned GPU memory is the device's total as
    ``torch.cuda.mem_get_info`` reports it, and the process has no CUDA context on any GPU afterwards. Contexts are
    read from the driver (``cuDevicePrimaryCtxGetState``): ``torch.cuda.is_initialized()`` is torch's own lazy
    set-up, which ``get_device_properties`` runs without opening a context (so it would fail a right probe and miss
    a context another library opened), and nvidia-smi's process list is often empty inside a container's PID
    namespace. On the CPU, pre-flight plans nothing (no GPU to plan for) and the script's path runs."""
    script = tmp / "probe.py"
    script.write_text(PROBE)
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.device_count() - 1)  # with several GPUs, one that is not cuda:0
    cmd = [sys.executable, str(script), str(ROOT / "recipes/shapes/tiny.yaml"), str(TINY), str(dev)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(
        next(x for x in r.stdout.splitlines() if x.startswith("RESULT ")).removeprefix("RESULT ")
    )
    if dev.type != "cuda":
        assert res["gib"] is None, res
        return res
    total = torch.cuda.mem_get_info(dev)[1]
    res["mem_get_info_total"] = total
    assert res["gib"] is not None and round(res["gib"] * 1024**3) == total, res
    assert res["before"] == res["after"] == [0] * torch.cuda.device_count(), res
    return res
