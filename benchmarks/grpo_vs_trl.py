"""Speed of mmrl's GRPO trainer against TRL's ``GRPOTrainer`` on the same tiny workload, in one process.

Workload (identical on both sides): the bundled random tiny Qwen2.5-VL (``assets/tiny-qwen2.5-vl``), fp32 on CPU
with one thread; shapes-recipe records (one-word answers) written by ``mmrl.recipes.shapes.data.build``, their
images re-saved at ``--image-size`` pixels square (LANCZOS from the recipe's 56x56) so both sides read the same
files; 8 prompts x G=8 responses per step, at most ``--max-new-tokens`` new tokens, temperature 1.0,
lr 2e-4 constant, AdamW (``torch.optim.AdamW``), grad clip 1.0, beta 0 (no reference model), one policy update per
rollout batch done as a single 64-sequence forward/backward, no gradient checkpointing, exact-match reward
(mmrl's ``exact_match``; on the TRL side a reward function calling the same ``normalize_text``/``answer_text``).
Images stay at that size on both sides (min_pixels = max_pixels = size^2; mmrl resizes with ``smart_resize`` before
the processor, TRL's image processor gets the same pixel bounds). ``n_train`` = prompts per step x steps, so no prompt
repeats within a run: mmrl caches encoded prompts by sample id, and repeats would flatter it.

Timing: s/step is the wall-clock interval between the ends of consecutive training steps, so it counts everything
a step does (data fetch, prompt encoding, generation, reward, loss, backward, optimizer step, per-step logging). On
the mmrl side a step ends when the trainer writes its metrics row (timestamped by wrapping ``trainer.logger.log``);
the checkpoint mmrl saves after the final step's row is therefore outside every measured interval. On the TRL side
a step ends at the ``on_step_end`` callback. The first ``--warmup`` steps are left out. The machine this was written
on is shared, so the table also gives this process's CPU seconds per step (``time.process_time`` over the same
intervals; with one torch thread it is less sensitive to other load than wall time) and the median ratio. It also
shows each side's own inner step time: the sum of mmrl's ``time/*`` stages and TRL's ``on_step_begin`` to
``on_step_end``. Peak RSS is sampled every 10 ms by a thread and reported as growth over the
RSS just before that side built its trainer (model load and data included); freed memory is handed back to the
OS (``malloc_trim``) between runs, yet a later run's growth can read low (allocator pages kept from an earlier
run), so it is printed per run. Each side runs ``--rounds`` times in A B B A order and its measured steps are
pooled, which evens out slow changes in the load of a shared machine.

The rewards are ~0 throughout (the tiny model is untrained), so advantages are zero and updates change nothing;
both sides still do the full forward/backward/optimizer work. Mean reward (first vs last steps) is printed for
information only.

The defaults (4 new tokens, 56 px: 4 image tokens per prompt) make a step mostly fixed costs; 64 new tokens at
112 px (16 image tokens) is closer to a real rollout, where generation and the completion's log-probs dominate.
A random model samples from its whole vocabulary, vision placeholders included, and a sampled ``<|image_pad|>`` in a
completion makes the training forward count one image token too many and fail. Both sides suppress the same vision
tokens at sampling: mmrl always does; TRL suppresses ``<|image_pad|>`` by itself and here gets the full list as
``generation_kwargs={"suppress_tokens": ...}``.

    OMP_NUM_THREADS=1 python benchmarks/grpo_vs_trl.py [--steps 10 --warmup 2 --rounds 2 --order mmrl-first]
        [--max-new-tokens 4 --image-size 56] [--device cuda]

``--device cuda`` puts both sides on the GPU (still fp32, the same workload; TRL without ``use_cpu``). A step's end
is stamped after its logged scalars are read back, which waits for the GPU on both sides. ``scripts/gpu-check.sh``
runs it so where TRL is importable (it travels to a GPU machine as wheels: ``scripts/gpu-wheels.sh``).

The last line is ``s/step: mmrl X trl Y ratio Z`` with ratio = trl / mmrl (above 1: mmrl is faster).
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from datasets import Dataset  # noqa: E402
from machine import describe, spread  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import AutoModelForImageTextToText, AutoProcessor, PrinterCallback, TrainerCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from mmrl.config import load_config  # noqa: E402
from mmrl.recipes.shapes.data import build  # noqa: E402
from mmrl.rewards.text import answer_text, normalize_text  # noqa: E402
from mmrl.run.metrics import read_metrics  # noqa: E402
from mmrl.train.trainer import Trainer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "assets" / "tiny-qwen2.5-vl"
RECIPE = REPO / "recipes" / "shapes" / "tiny.yaml"
PROMPTS, G, LR = 8, 8, 2e-4


@dataclass(frozen=True)
class Workload:
    max_new_tokens: int
    image_size: int  # pixels per side of every image, both sides
    device: str = "cpu"

    @property
    def pixels(self) -> int:
        return self.image_size**2


@dataclass
class SideResult:
    name: str
    step_s: list[float]  # end-to-end wall-clock interval per measured step
    cpu_s: list[float]  # this process's CPU time over the same intervals
    inner_s: list[float]  # the side's own per-step timer (mmrl time/* sum, TRL on_step_begin..on_step_end)
    rewards: list[float]  # mean reward of every step, warm-up included
    peak_rss_mb: float
    notes: list[str] = field(default_factory=list)


class RssMonitor:
    """Peak resident memory of this process above a baseline, sampled by a daemon thread."""

    def __init__(self, interval_s: float = 0.01):
        self.proc, self.interval = psutil.Process(), interval_s
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RssMonitor:
        self.base = self.peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def release_memory() -> None:
    """Collect garbage and return freed heap pages to the OS so the next side starts from a fair baseline."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def stamp() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def intervals(ends: list[tuple[float, float]], start: tuple[float, float]) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU seconds between consecutive step ends (the first from ``start``)."""
    pairs = list(zip([start, *ends[:-1]], ends))
    return [b[0] - a[0] for a, b in pairs], [b[1] - a[1] for a, b in pairs]


