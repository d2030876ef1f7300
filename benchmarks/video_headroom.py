"""How much of a video warm start's held-out error is a wrong answer prior (which RL can correct in minutes) and how
much is perception (which it could not, in the runs in recipes/video/README.md).

    python benchmarks/video_headroom.py assets/video-sft/model [runs/x/checkpoints/step-80 ...] [--recipe ...]

For every held-out record of the recipe (its ``data.eval``), the checkpoint scores each option letter as the first
response token, teacher-forced through ``Policy.logprobs`` (the training forward; the greedy eval's first token is
its argmax whenever that is a letter). Per question kind it prints:

- ``argmax``: accuracy of the best-scored letter, the greedy held-out accuracy;
- ``prior-corrected``: the best accuracy reachable by adding one constant per letter to the log-probs (a grid of
  -8..8 in steps of 0.25, letter A fixed at 0), i.e. by changing only the answer prior and not what the model reads
  from the clip. The gap between the two is what de-biasing alone can win; the rest needs better perception;
- the confusion counts (``answer>predicted``) and the mean probability mass on the option letters.

The printed ceilings are in-sample on the held-out set (the offsets are fitted to it), so they are an upper bound on
what a prior correction learned from the training prompts reaches.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import string
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
GRID = np.arange(-8.0, 8.01, 0.25)


def letter_logprobs(policy, samples) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per kind: log-probs ``[N, options]`` of each option letter as the first response token, and the answers."""
    tok = policy.processor.tokenizer
    ids = {L: tok.encode(L, add_special_tokens=False) for L in string.ascii_uppercase[:8]}
    rows: dict[str, list] = collections.defaultdict(list)
    answers: dict[str, list] = collections.defaultdict(list)
    with torch.no_grad():
        for s in samples:
            letters = string.ascii_uppercase[: len(s.metadata["choices"])]
            enc = policy.encode(s)
            lp, _, _ = policy.logprobs(
                [enc] * len(letters), [ids[L][:1] for L in letters], with_entropy=False
            )
            kind = str(s.metadata.get("kind", "all"))
            rows[kind].append(lp[:, 0].float().cpu().numpy())
            answers[kind].append(letters.index(s.answer))
    return {k: (np.stack(rows[k]), np.array(answers[k])) for k in rows}


def prior_corrected(logp: np.ndarray, y: np.ndarray) -> tuple[float, tuple[float, ...]]:
    """Best accuracy over per-letter constant offsets (letter A's fixed at 0) and the offsets reaching it."""
    best = (-1.0, ())
    for off in itertools.product(GRID, repeat=logp.shape[1] - 1):
        acc = float(np.mean((logp + np.array((0.0, *off))).argmax(1) == y))
        if acc > best[0]:
            best = (acc, tuple(float(o) for o in off))
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "video" / "tiny.yaml")
    p.add_argument("--max-samples", type=int, default=200)
    a = p.parse_args()
    from mmrl.config import load_config
    from mmrl.data import ensure_built, load_split
    from mmrl.model.policy import Policy

    cfg = load_config(a.recipe)
    ensure_built(cfg.data.train, cfg.data.builder)
    samples = load_split(cfg.data, cfg.data.eval, None)[: a.max_samples]
    for ckpt in a.checkpoints:
        if (Path(ckpt) / "model" / "config.json").is_file():  # a training checkpoint (step-N/) holds model/
            ckpt = str(Path(ckpt) / "model")
        policy = Policy.from_pretrained(cfg.model, ckpt, trainable=False)
        n = argmax_ok = corrected_ok = 0.0
        print(f"{ckpt}: {len(samples)} held-out records of {a.recipe.name}")
        for kind, (logp, y) in sorted(letter_logprobs(policy, samples).items()):
            acc = float(np.mean(logp.argmax(1) == y))
            best, off = prior_corrected(logp, y)
            confusion = collections.Counter(
                f"{'ABCDEFGH'[t]}>{'ABCDEFGH'[q]}" for t, q in zip(y, logp.argmax(1))
            )
            mass = float(np.exp(logp).sum(1).mean())
            print(
                f"  {kind:10s} n={len(y):3d} argmax {acc:.3f} prior-corrected {best:.3f} (offsets "
                f"{', '.join(f'{o:+.2f}' for o in off)}) letter mass {mass:.2f} {dict(sorted(confusion.items()))}"
            )
            n += len(y)
            argmax_ok += acc * len(y)
            corrected_ok += best * len(y)
        print(
            f"  overall: argmax {argmax_ok / n:.3f}, prior-corrected {corrected_ok / n:.3f} "
            f"(headroom a prior correction can win: {(corrected_ok - argmax_ok) / n:+.3f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
