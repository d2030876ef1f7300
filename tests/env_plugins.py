"""Envs a user would write in their own module, registered on import; pool workers import this module again by name
(pytest puts tests/ on sys.path, which workers inherit) or by file. Used by tests/test_envs.py.

``counter``: each action is a command: ``add K`` adds K to the total; ``hang S`` sleeps S seconds; ``meet DIR N``
leaves a mark in DIR and waits (up to 15 s) until N episodes have left theirs, its info saying how many it saw (a
barrier: all N see N only when their steps run at the same time); ``crash`` kills the worker (``os._exit(3)``);
``raise`` raises; ``spawn`` starts a ``sleep 60`` child and reports its pid; anything else is an invalid action.
The episode ends after ``limit`` valid steps with reward = total. Every result's info says which process and sample
it came from, so tests can check the routing. Its oracle says ``add 1``; the sample's metadata ``oracle`` makes it
have none (``"none"``), raise (``"raise"``) or hang (``"hang"``, 30 s).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from mmrl.envs import Env, Observation, StepResult, register_env
from mmrl.types import Sample


@register_env("test_counter")
class CounterEnv(Env):
    deterministic = True

    def __init__(self, *, workdir: Path, limit: int = 3, reset_sleep: float = 0.0, tag: str = "") -> None:
        super().__init__(workdir=workdir)
        self.limit, self.reset_sleep, self.tag = limit, reset_sleep, tag
        self.children: list[subprocess.Popen] = []

    def reset(self, sample: Sample) -> Observation:
        if sample.metadata.get("fail_reset"):
            raise RuntimeError(f"cannot start {sample.id}")
        time.sleep(self.reset_sleep)
        self.sample_id, self.total, self.steps = sample.id, 0, 0
        self.oracle_mode = sample.metadata.get("oracle", "add")
        return Observation(text=f"start {sample.id}", images=[], state_key=self.key())

    def key(self) -> str:
        return f"{self.sample_id}:{self.total}"

    def step(self, action_text: str) -> StepResult:
        cmd, _, arg = action_text.partition(" ")
        info = {"pid": os.getpid(), "sample": self.sample_id}
        if cmd == "hang":
            time.sleep(float(arg))
        elif cmd == "meet":
            folder, _, n = arg.rpartition(" ")
            info["met"] = _meet(Path(folder), self.sample_id, int(n))
        elif cmd == "crash":
            os._exit(3)
        elif cmd == "raise":
            raise RuntimeError("env bug")
        elif cmd == "spawn":
            self.children.append(subprocess.Popen(["sleep", "60"]))
            info["child"] = self.children[-1].pid
        elif cmd == "add" and arg.lstrip("-").isdigit():
            self.total += int(arg)
        else:
            obs = Observation(f"invalid action: {action_text!r}", [], self.key())
            return StepResult(obs, 0.0, False, {**info, "invalid": True})
        self.steps += 1
        info["total"] = self.total
        if self.steps >= self.limit:
            return StepResult(None, float(self.total), True, info)
        return StepResult(Observation(f"total {self.total}", [], self.key()), 0.0, False, info)

    def oracle(self) -> str | None:
        if self.oracle_mode == "none":
            return super().oracle()
        if self.oracle_mode == "raise":
            raise RuntimeError("oracle bug")
        if self.oracle_mode == "hang":
            time.sleep(30)
        return "add 1"

    def close(self) -> None:
        for child in self.children:
            child.kill()
            child.wait()


def _meet(folder: Path, name: str, n: int, timeout_s: float = 15.0) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).touch()
    deadline = time.monotonic() + timeout_s
    while len(list(folder.iterdir())) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(list(folder.iterdir()))


@register_env("test_counter_volatile")
class VolatileCounterEnv(CounterEnv):
    """The same env declared non-deterministic: its episodes are ended, not replayed, when their worker restarts."""

    deterministic = False


@register_env("test_counter_pid_state")
class PidStateEnv(CounterEnv):
    """Claims determinism but its state depends on the process: a replay in a fresh worker diverges."""

    def key(self) -> str:
        return f"{self.sample_id}:{self.total}:{os.getpid()}"