# ---------------------------------------------------------------------------------------------------- mmrl
def run_mmrl(data: Path, out: Path, steps: int, warmup: int, work: Workload) -> SideResult:
    overrides = [
        f"model.path={MODEL}",
        f"model.device={work.device}",
        f"model.min_pixels={work.pixels}",
        f"model.max_pixels={work.pixels}",
        f"data.train={data / 'train.jsonl'}",
        "data.eval=null",
        "data.builder=null",
        f"rollout.n={G}",
        "rollout.temperature=1.0",
        f"rollout.max_new_tokens={work.max_new_tokens}",
        f"rollout.batch_size={PROMPTS}",
        "algo.kl_coef=0.0",
        "algo.epochs=1",
        "algo.mini_batches=1",
        f"optim.lr={LR}",
        "optim.grad_clip=1.0",
        f"optim.micro_batch_size={PROMPTS * G}",
        "optim.scheduler=constant",
        f"train.prompts_per_step={PROMPTS}",
        f"train.max_steps={steps}",
        "train.save_every=0",
        "train.progress=false",
        "eval.every=0",
    ]
    release_memory()
    with RssMonitor() as mem:
        trainer = Trainer(load_config(RECIPE, overrides), out)
        ends: list[tuple[float, float]] = []
        log = trainer.logger.log

        def timed_log(metrics: dict) -> None:
            log(metrics)
            ends.append(stamp())

        trainer.logger.log = timed_log
        start = stamp()
        trainer.fit()
    rows = read_metrics(out / "metrics.jsonl")
    wall, cpu = intervals(ends, start)
    stage_keys = [
        k for k in rows[-1] if k.startswith("time/") and not k.endswith("_per_s")
    ]  # seconds, not rates
    inner = [sum(r.get(k, 0.0) for k in stage_keys) for r in rows]
    stages = {k[5:]: statistics.median(r[k] for r in rows[warmup:]) for k in stage_keys}
    del trainer
    return SideResult(
        "mmrl",
        wall[warmup:],
        cpu[warmup:],
        inner[warmup:],
        [r["reward/mean"] for r in rows],
        mem.growth_mb,
        ["stage medians (s): " + ", ".join(f"{k} {v:.3f}" for k, v in stages.items())],
    )


