"""An encoded prompt: token ids and the multimodal tensors only the policy interprets, the same prompt in a rollout
engine's own form, and the two helpers every encoder of prompts shares (the opened think block, media padding)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class EncodedPrompt:
    """One tokenised prompt with its multimodal tensors (interpreted only by :class:`Policy`)."""

    sample_id: str
    input_ids: torch.Tensor  # [L]
    mm: dict[str, torch.Tensor] = field(default_factory=dict)  # per-prompt tensors, concatenated along dim 0
    seq: dict[str, torch.Tensor] = field(
        default_factory=dict
    )  # [L] tensors aligned with input_ids, padded with 0
    image_sizes: list[tuple[int, int]] = field(default_factory=list)  # original (w, h)
    model_image_sizes: list[tuple[int, int]] = field(default_factory=list)  # (w, h) the model saw
    # The same prompt in a rollout engine's own form (vLLM): the chat-templated text with ONE placeholder per image
    # or video (the engine expands it), and the media exactly as the policy encoded them (after smart_resize).
    text: str = ""
    images: list[Any] = field(default_factory=list)  # PIL images, model size
    videos: list[Any] = field(default_factory=list)  # [frames, H, W, 3] uint8 arrays, model size
    video_fps: list[float] = field(default_factory=list)
    coordinate_frame: str = (
        "model_pixels"  # the frame points are written in (mmrl.processors.geometry.coordinate_frame)
    )
    # what the chat template already wrote of the response: an opened think block (Qwen3.5's generation prompt ends
    # with "<think>\n"); rewards see it before the completion, so a format check finds the opening tag
    response_prefix: str = ""
    # A multi-turn context's engine form (mmrl.rollout.episodes.Trajectory.context, whose ``text`` is empty): the first
    # prompt's text, then alternately ids appended as they are (a turn's sampled ids and any appended end-of-turn
    # marker) and the rendered text of an observation (ONE placeholder per image, as ``text``); the engine tokenises
    # the texts (the first as it tokenises ``text``, the others without special tokens) and expands the placeholders
    # over ``images`` in order.
    parts: list[str | list[int]] = field(default_factory=list)


def opened_think(text: str) -> str:
    """The think block a generation prompt leaves open (``<think>`` and the whitespace after it), else ``""``."""
    m = re.search(r"<think>\s*$", text)
    return m.group(0) if m else ""


def padded(parts: list[torch.Tensor], fill: int = 0) -> list[torch.Tensor]:
    """Prompts' media tensors padded past dim 0 to a common shape with ``fill``, as the processors pad a batch
    themselves (tiles per image in Idefics3 and LLaVA-OneVision with zeros, image sides in Pixtral, Gemma 4's patch
    positions with -1): the models find the real extent from the masks, sizes and positions that come with them, or
    drop all-zero tiles."""
    if len({t.shape[1:] for t in parts}) <= 1:
        return parts
    shape = [max(t.shape[d] for t in parts) for d in range(1, parts[0].dim())]
    out = []
    for t in parts:
        pad = t.new_full((t.shape[0], *shape), fill)
        pad[tuple(slice(0, n) for n in t.shape)] = t
        out.append(pad)
    return out


def seq_keys(prompts: list[EncodedPrompt], tails: list[dict[str, torch.Tensor]]) -> dict[str, torch.dtype]:
    """The per-token tensors of a batch of rows (``prompt.seq`` and each completion's ``tails``), name -> dtype,
    sorted by name: the first row that has one gives its dtype."""
    found: dict[str, torch.dtype] = {}
    for part in [p.seq for p in prompts] + list(tails):
        for k, v in part.items():
            found.setdefault(k, v.dtype)
    return dict(sorted(found.items()))
