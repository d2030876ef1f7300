"""Data types shared across mmrl: a dataset record, a rollout, and what a reward sees and returns."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One training or evaluation record.

    ``messages`` is an OpenAI/HF-style chat (a list of ``{"role", "content"}``); content may be a string or a list of
    parts ``{"type": "text", "text": ...}``, ``{"type": "image"}`` or ``{"type": "video"}``. The i-th image part refers
    to ``images[i]`` and the i-th video part to ``videos[i]`` (paths, resolved against the dataset's folder).
    """

    id: str
    messages: list[dict[str, Any]]
    images: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    answer: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_text(self) -> str:
        """The text of the last user turn (what a reward or a person reads as 'the question')."""
        for m in reversed(self.messages):
            if m.get("role") == "user":
                c = m.get("content")
                if isinstance(c, str):
                    return c
                return "".join(p.get("text", "") for p in c if p.get("type") == "text")
        return ""


@dataclass
class RewardInput:
    """What a reward sees for one response.

    ``images`` holds the sample's image paths (or PIL images when built in memory); ``metadata`` is the sample's
    metadata plus, when the trainer knows them, ``image_sizes`` (original ``[w, h]`` per image) and
    ``model_image_sizes`` (the ``[w, h]`` the model saw after ``smart_resize``) and ``coordinate_frame`` (the
    :mod:`mmrl.model.geometry` frame the model writes points in: ``model_pixels``, ``relative_1000``, ``relative_1`` or
    ``original_pixels``), which grounding rewards use with :func:`mmrl.processors.geometry.frame_to_original` to map points
    back to original pixels. ``response`` starts with what the chat template already wrote of it (an opened
    ``<think>`` block of a thinking model's generation prompt), so format checks see the whole answer.
    """

    id: str
    response: str
    reference: Any
    prompt: str = ""
    images: list[Any] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardResult:
    """A reward's verdict: ``score`` is ``None`` when the reward does not apply to this sample (a composite then
    renormalises over the rewards that do apply); ``parts`` are named sub-scores, logged as
    ``reward/<name>/<part>``; ``error`` is set when the reward raised (the score is then 0)."""

    score: float | None
    parts: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"score": self.score, "parts": dict(self.parts)}
        if self.error is not None:
            out["error"] = self.error
        return out


def render_stem(sample_id: str) -> str:
    """The file-name stem of a sample's renders (``metadata["render_dir"]``; also how the run report finds them)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", sample_id)[:100] or "sample"
