"""An env for tests/test_trainer_episodes.py, registered on import (pool workers import this module again by name or
by file, :mod:`mmrl.envs.base`).

``test_parity``: ``steps`` steps; each shows a new picture (a colour from the sample id and the step) after the text
``"screen {step}:"``. A step's reward is 1 when its action text has an even number of characters, else 0, so the
returns of a group vary with sampling and the step-level advantages (GiGPO) are not all zero. The state key is the
sample id and the step (every episode of a task visits the same states: anchor groups of G steps). ``info``:
``target_hit`` (the reward as a bool) and ``action_chars``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from PIL import Image

from mmrl.envs import Env, Observation, StepResult, register_env
from mmrl.types import Sample


@register_env("test_parity")
class ParityEnv(Env):
    deterministic = True

    def __init__(self, *, workdir: Path, steps: int = 2, side: int = 56) -> None:
        super().__init__(workdir=workdir)
        self.steps, self.side = steps, side

    def reset(self, sample: Sample) -> Observation:
        self.sample, self.step_no = sample, 0
        return Observation("", [], self._key())

    def step(self, action_text: str) -> StepResult:
        self.step_no += 1
        even = len(action_text) % 2 == 0
        info = {"target_hit": even, "action_chars": len(action_text)}
        if self.step_no >= self.steps:
            return StepResult(None, float(even), True, info)
        obs = Observation(f"screen {self.step_no}:", [self._picture()], self._key())
        return StepResult(obs, float(even), False, info)

    def close(self) -> None:
        return None

    def _key(self) -> str:
        return f"{self.sample.id}:{self.step_no}"

    def _picture(self) -> str:
        h = hashlib.sha1(f"{self.sample.id}|{self.step_no}".encode()).digest()
        path = self.workdir / f"screen-{self.step_no}.png"
        self.workdir.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (self.side, self.side), tuple(h[:3])).save(path)
        return str(path)
