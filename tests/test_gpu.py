"""CUDA-only checks (marker ``gpu``; skipped with a reason where no CUDA device is present). They are what
``scripts/gpu-check.sh`` runs first on a lent GPU machine:

- the policy on CUDA in fp32 and bf16: the HF engine's recorded log-probs equal the training forward's;
- a world-size-1 run under torchrun on NCCL through the whole distributed code path (the Dist collectives, DDP's
  gradient sum, evaluation split over ranks, a checkpoint written and resumed from the CPU), 2 steps + 2 resumed
  steps equal to 4 uninterrupted ones;
- the same with FSDP2 (one GPU: sharding over one rank, the optimizer state in torch's distributed checkpoint);
- the Dist collectives on a real NCCL default group (host tensors through the gloo host group);
- packed scoring on CUDA equals the padded path (log-probs 1e-5, gradients) for a multimodal-RoPE family, Qwen3.5's
  Gated-DeltaNet layers (mmrl.model.linear_attention: flash-linear-attention's kernel where installed, else the torch rule)
  and Gemma 3's two-way image blocks;
- the paths whose bodies live in tests/gpu_paths.py (run on the CPU too, by tests/test_gpu_paths_cpu.py): a multi-turn
  zoom episode's per-turn log-probs equal to the training forward's (fp32 and bf16), the HF judge's verdicts equal
  to the CPU judge's and its weights off the GPU after an offloaded call, the image check (nonzero sensitivity, a
  vision tower fed zeros refused), and pre-flight's per-rank memory probe (the device's total, no CUDA context).

``MMRL_GPU_TESTS_DEVICE=cpu`` rehearses this module on a CPU (``MMRL_GPU_TESTS_DEVICE=cpu bash scripts/gpu-check.sh
--device cpu --small --parts tests``): the gpu_paths tests run on the CPU, the CUDA-only ones skip with a reason."""

import json
import os
from pathlib import Path

import pytest
import torch
from gpu_paths import device_probe, image_check_sees_media, judge_agrees_with_cpu, multi_turn_logprobs
from multiproc import WALL_CLOCK, shapes_run_config, torchrun
from test_packing import media  # noqa: F401 (the fixture)

from mmrl.run.metrics import read_metrics

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("MMRL_GPU_TESTS_DEVICE", "cuda")  # cpu: the rehearsal (module docstring)
if DEVICE not in ("cuda", "cpu"):
    raise ValueError(f"MMRL_GPU_TESTS_DEVICE={DEVICE!r}: use cuda (the default) or cpu (a rehearsal)")
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (run scripts/gpu-check.sh on a GPU machine)", allow_module_level=True)
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="CUDA-only (NCCL, model on cuda): a CPU rehearsal")

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"


@cuda_only
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_logprobs_equal_training_forward_on_cuda(dtype, tmp_path):
    from PIL import Image

    from mmrl.config import load_config
    from mmrl.model.policy import Policy
    from mmrl.rollout import ENGINES
    from mmrl.rollout.base import SamplingParams
    from mmrl.types import Sample

    cfg = load_config(None, [f"model.path={TINY}", "model.device=cuda", f"model.dtype={dtype}"])
    pol = Policy.from_pretrained(cfg.model)
    assert pol.device.type == "cuda"
    img = tmp_path / "i.png"
    Image.new("RGB", (84, 56), (200, 30, 30)).save(img)
    s = Sample(
        "q", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}], [img]
    )
    prompts = [pol.encode(s)] * 2
    torch.manual_seed(0)
    groups = ENGINES.get("hf")(pol, batch_size=2).generate(prompts, SamplingParams(2, 1.0, 1.0, 0, 12))
    comps = [c for g in groups for c in g]
    with torch.no_grad():
        logp, _, mask = pol.logprobs([prompts[0]] * len(comps), [c.token_ids for c in comps])
    tol = 1e-5 if dtype == "float32" else 2e-2
    for i, c in enumerate(comps):
        got = logp[i, : len(c.token_ids)].cpu()
        assert torch.allclose(got, torch.tensor(c.logprobs), atol=tol), (
            i,
            (got - torch.tensor(c.logprobs)).abs().max(),
        )


def _strip(rows):
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "sys/")) and k not in WALL_CLOCK}
        for r in rows
    ]


