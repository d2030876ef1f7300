"""Time of one sampling draw per decode step: ``torch.multinomial`` (what transformers' ``generate`` samples with) vs
the HF engine's own draw (:func:`mmrl.rollout.hf.draw`: two-level inverse CDF, one uniform per row).

Both get the same ``[B, V]`` probabilities, softmax of random logits at Qwen's vocabulary (151,936), for B in 8 and
64, on CPU with one thread and on CUDA when there is one. A second pair of columns times the whole per-step work
around the draw: transformers' ``softmax -> multinomial`` vs the engine's last processor (``softmax -> draw ->
one-hot row``; generate's greedy argmax of that row is not counted). Each time is the median of ``--repeats`` calls
after two warm-up calls.

    OMP_NUM_THREADS=1 python benchmarks/sampler.py [--repeats 30]

Why multinomial is slow on CPU: for one sample it draws an Exp(1) variate for every vocabulary entry and takes
``argmax(p / q)``, so a step costs V random numbers and a logarithm per row; the engine's draw reads each row once
(block sums) and touches ~sqrt(V) entries afterwards.

Last line: ``sample s/step: multinomial X fast Y ratio Z`` for CPU at the largest batch, Z = multinomial / fast.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from mmrl.rollout.hf import _Draw, draw  # noqa: E402

VOCAB = 151_936


def _seconds(fn, device: torch.device, repeats: int) -> float:
    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    once(), once()
    return statistics.median(once() for _ in range(repeats))


def _row(device: torch.device, batch: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    logits = torch.randn(batch, VOCAB, device=device) * 3  # [B, V]
    probs = torch.softmax(logits, dim=-1)  # [B, V]
    processor, ids = _Draw(), torch.zeros(batch, 1, dtype=torch.long, device=device)
    return {
        "multinomial": _seconds(lambda: torch.multinomial(probs, 1), device, repeats),
        "fast": _seconds(lambda: draw(probs), device, repeats),
        "softmax+multinomial": _seconds(
            lambda: torch.multinomial(torch.softmax(logits, dim=-1), 1), device, repeats
        ),
        "processor": _seconds(lambda: processor(ids, logits), device, repeats),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), V = {VOCAB:,}")
    print(
        "| device | B | multinomial ms | fast draw ms | ratio | softmax+multinomial ms | engine processor ms | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = {}
    for device in devices:
        for batch in args.batches:
            r = rows[device.type, batch] = _row(device, batch, args.repeats)
            print(
                f"| {device.type} | {batch} | {r['multinomial'] * 1e3:.3f} | {r['fast'] * 1e3:.3f} "
                f"| {r['multinomial'] / r['fast']:.1f} | {r['softmax+multinomial'] * 1e3:.3f} "
                f"| {r['processor'] * 1e3:.3f} | {r['softmax+multinomial'] / r['processor']:.1f} |"
            )
    head = rows["cpu", max(args.batches)]
    print(
        f"sample s/step: multinomial {head['multinomial']:.6f} fast {head['fast']:.6f} "
        f"ratio {head['multinomial'] / head['fast']:.1f}"
    )


if __name__ == "__main__":
    main()
