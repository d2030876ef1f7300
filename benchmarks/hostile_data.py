"""Hostile data: what loading makes of each input of the test corpus, and the peak memory of a run with the corpus mixed
in against a clean run.

The corpus is tests/hostile_data.py's (generated into a temporary folder): corrupt, truncated, decompression-bomb,
CMYK, 16-bit, palette, animated, EXIF-rotated, 1x1 and extreme-aspect images, zero-frame and corrupt videos, lines
that are not UTF-8 or not JSON, wrong field types, missing files, 64 and 300 images in one record, very long text and
the model's special tokens in text. The first table gives each input's outcome through ``load_split`` with the tiny
shapes checkpoint's processor, ``data.on_bad_record: skip`` (used, or skipped with its reason's kind and message).

Peak memory: two ``mmrl train`` runs of ``--steps`` steps on ``assets/shapes-sft/model`` (CPU, fp32, images at 3136
pixels, G=2, 2 new tokens, 8 prompts a step, uniform sampler). The clean run has 16 plain one-image records; the
corpus run has 6 of them plus the whole corpus, of which 16 records are usable: both encode, roll out and train on
16 records (2 steps x 8), so the work differs only by what the corpus brings. Each run is a fresh process started by
a fresh wrapper, whose ``RUSAGE_CHILDREN`` ``ru_maxrss`` is the run's peak resident set (the largest of the trainer
and its reward workers). ``--no-limit`` adds a third run with ``data.max_images_per_record=400``, which lets the
300-image record in: what the limit saves.

    OMP_NUM_THREADS=1 python benchmarks/hostile_data.py [--steps 2] [--no-limit]

Last line: ``peak RSS MB: clean X corpus Y ratio Z (target <= 1.5)``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "assets" / "shapes-sft" / "model"
sys.path.insert(0, str(ROOT / "tests"))

from hostile_data import GOOD_ANSWER, build_corpus, mix  # noqa: E402

from mmrl.config import DataConfig  # noqa: E402
from mmrl.data import load_split  # noqa: E402

CONFIG = """
model: {{path: {model}, min_pixels: 3136, max_pixels: 3136, video_max_pixels: 3136, video_min_pixels: 784,
        device: cpu}}
data: {{train: {train}, on_bad_record: skip{extra}}}
rollout: {{n: 2, max_new_tokens: 2, batch_size: 8}}
optim: {{lr: 0.001, micro_batch_size: 8}}
rewards: [{{name: exact_match}}]
sampler: {{name: uniform}}
train: {{prompts_per_step: 8, progress: false, seed: 3, save_every: 0}}
"""


def good_records(path: Path, n: int) -> None:
    from PIL import Image

    Image.new("RGB", (56, 56), (220, 20, 20)).save(path.parent / "red.png")
    rows = [{"id": f"good-{i}", "prompt": "What colour? <image>", "images": ["red.png"], "answer": GOOD_ANSWER}
            for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def outcomes(folder: Path) -> list[tuple[str, str]]:
    """``(input, outcome)`` of every corpus case through load_split with the model's processor."""
    cases = build_corpus(folder)
    data = folder / "outcomes.jsonl"
    at = mix(data, cases)
    samples = load_split(DataConfig(on_bad_record="skip"), str(data), folder / "skipped.jsonl", str(MODEL))
    used = {s.id for s in samples}
    skipped = {int(r["where"].rsplit(":", 1)[1]): r for r in map(json.loads, open(folder / "skipped.jsonl"))}
    rows = []
    for c in cases:
        r = skipped.get(at[c.name])
        if r is None:
            assert c.id in used, c.name
            rows.append((c.name, "used"))
            continue
        reason = re.sub(r"^sample '[^']*': |^\S+:\d+: ", "", r["reason"])
        reason = re.sub(r"/\S*/(hostile/)?", "", reason)  # file names without their temporary folder
        reason = re.sub(r"(.)\1{15,}", r"\1\1\1...", reason)  # a 5000-character name
        rows.append((c.name, f"skipped: {r['kind']} ({reason[:110]})"))
    return rows


def peak_rss_mb(folder: Path, name: str, train: Path, extra: str, steps: int) -> float:
    cfg = folder / f"{name}.yaml"
    cfg.write_text(CONFIG.format(model=MODEL, train=train, extra=extra))
    cmd = [sys.executable, "-m", "mmrl.cli", "train", str(cfg), "--output-dir", str(folder / name)]
    cmd += ["--max-steps", str(steps)]
    wrapper = (
        "import resource, subprocess, sys; "
        f"r = subprocess.run({cmd!r}, capture_output=True, text=True); "
        "sys.stderr.write(r.stderr[-2000:] if r.returncode else ''); "
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, check=True)
    rc, kb = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"{name} run failed (exit {rc}):\n{out.stderr}")
    return int(kb) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--no-limit", action="store_true", help="also run with max_images_per_record=400")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="mmrl-hostile-") as tmp:
        folder = Path(tmp)
        rows = outcomes(folder)
        print("| input | outcome |\n|---|---|")
        for name, what in rows:
            print(f"| {name} | {what} |")
        clean, corpus = folder / "clean.jsonl", folder / "corpus.jsonl"
        good_records(clean, 16)
        good_records(corpus, 6)
        mix(corpus, build_corpus(folder))
        runs = [("clean", clean, ""), ("corpus", corpus, "")]
        if args.no_limit:
            runs.append(("corpus, max_images_per_record=400", corpus, ", max_images_per_record: 400"))
        peaks = {name: peak_rss_mb(folder, f"run{i}", train, extra, args.steps)
                 for i, (name, train, extra) in enumerate(runs)}  # fmt: skip
        print("\n| run | peak RSS MB | vs clean |\n|---|---|---|")
        for name, mb in peaks.items():
            print(f"| {name} | {mb:.0f} | {mb / peaks['clean']:.2f}x |")
        ratio = peaks["corpus"] / peaks["clean"]
        print(
            f"peak RSS MB: clean {peaks['clean']:.0f} corpus {peaks['corpus']:.0f} ratio {ratio:.2f} (target <= 1.5)"
        )


if __name__ == "__main__":
    main()
