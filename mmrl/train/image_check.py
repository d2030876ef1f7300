"""The image check: the policy, and the rollout engine, must see the media (docs/algorithms.md#sanity-checks).

A VLM whose images never reach the model still trains: the reward moves on the text alone, so a processor that drops
the pixels, an engine that never runs the vision tower, or placeholders expanded twice can go unnoticed for hours.
At step 1 and every ``train.image_check_every`` steps, :class:`ImageCheck` takes ``train.image_check_rows`` rows of
the step's batch that hold images or videos (the same rows on every rank: drawn with a generator seeded by (seed,
step), one row per prompt first) and scores their sampled tokens through the training forward
(:func:`mmrl.rollout.episodes.trajectory_logprobs`, no grad) twice: with the real media, and with every pixel tensor
blanked (:func:`blank_media`: one constant per tensor, so the ids, placeholders and grids, and so the token layout,
are unchanged). It logs, per scored token,

- ``sanity/image_sensitivity``: mean ``|logp(real) - logp(blanked)|``; ``sanity/image_sensitivity/image`` and
  ``/video`` over the rows holding that modality (a row holding both counts for both). Below
  :data:`SENSITIVITY_FLOOR` the media provably do not reach the model: the run stops (:class:`MediaNotSeen`);
- ``sanity/engine_media_gap``: ``mean |engine - blanked| - mean |engine - real|``, the engine's own log-probs of
  those tokens (``Trajectory.logprobs``) against both scorings. By the triangle inequality it lies in ``[-s, s]``
  (``s`` the sensitivity): ``+s`` for an exact engine that sampled with the media, ``-s`` for one that sampled
  without them. A right engine is far closer to the real scoring (``|engine - real| < |engine - blanked| / 2``); the run
  stops when it is far closer to the blanked one (``|engine - blanked| < |engine - real| / 2``: it sampled without
  the media), and a warning says when neither holds (the engine's own mismatch, bf16 kernels or top-k/top-p
  renormalisation, is as large as what the media do: the check cannot tell). Independent noise moves the engine
  away from the blanked scoring on average, so a right but noisy engine gets the warning, not the refusal;
- with an engine that can score given tokens (``engine.score``: vLLM's prompt log-probs,
  :meth:`mmrl.rollout.vllm.VLLMEngine.score`), ``sanity/engine_image_sensitivity``: the engine's own log-probs of the
  same tokens with its real and its blanked media (constant images of the same sizes), checked like the policy's.
  The HF engine generates with the policy itself, so its check is the policy's.

Costs two no-grad forwards over a few rows (and two engine prefills with an engine that scores) on the steps it
checks.
Under several processes every rank runs the same forwards on the same rows (FSDP forwards are collectives) and
reaches the same verdict.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from PIL import Image

from mmrl.config import Config, ConfigError
from mmrl.model.policy import Policy
from mmrl.model.prompt import EncodedPrompt
from mmrl.rollout.base import RolloutEngine
from mmrl.rollout.episodes import Trajectory, trajectory_logprobs
from mmrl.train.update import RolloutBatch, micro_batches

log = logging.getLogger("mmrl.train.image_check")

# mean |delta log-prob| per token below this: the media do not reach the model (fp32 rounding is ~1e-7)
SENSITIVITY_FLOOR = 1e-6
MODALITIES = ("image", "video")


class MediaNotSeen(RuntimeError):
    """The image check found that the media do not reach the policy or the rollout engine."""


def blank_media(mm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``mm`` with every pixel tensor (``pixel_values*``) replaced by one constant, the mid-value of its own range
    (its maximum + 1 when it is uniform, so a blank never equals the real media), every other tensor (grids, sizes,
    masks, positions) as it is. In ``[..., C, H, W]`` layouts an all-zero image or tile stays zero: processors pad
    with those, and some families (Idefics3, SmolVLM) drop them by that test."""
    out = dict(mm)
    for key, x in mm.items():
        if not (key.startswith("pixel_values") and x.is_floating_point() and x.numel()):
            continue
        tiled = x.dim() >= 4  # [..., C, H, W]
        pad = x.flatten(x.dim() - 3).eq(0).all(-1) if tiled else None  # [...]: all-zero images or tiles
        real = x[~pad] if tiled else x
        if not real.numel():
            continue
        lo, hi = real.min().item(), real.max().item()
        value = (lo + hi) / 2 if lo < hi else hi + 1.0
        if value == 0:  # a zero image or tile reads as padding
            value = hi / 2 if hi else 1.0
        blank = torch.full_like(x, value)
        if tiled:
            blank[pad] = 0
        out[key] = blank
    return out