@cuda_only
@pytest.mark.parametrize("fsdp", [False, True])
def test_one_gpu_run_under_torchrun_on_nccl_resumes_exactly(fsdp, tmp_path):
    cfg = shapes_run_config(tmp_path, micro_batch_size=8)
    extra = ["model.device=auto", f"train.fsdp={str(fsdp).lower()}"]
    run = ["-m", "mmrl", "train", str(cfg), "--output-dir"]
    torchrun(1, *run, str(tmp_path / "full"), "--max-steps", "4", *extra, cwd=tmp_path)
    torchrun(1, *run, str(tmp_path / "split"), "--max-steps", "2", *extra, cwd=tmp_path)
    torchrun(1, *run, str(tmp_path / "split"), "--max-steps", "4", "--resume", *extra, cwd=tmp_path)
    full = _strip(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    split = _strip(read_metrics(tmp_path / "split" / "metrics.jsonl"))
    assert [r["step"] for r in full] == [0, 1, 2, 3, 4]
    assert full == split
    config = json.loads((tmp_path / "full" / "config.json").read_text())
    assert config["model"]["device"].startswith("cuda")
    ck = tmp_path / "full" / "checkpoints" / "step-4"
    assert (ck / "optimizer").is_dir() if fsdp else (ck / "optimizer.pt").is_file()


NCCL_WORKER = r"""
import json, torch
from mmrl.distributed import Dist

d = Dist()
assert torch.distributed.get_backend() == "nccl", torch.distributed.get_backend()
summed = d.sum({"a": 1.5})
gathered = d.gather({"rank": d.rank})
t = torch.full((3,), 7.0, device=d.device)
d.broadcast([t])
h = torch.full((2,), 3.0)
d.broadcast([h])
d.barrier()
print("RESULT " + json.dumps({"sum": summed, "gathered": gathered, "t": t.tolist(), "h": h.tolist(),
                              "host_group": d.host_group is not None, "device": str(d.device)}), flush=True)
d.exit()  # as `mmrl train` ends a launched rank (Dist.exit says why)
"""


@cuda_only
def test_dist_collectives_on_nccl(tmp_path):
    worker = tmp_path / "w.py"
    worker.write_text(NCCL_WORKER)
    r = torchrun(1, str(worker), cwd=tmp_path)
    res = json.loads(
        next(x for x in r.stdout.splitlines() if x.startswith("RESULT ")).removeprefix("RESULT ")
    )
    assert res == {
        "sum": {"a": 1.5},
        "gathered": [{"rank": 0}],
        "t": [7.0] * 3,
        "h": [3.0] * 2,
        "host_group": True,
        "device": "cuda:0",
    }, res


@cuda_only
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5", "gemma3"])
def test_packed_scoring_equals_padded_on_cuda(family, tiny_family, media):  # noqa: F811 (the fixture)
    from test_packing import _check_packed, _samples

    from mmrl.config import ModelConfig
    from mmrl.model.policy import Policy

    policy = Policy.from_pretrained(
        ModelConfig(path=str(tiny_family(family)), device="cuda", min_pixels=3136, max_pixels=12544)
    )
    assert policy.device.type == "cuda" and policy.packs
    _check_packed(policy, [policy.encode(s) for s in _samples(media, video=False)], family)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_multi_turn_logprobs_equal_training_forward_per_turn(dtype, tmp_path):
    multi_turn_logprobs(DEVICE, dtype, tmp_path)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_judge_agrees_with_cpu_and_offload_leaves_the_gpu(dtype):
    judge_agrees_with_cpu(DEVICE, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_image_check_sees_media_and_refuses_a_blind_tower(dtype, tmp_path):
    image_check_sees_media(DEVICE, dtype, tmp_path)


def test_preflight_probe_reads_the_device_total_without_a_context(tmp_path):
    device_probe(DEVICE, tmp_path)


@pytest.mark.parametrize("old_logprobs", ["recompute", "interpolate"])
def test_async_rollouts_on_one_device(old_logprobs, tmp_path):
    """Asynchronous rollouts (rollout.max_staleness 1, the producer thread and the engine's own copy of the weights,
    copied in between two decoding steps) on the device: four steps, no token more than one version old, and with
    pi_prox recomputed the engine's behaviour log-probs within float noise of the training forward's where the
    tokens are of the trained version (docs/async.md#asynchronous-rollouts)."""
    import subprocess
    import sys

    from multiproc import BASE_ENV

    cfg = shapes_run_config(tmp_path, micro_batch_size=8)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mmrl", "train", str(cfg), "--output-dir", str(out), "--max-steps", "4"]
    cmd += [f"model.device={'auto' if DEVICE == 'cuda' else 'cpu'}", "rollout.max_staleness=1"]
    cmd += [f"algo.old_logprobs={old_logprobs}", "algo.rollout_correction=tis_token"]
    env = {k: v for k, v in BASE_ENV.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [x for x in read_metrics(out / "metrics.jsonl") if "reward/mean" in x]
    assert [x["step"] for x in rows] == [1, 2, 3, 4]
    assert all(0 <= x["async/staleness_max"] <= 1 for x in rows)
    config = json.loads((out / "resolved.json").read_text())
    assert config["device"].startswith(DEVICE)
    if old_logprobs == "recompute":
        assert all(x["rollout/logprob_diff_mean"] < 0.5 for x in rows)  # a wrong or half-copied weight: >> 1
