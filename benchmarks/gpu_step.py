"""Seconds per GRPO step, tokens/s and peak GPU memory of a Qwen2.5-VL-3B-architecture policy with random weights,
with and without activation checkpointing (the scale-out issue's GPU measurements).

    python benchmarks/gpu_step.py                       # a CUDA machine: the 3B shapes, 8 prompts x G=8, 256 tokens
    OMP_NUM_THREADS=1 python benchmarks/gpu_step.py --arch tiny --device cpu --prompts 2 --group 2 --tokens 8 \\
        --image 112x112 --steps 2                       # the same code path on a CPU, in about a minute

The model is built, not downloaded: Qwen2.5-VL-3B-Instruct's published shapes (text: 36 layers, hidden 2,048, MLP
11,008, 16 heads with 2 KV heads, vocabulary 151,936, tied embeddings; vision: 32 blocks of 1,280, full attention in
blocks 7/15/23/31, window 112 px, merger to 2,048), randomly initialised by transformers, saved once in bf16 under
``--cache`` with the bundled tiny model's tokenizer and processor (the tokenizer's ids fit in the larger vocabulary;
tokens it lacks decode to nothing, so responses are random text of the full ``--tokens``: a random model almost never
samples ``<|im_end|>``). The run is mmrl's own trainer, as ``mmrl train`` runs it: HF generate, fp32 master weights
with bf16 autocast (``model.dtype: bfloat16``), AdamW, GRPO with a reward that varies across random responses (the
share of ASCII letters in the text), ``--prompts`` x ``--group`` rollouts of ``--tokens`` tokens per step, one image
of ``--image`` pixels per prompt taken whole (``model.max_pixels`` = its area: 1024x784 is 1,024 visual tokens).

``--compare throughput`` runs the throughput issue's before/after instead, both with activation checkpointing:
``before`` is the old update path (``model.packing: false``, ``model.attn_implementation: sdpa``, ``--micro-batch``
rows per micro-batch in draw order, each left/right-padded to its longest row); ``after`` is today's default
(``model.packing: true``, ``attn_implementation: auto``, rows grouped by length under ``optim.micro_batch_tokens`` =
``--micro-batch-tokens`` and each micro-batch forwarded as one packed row). What does not switch off (vision encoded
once per prompt, the sampler, frozen copies in the compute dtype) runs on both sides. Last line
``s/step: before X after Y ratio Z; peak GiB: before A after B`` (Z = X / Y). ``--compare all`` (what
``scripts/gpu-check.sh`` runs) measures ``before``, ``after`` and ``after-plain`` (``after`` without checkpointing) in
three processes rather than four: the throughput pair, and checkpointing's cost on the path that runs by default.

Each setting runs in its own subprocess, so its peak is its own
(``torch.cuda.max_memory_allocated``; on CPU the process's peak resident size). Steps after the first are timed
(the first compiles kernels and fills caches). Printed per setting: seconds per step (and the rollout / update
split from the trainer's ``time/*``), rollout and training tokens/s (``sys/*``), peak memory; last line
``s/step: checkpointing X plain Y; peak GiB: checkpointing A plain B`` (each setting's name and numbers, and
``ratio`` = before / after where both ran); ``results.json`` under ``--out`` is rewritten after each setting.
Out-of-memory is reported as such, not hidden.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"

CONFIG_3B = ROOT / "mmrl" / "plan" / "configs" / "Qwen2.5-VL-3B-Instruct"  # the published config.json

REWARD = '''
from mmrl.types import RewardResult


def letters(batch):
    """Share of ASCII letters in the response: varies across random responses, so GRPO groups carry signal."""
    return [RewardResult(sum(c.isascii() and c.isalpha() for c in x.response) / max(len(x.response), 1))
            for x in batch]
'''


def make_config(arch: str):
    """The Qwen2.5-VL config of ``arch``'s shapes, with the bundled tokenizer's special-token ids."""
    from transformers import AutoConfig, AutoTokenizer, Qwen2_5_VLConfig

    from mmrl.tiny.archs import TEXT_ARCH, VISION_ARCH
    from mmrl.tiny.tokenization import QWEN_SPECIAL_TOKENS

    tok = AutoTokenizer.from_pretrained(TINY)
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    text, vision = TEXT_ARCH, VISION_ARCH
    if arch == "3b":
        published = AutoConfig.from_pretrained(CONFIG_3B)
        text, vision = published.text_config.to_dict(), published.vision_config.to_dict()
    text = {**text, "vocab_size": max(text.get("vocab_size", 0), len(tok))}
    text.update(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]
    )
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config={**vision, "out_hidden_size": text["hidden_size"]},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def build_model(arch: str, folder: Path) -> Path:
    """A random-weight Qwen2.5-VL of ``arch``'s shapes with the tiny model's tokenizer and processor (once)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    processor = AutoProcessor.from_pretrained(TINY)
    config = make_config(arch)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration(config)
    n = sum(p.numel() for p in model.parameters())
    tmp = folder.with_name(folder.name + ".tmp")
    model.to(torch.bfloat16).save_pretrained(tmp)
    processor.save_pretrained(tmp)
    tmp.rename(folder)
    print(
        f"built {arch}: {n / 1e9:.3f} B parameters in {time.perf_counter() - t0:.0f} s -> {folder}",
        flush=True,
    )
    return folder


