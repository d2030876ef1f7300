"""Rewards a user would write in their own file, loaded by tests as ``tests/reward_plugin_example.py:function``."""

from __future__ import annotations

import os
import time

from mmrl.rewards.base import register_reward
from mmrl.types import RewardInput, RewardResult

SCORED: list[str] = []  # ids scored in this process by `counted_length`, to check the composite's cache


def plain_length(batch: list[RewardInput], *, scale: float = 1.0) -> list[RewardResult]:
    """A plain (unregistered) batch function: score = scale * number of words."""
    return [RewardResult(score=scale * len(x.response.split())) for x in batch]


def counted_length(batch: list[RewardInput]) -> list[RewardResult]:
    SCORED.extend(x.id for x in batch)
    return [RewardResult(score=float(len(x.response))) for x in batch]


def positional_option(batch: list[RewardInput], scale: float = 1.0) -> list[RewardResult]:
    return [RewardResult(score=scale) for _ in batch]


@register_reward("plugin_flaky")
def flaky(batch: list[RewardInput], *, fail_on: str = "boom") -> list[RewardResult]:
    """Raises for the whole batch when any response equals ``fail_on``."""
    for x in batch:
        if x.response == fail_on:
            raise ValueError(f"cannot score {x.response!r}")
    return [RewardResult(score=1.0, parts={"seen": 1.0}) for _ in batch]


@register_reward("plugin_when_reference")
def when_reference(batch: list[RewardInput]) -> list[RewardResult]:
    """Applies only when the sample has a reference."""
    return [RewardResult(score=None) if x.reference is None else RewardResult(score=0.5) for x in batch]


@register_reward("plugin_sleepy", heavy=True)
def sleepy(batch: list[RewardInput], *, seconds: float = 60.0) -> list[RewardResult]:
    """Heavy: hangs on the response "hang", kills its worker on "crash", else scores the length."""
    out = []
    for x in batch:
        if x.response == "hang":
            time.sleep(seconds)
        if x.response == "crash":
            os._exit(3)
        out.append(RewardResult(score=float(len(x.response)), parts={"pid": float(os.getpid())}))
    return out


def render_marker(batch: list[RewardInput]) -> list[RewardResult]:
    """Writes the response into metadata["render_dir"] (as a rendering reward saves its renders); 1 when it did."""
    out = []
    for x in batch:
        render_dir = x.metadata.get("render_dir")
        if render_dir is not None:
            with open(os.path.join(render_dir, f"{x.id}.txt"), "w", encoding="utf-8") as f:
                f.write(x.response)
        out.append(RewardResult(score=float(render_dir is not None)))
    return out


def slow_length(batch: list[RewardInput], *, seconds: float = 0.05) -> list[RewardResult]:
    """Like a rendering reward: ``seconds`` of wall time per item (sleeping, so it overlaps generation)."""
    time.sleep(seconds * len(batch))
    return [RewardResult(score=float(len(x.response.split()))) for x in batch]


@register_reward("plugin_slow_heavy", heavy=True)
def slow_heavy(batch: list[RewardInput], *, seconds: float = 0.05) -> list[RewardResult]:
    """Heavy (runs in the worker pool): ``seconds`` of wall time per item, scores the number of words."""
    time.sleep(seconds * len(batch))
    return [
        RewardResult(score=float(len(x.response.split())), parts={"chars": float(len(x.response))})
        for x in batch
    ]


def image_pixels(batch: list[RewardInput]) -> list[RewardResult]:
    """Pixels of the first image (a path or a PIL image) and a checksum of them (``score=None`` without an image)."""
    import zlib

    from PIL import Image

    out = []
    for x in batch:
        if not x.images:
            out.append(RewardResult(score=None))
            continue
        first = x.images[0]
        if isinstance(first, Image.Image):
            rgb = first.convert("RGB")
        else:
            with Image.open(first) as im:
                rgb = im.convert("RGB")
        parts = {"crc": float(zlib.crc32(rgb.tobytes())), "images": float(len(x.images))}
        out.append(RewardResult(score=float(rgb.width * rgb.height), parts=parts))
    return out


def saw_hint(batch: list[RewardInput], *, needle: str = "rung t") -> list[RewardResult]:
    """1 when the question the response answered holds ``needle`` (the default is in hint rungs two and three only),
    else 0: for the hint scaffolding and critique tests, where only hinted or critiqued prompts can succeed."""
    return [RewardResult(score=float(needle in x.prompt)) for x in batch]


def constant(batch: list[RewardInput], *, value: float = 0.1) -> list[RewardResult]:
    """The same score for every response (0.1 is not a binary fraction: a group's float32 std is ~8e-9, not 0)."""
    return [RewardResult(score=value) for _ in batch]
