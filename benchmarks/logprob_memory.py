"""Peak memory of mmrl's log-prob + entropy (forward and backward) vs the naive full-vocabulary materialisation.

Workload (issue 6, item 4): hidden states of the tiny model's width (128) and Qwen's real vocabulary (151,936),
B=8 sequences x T=1024 tokens, one language-model head; the loss is the mean sampled-token log-prob, backpropagated
to the hidden states and the head; the entropy is computed as the trainer logs it.

- mmrl: :func:`mmrl.model.logprobs.selective_logprobs` (fp32 logits of ``--chunk`` rows at a time, checkpointed).
- naive: ``log_softmax(head(h).float() / temperature)`` over the whole ``[B, T, V]``, gather, and
  ``-(exp(logp) * logp).sum(-1)`` for the entropy: the path mmrl itself used before (and most trainers use).

Each variant runs in a fresh subprocess; its peak is ``ru_maxrss`` minus the resident size just before the workload
(CPU), or ``torch.cuda.max_memory_allocated`` (CUDA). The naive path needs ~4 copies of ``B x T x V x 4`` bytes (about
20 GB at the default shape), more than a 24 GB machine shared with other work can give: when it would not fit in the
available memory it is measured at the largest T = 1024 / 2^k that fits and its peak is scaled by 2^k (every one of its
buffers is linear in B x T; the printed line says so). Values (log-probs, entropies, gradients) are compared on the
shape both variants ran, to 1e-5 relative.

    OMP_NUM_THREADS=1 python benchmarks/logprob_memory.py [--batch 8] [--tokens 1024] [--chunk 512]

Last line: ``peak MB: mmrl X naive Y ratio Z`` (Z = naive / mmrl).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

VOCAB, WIDTH = 151_936, 128


def _workload(variant: str, B: int, T: int, chunk: int, device: str, save: str) -> None:
    import psutil
    import torch

    from mmrl.model.logprobs import selective_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(WIDTH, VOCAB, bias=False).to(device)
    hidden = (torch.randn(B, T, WIDTH, device=device) * 0.5).requires_grad_(True)
    target = torch.randint(0, VOCAB, (B, T), device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = psutil.Process().memory_info().rss
    if variant == "mmrl":
        logp, ent = selective_logprobs(head, hidden, target, temperature=1.0, chunk=chunk)
    else:
        logp_all = torch.log_softmax(head(hidden).float() / 1.0, dim=-1)  # [B, T, V]
        logp = logp_all.gather(-1, target[..., None]).squeeze(-1)
        with torch.no_grad():
            ent = -(logp_all.exp() * logp_all).sum(-1)
    (-logp.mean()).backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    torch.save({"logp": logp.detach().cpu(), "ent": ent.cpu(), "grad": hidden.grad.cpu()}, save)
    print(json.dumps({"peak_bytes": peak}))


def _run(variant: str, B: int, T: int, chunk: int, device: str, save: str) -> int:
    root = str(Path(__file__).resolve().parents[1])
    code = (
        f"import sys; sys.path.insert(0, {root!r}); from benchmarks.logprob_memory import _workload; "
        f"_workload({variant!r}, {B}, {T}, {chunk}, {device!r}, {save!r})"
    )
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{variant} (B={B}, T={T}) failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]


def main() -> None:
    import psutil
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    B, T = args.batch, args.tokens
    tmp = Path(tempfile.mkdtemp(prefix="logprob_mem_"))
    mm = _run("mmrl", B, T, args.chunk, args.device, str(tmp / "mmrl.pt"))
    print(f"mmrl : B={B} T={T} chunk={args.chunk}: peak {mm / 2**20:,.0f} MB")
    # naive needs ~4 fp32 [B, T, V] buffers at its peak; halve T until that fits in 80% of what is available
    avail = psutil.virtual_memory().available if args.device == "cpu" else torch.cuda.mem_get_info()[0]
    scale, Tn = 1, T
    while 4.5 * B * Tn * VOCAB * 4 > 0.8 * avail and Tn > 1:
        Tn, scale = Tn // 2, scale * 2
    naive = _run("naive", B, Tn, args.chunk, args.device, str(tmp / "naive.pt")) * scale
    how = (
        "measured"
        if scale == 1
        else f"measured at T={Tn} and scaled x{scale} (its buffers are linear in B*T)"
    )
    print(f"naive: B={B} T={T}: peak {naive / 2**20:,.0f} MB ({how})")
    a, b = torch.load(tmp / "mmrl.pt"), torch.load(tmp / "naive.pt")
    if scale > 1:  # compare on the shape both ran
        ref = str(tmp / "mmrl_small.pt")
        _run("mmrl", B, Tn, args.chunk, args.device, ref)
        a = torch.load(ref)
    # relative to each value's size (at least 1): entropies are ~ln(V) = 11.9, where fp32 summation order alone
    # moves the 6th significant digit; gradients are ~1e-6 each, so they are compared relative to their largest
    diffs = {
        k: ((a[k] - b[k]).abs() / b[k].abs().clamp(min=1.0 if k != "grad" else b[k].abs().max())).max().item()
        for k in ("logp", "ent", "grad")
    }
    print("max relative |mmrl - naive|: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    if max(diffs.values()) > 1e-5:
        raise SystemExit("values differ by more than 1e-5")
    print(f"peak MB: mmrl {mm / 2**20:.0f} naive {naive / 2**20:.0f} ratio {naive / mm:.1f}")


if __name__ == "__main__":
    main()