def blank_engine_prompt(p: EncodedPrompt) -> EncodedPrompt:
    """``p`` with its images and video frames replaced by uniform ones of the same sizes (mid grey, or black where
    the original is mid grey throughout), so an engine expands the same placeholders, and its ``mm`` blanked
    (:func:`blank_media`) for an engine that reads the policy's tensors."""

    def image(img: Image.Image) -> Image.Image:
        grey = (128,) * len(img.getbands())
        colour = (0,) * len(grey) if img.getextrema() == ((128, 128),) * len(grey) else grey
        return Image.new(img.mode, img.size, colour if len(colour) > 1 else colour[0])

    def video(frames: Any) -> Any:
        a = np.asarray(frames)
        return np.full_like(a, 0 if (a == 128).all() else 128)

    return replace(
        p, images=[image(i) for i in p.images], videos=[video(v) for v in p.videos], mm=blank_media(p.mm)
    )


def modalities(t: Trajectory) -> set[str]:
    """The media a trajectory holds, whatever its processor made of them."""
    return {m for m, held in zip(MODALITIES, (t.images, t.prompt.videos)) if held}


def _with_media(t: Trajectory, mm: dict[str, torch.Tensor]) -> Trajectory:
    copy = replace(t)
    copy.set_media(mm)
    return copy


