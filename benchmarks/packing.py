"""Padding-free updates: the update stage on a batch of mixed lengths, padded micro-batches vs packed ones.

Workload (issue "Throughput at real scale"): 8 prompts x G=4 responses; prompts of 20-400 tokens (text of random
length, an image of 56-448 px a side on most of them), responses of 4-256 random ordinary tokens, drawn with a fixed
seed. The model is a random Qwen2.5-VL built here from the bundled tiny checkpoint's tokenizer and processor with a
wider text model (``--width``, ``--layers``; the tiny one's per-token work is too small to show anything), fp32, CPU.

- before: ``model.packing: false``, ``optim.micro_batch_size: 8`` rows in draw order (the old path): each micro-batch
  left-pads its prompts and right-pads its completions to the longest, and the head scored every padded position;
- grouped (for reference): ``optim.micro_batch_tokens: --budget`` with ``model.packing: false``: the same length-grouped
  micro-batches, padded;
- after: ``model.packing: true``, ``optim.micro_batch_tokens: --budget``: rows grouped by length into micro-batches
  of at most that many tokens, each forwarded as one packed row (no padding token is computed; the head scores the
  completion tokens only), attention per sequence (``model.attn_implementation: auto`` -> ``mmrl_sdpa`` here).

Both run the same ``PolicyUpdate`` (1 epoch, 1 mini-batch, token-mean GRPO loss) from the same weights, alternating
(A B B A) for ``--rounds``; s/update is the median. The padded-token share is the share of computed positions that
are padding: sum over micro-batches of ``rows x (longest prompt + longest completion)`` against the real tokens.

    OMP_NUM_THREADS=1 python benchmarks/packing.py [--width 256 --layers 4 --budget 4096 --rounds 2]
        [--family qwen2_5_vl|qwen3_5]

``--device cuda --dtype bfloat16`` runs the same comparison on a GPU (bf16 autocast over fp32 master weights, as the
``gpu*.yaml`` recipes; each update is timed between CUDA synchronisations, and the peak memory of each variant is
printed beside its time). ``scripts/gpu-check.sh`` runs it so.

``--family qwen3_5`` builds a random Qwen3.5 of the same width instead (:func:`build_qwen3_5`): three of every four
layers are Gated-DeltaNet linear attention, packed by :mod:`mmrl.model.linear_attention`.

Last line: ``padding share: before X after Y; update speed-up Z`` (Z = before / after s/update).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"


def build_model(out: Path, width: int, layers: int, family: str = "qwen2_5_vl") -> Path:
    if family == "qwen3_5":
        return build_qwen3_5(out, width, layers)
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    for f in TINY.iterdir():
        if f.suffix in (".json", ".jinja", ".txt") and f.name not in ("config.json",):
            shutil.copy(f, out / f.name)
    conf = json.loads((TINY / "config.json").read_text())
    text = conf["text_config"]
    heads = width // 32  # head dim 32, as the tiny model's: its M-RoPE sections (4, 6, 6) stay valid
    text.update(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
    )
    text.pop("layer_types", None)
    conf["vision_config"]["out_hidden_size"] = width
    config = Qwen2_5_VLConfig(
        **{k: v for k, v in conf.items() if k not in ("architectures", "transformers_version")}
    )
    torch.manual_seed(0)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(out)
    return out


def build_qwen3_5(out: Path, width: int, layers: int) -> Path:
    """``mmrl build-tiny --family qwen3_5`` widened: three Gated-DeltaNet layers to one full-attention layer, as
    released, with linear-attention heads of 64 (``width // 64`` value heads, half as many key heads)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from mmrl.tiny.build import build_tiny

    build_tiny(out, family="qwen3_5")
    conf = AutoConfig.from_pretrained(out)
    heads = width // 32  # head dim 32 as the tiny model's (its M-RoPE sections stay valid)
    conf.text_config.update(
        dict(
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=layers,
            layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            linear_num_value_heads=max(2, width // 64),
            linear_num_key_heads=max(1, width // 128),
        )
    )
    conf.vision_config.out_hidden_size = width
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(conf).save_pretrained(out)
    return out


def make_batch(policy, rng: np.random.Generator, tmp: Path, prompts: int, G: int):
    from mmrl.train.update import RolloutBatch
    from mmrl.types import Sample

    words = "the red circle left of a blue square above green triangle shape colour table cell".split()
    suppressed = set(policy.suppressed_token_ids) | set(policy.eos_ids) | {policy.pad_id}
    ordinary = [t for t in range(100, 2900) if t not in suppressed]
    encoded = []
    for b in range(prompts):
        n_words = int(rng.integers(10, 300))
        text = " ".join(rng.choice(words, n_words))
        content = [{"type": "text", "text": text}]
        images = []
        if b % 4 != 3:  # most prompts carry an image, one in four is text only
            side = int(rng.integers(56, 449))
            other = int(rng.integers(56, 449))
            path = tmp / f"img{b}.png"
            Image.fromarray(rng.integers(0, 255, (other, side, 3), dtype=np.uint8)).save(path)
            content.insert(0, {"type": "image"})
            images.append(str(path))
        encoded.append(policy.encode(Sample(f"p{b}", [{"role": "user", "content": content}], images=images)))
    rows = [p for p in encoded for _ in range(G)]
    comps = [list(rng.choice(ordinary, int(rng.integers(4, 257)))) for _ in rows]
    T = max(len(c) for c in comps)
    old = torch.zeros(len(rows), T)
    batch = RolloutBatch.one_turn(rows, [[int(t) for t in c] for c in comps], G, old)
    batch.advantages = torch.tensor(rng.standard_normal(len(rows)), dtype=torch.float32)
    return batch


def padding_share(batch, micros, packed: bool) -> float:
    real = computed = 0
    for m in micros:
        P = [len(batch.trajectories[r].prompt.input_ids) for r in m]
        T = [len(batch.trajectories[r].response) for r in m]
        real += sum(P) + sum(T)
        computed += sum(P) + sum(T) if packed else len(m) * (max(P) + max(T))
    return 1 - real / computed


def run(
    variant: str, model_dir: Path, batch, budget: int, device: str = "cpu", dtype: str = "float32"
) -> tuple[float, float, float]:
    """One update of ``variant``: its seconds, its padded-token share and its peak memory in GiB (CUDA's allocator
    peak; 0 on a CPU)."""
    from mmrl.config import Config, from_dict
    from mmrl.model.policy import Policy
    from mmrl.train.trainer import build_scheduler
    from mmrl.train.update import PolicyUpdate, micro_batches

    packed = variant == "after"
    budgeted = variant != "before"
    cfg = from_dict(
        Config,
        {
            "model": {
                "path": str(model_dir),
                "packing": packed,
                "max_pixels": 448 * 448,
                "device": device,
                "dtype": dtype,
            },
            "optim": {"lr": 1e-4, "micro_batch_size": 8, "micro_batch_tokens": budget if budgeted else 0},
            "algo": {"kl_coef": 0.0},
        },
    )
    policy = Policy.from_pretrained(cfg.model)
    assert policy.packs == packed
    opt = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=cfg.optim.lr)
    update = PolicyUpdate(cfg, policy, opt, build_scheduler(opt, cfg), temperature=1.0)
    share = padding_share(batch, micro_batches(batch, list(range(len(batch))), 1, cfg), packed)
    cuda = policy.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with policy.training():
        update(batch, step=0)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    del update, opt, policy
    if cuda:
        torch.cuda.empty_cache()
    return seconds, share, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--family",
        choices=("qwen2_5_vl", "qwen3_5"),
        default="qwen2_5_vl",
        help="qwen3_5: Gated-DeltaNet layers (mmrl.model.linear_attention) between the attention layers",
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from mmrl.config import ModelConfig
    from mmrl.model.policy import Policy

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = build_model(tmp, args.width, args.layers, args.family)
        encoder = Policy.from_pretrained(ModelConfig(path=str(model_dir), max_pixels=448 * 448))
        batch = make_batch(encoder, np.random.default_rng(0), tmp, args.prompts, args.group)
        del encoder
        lengths = [len(t.prompt.input_ids) for t in batch.trajectories[:: args.group]]
        responses = [len(t.response) for t in batch.trajectories]
        print(
            f"batch: {len(batch)} rows, prompts {min(lengths)}-{max(lengths)} tokens, responses "
            f"{min(responses)}-{max(responses)} tokens; width {args.width}, "
            f"{args.layers} layers ({args.family}), budget {args.budget} tokens; {args.device}, {args.dtype}"
        )
        times: dict[str, list[float]] = {"before": [], "grouped": [], "after": []}
        shares: dict[str, float] = {}
        peaks: dict[str, float] = {}
        if args.device.startswith("cuda"):  # CUDA: the first update of each variant loads kernels; not timed
            for variant in ("before", "grouped", "after"):
                run(variant, model_dir, batch, args.budget, args.device, args.dtype)
        for r in range(args.rounds):
            for variant in ("before", "grouped", "after") if r % 2 == 0 else ("after", "grouped", "before"):
                s, share, peak = run(variant, model_dir, batch, args.budget, args.device, args.dtype)
                times[variant].append(s)
                shares[variant] = share
                peaks[variant] = max(peak, peaks.get(variant, 0.0))
                memory = f", peak {peak:.2f} GiB" if peak else ""
                print(f"round {r} {variant}: {s:.2f} s/update, padded share {share:.1%}{memory}", flush=True)
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    print(f"| variant | s/update (median of {args.rounds}) | padded share | peak GiB |")
    print("|---|---|---|---|")
    for v in ("before", "grouped", "after"):
        print(f"| {v} | {statistics.median(times[v]):.2f} | {shares[v]:.1%} | {peaks[v]:.2f} |")
    print(
        f"padding share: before {shares['before']:.1%} after {shares['after']:.1%}; "
        f"update speed-up {before / after:.2f}"
    )


if __name__ == "__main__":
    main()
