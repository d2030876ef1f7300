"""Observation turns as tokens (docs/agents.md#the-episode-driver): what the chat template appends after the
assistant's end-of-turn marker for an env's observation, tokenised alone with its new images at the policy's geometry
(:func:`observation_delta`), and the media tensors of a whole trajectory (:func:`all_media`). The episode driver
(:mod:`mmrl.rollout.episodes`) appends these deltas; earlier turns are never re-tokenised."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mmrl.model.policy import Policy
from mmrl.model.prompt import EncodedPrompt, opened_think

SENTINEL = "MMRLTURNSENTINEL"  # the stand-in assistant text the delta is cut after


@dataclass
class Delta:
    """An observation turn as tokens appended after the assistant's end-of-turn marker."""

    ids: list[int]
    seq: dict[str, torch.Tensor]  # [len(ids)] per-token tensors of the processor (mm_token_type_ids, ...)
    text: str  # the rendered delta (its image placeholders unexpanded)
    images: list[Any] = field(default_factory=list)  # PIL images, model size
    image_sizes: list[tuple[int, int]] = field(default_factory=list)  # original (w, h)
    model_image_sizes: list[tuple[int, int]] = field(default_factory=list)  # (w, h) the model sees
    response_prefix: str = ""  # a think block the generation prompt opens


def end_of_turn(
    policy: Policy, role: str = "user", content: list[dict[str, Any]] | None = None
) -> tuple[int, str]:
    """The assistant's end-of-turn marker ``(token id, string)`` and the text the template writes after it for a
    following ``role`` turn with ``content`` (the delta's text, with the generation prompt)."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": SENTINEL}]},
        {"role": role, "content": content if content is not None else [{"type": "text", "text": "."}]},
    ]
    rendered = policy.processor.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **policy.cfg.chat_template_kwargs
    )
    after = rendered[rendered.index(SENTINEL) + len(SENTINEL) :]
    stops = dict(zip(policy.tokenizer.convert_ids_to_tokens(policy.eos_ids), policy.eos_ids))
    found = [(after.find(s), s) for s in stops if s and after.find(s) >= 0]
    if not found:
        raise ValueError(
            f"the chat template writes none of the stop tokens {sorted(stops)} after an assistant turn "
            f"({after[:80]!r}...); multi-turn episodes need the assistant's end-of-turn marker among the "
            "checkpoint's eos_token_id (generation_config.json)"
        )
    at, marker = min(found)
    return stops[marker], after[at + len(marker) :]


def prepare_images(
    policy: Policy, sources: list[Any], record_id: str, max_pixels: int | None = None
) -> tuple[list[Any], list[tuple[int, int]], list[tuple[int, int]]]:
    """Images (paths or PIL) resized at the policy's geometry as :meth:`Policy.encode` resizes them, under
    ``max_pixels`` when given (else the policy's): ``(images, original sizes, model sizes)``."""
    from mmrl.processors.image import load_image

    cfg = policy.cfg
    hi = cfg.max_pixels if max_pixels is None else max_pixels
    out, sizes, model_sizes = [], [], []
    for src in sources:
        img = load_image(src, record_id=record_id)
        resized, geom = policy.geometry.prepare_image(
            img, min_pixels=min(cfg.min_pixels, hi), max_pixels=hi, record_id=record_id
        )
        out.append(resized)
        sizes.append(geom.original_size)
        model_sizes.append(geom.model_size)
    return out, sizes, model_sizes


def observation_delta(
    policy: Policy,
    text: str,
    images: Sequence[Any] = (),
    *,
    role: str = "user",
    max_pixels: int | None = None,
    record_id: str = "?",
    prepared: tuple[list[Any], list[tuple[int, int]], list[tuple[int, int]]] | None = None,
) -> Delta:
    """The tokens (and per-token tensors) the chat template appends after the assistant's end-of-turn marker for an
    observation turn ``role`` saying ``text`` and then showing ``images`` (paths or PIL; ``prepared``: already
    resized by :func:`prepare_images`). See the module docstring."""
    imgs, sizes, model_sizes = prepared or prepare_images(policy, list(images), record_id, max_pixels)
    content = ([{"type": "text", "text": text}] if text else []) + [{"type": "image"} for _ in imgs]
    _, rendered = end_of_turn(policy, role, content)
    kwargs: dict[str, Any] = {"text": [rendered], "return_tensors": "pt", "add_special_tokens": False}
    if imgs:
        kwargs["images"] = imgs
        kwargs["images_kwargs"] = policy.geometry.processor_kwargs()["images_kwargs"]
    out = policy.processor(**kwargs)
    L = out["input_ids"].shape[1]
    seq = {
        k: v[0]
        for k, v in out.items()
        if k not in ("input_ids", "attention_mask") and v.dim() == 2 and v.shape[0] == 1 and v.shape[1] == L
    }
    return Delta(
        out["input_ids"][0].tolist(), seq, rendered, imgs, sizes, model_sizes, opened_think(rendered)
    )


def all_media(
    policy: Policy, texts: list[str], images: list[Any], prompt: EncodedPrompt | None = None
) -> dict[str, torch.Tensor]:
    """The ``mm`` tensors of a whole trajectory: one processor call over all its (model-size) images in order, and
    the first ``prompt``'s videos, with the rendered texts holding their placeholders (the ids of this call are not
    used)."""
    media = policy.geometry.processor_kwargs()
    kwargs: dict[str, Any] = {"text": ["".join(texts)], "return_tensors": "pt", "add_special_tokens": False}
    if images:
        kwargs["images"] = images
        kwargs["images_kwargs"] = media["images_kwargs"]
    if prompt is not None and prompt.videos:  # as Policy.encode hands them over: each video with its own rate
        kwargs["videos"] = prompt.videos
        kwargs["videos_kwargs"] = {
            **media["videos_kwargs"],
            "video_metadata": [
                {"fps": fps, "total_num_frames": len(v), "frames_indices": list(range(len(v)))}
                for v, fps in zip(prompt.videos, prompt.video_fps)
            ],
        }
    if "images" not in kwargs and "videos" not in kwargs:
        return {}
    out = policy.processor(**kwargs)
    L = out["input_ids"].shape[1]
    return {
        k: v
        for k, v in out.items()
        if k not in ("input_ids", "attention_mask")
        and not (v.dim() == 2 and v.shape[0] == 1 and v.shape[1] == L)
    }