class ImageCheck:
    """Called with each step's batch (see the module docstring); returns the ``sanity/*`` metrics, ``{}`` on a step
    it does not check or a batch without media, and raises :class:`MediaNotSeen` when the media do not reach the
    policy or the engine."""

    def __init__(self, cfg: Config, policy: Policy, engine: RolloutEngine | None, temperature: float):
        every, rows = cfg.train.image_check_every, cfg.train.image_check_rows
        if every < 0 or rows < 1:
            raise ConfigError(
                f"train.image_check_every must be >= 0 (0 = off) and train.image_check_rows >= 1, got {every} "
                f"and {rows}"
            )
        self.cfg, self.policy, self.engine, self.temperature = cfg, policy, engine, temperature
        self.every, self.rows = every, rows

    def due(self, step: int) -> bool:
        return self.every > 0 and (step == 1 or step % self.every == 0)

    def __call__(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        if not self.due(step):
            return {}
        rows = self.pick(batch, step)
        if not rows:
            return {}
        trajs = [batch.trajectories[r] for r in rows]
        real, mask = self._score(batch, rows, trajs)
        blank, _ = self._score(batch, rows, [_with_media(t, blank_media(t.mm)) for t in trajs])
        delta = (real - blank).abs() * mask  # [n, T]
        sens = _mean(delta, mask)
        stats = {"sanity/image_sensitivity": sens}
        for m in MODALITIES:
            has = torch.tensor([m in modalities(t) for t in trajs])
            if has.any():
                stats[f"sanity/image_sensitivity/{m}"] = _mean(delta[has], mask[has])
        if not sens >= SENSITIVITY_FLOOR:
            raise MediaNotSeen(self._not_seen(step, rows, trajs, sens, mask))
        stats |= self._engine_gap(step, rows, trajs, real, blank, mask, sens)
        return stats | self._engine_sensitivity(step, rows, trajs, mask)

    def _engine_gap(
        self,
        step: int,
        rows: list[int],
        trajs: list[Trajectory],
        real: torch.Tensor,
        blank: torch.Tensor,
        mask: torch.Tensor,
        sens: float,
    ) -> dict[str, float]:
        """The engine's recorded log-probs against the policy's real and blanked scorings (module docstring)."""
        engine = torch.zeros_like(real)  # [n, T]
        for i, t in enumerate(trajs):
            engine[i, : len(t.logprobs)] = torch.tensor(t.logprobs)
        to_real, to_blank = _mean((engine - real).abs(), mask), _mean((engine - blank).abs(), mask)
        if to_blank < to_real / 2:
            raise MediaNotSeen(self._text_only_engine(step, rows, trajs, to_real, to_blank, sens))
        if to_real >= to_blank / 2:  # neither far closer: the engine's mismatch hides what the media do
            log.warning(
                "image check at step %d: cannot tell whether the rollout engine sees the media: its log-probs are "
                "%.2e from the policy's with the media and %.2e with them blanked (the media move the policy's by "
                "%.2e per token); a right engine is far closer to the first",
                step, to_real, to_blank, sens,
            )  # fmt: skip
        return {"sanity/engine_media_gap": to_blank - to_real}

    def pick(self, batch: RolloutBatch, step: int) -> list[int]:
        """Up to ``train.image_check_rows`` rows holding media, one per prompt first, drawn with a generator seeded
        by (seed, step): the same rows on every rank."""
        placed = (
            batch.off_policy_rows
        )  # an augmenter's rows from another prompt: their log-probs are not this row's
        media = [
            r for r, t in enumerate(batch.trajectories) if modalities(t) and any(t.mask) and r not in placed
        ]
        gen = torch.Generator().manual_seed(self.cfg.train.seed * 1_000_003 + step)
        first, rest, seen = [], [], set()
        for i in torch.randperm(len(media), generator=gen).tolist():
            group = media[i] // batch.group_size
            (rest if group in seen else first).append(media[i])
            seen.add(group)
        return sorted((first + rest)[: self.rows])

    @torch.no_grad()
    def _score(
        self, batch: RolloutBatch, rows: list[int], trajs: list[Trajectory]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The training forward's log-probs of ``trajs`` (standing for ``rows``), in the update's micro-batches:
        ``logp, mask [n, T]`` on the host."""
        T = max(len(t.response) for t in trajs)
        logp, mask = torch.zeros(len(rows), T), torch.zeros(len(rows), T)
        at = {r: i for i, r in enumerate(rows)}
        for part in micro_batches(batch, rows, 1, self.cfg):
            idx = [at[r] for r in part]
            lp, _, m = trajectory_logprobs(self.policy, [trajs[i] for i in idx], temperature=self.temperature)
            logp[idx, : lp.shape[1]] = lp.float().cpu()
            mask[idx, : m.shape[1]] = m.float().cpu()
        return logp, mask

    def _engine_sensitivity(
        self, step: int, rows: list[int], trajs: list[Trajectory], mask: torch.Tensor
    ) -> dict[str, float]:
        """The engine's own log-probs with and without its media, where it can score given tokens."""
        contexts = [t.context() for t in trajs]
        tails = [len(t.response) for t in trajs]
        with_media = self.engine.score(contexts, tails)
        if with_media is None:
            return {}
        blanked = self.engine.score([blank_engine_prompt(c) for c in contexts], tails)
        real, blank = torch.zeros_like(mask), torch.zeros_like(mask)
        for i, (a, b) in enumerate(zip(with_media, blanked)):
            real[i, : len(a)], blank[i, : len(b)] = torch.tensor(a), torch.tensor(b)
        sens = _mean((real - blank).abs(), mask)
        if not sens >= SENSITIVITY_FLOOR:
            raise MediaNotSeen(
                f"image check at step {step} (train.image_check_every): the rollout engine "
                f"({type(self.engine).__name__}) scores the sampled tokens of rows {_named(rows, trajs)} the same with "
                f"their media as with blank images of the same sizes (mean |delta log-prob| {sens:.2e} per token): the "
                "media do not reach the engine's model. Look at what the engine is handed (EncodedPrompt.images / "
                "videos; vLLM's multi_modal_data and its expansion of the placeholders) and rollout.engine_options; "
                "train.image_check_every=0 turns the check off"
            )
        return {"sanity/engine_image_sensitivity": sens}

    def _not_seen(
        self, step: int, rows: list[int], trajs: list[Trajectory], sens: float, mask: torch.Tensor
    ) -> str:
        keys = sorted({k for t in trajs for k in t.mm})
        return (
            f"image check at step {step} (train.image_check_every): the media do not reach the policy. Rows "
            f"{_named(rows, trajs)} hold {'/'.join(sorted(set().union(*map(modalities, trajs))))}, yet their "
            f"{int(mask.sum())} sampled tokens score the same with the media as with the media blanked (mean "
            f"|delta log-prob| {sens:.2e} per token, floor {SENSITIVITY_FLOOR:g}): the policy trains as a text "
            f"model. Their media tensors: {keys or 'none'}. Look at: the processor's output for these samples "
            "(Policy.encode: pixel_values* and the image placeholder tokens), the model's vision tower and "
            "projector (do their features reach the language model's input embeddings?), and model.* options "
            "that touch the media (freeze_vision, LoRA targets, attention); train.image_check_every=0 turns the "
            "check off"
        )

    def _text_only_engine(
        self,
        step: int,
        rows: list[int],
        trajs: list[Trajectory],
        to_real: float,
        to_blank: float,
        sens: float,
    ) -> str:
        return (
            f"image check at step {step} (train.image_check_every): the rollout engine "
            f"({type(self.engine).__name__}) sampled rows {_named(rows, trajs)} as if it did not see their media: "
            f"its log-probs are closer to the policy's scoring with the media blanked (mean |engine - blanked| "
            f"{to_blank:.2e} per token) than with the real media (mean |engine - real| {to_real:.2e}; the media "
            f"move the policy's log-probs by {sens:.2e}). Look at what the engine is handed (EncodedPrompt.images "
            "/ videos and mm; vLLM's multi_modal_data and its expansion of the placeholders), whether it runs "
            "the vision tower, and rollout.engine_options; train.image_check_every=0 turns the check off"
        )


def _mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def _named(rows: list[int], trajs: list[Trajectory]) -> str:
    return ", ".join(f"{r} (sample {t.sample.id!r})" for r, t in zip(rows, trajs))
