"""``latency``: an env whose steps wait, for :mod:`episode_schedule` (the pool's workers import this module by file).

Each step sleeps a long-tailed latency, ``median_s * exp(sigma * z)`` with ``z`` standard normal drawn from the
sample id, the step and ``seed`` (so both schedules of a round see the same latencies; a group's episodes share
them), then shows a new small picture and ``"screen {step}:"``; the episode ends after ``steps`` steps with
reward 1. A sleep stands for an env that waits on something outside the trainer's CPU (a page load, a remote
tool), so the two schedules are compared on waiting, not on CPU contention.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from pathlib import Path

from PIL import Image

from mmrl.envs import Env, Observation, StepResult, register_env
from mmrl.types import Sample


def latency(seed: int, key: str, step: int, median_s: float, sigma: float) -> float:
    """The sleep of step ``step`` (from 0) of an episode of sample ``key``."""
    h = hashlib.sha1(f"{seed}|{key}|{step}".encode()).digest()
    z = random.Random(int.from_bytes(h[:8], "big")).gauss(0.0, 1.0)
    return median_s * math.exp(sigma * z)


@register_env("latency")
class LatencyEnv(Env):
    deterministic = True

    def __init__(
        self, *, workdir: Path, steps: int = 4, median_s: float = 0.1, sigma: float = 1.0, seed: int = 0
    ) -> None:
        super().__init__(workdir=workdir)
        self.steps, self.median_s, self.sigma, self.seed = steps, median_s, sigma, seed

    def reset(self, sample: Sample) -> Observation:
        self.sample, self.step_no = sample, 0
        self.key = sample.id
        return Observation("", [], self._state())

    def step(self, action_text: str) -> StepResult:
        time.sleep(latency(self.seed, self.key, self.step_no, self.median_s, self.sigma))
        self.step_no += 1
        if self.step_no >= self.steps:
            return StepResult(None, 1.0, True, {})
        path = self.workdir / f"screen-{self.step_no}.png"
        self.workdir.mkdir(parents=True, exist_ok=True)
        Image.new(
            "RGB", (56, 56), tuple(hashlib.sha1(f"{self.key}{self.step_no}".encode()).digest()[:3])
        ).save(path)
        return StepResult(Observation(f"screen {self.step_no}:", [str(path)], self._state()), 0.0, False, {})

    def close(self) -> None:
        return None

    def _state(self) -> str:
        return f"{self.key}:{self.step_no}"
