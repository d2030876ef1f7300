"""An env for tests/test_episodes.py, registered on import; pool workers import this module again by name (pytest puts
tests/ on sys.path) or by file.

``test_pictures``: every step shows a NEW picture (``width`` x ``height``, a colour drawn from the sample id and the
step) after the text ``"{text} {step}:"``, whatever the action; a step's reward is ``0.1 * step``, and the episode
ends with reward 1 after ``steps`` steps. The state key is the sample id and the step. A sample whose metadata has
``hang`` sleeps ``hang_s`` seconds in its steps (a timeout when the pool's deadline is shorter), and ``reset_images``
pictures are shown at reset. Its oracle says the metadata's ``oracle`` (default ``"step {step}"``) formatted with the
step number, and has no action from step ``oracle_steps`` on (metadata; default: never).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from PIL import Image

from mmrl.envs import Env, Observation, StepResult, register_env
from mmrl.types import Sample


@register_env("test_pictures")
class PicturesEnv(Env):
    deterministic = True

    def __init__(
        self,
        *,
        workdir: Path,
        steps: int = 3,
        width: int = 40,
        height: int = 60,
        text: str = "picture",
        hang_s: float = 0.0,
        reset_images: int = 0,
    ) -> None:
        super().__init__(workdir=workdir)
        self.steps, self.size, self.text = steps, (width, height), text
        self.hang_s, self.reset_images = hang_s, reset_images

    def reset(self, sample: Sample) -> Observation:
        self.sample, self.step_no = sample, 0
        shown = [self._picture(f"reset-{i}") for i in range(self.reset_images)]
        return Observation("look" if shown else "", shown, self._key())

    def step(self, action_text: str) -> StepResult:
        if self.sample.metadata.get("hang"):
            time.sleep(self.hang_s)
        self.step_no += 1
        info = {"action_chars": len(action_text)}
        if self.step_no >= self.steps:
            return StepResult(None, 1.0, True, info)
        obs = Observation(
            f"{self.text} {self.step_no}:", [self._picture(f"step-{self.step_no}")], self._key()
        )
        return StepResult(obs, 0.1 * self.step_no, False, info)

    def oracle(self) -> str | None:
        meta = self.sample.metadata
        if self.step_no >= meta.get("oracle_steps", self.steps):
            return None
        return meta.get("oracle", "step {step}").format(step=self.step_no)

    def close(self) -> None:
        return None

    def _key(self) -> str:
        return f"{self.sample.id}:{self.step_no}"

    def _picture(self, name: str) -> str:
        h = hashlib.sha1(f"{self.sample.id}|{name}".encode()).digest()
        path = self.workdir / f"{name}.png"
        self.workdir.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", self.size, tuple(h[:3])).save(path)
        return str(path)
