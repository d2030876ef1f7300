"""Policy wrapper over any HF transformers VLM loaded with ``AutoModelForImageTextToText``.

It is the only code that knows model-specific inputs: every multimodal tensor (``pixel_values``, ``image_grid_thw``,
``pixel_values_videos``, ``video_grid_thw``, ...) travels in one dict, ``mm``, that the trainer and rollout engines
pass along without looking inside.

Sequence layout, shared by generation and training so the two see identical positions: prompts are LEFT-padded to
a common length P and completions RIGHT-padded to a common length T, giving ``[pad.. prompt | completion ..pad]``.
Qwen2.5-VL's M-RoPE positions are computed from the attention mask, so the completion's positions equal those the
model used while generating it; the rollout engine's log-probs then match the training forward's (tested to 1e-5).
Images are resized by :func:`mmrl.processors.image.prepare_image` (Qwen's ``smart_resize``) before the HF processor
sees them, so the model-input size of every image is known exactly and rewards can map coordinates back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mmrl.config import ModelConfig
from mmrl.types import Sample

REPO_ROOT = Path(__file__).resolve().parents[1]


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
    model_image_sizes: list[tuple[int, int]] = field(default_factory=list)  # after smart_resize (w, h)


def resolve_model_path(path: str) -> str:
    """A local folder (relative to the working directory or the repository) or a hub id, returned as given."""
    for cand in (Path(path), REPO_ROOT / path):
        if cand.is_dir():
            return str(cand)
    return path


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Policy:
    def __init__(self, model: Any, processor: Any, cfg: ModelConfig):
        self.model = model
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.cfg = cfg
        self.device = next(model.parameters()).device
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) or self.tokenizer.eos_token_id
        self.eos_ids: list[int] = list(eos) if isinstance(eos, (list, tuple)) else [eos]

    @classmethod
    def from_pretrained(cls, cfg: ModelConfig, path: str | None = None) -> Policy:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        src = resolve_model_path(path or cfg.path)
        dtype = getattr(torch, cfg.dtype)
        kwargs: dict[str, Any] = {"dtype": dtype}
        if cfg.attn_implementation:
            kwargs["attn_implementation"] = cfg.attn_implementation
        model = AutoModelForImageTextToText.from_pretrained(src, **kwargs).to(pick_device(cfg.device))
        processor = AutoProcessor.from_pretrained(src)
        if not hasattr(processor, "image_processor"):
            raise TypeError(
                f"{src}: AutoProcessor returned {type(processor).__name__}, not a multimodal processor "
                "(is preprocessor_config.json / processor_config.json missing?)"
            )
        if cfg.gradient_checkpointing:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.23 renamed it
                model.activation_checkpointing_enable(
                    activation_checkpointing_kwargs={"use_reentrant": False}
                )
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        if cfg.freeze_vision:
            for name, p in model.named_parameters():
                if ".visual." in f".{name}":
                    p.requires_grad_(False)
        return cls(model, processor, cfg)

    # ---------------------------------------------------------------- encoding
    def encode(self, sample: Sample, extra_messages: list[dict[str, Any]] | None = None) -> EncodedPrompt:
        """Tokenise a sample's chat (plus a generation prompt) with its images and videos."""
        from mmrl.processors.image import load_image, prepare_image

        images, sizes, model_sizes = [], [], []
        for src in sample.images:
            img = load_image(src, record_id=sample.id)
            resized, geom = prepare_image(
                img, min_pixels=self.cfg.min_pixels, max_pixels=self.cfg.max_pixels, record_id=sample.id
            )
            images.append(resized)
            sizes.append(geom.original_size)
            model_sizes.append(geom.model_size)
        videos, video_meta = [], []
        if sample.videos:
            from mmrl.processors.video import load_video

            for src in sample.videos:
                clip = load_video(
                    src,
                    record_id=sample.id,
                    fps=self.cfg.video_fps,
                    max_frames=self.cfg.video_max_frames,
                    max_pixels=self.cfg.video_max_pixels,
                )
                videos.append(clip.frames)
                video_meta.append(clip.sample_fps)
        messages = sample.messages + (extra_messages or [])
        text = self.processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=extra_messages is None
        )
        kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
        if images:
            kwargs["images"] = images
            kwargs["images_kwargs"] = {"do_resize": False}
        if videos:
            kwargs["videos"] = videos
            kwargs["videos_kwargs"] = {"do_resize": False, "do_sample_frames": False, "fps": video_meta}
        out = self.processor(**kwargs)
        L = out["input_ids"].shape[1]
        rest = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
        seq = {k: v[0] for k, v in rest.items() if v.dim() == 2 and v.shape[0] == 1 and v.shape[1] == L}
        mm = {k: v for k, v in rest.items() if k not in seq}
        return EncodedPrompt(sample.id, out["input_ids"][0], mm, seq, sizes, model_sizes)

    # ---------------------------------------------------------------- batching
    def collate(
        self, prompts: list[EncodedPrompt], completions: list[list[int]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], int]:
        """Left-pad prompts to P, right-pad completions to T. Returns ``input_ids, attention_mask [B, P+T]``,
        the concatenated ``mm`` dict and P."""
        P = max(len(p.input_ids) for p in prompts)
        T = max((len(c) for c in completions), default=0) if completions is not None else 0
        B = len(prompts)
        ids = torch.full((B, P + T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, P + T), dtype=torch.long)
        for i, p in enumerate(prompts):
            L = len(p.input_ids)
            ids[i, P - L : P] = p.input_ids
            mask[i, P - L : P] = 1
            if completions is not None and completions[i]:
                c = torch.as_tensor(completions[i], dtype=torch.long)
                ids[i, P : P + len(c)] = c
                mask[i, P : P + len(c)] = 1
        mm: dict[str, torch.Tensor] = {}
        for key in sorted({k for p in prompts for k in p.seq}):
            t = torch.zeros((B, P + T), dtype=next(p.seq[key].dtype for p in prompts if key in p.seq))
            for i, p in enumerate(prompts):
                if key in p.seq:
                    t[i, P - len(p.input_ids) : P] = p.seq[key]
            mm[key] = t.to(self.device)
        for key in sorted({k for p in prompts for k in p.mm}):
            parts = [p.mm[key] for p in prompts if key in p.mm]
            mm[key] = torch.cat(parts, dim=0).to(self.device)
            if mm[key].is_floating_point():
                mm[key] = mm[key].to(self.model.dtype)
        return ids.to(self.device), mask.to(self.device), mm, P

    # ---------------------------------------------------------------- scoring
    def logprobs(
        self,
        prompts: list[EncodedPrompt],
        completions: list[list[int]],
        *,
        temperature: float = 1.0,
        with_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Per-token log-probs (and full-vocabulary entropies) of ``completions`` given ``prompts``.

        Returns ``logp [B, T]``, ``entropy [B, T]`` (or None), ``mask [B, T]`` (1 on real completion tokens).
        Gradients flow through ``logp`` unless called under ``torch.no_grad()``.
        """
        logits, target, comp_mask = self.completion_logits(prompts, completions, temperature)
        logp_all = F.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [B, T]
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp * comp_mask, entropy, comp_mask

    def completion_logits(
        self, prompts: list[EncodedPrompt], completions: list[list[int]], temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fp32 ``logits / temperature [B, T, V]`` predicting each completion token, the tokens ``[B, T]``, the mask."""
        ids, attn, mm, P = self.collate(prompts, completions)
        T = ids.shape[1] - P
        out = self.model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=T + 1, **mm)
        logits = out.logits[:, :-1, :].float() / temperature  # position P-1+t predicts token P+t
        return logits, ids[:, P:], attn[:, P:].to(logits.dtype)

    def sequence_nll(
        self, prompts: list[EncodedPrompt], targets: list[list[int]], label_smoothing: float = 0.0
    ) -> torch.Tensor:
        """Mean token cross-entropy of ``targets`` (supervised warm start), optionally label-smoothed."""
        logits, target, mask = self.completion_logits(prompts, targets)
        ce = F.cross_entropy(
            logits.transpose(1, 2), target, reduction="none", label_smoothing=label_smoothing
        )
        return (ce * mask).sum() / mask.sum().clamp(min=1.0)

    def save(self, path: str | os.PathLike) -> None:
        self.model.save_pretrained(path)
        self.processor.save_pretrained(path)