# ---------------------------------------------------------------------------------------------------- TRL
def exact_match_reward(completions: list, answer: list[str], **_: object) -> list[float]:
    """The same score as mmrl's ``exact_match`` (``<answer>`` content if tagged, SQuAD-normalised equality)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(normalize_text(answer_text(t)) == normalize_text(a)) for t, a in zip(texts, answer)]


class StepClock(TrainerCallback):
    """Wall-clock and CPU stamps at the start of training and at every step's begin and end; logged rewards."""

    def __init__(self) -> None:
        self.start = (0.0, 0.0)
        self.begins: list[tuple[float, float]] = []
        self.ends: list[tuple[float, float]] = []
        self.rewards: list[float] = []

    def on_train_begin(self, args, state, control, **kw):
        self.start = stamp()

    def on_step_begin(self, args, state, control, **kw):
        self.begins.append(stamp())

    def on_step_end(self, args, state, control, **kw):
        self.ends.append(stamp())

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "reward" in logs:
            self.rewards.append(float(logs["reward"]))


def trl_dataset(data: Path) -> Dataset:
    """Conversational prompts with a separate ``image`` column, the layout TRL 1.16 expects for VLMs."""
    rows = []
    for line in (data / "train.jsonl").read_text().splitlines():
        rec = json.loads(line)
        img = Image.open(data / rec["images"][0]).convert("RGB")
        rows.append(
            {"prompt": [{"role": "user", "content": rec["prompt"]}], "image": img, "answer": rec["answer"]}
        )
    return Dataset.from_list(rows)


def vision_token_ids(processor: AutoProcessor) -> list[int]:
    """Image/video placeholders and vision start/end/pad: tokens a completion must never contain."""
    vocab = processor.tokenizer.get_vocab()
    names = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"]
    return sorted(vocab[n] for n in names if n in vocab)


def run_trl(data: Path, out: Path, steps: int, warmup: int, work: Workload) -> SideResult:
    processor = AutoProcessor.from_pretrained(MODEL, padding_side="left")
    processor.image_processor.size = {"shortest_edge": work.pixels, "longest_edge": work.pixels}
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=PROMPTS * G,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=G,
        max_completion_length=work.max_new_tokens,
        generation_kwargs={"suppress_tokens": vision_token_ids(processor)},
        temperature=1.0,
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        gradient_checkpointing=False,
        use_cpu=work.device == "cpu",
        bf16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        max_steps=steps,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    release_memory()
    with RssMonitor() as mem:
        model = AutoModelForImageTextToText.from_pretrained(MODEL, dtype=torch.float32)
        clock = StepClock()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=exact_match_reward,
            args=args,
            train_dataset=trl_dataset(data),
            processing_class=processor,
            callbacks=[clock],
        )
        # mmrl runs with train.progress=false, so TRL's per-step console printing is switched off too
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    inner = [e[0] - b[0] for b, e in zip(clock.begins, clock.ends)]
    wall, cpu = intervals(clock.ends, clock.start)
    del trainer, model
    notes = [f"image processor size set to {processor.image_processor.size}"]
    return SideResult(
        "trl",
        wall[warmup:],
        cpu[warmup:],
        inner[warmup:],
        clock.rewards,
        mem.growth_mb,
        notes,
    )


def resize_images(folder: Path, size: int) -> None:
    """Re-save every image of the built records at ``size`` x ``size`` pixels, in place."""
    for path in sorted(folder.iterdir()):
        with Image.open(path) as im:
            resized = im.convert("RGB").resize((size, size), Image.LANCZOS)
        resized.save(path)


# ---------------------------------------------------------------------------------------------------- report
def pooled(runs: list[SideResult], key: str) -> list[float]:
    return [x for r in runs for x in getattr(r, key)]


