"""bf16 log-prob numerics (mmrl.model.logprobs): under ``model.dtype: bfloat16`` the output head runs per chunk in fp32, so
a logit is never rounded to bf16 (whose spacing near 16-32 is 0.125). Before, a token's log-prob moved by a bf16
rounding step whenever the micro-batch's padding nudged the last bits of its hidden state, and the HF engine's
recorded log-probs differed from the training forward's by as much. The chunked memory bound still holds."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmrl.config import ModelConfig
from mmrl.model.logprobs import selective_logprobs
from mmrl.model.policy import Policy
from mmrl.rollout import HFEngine, SamplingParams
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "assets" / "tiny-qwen2.5-vl")
# measured on the tiny model (96 greedy tokens): padded vs alone 1.1e-3 with the fp32 head, 7.8e-3 with the bf16 head
# (one bf16 step at |logit| in [1, 2)); HF engine vs training forward 1.0e-3 vs 7.8e-3. What remains is the bf16
# backbone's own kernels (sdpa on CPU varies with the padding; eager attention here gives bit-identical rows).
TOL = 3e-3


def _reference(head_weight, hidden, target, temperature=1.0):
    logits = hidden.float() @ head_weight.float().T / temperature
    full = torch.log_softmax(logits, -1)
    return full.gather(-1, target[..., None]).squeeze(-1), -(full.exp() * full).sum(-1)


@pytest.mark.parametrize("frozen", [False, True])
def test_head_runs_in_fp32_under_bf16_autocast(frozen):
    """fp32 master weights (the trained policy) or a bf16 copy (the reference model): either way the log-probs
    equal the fp32 computation from the same hidden states and weights; a bf16 head was off by up to 0.06 here."""
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 3000, bias=False)
    with torch.no_grad():
        head.weight.mul_(8.0)  # logits of a confident model: |logit| up to ~25
    hidden = torch.randn(3, 9, 64)
    if frozen:
        head, hidden = head.to(torch.bfloat16).requires_grad_(False), hidden.to(torch.bfloat16)
    hidden.requires_grad_(not frozen)
    target = torch.randint(0, 3000, (3, 9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = selective_logprobs(head, hidden, target, temperature=0.7, chunk=5)
    ref_lp, ref_ent = _reference(head.weight, hidden.detach(), target, 0.7)
    assert lp.dtype == torch.float32 and ref_lp.abs().max() > 5
    assert torch.allclose(lp, ref_lp, atol=2e-5, rtol=1e-6) and torch.allclose(ent, ref_ent, atol=2e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what the old head computed
        bf16_lp = torch.log_softmax(head(hidden.detach()).float() / 0.7, -1).gather(-1, target[..., None])[
            ..., 0
        ]
    assert (bf16_lp - ref_lp).abs().max() > 0.01
    if not frozen:  # gradients through the checkpointed chunks: the fp32 ones
        lp.sum().backward()
        g, gw = hidden.grad.clone(), head.weight.grad.clone()
        hidden.grad = head.weight.grad = None
        _reference(head.weight, hidden, target, 0.7)[0].sum().backward()
        assert torch.allclose(g, hidden.grad, atol=1e-4) and torch.allclose(gw, head.weight.grad, atol=1e-4)


@pytest.fixture(scope="module")
def policy():
    return Policy.from_pretrained(ModelConfig(path=TINY, dtype="bfloat16", min_pixels=3136, max_pixels=12544))


@pytest.fixture(scope="module")
def prompts(policy, tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    questions = ["What colour is the shape?", "How many shapes?", "Is it on the left?", "Which shape is it?"]
    out = []
    for i, q in enumerate(questions):
        Image.new("RGB", (56, 56), (60 * i, 255 - 60 * i, 90)).save(d / f"{i}.png")
        content = [{"type": "image"}, {"type": "text", "text": q}]
        out.append(
            policy.encode(Sample(f"s{i}", [{"role": "user", "content": content}], [str(d / f"{i}.png")]))
        )
    Image.new("RGB", (112, 112), (0, 0, 255)).save(d / "long.png")
    text = "a much longer question about the picture, to change the padding a lot, " * 3
    content = [{"type": "image"}, {"type": "text", "text": text}]
    out.append(policy.encode(Sample("long", [{"role": "user", "content": content}], [str(d / "long.png")])))
    return out


@pytest.fixture(scope="module")
def greedy(policy, prompts):
    """Greedy completions: the highest logits, where a bf16 rounding step is largest."""
    groups = HFEngine(policy, batch_size=4).generate(
        prompts[:4], SamplingParams(temperature=0, max_new_tokens=24)
    )
    return [g[0] for g in groups]


def test_logprobs_do_not_move_with_padding_in_bf16(policy, prompts, greedy):
    """Each completion scored alone and beside a much longer prompt and completion (left and right padding)."""
    torch.manual_seed(0)
    ok = [t for t in range(3000) if not policy.suppress_mask[t]]
    neighbour = [ok[i] for i in torch.randint(0, len(ok), (120,)).tolist()]
    worst = 0.0
    with torch.no_grad():
        for p, c in zip(prompts, greedy):
            n = len(c.token_ids)
            alone = policy.logprobs([p], [c.token_ids])[0][0, :n]
            padded = policy.logprobs([p, prompts[4]], [c.token_ids, neighbour])[0][0, :n]
            worst = max(worst, (alone - padded).abs().max().item())
    assert sum(len(c.token_ids) for c in greedy) >= 64
    assert worst < TOL


def test_hf_engine_records_what_the_training_forward_scores_in_bf16(policy, prompts, greedy):
    with torch.no_grad():
        for p, c in zip(prompts, greedy):
            lp = policy.logprobs([p], [c.token_ids])[0][0, : len(c.token_ids)]
            assert (lp - torch.tensor(c.logprobs)).abs().max().item() < TOL


_WORKLOAD = """
import json, sys
import psutil, torch
from mmrl.model.logprobs import selective_logprobs
rows, frozen = int(sys.argv[1]), sys.argv[2] == "1"
torch.manual_seed(0)
head = torch.nn.Linear(64, 32_000, bias=False)
hidden = torch.randn(1, rows, 64)
if frozen:  # a bf16 copy: its weight is upcast chunk by chunk
    head, hidden = head.to(torch.bfloat16).requires_grad_(False), hidden.to(torch.bfloat16)