def write_data(folder: Path, n: int, width: int, height: int) -> Path:
    """``n`` prompts, each with one ``width`` x ``height`` picture of coloured rectangles."""
    import random

    from PIL import Image, ImageDraw

    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    lines = []
    for i in range(n):
        img = Image.new("RGB", (width, height), "white")
        draw = ImageDraw.Draw(img)
        for _ in range(8):
            x, y = rng.randrange(width), rng.randrange(height)
            colour = tuple(rng.randrange(256) for _ in range(3))
            draw.rectangle([x, y, min(width, x + width // 4), min(height, y + height // 4)], fill=colour)
        img.save(folder / "images" / f"{i}.png")
        lines.append(
            json.dumps(
                {
                    "id": f"gpu-step-{i}",
                    "prompt": "<image>Describe the picture.",
                    "images": [f"images/{i}.png"],
                }
            )
        )
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "reward.py").write_text(REWARD)
    return folder / "train.jsonl"


def _plan_options(cfg, gpu_gib: float | None = None):
    from mmrl.plan.memory import PlanOptions

    text = max(
        len(json.loads(x)["prompt"]) for x in Path(cfg.data.train).read_text().splitlines() if x.strip()
    )
    return PlanOptions(gpus=1, nodes=1, gpu_memory_gib=gpu_gib, images=1, text_tokens=text + 24)


def planned(cfg) -> dict:
    """What ``mmrl plan`` predicts for this run on one GPU: torch's allocator peak (the measure of
    ``torch.cuda.max_memory_allocated``) and its stage. The prompt's text tokens are bounded by its characters plus
    the chat template's own (~24 tokens); the image's visual tokens follow from ``model.max_pixels``."""
    from mmrl.plan.planner import plan_run, torch_peak

    peak, stage = torch_peak(plan_run(cfg, _plan_options(cfg), advise=False))
    return {"planned_peak_gib": peak / 2**30, "planned_stage": stage}


def fitted(cfg, overrides: list[str], gpu_gib: float) -> tuple[object, list[str]]:
    """``cfg`` as run on a card of ``gpu_gib``: where ``mmrl plan`` says it does not fit, with the plan's cheapest
    change that does (``after-plain`` at the 3B shapes: 271 GiB planned at 12 rows a micro-batch, so the planner
    lowers ``optim.micro_batch_tokens``); the changes are returned and reported, not hidden. A plan without advice
    leaves the config as it is, and the run reports its out-of-memory."""
    from mmrl.config import load_config
    from mmrl.plan.planner import plan_run

    p = plan_run(cfg, _plan_options(cfg, gpu_gib))
    changes = [x for x in (p.advice or []) if not x.startswith("--")] if not p.fits else []
    return (load_config(None, overrides + changes) if changes else cfg), changes


SETTINGS = {
    "checkpointing": ("checkpointing", "plain"),
    "throughput": ("before", "after"),
    "all": ("before", "after", "after-plain"),
}


def setting_overrides(a: argparse.Namespace, setting: str) -> list[str]:
    """The config overrides that make ``setting`` differ from the others of its comparison: ``checkpointing`` and
    ``plain`` run the defaults with activation checkpointing on and off; ``before`` is the padded path of row-count
    micro-batches, ``after`` the packed path of token-budget micro-batches (both checkpointed); ``after-plain`` is
    ``after`` without checkpointing."""
    checkpointing = setting not in ("plain", "after-plain")
    out = [f"model.gradient_checkpointing={str(checkpointing).lower()}"]
    if setting == "before":
        out += ["model.packing=false", "model.attn_implementation=sdpa", "optim.micro_batch_tokens=0"]
    elif setting.startswith("after"):
        out += ["model.packing=true", "model.attn_implementation=auto"]
        out += [f"optim.micro_batch_tokens={a.micro_batch_tokens}"]
    return out


def setting_config(a: argparse.Namespace, setting: str, model: Path, data: Path) -> list[str]:
    """The overrides of ``setting``'s run (on the defaults, as ``mmrl train`` without a recipe)."""
    width, height = (int(v) for v in a.image.split("x"))
    return [
        f"model.path={model}",
        f"model.device={a.device}",
        "model.dtype=bfloat16",
        *setting_overrides(a, setting),
        "model.min_pixels=3136",
        f"model.max_pixels={width * height}",
        f"data.train={data}",
        f"rollout.n={a.group}",
        f"rollout.max_new_tokens={a.tokens}",
        f"rollout.batch_size={a.prompts * a.group}",
        f"optim.micro_batch_size={a.micro_batch}",
        "optim.lr=1e-6",
        f"rewards=[{{name: {data.parent / 'reward.py'}:letters}}]",
        f"train.prompts_per_step={a.prompts}",
        f"train.max_steps={a.steps}",
        "train.save_every=0",
        "train.progress=false",
        "train.seed=0",
    ]


def run_setting(a: argparse.Namespace, setting: str) -> dict:
    """Train ``a.steps`` steps in this process and return the timings and the peak memory."""
    import resource

    import torch

    from mmrl.config import load_config
    from mmrl.train.trainer import Trainer

    width, height = (int(v) for v in a.image.split("x"))
    model = build_model(a.arch, a.cache / f"qwen2.5-vl-{a.arch}-random")
    data = write_data(a.out / "data", a.prompts, width, height)
    out = a.out / setting
    overrides = setting_config(a, setting, model, data)
    cfg = load_config(None, overrides)
    cuda = a.device.startswith("cuda")
    changes: list[str] = []
    if cuda:
        cfg, changes = fitted(cfg, overrides, torch.cuda.get_device_properties(a.device).total_memory / 2**30)
    result: dict = {"setting": setting, "checkpointing": cfg.model.gradient_checkpointing} | planned(cfg)
    result.update(packing=cfg.model.packing, planner_changes=changes)
    result["micro_batch_tokens"] = cfg.optim.micro_batch_tokens
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        Trainer(cfg, out, overwrite=True).fit()
    except torch.OutOfMemoryError as e:
        result["oom"] = str(e).splitlines()[0]
    result["wall_s"] = time.perf_counter() - t0
    if cuda:
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["device_name"] = torch.cuda.get_device_name()
    else:
        result["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [r for r in rows if "loss" in r][1:] or [r for r in rows if "loss" in r]
    step_s = [sum(v for k, v in r.items() if k.startswith("time/")) for r in timed]
    result.update(
        steps_timed=len(timed),
        s_per_step=statistics.mean(step_s) if step_s else float("nan"),
        rollout_s=statistics.mean(r.get("time/rollout", 0.0) for r in timed) if timed else float("nan"),
        update_s=statistics.mean(r.get("time/update", 0.0) for r in timed) if timed else float("nan"),
        rollout_tokens_per_s=statistics.mean(r["sys/rollout_tokens_per_s"] for r in timed) if timed else 0.0,
        train_tokens_per_s=statistics.mean(r["sys/train_tokens_per_s"] for r in timed) if timed else 0.0,
        response_tokens=statistics.mean(r["response_length/mean"] for r in timed) if timed else 0.0,
    )
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=("3b", "tiny"), default="3b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--image", default="1024x784", help="WIDTHxHEIGHT of each prompt's image")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=16384,
        help="the token budget of --compare throughput's after",
    )
    p.add_argument("--compare", choices=tuple(SETTINGS), default="checkpointing")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--cache", type=Path, default=ROOT / "runs" / "gpu-step-models")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-step")
    p.add_argument("--setting", choices=sorted(set(sum(SETTINGS.values(), ()))), help=argparse.SUPPRESS)
    return p


