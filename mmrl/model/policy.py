"""Policy wrapper over any HF transformers VLM loaded with ``AutoModelForImageTextToText``.

It is the only code that knows model-specific inputs: every multimodal tensor (``pixel_values``, ``image_grid_thw``,
``pixel_values_videos``, ``video_grid_thw``, ...) travels in one dict, ``mm``, that the trainer and rollout engines
pass along without looking inside.

Sequence layout, shared by generation and training so the two see identical positions: prompts are LEFT-padded to
a common length P and completions RIGHT-padded to a common length T, giving ``[pad.. prompt | completion ..pad]``.
Qwen2.5-VL's M-RoPE positions are computed from the attention mask, so the completion's positions equal those the
model used while generating it; the rollout engine's log-probs then match the training forward's (tested to 1e-5).
Images are resized by :func:`mmrl.processors.image.prepare_image` to the checkpoint's own geometry (read from its
processor, :attr:`Policy.geometry`, :mod:`mmrl.model.geometry`: Qwen's ``smart_resize`` on a 28 or 32 px grid, or a fixed
size such as Gemma 3's) before the HF processor sees them, so the model-input size of every image is known exactly
and rewards can map coordinates back.

Hardening that real checkpoints need (issue 6):
- Vision placeholders (image/video pad, vision start/end) are never sampled: :attr:`Policy.suppressed_token_ids`
  get logit -inf in every engine and in the training forward, so the scored distribution is the sampled one. A
  completion token is never read as an image slot either: such ids are replaced by padding on the input side.
- Mixed precision with fp32 master weights: ``model.dtype: bfloat16`` keeps the trainable parameters (and so AdamW's
  update and state) in fp32 and runs every forward under bf16 autocast, as FSDP's mixed precision does. An update of
  lr 1e-6 then changes the weights as in fp32; bf16 parameters would round it away (1e-6 is far below bf16's spacing
  near typical weights, ~1e-4). Frozen copies (the reference model, evaluation) are stored in bf16 directly, and so
  are the trainable policy's frozen ``Linear``/``Conv`` weights (LoRA's base, a ``freeze_vision`` tower): autocast
  would round them at every use, so storing them rounded changes no value (tests/test_frozen_dtype.py).
- Modes: updates run in train mode (so gradient checkpointing is active: HF only checkpoints when ``training``) with
  every dropout module kept in eval mode, so the training forward is the same function the engine sampled from;
  generation runs in eval mode.
- Sampling uses only the run's own settings: the checkpoint's ``generation_config.json`` (repetition penalty, top-k,
  ...) is replaced by one holding only the special token ids, with a warning naming what was dropped, because
  transformers fills every unset generation field from it while pi_old is scored from the plain logits.
- Log-probs and entropies are computed chunk by chunk from the hidden states (:mod:`mmrl.model.logprobs`); the full
  ``[B, T, V]`` logits never exist in fp32.

LoRA (``model.lora.r > 0``, peft): adapters are injected into the model in place, so ``self.model`` stays the HF model
and every code path above is unchanged; only adapter weights train. The reference model is this same model with
adapters disabled (:meth:`Policy.reference`), never a second copy. A checkpoint's ``model/`` holds ``adapter/`` (and,
with ``lora.save_merged``, the merged model in HF format); engines that keep their own weights (vLLM) receive
:meth:`Policy.stream_weights`, each adapted weight computed as W + delta without touching the training weights
(merging in place and back would round them).

Weights for an engine are streamed (:meth:`Policy.stream_weights`): one tensor at a time in the engine's dtype, a
LoRA layer merged as soon as its own tensors are read, and under FSDP each tensor gathered from the shards just
before it is handed over, so the full model never exists a second time in fp32 (nor, under FSDP, at all on one rank
outside the engine).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from mmrl.config import ModelConfig
from mmrl.model.checkpoint_files import checkpoint_layout, resolve_model_path
from mmrl.model.logprobs import selective_logprobs
from mmrl.model.lora import add_lora, lora_layers, lora_owner, merge_lora
from mmrl.model.prompt import EncodedPrompt, opened_think, padded, seq_keys
from mmrl.types import Sample

if TYPE_CHECKING:
    from mmrl.model.geometry import VisionGeometry

log = logging.getLogger("mmrl.model.policy")

# config attributes naming the vision placeholder tokens across HF VLMs (Qwen2/2.5-VL, LLaVA-style, ...)
VISION_TOKEN_ATTRS = (
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
    "image_token_index",
    "video_token_index",
    "boi_token_id",  # Gemma 3's image start/end (its config's boi/eoi_token_index)
    "eoi_token_id",
)
VISION_TOKEN_NAMES = (
    "<|image_pad|>",
    "<|video_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
)
# generation settings that would change what is sampled without changing how pi_old is scored
SAMPLING_FIELDS = (
    "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
    "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens",
    "sequence_bias", "min_length", "min_new_tokens", "forced_bos_token_id", "forced_eos_token_id",
    "exponential_decay_length_penalty", "encoder_repetition_penalty", "guidance_scale",
)  # fmt: skip


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Policy:
    def __init__(self, model: Any, processor: Any, cfg: ModelConfig, peft_model: Any = None):
        self.model = model
        self.peft = peft_model  # the PeftModel wrapping ``model`` when LoRA is on
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.cfg = cfg
        self.device = next(model.parameters()).device
        self.compute_dtype = getattr(torch, cfg.dtype)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.checkpoint_generation_config = getattr(model, "generation_config", None)
        eos = getattr(self.checkpoint_generation_config, "eos_token_id", None) or self.tokenizer.eos_token_id
        self.eos_ids: list[int] = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        self._clean_generation_config()
        self.suppressed_token_ids = self._vision_token_ids()
        head = model.get_output_embeddings()
        vocab = head.weight.shape[0] if head is not None else len(self.tokenizer)
        self.suppress_mask = torch.zeros(vocab, dtype=torch.bool, device=self.device)  # [V]
        self.suppress_mask[[t for t in self.suppressed_token_ids if t < vocab]] = True
        self._suppress_host = (
            self.suppress_mask.cpu()
        )  # host copies: checks on completions never sync the device
        self.suppressed_id_set = frozenset(t for t in self.suppressed_token_ids if t < vocab)
        # the same ids on the device, for scoring (selective_logprobs sets them by index; no nonzero() per call)
        self.suppress_ids = torch.tensor(sorted(self.suppressed_id_set), dtype=torch.long, device=self.device)
        self.sharded: list[torch.nn.Module] = []  # FSDP2 modules, root last (see shard())
        self._gathered = False  # inside full_weights(): every rank holds the whole model
        self.replica: torch.nn.Module | None = None  # the DDP module that sums gradients (see replicate())

    # ---------------------------------------------------------------- FSDP2
    def shard(self, dist: Any = None) -> None:
        """Shard the weights over the processes with FSDP2 (:mod:`mmrl.model.fsdp`); build the optimizer afterwards.
        ``dist`` (:class:`mmrl.distributed.Dist`, made here if not given) matches the ranks' vision-tower calls in
        each scoring forward (:func:`mmrl.model.fsdp.matched_tower_calls`)."""
        from mmrl.distributed import Dist
        from mmrl.model.fsdp import shard_model

        self.dist = dist or Dist()
        self.sharded = shard_model(self.model, self.compute_dtype, self.dist.mesh())

    def replicate(self, dist: Any) -> None:
        """Sum gradients over the processes with torch's DDP (:meth:`mmrl.distributed.Dist.replicate`): scoring
        with gradients runs inside the DDP module's forward, so its hooks see the chunked head too."""
        self.replica = dist.replicate(_Scoring(self.model))

    @property
    def distributed(self) -> bool:
        """Sharded or replicated: every rank must run a backward for each optimizer step."""
        return bool(self.sharded) or self.replica is not None

    def grad_sync(self, sync: bool):
        """Context of one micro-batch's backward: with DDP, gradients are reduced only when ``sync`` (the last
        micro-batch of an optimizer step); the others accumulate locally (``no_sync``)."""
        return self.replica.no_sync() if self.replica is not None and not sync else nullcontext()

    def scored(self, fn, *args):
        """Run a scoring function (backbone + chunked head) where FSDP gathers the root's weights for it, or inside
        DDP's forward when gradients are wanted."""
        if self.sharded:
            return self.model.mmrl_run(fn, *args)
        if self.replica is not None and torch.is_grad_enabled():
            return self.replica(lambda: fn(*args))
        return fn(*args)

    @contextmanager
    def full_weights(self):
        """Generation-ready weights: under FSDP every rank gathers them on entry (call it on every rank) and
        forwards inside need no communication; otherwise a no-op."""
        if not self.sharded:
            yield
            return
        from mmrl.model.fsdp import full_weights

        with full_weights(self.sharded):
            self._gathered = True  # forwards inside are the rank's own: no collective to match
            try:
                yield
            finally:
                self._gathered = False

    @classmethod
    def from_pretrained(cls, cfg: ModelConfig, path: str | None = None, *, trainable: bool = True) -> Policy:
        """Load a VLM. ``trainable`` policies keep fp32 master weights (compute in ``cfg.dtype`` under autocast);
        frozen ones (reference model, evaluation) are stored in ``cfg.dtype``.

        In a trainable policy the frozen ``Linear``/``Conv`` weights (LoRA's base, a ``freeze_vision`` tower) are
        stored in ``cfg.dtype`` too: autocast would round each to it at every use (every decode step included), and
        rounding once gives the same values, so the numerics are unchanged for half their memory and no per-op cast.
        Embeddings, norms, biases and the output head stay fp32 (:func:`mmrl.model.logprobs.head_logits` scores the head
        in fp32). Checkpoints save them as stored: a bf16 release's own values, in its own dtype. LoRA merges still
        add in fp32 (:func:`merge_lora`). FSDP2 shards such mixed units from torch 2.8 on (only the trainable
        parameters of a unit must share a dtype)."""
        from transformers import AutoModelForImageTextToText, AutoProcessor

        # a LoRA checkpoint holds the adapter only: the base weights come from model.path
        src = resolve_model_path(cfg.path if cfg.lora.r > 0 and trainable else (path or cfg.path))
        kwargs: dict[str, Any] = {"dtype": torch.float32 if trainable else getattr(torch, cfg.dtype)}
        processor = AutoProcessor.from_pretrained(src)
        if cfg.attn_implementation:
            from transformers import AutoConfig

            from mmrl.model.attention import resolve
            from mmrl.model.encoders import media_blocks

            blocks = (
                media_blocks(SimpleNamespace(config=AutoConfig.from_pretrained(src)), processor) is not None
            )
            kwargs["attn_implementation"] = resolve(cfg.attn_implementation, pick_device(cfg.device), blocks)
        model = AutoModelForImageTextToText.from_pretrained(src, **kwargs).to(pick_device(cfg.device))
        if not hasattr(processor, "image_processor"):
            raise TypeError(
                f"{src}: AutoProcessor returned {type(processor).__name__}, not a multimodal processor "
                "(is preprocessor_config.json / processor_config.json missing?)"
            )
        if cfg.gradient_checkpointing and trainable:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.23 renamed it
                model.activation_checkpointing_enable(
                    activation_checkpointing_kwargs={"use_reentrant": False}
                )
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        # dropout stays off in updates (see Policy.training); attention dropout is a float, not a module
        for module in (model, *model.modules()):
            if isinstance(getattr(module, "attention_dropout", None), float):
                module.attention_dropout = 0.0
        for conf in (
            model.config,
            getattr(model.config, "text_config", None),
            getattr(model.config, "vision_config", None),
        ):
            if conf is not None and isinstance(getattr(conf, "attention_dropout", None), float):
                conf.attention_dropout = 0.0
        if cfg.freeze_vision or not trainable:
            from mmrl.model.layout import is_vision_param, language_model_prefix

            decoder = language_model_prefix(model)
            for name, p in model.named_parameters():
                if not trainable or is_vision_param(name, decoder):
                    p.requires_grad_(False)
        peft_model = None
        if cfg.lora.r > 0 and trainable:
            peft_model = add_lora(model, cfg, adapter=Path(path) / "adapter" if path else None)
        if trainable and cfg.dtype != "float32":  # frozen matmul weights in the compute dtype (see above)
            head = model.get_output_embeddings()
            fp32 = {id(m) for m in head.modules()} if head is not None else set()
            matmul = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
            for m in model.modules():  # exact types: a subclass may run its weight outside autocast
                if type(m) in matmul and id(m) not in fp32 and not m.weight.requires_grad:
                    m.weight.data = m.weight.data.to(getattr(torch, cfg.dtype))
        model.eval()
        return cls(model, processor, cfg, peft_model)

    def _vision_token_ids(self) -> list[int]:
        ids: set[int] = set()
        for conf in (self.model.config, getattr(self.model.config, "text_config", None)):
            for attr in VISION_TOKEN_ATTRS:
                v = getattr(conf, attr, None) if conf is not None else None
                if isinstance(v, int) and v >= 0:
                    ids.add(v)
        vocab = self.tokenizer.get_vocab()
        ids |= {vocab[t] for t in VISION_TOKEN_NAMES if t in vocab}
        return sorted(ids)

    def _clean_generation_config(self) -> None:
        """Replace the checkpoint's generation config by one holding only token ids (see the module docstring)."""
        from transformers import GenerationConfig

        old = self.checkpoint_generation_config
        if old is None:
            return
        defaults = GenerationConfig()
        dropped = {
            k: getattr(old, k)
            for k in SAMPLING_FIELDS
            if getattr(old, k, None) is not None and getattr(old, k, None) != getattr(defaults, k, None)
        }
        if dropped:
            log.warning(
                "the checkpoint's generation_config sets %s; mmrl ignores them and samples only with the run's "
                "rollout.* settings, so that sampling and the scored log-probs agree",
                ", ".join(f"{k}={v!r}" for k, v in sorted(dropped.items())),
            )
        self.model.generation_config = GenerationConfig(
            bos_token_id=old.bos_token_id, eos_token_id=self.eos_ids, pad_token_id=self.pad_id
        )

    # ---------------------------------------------------------------- modes and precision
    def autocast(self):
        """bf16/fp16 compute over fp32 master weights; a no-op in fp32."""
        if self.compute_dtype == torch.float32:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    @contextmanager
    def training(self):
        """Train mode for an update (gradient checkpointing runs), with dropout kept off; eval mode afterwards."""
        self.model.train()
        for name, m in self.model.named_modules():
            if isinstance(m, torch.nn.modules.dropout._DropoutNd) and ".lora_dropout." not in f".{name}.":
                m.eval()
        try:
            yield
        finally:
            self.model.eval()

    # ---------------------------------------------------------------- encoding
    @cached_property
    def geometry(self) -> VisionGeometry:
        """This checkpoint's image and video geometry, read from its processor (:mod:`mmrl.model.geometry`)."""
        from mmrl.model.geometry import vision_geometry

        return vision_geometry(self.processor)

    @cached_property
    def _dropped_on_decode(self) -> frozenset[int]:
        """Special tokens a decoded completion leaves out: every special token but markup tags (``<think>``,
        ``</answer>``: GLM-4.1V's are special tokens, which a plain ``skip_special_tokens`` decode would drop and
        with them the format a reward checks)."""
        tok = self.tokenizer
        special = {i for i, t in tok.added_tokens_decoder.items() if t.special} | set(tok.all_special_ids)
        tags = {i for i in special if re.fullmatch(r"</?[A-Za-z_]+>", tok.convert_ids_to_tokens(i) or "")}
        return frozenset(special - tags)

    def decode(self, tokens: list[int]) -> str:
        """A completion's text: special tokens (stops, padding, control tokens) left out, markup tags kept."""
        drop = self._dropped_on_decode
        return self.tokenizer.decode([t for t in tokens if t not in drop], skip_special_tokens=False)

    @cached_property
    def coordinate_frame(self) -> str:
        """The frame this checkpoint writes points and boxes in: ``model.coordinate_frame``, else its family's
        (:func:`mmrl.processors.geometry.coordinate_frame`)."""
        from mmrl.processors.geometry import coordinate_frame

        return coordinate_frame(getattr(self.model.config, "model_type", None), self.cfg.coordinate_frame)

    def encode(self, sample: Sample, extra_messages: list[dict[str, Any]] | None = None) -> EncodedPrompt:
        """Tokenise a sample's chat (plus a generation prompt) with its images and videos, resized to the
        checkpoint's geometry (:attr:`geometry`) here, so the processor (told not to resize) sees model-size pixels;
        a processor that owns its geometry (tiling) gets the images as they are."""
        from mmrl.processors.errors import MediaError
        from mmrl.processors.image import load_image

        geo = self.geometry
        images, sizes, model_sizes = [], [], []
        for src in sample.images:
            img = load_image(src, record_id=sample.id)
            resized, geom = geo.prepare_image(
                img, min_pixels=self.cfg.min_pixels, max_pixels=self.cfg.max_pixels, record_id=sample.id
            )
            images.append(resized)
            sizes.append(geom.original_size)
            model_sizes.append(geom.model_size)
        videos, video_meta = [], []
        if sample.videos:
            from mmrl.processors.video import load_video

            if geo.video_factor is None:
                raise MediaError(
                    sample.id,
                    f"this checkpoint's processor ({type(self.processor).__name__}) takes no video; "
                    "drop the sample's videos or train a video model",
                )
            for src in sample.videos:
                clip = load_video(
                    src,
                    record_id=sample.id,
                    fps=self.cfg.video_fps,
                    max_frames=self.cfg.video_max_frames,
                    max_pixels=self.cfg.video_max_pixels,
                    min_pixels=self.cfg.video_min_pixels,
                    factor=geo.video_factor,
                    temporal_patch=geo.temporal_patch,
                )
                videos.append(clip.frames)
                video_meta.append(clip.sample_fps)
        # string contents as one text part: the processors' canonical form (LLaVA-OneVision's template renders a
        # plain string as nothing)
        messages = [
            {**m, "content": [{"type": "text", "text": m["content"]}]}
            if isinstance(m.get("content"), str)
            else m
            for m in sample.messages + (extra_messages or [])
        ]
        text = self.processor.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=extra_messages is None,
            **self.cfg.chat_template_kwargs,
        )
        kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
        bos = self.tokenizer.bos_token
        if bos and text.startswith(bos):  # the template wrote the BOS (Gemma): never a second one
            kwargs["add_special_tokens"] = False
        media = geo.processor_kwargs()
        if images:
            kwargs["images"] = images
            kwargs["images_kwargs"] = media["images_kwargs"]
        if videos:
            # one list of videos per text, the processors' batched form: the same inputs for every family, and the
            # form SmolVLM's processor under transformers 5.16-5.17 requires (a flat list counts frames as videos)
            kwargs["videos"] = [videos]
            # each video carries its own rate: transformers otherwise assumes 24 fps for second_per_grid_ts
            kwargs["videos_kwargs"] = {
                **media["videos_kwargs"],
                "video_metadata": [
                    {"fps": fps, "total_num_frames": len(v), "frames_indices": list(range(len(v)))}
                    for v, fps in zip(videos, video_meta)
                ],
            }
        out = self.processor(**kwargs)
        L = out["input_ids"].shape[1]
        rest = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
        seq = {k: v[0] for k, v in rest.items() if v.dim() == 2 and v.shape[0] == 1 and v.shape[1] == L}
        mm = {k: v for k, v in rest.items() if k not in seq}
        return EncodedPrompt(
            sample.id,
            out["input_ids"][0],
            mm,
            seq,
            sizes,
            model_sizes,
            text,
            images,
            videos,
            video_meta,
            self.coordinate_frame,
            opened_think(text) if extra_messages is None else "",
        )

    # ---------------------------------------------------------------- batching
    def collate(
        self,
        prompts: list[EncodedPrompt],
        completions: list[list[int]] | None = None,
        *,
        sampled: list[list[int]] | None = None,
        completion_seq: list[dict[str, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], int]:
        """Left-pad prompts to P, right-pad completions to T. Returns ``input_ids, attention_mask [B, P+T]``,
        the concatenated ``mm`` dict and P. A completion's suppressed tokens (vision placeholders) become padding
        where it was sampled (``sampled``: 1 per sampled token; default all), and stay where an environment wrote
        them (an observation's images); ``completion_seq``: each completion's per-token tensors (zeros where
        absent), as ``prompt.seq`` is the prompt's."""
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
                ids[i, P : P + len(c)] = c.masked_fill(self.sampled_suppressed(c, sampled, i), self.pad_id)
                mask[i, P : P + len(c)] = 1
        mm: dict[str, torch.Tensor] = {}
        tails = completion_seq or [{}] * B
        for key, dtype in seq_keys(prompts, tails).items():
            t = torch.zeros((B, P + T), dtype=dtype)
            for i, p in enumerate(prompts):
                if key in p.seq:
                    t[i, P - len(p.input_ids) : P] = p.seq[key]
                if key in tails[i]:
                    t[i, P : P + len(tails[i][key])] = tails[i][key]
            mm[key] = t.to(self.device)
        for key in sorted({k for p in prompts for k in p.mm}):
            parts = padded(
                [p.mm[key] for p in prompts if key in p.mm], -1 if key.endswith("position_ids") else 0
            )
            mm[key] = torch.cat(parts, dim=0).to(self.device)
            if mm[key].is_floating_point():
                mm[key] = mm[key].to(self.model.dtype)
        return ids.to(self.device), mask.to(self.device), mm, P

    def sampled_suppressed(
        self, tokens: torch.Tensor, sampled: list[list[int]] | None, row: int
    ) -> torch.Tensor:
        """Which of completion ``row``'s ``tokens`` are suppressed ids the policy sampled (blanked before scoring;
        an environment's own vision placeholders are kept)."""
        hit = self.is_suppressed(tokens)
        if sampled is not None:
            hit &= torch.as_tensor(sampled[row], dtype=torch.bool)
        return hit

    def is_suppressed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._suppress_host[tokens.clamp(0, len(self._suppress_host) - 1)] & (
            tokens < len(self._suppress_host)
        )

    # ---------------------------------------------------------------- scoring
    def completion_hidden(
        self,
        prompts: list[EncodedPrompt],
        completions: list[list[int]],
        packed: bool | None = None,
        *,
        sampled: list[list[int]] | None = None,
        completion_seq: list[dict[str, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Final hidden states at the positions predicting each completion token ``[B, T, H]``, the tokens
        ``[B, T]`` and the mask ``[B, T]`` (1 on real completion tokens). ``packed`` (default: :attr:`packs`):
        one forward over the sequences packed into one row without padding (:func:`mmrl.model.packing.packed_hidden`);
        ``sampled``, ``completion_seq``: see :meth:`collate`."""
        if self.packs if packed is None else packed:
            from mmrl.model.packing import packed_hidden

            return packed_hidden(self, prompts, completions, sampled=sampled, completion_seq=completion_seq)
        ids, attn, mm, P = self.collate(prompts, completions, sampled=sampled, completion_seq=completion_seq)
        T = ids.shape[1] - P
        target = torch.full((len(prompts), T), self.pad_id, dtype=torch.long)
        for i, c in enumerate(completions):
            target[i, : len(c)] = torch.as_tensor(c, dtype=torch.long)
        with self.autocast(), self.matched_tower_calls(mm):
            last = self.last_hidden(input_ids=ids, attention_mask=attn, use_cache=False, **mm)
        hidden = last[:, P - 1 : P + T - 1]  # position P-1+t predicts token P+t
        return hidden, target.to(self.device), attn[:, P:].float()

    @cached_property
    def logit_softcap(self) -> float | None:
        """The model's final logit soft-capping (``final_logit_softcapping`` of its text config: Gemma 2 and 4), which
        its own forward applies after the head and the scoring here must apply too; None where there is none."""
        config = self.model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return getattr(text, "final_logit_softcapping", None) or None

    @cached_property
    def packs(self) -> bool:
        """Whether micro-batches are scored packed: ``model.packing``, the family can
        (:func:`mmrl.model.encoders.packing_support`) and the attention attends each packed sequence alone
        (:func:`mmrl.model.attention.is_varlen`; under plain ``sdpa`` a packed row would cost ``N^2`` attention)."""
        from mmrl.model.attention import is_varlen
        from mmrl.model.encoders import packing_support

        attn = getattr(self.model.config, "_attn_implementation", None)
        return self.cfg.packing and is_varlen(attn) and packing_support(self.model, self.processor, attn)[0]

    def matched_tower_calls(self, mm: dict[str, Any]):
        """Context of one scoring forward with the media ``mm`` (its vision encoding included): under FSDP, outside
        :meth:`full_weights`, every rank runs the vision tower as often (:func:`mmrl.model.fsdp.matched_tower_calls`)."""
        if not self.sharded or self._gathered:
            return nullcontext()
        from mmrl.model.fsdp import matched_tower_calls

        return matched_tower_calls(self, mm)

    def last_hidden(self, **inputs: Any) -> torch.Tensor:
        """The final hidden states ``[B, L, H]`` (after the last norm, before the head) of a forward with the media:
        from the model's multimodal backbone (``model.model``) where it has one; else (Llama 4, whose head sits
        inside its language model) captured from the text decoder's output during a full forward that computes the
        head's logits at one position only."""
        backbone = getattr(self.model, "model", None)
        if backbone is not None:
            return backbone(**inputs).last_hidden_state
        captured: list[torch.Tensor] = []
        decoder = self.model.get_decoder()  # Llama 4: a causal LM whose inner model ends with the final norm
        decoder = getattr(decoder, "model", None) or decoder
        hook = decoder.register_forward_hook(lambda _m, _args, out: captured.append(out.last_hidden_state))
        try:
            self.model(**inputs, logits_to_keep=1)
        finally:
            hook.remove()
        return captured[-1]

    def refuse_placeholders(self, tokens: Iterable[int], what: str) -> None:
        """Vision placeholders are outside the policy's support: sampled tokens holding one are an engine bug, refused
        before scoring (a host-side set: no device sync per token)."""
        bad = self.suppressed_id_set.intersection(tokens)
        if bad:
            raise ValueError(
                f"{what} holds vision placeholder token(s) {sorted(bad)}; rollout engines must suppress "
                "Policy.suppressed_token_ids"
            )

    def score_tokens(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        keep: torch.Tensor,
        like: torch.Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = True,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head step every scoring path shares: log-probs (and full-vocabulary entropies) of ``targets [N]`` from
        the hidden states that predict them ``[N, H]``, in fp32 over the support less the vision placeholders,
        scattered to the flat positions ``keep [N]`` of a grid shaped, typed and placed like ``like [B, T]`` (0
        elsewhere)."""
        B, T = like.shape
        with self.autocast():
            lp, ent = selective_logprobs(
                self.model.get_output_embeddings(),
                hidden[None],
                targets[None],
                temperature=temperature,
                suppress=self.suppress_ids,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
                chunk=self.cfg.logits_chunk_tokens,
                softcap=self.logit_softcap,
            )
        logp = like.new_zeros(B * T).index_put((keep,), lp[0]).view(B, T)
        entropy = None if ent is None else like.new_zeros(B * T).index_put((keep,), ent[0]).view(B, T)
        return logp, entropy

    def logprobs(
        self,
        prompts: list[EncodedPrompt],
        completions: list[list[int]],
        *,
        sampled: list[list[int]] | None = None,
        completion_seq: list[dict[str, torch.Tensor]] | None = None,
        temperature: float = 1.0,
        with_entropy: bool = True,
        entropy_grad: bool = False,
        packed: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Per-token log-probs (and full-vocabulary entropies) of ``completions`` given ``prompts``, in fp32.

        Returns ``logp [B, T]``, ``entropy [B, T]`` (or None), ``mask [B, T]`` (1 on the scored tokens). The head
        scores the tokens the policy sampled (``sampled``: 1 per sampled token; default every completion token)
        and nothing else: 0 on an environment's tokens inside a multi-turn response and on padding. Gradients flow
        through ``logp`` unless called under ``torch.no_grad()``. ``packed``: see :meth:`completion_hidden`;
        ``completion_seq``: see :meth:`collate`. Vision placeholders are outside the policy's support: a sampled
        token holding one is an engine bug and is refused.
        """
        for i, c in enumerate(completions):
            picked = c if sampled is None else [tok for tok, m in zip(c, sampled[i]) if m]
            self.refuse_placeholders(picked, "a completion")
        T = max((len(c) for c in completions), default=0)
        # the scored tokens' flat positions, from host-side lists (no data-dependent shape on the device)
        flat = [
            i * T + t
            for i, c in enumerate(completions)
            for t in range(len(c))
            if sampled is None or sampled[i][t]
        ]
        if not flat:  # nothing sampled (an episode the env ended at reset): nothing to score
            none = torch.zeros((len(completions), T), device=self.device)
            return none, (none.clone() if with_entropy else None), none.clone()

        def score() -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
            hidden, target, mask = self.completion_hidden(
                prompts, completions, packed, sampled=sampled, completion_seq=completion_seq
            )
            B = mask.shape[0]
            keep = torch.tensor(flat, device=mask.device)
            if sampled is not None:
                mask = torch.zeros(B * T, device=mask.device).index_fill_(0, keep, 1.0).view(B, T)
            logp, entropy = self.score_tokens(
                hidden.reshape(B * T, -1)[keep],
                target.reshape(B * T)[keep],
                keep,
                mask,
                temperature=temperature,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
            )
            return logp, entropy, mask

        return self.scored(score)

    def sequence_nll(
        self, prompts: list[EncodedPrompt], targets: list[list[int]], label_smoothing: float = 0.0
    ) -> torch.Tensor:
        """Mean token cross-entropy of ``targets`` (supervised warm start), optionally label-smoothed."""

        def score() -> torch.Tensor:
            hidden, target, mask = self.completion_hidden(prompts, targets)
            with self.autocast():  # [B, T, V] logits at once: warm starts are short
                logits = self.model.get_output_embeddings()(hidden).float()
                if self.logit_softcap:
                    logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
            ce = F.cross_entropy(
                logits.transpose(1, 2), target, reduction="none", label_smoothing=label_smoothing
            )
            return (ce * mask).sum() / mask.sum().clamp(min=1.0)

        return self.scored(score)

    # ---------------------------------------------------------------- LoRA, weights, saving
    @contextmanager
    def reference(self):
        """The reference policy: with LoRA, this model with its adapters disabled (no second copy)."""
        if self.peft is None:
            raise ValueError(
                "Policy.reference() needs LoRA; without it the reference is a separate frozen Policy"
            )
        with self.peft.disable_adapter():
            yield self

    def stream_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's weights in the plain HF layout as ``(name, tensor)`` pairs, one at a time, in ``dtype``
        (default: as stored), for an engine that keeps its own copy (:class:`mmrl.rollout.vllm.VLLMEngine`).

        Nothing is gathered up front: the plain model's tensors are read (and cast) one by one; under FSDP each
        tensor is all-gathered from the shards, cast first so that a bf16 engine gathers bf16
        (:func:`mmrl.model.fsdp.stream_full_tensors`; a collective per tensor: every rank must consume the whole
        iterator). With LoRA an adapted ``Linear`` is yielded merged (:func:`merge_lora`, fp32 arithmetic) as soon
        as its base weight and adapters have been read; those few tensors are gathered as stored (fp32 master
        weights), so the merge rounds once, into ``dtype``. Names follow the model's own order, which keeps each
        layer's tensors together (vLLM's layerwise reload buffers a layer until all of its weights have arrived)."""
        lora = lora_layers(self.model) if self.peft is not None else {}

        def gather_dtype(name: str) -> torch.dtype | None:
            return None if lora_owner(name, lora) else dtype

        if self.sharded:
            from mmrl.model.fsdp import stream_full_tensors

            items = stream_full_tensors(self.model, gather_dtype)
        else:
            items = (
                (k, v.detach() if gather_dtype(k) is None else v.detach().to(gather_dtype(k)))
                for k, v in self.model.state_dict().items()
            )
        return checkpoint_layout(self.model, merge_lora(items, lora, dtype))

    def merged_state_dict(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The model's weights in the plain HF layout as one dict (a merged checkpoint), from ``state`` (a sharded
        policy's gathered full weights, :meth:`full_state_dict`) or else the model's own; LoRA merged as in
        :meth:`stream_weights`."""
        if state is None:
            state = {k: v.detach() for k, v in self.model.state_dict().items()}
        lora = lora_layers(self.model) if self.peft is not None else {}
        return dict(merge_lora(iter(state.items()), lora, None))

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Under FSDP the full weights gathered on rank 0 (a collective: call it on every rank; other ranks get an
        empty dict); None when the policy is not sharded (:meth:`save` reads the model itself)."""
        if not self.sharded:
            return None
        from mmrl.model.fsdp import full_state_dict

        return full_state_dict(self.model)

    def save(self, path: str | os.PathLike, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """HF format (processor included). With LoRA: ``path/adapter/``, plus the merged model when asked.
        ``state_dict``: the gathered full weights of a sharded policy (:meth:`full_state_dict`)."""
        path = Path(path)
        self.processor.save_pretrained(path)
        if self.peft is not None:
            # peft names its own state "base_model.model.<the wrapped model's names>"
            given = (
                {}
                if state_dict is None
                else {"state_dict": {f"base_model.model.{k}": v for k, v in state_dict.items()}}
            )
            self.peft.save_pretrained(path / "adapter", **given)
            if self.cfg.lora.save_merged:
                self.model.save_pretrained(path, state_dict=self.merged_state_dict(state_dict))
            return
        self.model.save_pretrained(path, **({} if state_dict is None else {"state_dict": state_dict}))


class _Scoring(torch.nn.Module):
    """What DDP wraps: the HF model, with a ``forward`` that runs a scoring closure over it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn):
        return fn()
