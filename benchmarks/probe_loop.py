"""The supervised probe loop shared by ``grounding_probe.py`` and ``panel_probe.py``: train a policy on records
``(encoded prompt, candidate answers as token ids, index of the right one)`` with AdamW, batch 32, and every 100 steps
score the held-out records by picking the likeliest candidate (a ranking, so the answer's format never decides)."""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import torch

Record = tuple[Any, list[list[int]], int]


def training_options(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """Add the options every probe takes (records, steps, learning rate, seed), parse, and seed torch."""
    ap.add_argument("--n", type=int, default=1000, help="training records (200 more are held out)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    return args


def held_out_accuracy(policy: Any, held: list[Record]) -> float:
    policy.model.eval()
    right = 0
    with torch.no_grad():
        for enc, cands, label in held:
            nll = [policy.sequence_nll([enc], [c]).item() for c in cands]
            right += int(min(range(len(cands)), key=nll.__getitem__) == label)
    policy.model.train()
    return right / len(held)


def train_probe(
    policy: Any, train: list[Record], held: list[Record], steps: int, lr: float, t0: float
) -> tuple[float, tuple[float, int]]:
    """Train ``steps`` steps, printing the held-out accuracy every 100; returns the last accuracy and the best
    ``(accuracy, step)``."""
    opt = torch.optim.AdamW(policy.model.parameters(), lr=lr)
    best, acc = (0.0, 0), 0.0
    for step in range(steps + 1):
        if step % 100 == 0:
            acc = held_out_accuracy(policy, held)
            best = max(best, (acc, step))
            print(f"step {step}: held-out accuracy {acc:.3f} ({time.time() - t0:.0f} s)", flush=True)
        if step == steps:
            break
        idx = random.Random(step).sample(range(len(train)), 32)
        loss = policy.sequence_nll([train[i][0] for i in idx], [train[i][1][train[i][2]] for i in idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return acc, best