def main() -> None:
    a = parser().parse_args()
    if a.setting:  # a child: one setting, its result as the last line
        print("RESULT " + json.dumps(run_setting(a, a.setting)), flush=True)
        return
    a.cache.mkdir(parents=True, exist_ok=True)
    build_model(a.arch, a.cache / f"qwen2.5-vl-{a.arch}-random")  # once, before the timed children
    a.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for setting in SETTINGS[a.compare]:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--setting", setting]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith("RESULT ")), None)
        if r.returncode or line is None:
            print(f"{setting}: failed (exit {r.returncode})\n{r.stderr[-3000:]}", flush=True)
            continue
        res = results[setting] = json.loads(line.removeprefix("RESULT "))
        print(
            f"{setting}: {res['s_per_step']:.2f} s/step over {res['steps_timed']} timed steps (rollout "
            f"{res['rollout_s']:.2f} s, update {res['update_s']:.2f} s); rollout {res['rollout_tokens_per_s']:.0f} "
            f"tokens/s, training {res['train_tokens_per_s']:.0f} tokens/s; {res['response_tokens']:.0f} tokens per "
            f"response; peak {res['peak_gib']:.2f} GiB (planned {res['planned_peak_gib']:.2f} GiB, "
            f"{res['planned_stage']})"
            + (
                f"; changed by the planner to fit: {' '.join(res['planner_changes'])}"
                if res["planner_changes"]
                else ""
            )
            + (f"; OUT OF MEMORY: {res['oom']}" if "oom" in res else ""),
            flush=True,
        )
        write_summary(a, results)
    write_summary(a, results)  # also when no setting finished
    if len(results) < 2:
        return
    s_per_step = " ".join(f"{k} {r['s_per_step']:.2f}" for k, r in results.items())
    peaks = " ".join(f"{k} {r['peak_gib']:.2f}" for k, r in results.items())
    ratio = ""
    if "before" in results and "after" in results:
        ratio = f" ratio {results['before']['s_per_step'] / results['after']['s_per_step']:.2f}"
    print(f"s/step: {s_per_step}{ratio}; peak GiB: {peaks}")


def write_summary(a: argparse.Namespace, results: dict) -> None:
    """``results.json`` under ``--out``, rewritten after each setting (a run stopped early keeps what it measured)."""
    summary = {"settings": vars(a), "results": results}
    (a.out / "results.json").write_text(json.dumps(summary, indent=1, default=str))  # paths as strings


if __name__ == "__main__":
    main()