hidden.requires_grad_(not frozen)
target = torch.randint(0, 32_000, (1, rows))
base = psutil.Process().memory_info().rss
with torch.autocast("cpu", dtype=torch.bfloat16):
    logp, ent = selective_logprobs(head, hidden, target, chunk=128)
if not frozen:
    (-logp.mean()).backward()
# VmHWM: this process image's own peak (ru_maxrss would carry the parent's resident size over the exec)
hwm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"peak": hwm - base}))
"""


def _peak(rows: int, frozen: bool) -> int:
    # a fixed mmap threshold: glibc then returns every freed buffer over 64 KB at once, so the resident size follows
    # live memory (its dynamic threshold otherwise keeps freed chunk buffers and the peak varied 0.3-2.4 GB run to run)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", _WORKLOAD, str(rows), str(int(frozen))],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak"]


@pytest.mark.parametrize("frozen", [False, True])
def test_fp32_head_keeps_the_chunked_memory_bound(frozen):
    """Peak memory of log-probs + entropy (+ backward) under bf16 autocast does not grow with B x T: 8x the rows
    cost less than one more chunk of logits, far below the [B, T, V] fp32 logits (1 GB at 8,192 rows). The
    same bound at Qwen's vocabulary: ``benchmarks/logprob_memory.py``."""
    chunk_bytes, full = 128 * 32_000 * 4, 8192 * 32_000 * 4
    small, large = _peak(1024, frozen), _peak(8192, frozen)
    assert large < small + chunk_bytes, (small, large)
    assert large < full / 3, (large, full)


def test_fp32_head_from_two_threads():
    """Asynchronous rollouts generate in the producer thread while held-out validation generates with the same
    engine in the trainer's: blocks on one head overlap and end in either order, and the head is restored after the
    last one."""
    import threading

    from mmrl.model.logprobs import fp32_head

    head = torch.nn.Linear(4, 3).to(torch.bfloat16)
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    inside, leave_first = threading.Barrier(2), threading.Event()
    dtypes: list[torch.dtype] = []

    def first() -> None:
        with fp32_head(head):
            inside.wait()
            leave_first.wait()  # leaves while the second is still inside
        dtypes.append(head(x).dtype)

    t = threading.Thread(target=first)
    t.start()
    with fp32_head(head):
        inside.wait()
        leave_first.set()
        t.join()
        assert "forward" in head.__dict__ and head(x).dtype == torch.float32  # still patched for this block
    assert "forward" not in head.__dict__ and head(x).dtype == torch.bfloat16
    assert dtypes == [torch.float32]  # the first left; the second block kept the patch
