"""Uniform sampling without replacement: shuffled epochs, reshuffled with a per-epoch seed."""

from __future__ import annotations

from typing import Any

import torch

from mmrl.samplers.base import SAMPLERS


@SAMPLERS.register("uniform")
class UniformSampler:
    def __init__(self, num_records: int, seed: int = 0, shuffle: bool = True):
        if num_records <= 0:
            raise ValueError("the sampler needs at least one record")
        self.n, self.seed, self.shuffle = num_records, seed, shuffle
        self.epoch, self.pos = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def select(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._make_order()
            take = min(k - len(out), self.n - self.pos)
            out.extend(self._order[self.pos : self.pos + take])
            self.pos += take
        return out

    def update(self, indices: list[int], rewards: torch.Tensor) -> None:
        return None

    def stats(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed, "n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["n"] != self.n:
            raise ValueError(f"checkpoint sampler saw {state['n']} records but the dataset now has {self.n}")
        self.epoch, self.pos, self.seed = state["epoch"], state["pos"], state["seed"]
        self._order = self._make_order()