def print_side(runs: list[SideResult], k: int) -> None:
    """One side's table over all its rounds (timings pooled; rewards of its first run)."""
    step, cpu, inner = pooled(runs, "step_s"), pooled(runs, "cpu_s"), pooled(runs, "inner_s")
    mean, rewards = statistics.mean(step), runs[0].rewards
    first, last = statistics.mean(rewards[:k]), statistics.mean(rewards[-k:])
    print(f"--- {runs[0].name}")
    print(f"  measured steps        {len(step)} ({len(runs)} run(s))")
    print(f"  s/step mean           {mean:.3f}")
    print(f"  s/step median         {statistics.median(step):.3f}")
    print(f"  s/step min / max      {min(step):.3f} / {max(step):.3f}")
    print(f"  s/step mean per run   {' '.join(f'{statistics.mean(r.step_s):.3f}' for r in runs)}")
    print(f"  CPU s/step mean       {statistics.mean(cpu):.3f}")
    print(f"  inner s/step median   {statistics.median(inner):.3f}")
    print(f"  rollouts/s            {PROMPTS * G / mean:.1f}")
    print(f"  peak RSS growth MB    {' '.join(f'{r.peak_rss_mb:.0f}' for r in runs)} (per run)")
    moved = "moved" if abs(last - first) > 1e-9 else "did not move"
    print(f"  mean reward first {k} steps {first:.4f}, last {k} steps {last:.4f} ({moved}; information only)")
    for n in runs[0].notes:
        print(f"  note: {n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="measured training steps per side and round")
    ap.add_argument(
        "--warmup", type=int, default=2, help="steps run first in every run, left out of the timings"
    )
    ap.add_argument("--rounds", type=int, default=2, help="runs per side, in A B B A ... order")
    ap.add_argument("--order", choices=["mmrl-first", "trl-first"], default="mmrl-first")
    ap.add_argument("--max-new-tokens", type=int, default=4, help="completion length limit, both sides")
    ap.add_argument("--image-size", type=int, default=56, help="image side in pixels (a multiple of 28)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda: both sides")
    a = ap.parse_args()
    if a.image_size % 28:
        ap.error(
            f"--image-size {a.image_size} is not a multiple of 28 (Qwen2.5-VL's patch grid); try 56 or 112"
        )
    work = Workload(a.max_new_tokens, a.image_size, a.device)
    hf_logging.disable_progress_bar()
    total = a.steps + a.warmup
    first = ["mmrl", "trl"] if a.order == "mmrl-first" else ["trl", "mmrl"]
    order = [n for r in range(a.rounds) for n in (first if r % 2 == 0 else first[::-1])]
    print(describe())
    print(
        f"torch threads {torch.get_num_threads()}, {PROMPTS} prompts x G={G}, max {work.max_new_tokens} new tokens, "
        f"{work.image_size}x{work.image_size} images, "
        f"{a.warmup} warm-up + {a.steps} measured steps per run, run order {' '.join(order)}, on {a.device}"
    )
    runners = {"mmrl": run_mmrl, "trl": run_trl}
    res: dict[str, list[SideResult]] = {"mmrl": [], "trl": []}
    with tempfile.TemporaryDirectory(prefix="grpo_vs_trl_") as tmp:
        root = Path(tmp)
        build(root / "data", n_train=PROMPTS * total, n_eval=0, seed=0)
        resize_images(root / "data" / "images", work.image_size)
        for i, n in enumerate(order):
            res[n].append(runners[n](root / "data", root / f"{n}-{i}", total, a.warmup, work))
    k = max(1, min(3, total // 2))
    for n in ("mmrl", "trl"):
        print_side(res[n], k)
    for label, fn, key in (("median", statistics.median, "step_s"), ("CPU mean", statistics.mean, "cpu_s")):
        mv, tv = fn(pooled(res["mmrl"], key)), fn(pooled(res["trl"], key))
        print(f"{label} s/step: mmrl {mv:.3f} trl {tv:.3f} ratio {tv / mv:.3f}")
    per_round = [
        statistics.mean(t.step_s) / statistics.mean(m.step_s)
        for m, t in zip(res["mmrl"], res["trl"], strict=True)
    ]
    print(f"ratio per round (trl / mmrl, mean s/step of each run): {spread(per_round)}")
    m, t = statistics.mean(pooled(res["mmrl"], "step_s")), statistics.mean(pooled(res["trl"], "step_s"))
    print(f"s/step: mmrl {m:.3f} trl {t:.3f} ratio {t / m:.3f}")


if __name__ == "__main__":
    main()
