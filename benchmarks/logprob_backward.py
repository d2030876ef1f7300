"""Speed of the chunked head's training pass (log-probs + entropy forward, then backward): mmrl's written-out
backward for a linear head against autograd through activation-checkpointed chunks, the path it replaced (and still
the path of a wrapped head, soft-capping or an entropy bonus; :mod:`mmrl.model.logprobs`).

Both run :func:`mmrl.model.logprobs.selective_logprobs` on the same tensors and head; the peer with ``fused=False``.
Shapes: ``tiny`` is the GRPO benchmark's update (64 completions of 64 tokens = 4,096 rows, hidden 128, the tiny
Qwen2.5-VL's 3,018-token vocabulary); ``qwen`` is 1,024 rows of hidden 512 over Qwen2.5-VL's 151,936 tokens.
Temperature 0.9, five suppressed ids, chunks of 1,024 rows, a per-token weighted loss; gradients reach the hidden
states and the head. Each shape is timed ``--reps`` times per path in A B B A order, CPU seconds (one thread),
median; the gradients of the two paths are compared.

    OMP_NUM_THREADS=1 python benchmarks/logprob_backward.py [--reps 7]

Last line: ``head fwd+bwd s: fused X checkpointed Y ratio Z`` for the tiny shape (Z = checkpointed / fused).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mmrl.model.logprobs import selective_logprobs

SHAPES = {"tiny": (4096, 128, 3018), "qwen": (1024, 512, 151_936)}


def one(fused: bool, lin: torch.nn.Linear, hidden, target, suppress, weight) -> tuple[float, list]:
    hidden.grad = None
    lin.weight.grad = None
    t = time.process_time()
    lp, _ = selective_logprobs(
        lin, hidden, target, temperature=0.9, suppress=suppress, chunk=1024, fused=fused
    )
    (lp * weight).sum().backward()
    return time.process_time() - t, [hidden.grad.clone(), lin.weight.grad.clone()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    last = ""
    for name, (n, width, vocab) in SHAPES.items():
        torch.manual_seed(0)
        lin = torch.nn.Linear(width, vocab, bias=False)
        hidden = torch.randn(1, n, width, requires_grad=True)
        suppress = torch.zeros(vocab, dtype=torch.bool)
        suppress[:5] = True
        target = torch.randint(5, vocab, (1, n))
        weight = torch.randn(1, n)
        heads = {"fused": True, "checkpointed": False}
        times: dict[str, list[float]] = {k: [] for k in heads}
        grads = {}
        for r in range(a.reps):
            for k in list(heads) if r % 2 == 0 else list(heads)[::-1]:
                s, grads[k] = one(heads[k], lin, hidden, target, suppress, weight)
                times[k].append(s)
        diff = max(
            (g - h).abs().max().item() / h.abs().max().item() for g, h in zip(*grads.values(), strict=True)
        )
        f, c = statistics.median(times["fused"]), statistics.median(times["checkpointed"])
        print(f"{name}: {n} rows x hidden {width} x vocab {vocab:,}: fused {f:.4f} s, checkpointed {c:.4f} s, "
              f"ratio {c / f:.2f}; max relative gradient difference {diff:.1e}")  # fmt: skip
        if name == "tiny":
            last = f"head fwd+bwd s: fused {f:.4f} checkpointed {c:.4f} ratio {c / f:.2f}"
    print(last)


if __name__ == "__main__":
    main()
