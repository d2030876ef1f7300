"""The arithmetic behind ``mmrl plan`` (:mod:`mmrl.plan.planner`, whose docstring is the model of memory): a checkpoint's
shapes read from its ``config.json`` on the meta device, the run's geometry (machine, sequence, micro-batches,
trainable set), and the bytes of activations per token and block, per phase of an update and of a no-grad forward.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrl.config import Config, ConfigError

GIB = 1024**3
DEFAULT_GPU_GIB = 80.0
TEXT_TOKENS = 256  # the text part of a prompt (chat template, system prompt, question) when not given
OBSERVATION_TEXT_TOKENS = 32  # an episode's observation turn: the template's markers and the env's text
SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ---------------------------------------------------------------------------------------------- model shapes
class ConfigNotLocal(ConfigError):
    """The checkpoint's config.json is nowhere on this machine."""


@dataclass(frozen=True)
class Tower:
    """A stack of identical blocks (decoder layers or vision blocks)."""

    layers: int
    hidden: int
    mlp: int
    heads: int
    kv_heads: int
    block_params: int  # one block's parameters
    matmul_params: int  # the tower's Linear/Conv parameters (what autocast casts to bf16)


@dataclass(frozen=True)
class ModelShapes:
    source: str  # the config folder the shapes were read from
    params: int
    vision_params: int
    embed_params: int  # the input embedding
    head_params: int  # an untied output head (0 when tied to the embedding)
    vocab: int
    text: Tower
    vision: Tower | None
    patch: int = 14
    merge: int = 2
    temporal_patch: int = 2
    in_channels: int = 3
    max_positions: int = 32768
    linears: tuple[tuple[str, int, int], ...] = ()  # every nn.Linear: (name, in, out), for LoRA
    # plain Linear/Conv weights but the head's (biases apart): frozen, Policy.from_pretrained stores them in
    # model.dtype; all of them under LoRA, the vision side's under freeze_vision. first_matmul: the model's first
    # parameter when it is one of them (it sets model.dtype, in which the policy collates pixels)
    matmul_weights: int = 0
    vision_matmul_weights: int = 0
    first_matmul: str | None = None
    decoder: str = (
        "model.language_model"  # the text decoder's module name (mmrl.model.layout.language_model_prefix)
    )
    tokens_per_image: int = 0  # a fixed-size tower's tokens per image (Gemma 3: 256); 0: dynamic resolution
    patches_per_image: int = 0  # and the patches its tower sees

    @property
    def pixels_per_token(self) -> int:
        return (self.patch * self.merge) ** 2


def config_folder(model_path: str, model_config: str | None = None) -> Path:
    """The folder holding the checkpoint's ``config.json``: ``model_config`` when given, else the model folder, else
    the HF cache's copy of a hub id, else the folder shipped under ``mmrl/plan/configs/`` with the hub id's name."""
    from mmrl.model.checkpoint_files import resolve_model_path

    for cand in (model_config, resolve_model_path(model_path)):
        if cand and (Path(cand) / "config.json").is_file():
            return Path(cand)
    if model_config:
        raise ConfigError(f"--model-config {model_config}: no config.json there")
    cached = _hub_cached_config(model_path)
    if cached is not None:
        return cached
    shipped = SHIPPED_CONFIGS / model_path.rstrip("/").split("/")[-1]
    if (shipped / "config.json").is_file():
        return shipped
    raise ConfigNotLocal(
        f"model.path {model_path!r}: no config.json found locally (not a folder, not in the HF cache, not among "
        f"mmrl/plan/configs/): give the checkpoint's config folder with "
        "--model-config DIR (the folder's config.json is all the plan reads)"
    )


def _hub_cached_config(repo_id: str) -> Path | None:
    if repo_id.count("/") != 1 or Path(repo_id).exists():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    hit = try_to_load_from_cache(repo_id, "config.json")
    return Path(hit).parent if isinstance(hit, str) else None


@functools.lru_cache(maxsize=16)
def model_shapes(folder: str) -> ModelShapes:
    """Count a checkpoint's parameters by module on the meta device (nothing is allocated or read)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from mmrl.model.layout import is_vision_param, language_model_prefix

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    text_cfg = config.get_text_config()
    vision_cfg = getattr(config, "vision_config", None)
    blocks = _blocks(model)
    text_blocks = [(n, b) for n, b in blocks if not _is_vision(n)]
    vision_blocks = [(n, b) for n, b in blocks if _is_vision(n)]
    if not text_blocks:
        raise ConfigError(f"{folder}: no decoder layers found (the model declares no _no_split_modules)")
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and head.weight is embed.weight
    patch = int(_get(vision_cfg, "patch_size", default=14))
    decoder = language_model_prefix(model)
    types = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)  # exact, as the policy casts
    matmul = {
        f"{n}.weight": m.weight.numel()
        for n, m in model.named_modules()
        if type(m) in types and m is not head
    }
    first = next(n for n, p in model.named_parameters() if p.is_floating_point())
    return ModelShapes(
        source=folder,
        params=_count(model),
        vision_params=_vision_params(model),
        embed_params=embed.weight.numel(),
        head_params=0 if tied or head is None else head.weight.numel(),
        vocab=embed.weight.shape[0],
        text=_tower(text_cfg, text_blocks, model, vision=False),
        vision=_tower(vision_cfg, vision_blocks, model, vision=True) if vision_blocks else None,
        patch=patch,
        merge=int(_get(vision_cfg, "spatial_merge_size", default=1)),
        temporal_patch=int(_get(vision_cfg, "temporal_patch_size", default=1)),
        in_channels=int(_get(vision_cfg, "in_channels", "in_chans", default=3)),
        max_positions=int(_get(text_cfg, "max_position_embeddings", default=32768)),
        tokens_per_image=int(_get(config, "mm_tokens_per_image", default=0)),
        patches_per_image=(int(_get(vision_cfg, "image_size", default=0)) // patch) ** 2,
        linears=tuple(
            (n, m.in_features, m.out_features)
            for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not head
        ),
        matmul_weights=sum(matmul.values()),
        vision_matmul_weights=sum(v for k, v in matmul.items() if is_vision_param(k, decoder)),
        first_matmul=first if first in matmul else None,
        decoder=decoder,
    )


@dataclass(frozen=True)
class RewardModelShape:
    params: int
    dtype: str | None  # the checkpoint's own (config.json's dtype)
    kv_per_token: int  # a bf16 KV cache's bytes per token (0 for an encoder)
    max_positions: int


@functools.lru_cache(maxsize=16)
def reward_model_shape(model_path: str, kind: str) -> RewardModelShape:
    """A reward's model counted on the meta device from the config.json that :func:`config_folder` finds
    (ConfigNotLocal when none): ``judge`` a causal LM, ``image_judge`` an image-text-to-text model (``use_image``),
    ``encoder`` the transformer of a sentence-transformers folder (else the folder itself), as
    :mod:`mmrl.rewards.judge` and :mod:`mmrl.rewards.embedding` load them."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText

    from mmrl.rewards.embedding import sentence_transformers_layout

    folder = config_folder(model_path)
    body = sentence_transformers_layout(folder)[0] if kind == "encoder" else folder
    config = AutoConfig.from_pretrained(body)
    autos = {"judge": AutoModelForCausalLM, "image_judge": AutoModelForImageTextToText, "encoder": AutoModel}
    with torch.device("meta"):
        model = autos[kind].from_config(config)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    text = config.get_text_config()
    heads = int(_get(text, "num_attention_heads", default=1))
    head_dim = int(_get(text, "head_dim", default=0) or _get(text, "hidden_size", default=0) // heads)
    kv_heads = int(_get(text, "num_key_value_heads", default=heads))
    layers = int(_get(text, "num_hidden_layers", default=0))
    return RewardModelShape(
        params=_count(model),
        dtype=str(dtype).removeprefix("torch.") if dtype else None,
        kv_per_token=0 if kind == "encoder" else 2 * layers * kv_heads * head_dim * 2,
        max_positions=int(_get(text, "max_position_embeddings", default=0)),
    )


def _count(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def _is_vision(name: str) -> bool:
    return any(k in name for k in ("visual", "vision"))


def _vision_params(model: Any) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if _is_vision(n))


def _blocks(model: Any) -> list[tuple[str, Any]]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    return [(n, m) for n, m in model.named_modules() if type(m).__name__ in names]


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(cfg, n, None) if cfg is not None else None
        if v is not None:
            return v
    return default


def _tower(cfg: Any, blocks: list[tuple[str, Any]], model: Any, vision: bool) -> Tower:
    import torch

    hidden = _get(cfg, "hidden_size", "embed_dim")
    heads = _get(cfg, "num_attention_heads", "num_heads")
    mlp = _get(cfg, "intermediate_size") or int(hidden * _get(cfg, "mlp_ratio", default=4))
    matmul = sum(
        _count(m)
        for n, m in model.named_modules()
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv3d, torch.nn.Conv2d))
        and _is_vision(n) == vision
        and m is not model.get_output_embeddings()
    )
    return Tower(
        layers=len(blocks),
        hidden=int(hidden),
        mlp=int(mlp),
        heads=int(heads),
        kv_heads=int(_get(cfg, "num_key_value_heads", default=heads)),
        block_params=_count(blocks[0][1]),
        matmul_params=matmul,
    )


# ---------------------------------------------------------------------------------------------- the run
@dataclass(frozen=True)
class PlanOptions:
    """What the config does not say: the machine (else ``hardware:``) and the prompts' contents."""

    gpus: int | None = None  # per node
    nodes: int | None = None
    gpu_memory_gib: float | None = None
    model_config: str | None = None  # a folder with the checkpoint's config.json
    text_tokens: int | None = None  # the text part of the longest prompt
    images: int | None = None  # per prompt
    videos: int | None = None  # per prompt


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int
    nodes: int
    gpu_gib: float
    name: str | None
    source: str
    generating: int = 0  # a separate placement's generating processes (rollout.rollout_processes), else 0

    @property
    def launched(self) -> int:
        """Processes launched: one per GPU."""
        return self.gpus_per_node * self.nodes

    @property
    def world(self) -> int:
        """The processes that train (all of them, or a separate placement's training group): what FSDP shards
        over, DDP replicates on and a step's rows are split among."""
        return self.launched - self.generating


@dataclass(frozen=True)
class Sequence:
    text_tokens: int
    images: int
    videos: int
    visual_tokens: int  # per prompt
    patches: int  # vision-tower tokens per prompt
    response: int  # T

    @property
    def prompt(self) -> int:
        return self.text_tokens + self.visual_tokens

    @property
    def total(self) -> int:  # S
        return self.prompt + self.response


def hardware(cfg: Config, opts: PlanOptions) -> Hardware:
    hw = cfg.hardware
    given = opts.gpus is not None or opts.nodes is not None or opts.gpu_memory_gib is not None
    stated = hw.gpu_memory_gib is not None or hw.gpus_per_node != 1 or hw.nodes != 1 or hw.name
    memory = opts.gpu_memory_gib or hw.gpu_memory_gib or DEFAULT_GPU_GIB
    source = "the command line" if given else "the config's hardware section" if stated else "the default"
    gpus, nodes = opts.gpus or hw.gpus_per_node, opts.nodes or hw.nodes
    if gpus < 1 or nodes < 1 or memory <= 0:
        raise ConfigError(f"hardware: {gpus} GPUs x {nodes} nodes of {memory} GiB: each must be positive")
    generating = 0
    if cfg.rollout.placement == "separate":  # the last rollout_processes generate, the others train
        generating = cfg.rollout.rollout_processes
        if generating < 1 or gpus * nodes - generating < 1:
            raise ConfigError(
                f"rollout.placement: separate with rollout.rollout_processes {generating} of {gpus * nodes} "
                f"launched process(es): at least one must train and one generate (plan it with --gpus "
                f"{max(1, generating) + 1} or more)"
            )
    return Hardware(gpus, nodes, float(memory), hw.name, source, generating)


def sequence(cfg: Config, shapes: ModelShapes, opts: PlanOptions) -> Sequence:
    images, videos = _media_per_prompt(cfg.data.train, max_images=cfg.data.max_images_per_record)
    images = images if opts.images is None else opts.images
    videos = videos if opts.videos is None else opts.videos
    m = cfg.model
    per_image = m.max_pixels // shapes.pixels_per_token
    image_patches = per_image * shapes.merge**2
    if shapes.tokens_per_image:  # a fixed-size tower: every image is resized to its one size
        per_image, image_patches = shapes.tokens_per_image, shapes.patches_per_image
    frames = max(1, math.ceil(m.video_max_frames / shapes.temporal_patch))
    per_video = frames * (m.video_max_pixels // shapes.pixels_per_token)
    r, ep = cfg.rollout, cfg.rollout.episode
    response = r.max_new_tokens
    visual = images * per_image
    if (
        r.env and ep.max_turns > 1
    ):  # an episode: every turn's completion, and each observation's text and image
        later = ep.max_turns - 1
        if ep.max_images is not None:
            later = max(0, min(later, ep.max_images - images))
        images += later
        visual = images * per_image
        if ep.max_context_pixels is not None:
            visual = min(visual, ep.max_context_pixels // shapes.pixels_per_token)
        response = ep.max_turns * r.max_new_tokens + (ep.max_turns - 1) * OBSERVATION_TEXT_TOKENS
    if shapes.vision is None:
        images = videos = visual = 0
    text = TEXT_TOKENS if opts.text_tokens is None else opts.text_tokens
    if r.env and ep.max_total_tokens is not None:  # episodes stop before passing it
        response = max(r.max_new_tokens, min(response, ep.max_total_tokens - text - visual))
    return Sequence(
        text_tokens=text,
        images=images,
        videos=videos,
        visual_tokens=visual + videos * per_video,
        patches=(visual * image_patches // per_image if per_image else 0)
        + videos * per_video * shapes.merge**2,
        response=response,
    )


def _media_per_prompt(train: str, limit: int = 1000, max_images: int | None = None) -> tuple[int, int]:
    """The most images and videos one usable record of ``data.train`` holds (a .jsonl that exists), else one image.
    Lines the loader would skip (not UTF-8, not one JSON object, lists where lists belong not) are passed over here
    too, and a record over ``max_images`` (``data.max_images_per_record``) is one the loader leaves out, so the plan
    is of the records that train."""
    path = Path(train) if train else None
    if path is None or path.suffix != ".jsonl" or not path.is_file():
        return 1, 0
    images = videos = 0
    with path.open("rb") as f:
        for _, raw in zip(range(limit), f):
            try:
                rec = json.loads(raw.decode("utf-8")) if raw.strip() else {}
            except (UnicodeDecodeError, ValueError, RecursionError):
                continue
            if not isinstance(rec, dict):
                continue
            ims, vids = rec.get("images") or [], rec.get("videos") or []
            if not isinstance(ims, list) or not isinstance(vids, list):
                continue
            if max_images is not None and len(ims) > max_images:
                continue
            images, videos = max(images, len(ims)), max(videos, len(vids))
    return images, videos


@dataclass(frozen=True)
class Setup:
    """Everything the arithmetic needs, read once from the config, the shapes and the machine."""

    cfg: Config
    shapes: ModelShapes
    hw: Hardware
    seq: Sequence
    # the training compute's precision: autocast (bf16 over fp32 weights), bf16 (FSDP mixed precision), fp32
    mode: str
    fsdp: bool
    ddp: bool
    trainable: int  # parameters the optimizer holds (whole model, before sharding)
    adapters: int  # LoRA parameters (0 without LoRA)
    frozen_low: int  # the policy's frozen Linear/Conv weights, stored in model.dtype (0 in fp32)
    pixels_low: bool  # the policy collates pixels in model.dtype (its first parameter is one of them)
    vision_trainable: bool
    vision_graph: bool  # the tower's forward is recorded for a backward (trainable, or LoRA's input hook)
    micro: int  # rows of an update micro-batch on this rank
    micro_nograd: int  # rows of a no-grad log-prob micro-batch
    ref_copy: bool
    old_forward: bool  # pi_old recomputed with a training forward

    @property
    def shard(self) -> int:
        return self.hw.world if self.fsdp else 1

    @property
    def lora(self) -> bool:
        return self.cfg.model.lora.r > 0


def setup(cfg: Config, opts: PlanOptions | None = None) -> Setup:
    from mmrl.model.layout import is_vision_param

    opts = opts or PlanOptions()
    shapes = model_shapes(str(config_folder(cfg.model.path, opts.model_config)))
    hw = hardware(cfg, opts)
    fsdp = bool(cfg.train.fsdp) and hw.world > 1
    lora = cfg.model.lora.r > 0
    adapters = _adapter_params(shapes, cfg) if lora else 0
    vision_trainable = not lora and not cfg.model.freeze_vision and shapes.vision is not None
    trainable = adapters if lora else shapes.params - (0 if vision_trainable else shapes.vision_params)
    mode = "fp32" if cfg.model.dtype == "float32" else "bf16" if fsdp else "autocast"
    frozen = _frozen_low(shapes, cfg)
    first = shapes.first_matmul
    pixels_low = bool(frozen) and first is not None and (lora or is_vision_param(first, shapes.decoder))
    rows = cfg.train.prompts_per_step * cfg.rollout.n // hw.world  # this rank's rows per step
    per_mini = max(1, math.ceil(rows / cfg.algo.mini_batches))
    seq = sequence(cfg, shapes, opts)
    return Setup(
        cfg=cfg,
        shapes=shapes,
        hw=hw,
        seq=seq,
        mode=mode,
        fsdp=fsdp,
        ddp=hw.world > 1 and not fsdp,
        trainable=trainable,
        adapters=adapters,
        frozen_low=frozen,
        pixels_low=pixels_low,
        vision_trainable=vision_trainable,
        # peft makes the inputs require grad when checkpointing (transformers hooks the patch embedding too), so
        # under LoRA the frozen tower's activations are kept and back-propagated through
        vision_graph=shapes.vision is not None
        and (vision_trainable or (lora and cfg.model.gradient_checkpointing)),
        micro=max(1, min(_micro_rows(cfg, seq.total), per_mini)),
        micro_nograd=max(1, min(_micro_rows(cfg, seq.total, whole=False), rows)),
        ref_copy=cfg.algo.kl_coef > 0 and not lora,
        old_forward=cfg.algo.old_logprobs == "recompute" or _needs_entropy(cfg),
    )


def _frozen_low(shapes: ModelShapes, cfg: Config) -> int:
    """The frozen Linear/Conv weights :meth:`Policy.from_pretrained` stores in ``model.dtype``: every one but the
    head's under LoRA, the vision side's under ``freeze_vision``; none in fp32."""
    if cfg.model.dtype == "float32":
        return 0
    if cfg.model.lora.r > 0:
        return shapes.matmul_weights
    return shapes.vision_matmul_weights if cfg.model.freeze_vision else 0


def _micro_rows(cfg: Config, row_tokens: int, whole: bool = True) -> int:
    """Rows in a micro-batch (:func:`mmrl.train.update.micro_batches`): blocks of whole groups for a loss that needs them
    (``whole``: the update; the no-grad scoring passes take single rows); ``optim.micro_batch_size`` rows, or with
    ``optim.micro_batch_tokens`` as many blocks of rows of ``row_tokens`` (the longest prompt + response) as the
    budget holds, at least one."""
    from mmrl.algos import LOSSES

    G, mb, budget = cfg.rollout.n, cfg.optim.micro_batch_size, cfg.optim.micro_batch_tokens
    unit = G if whole and getattr(LOSSES.get(cfg.algo.loss), "needs_whole_groups", False) else 1
    if budget > 0:
        return max(1, budget // (unit * max(1, row_tokens))) * unit
    return max(unit, mb // unit * unit)


def _needs_entropy(cfg: Config) -> bool:
    """Whether the estimator asks for pi_old's full-vocabulary entropy (an extra no-grad forward of the policy)."""
    from mmrl.algos import ADVANTAGES

    a = cfg.algo  # built as the pre-flight checks build it
    est = ADVANTAGES.get(a.advantage)(1, eps=a.adv_eps, **a.advantage_options)
    return bool(getattr(est, "needs_entropy", False))


def _adapter_params(shapes: ModelShapes, cfg: Config) -> int:
    return sum(cfg.model.lora.r * (i + o) for _, i, o in adapted(shapes, cfg))


def adapted(shapes: ModelShapes, cfg: Config) -> list[tuple[str, int, int]]:
    """The Linear layers peft adapts: a string is a regex that must match the whole name, a list matches name
    suffixes (peft's ``check_target_module_exists``)."""
    from mmrl.model.layout import lora_targets

    target = cfg.model.lora.target_modules
    if target == "auto":
        target = lora_targets([x[0] for x in shapes.linears], shapes.decoder, vision=cfg.model.lora.vision)
        return [x for x in shapes.linears if x[0] in set(target)]
    if isinstance(target, str):
        return [x for x in shapes.linears if re.fullmatch(target, x[0])]
    return [x for x in shapes.linears if any(x[0] == t or x[0].endswith(f".{t}") for t in target)]


# ---------------------------------------------------------------------------------------------- activations
# Bytes per token that a block keeps for its backward, as (hidden, mlp) coefficients, by the training precision
# (autocast: bf16 compute over fp32 weights; bf16: FSDP's mixed precision; fp32). Counted op by op from what
# autograd saves in a Qwen2.5-VL decoder layer / vision block, and checked against torch's accounting.
KEEP = {
    "autocast": {"text": (34, 8), "vision": (34, 8)},
    "bf16": {"text": (26, 8), "vision": (32, 8)},
    "fp32": {"text": (40, 16), "vision": (52, 16)},
}
STREAM = {
    "autocast": (4, 2),
    "bf16": (2, 2),
    "fp32": (4, 4),
}  # bytes per unit of a block's input: text, vision
# what lives at once inside one block's forward when it keeps nothing (no grad, or checkpointed), besides its input
TRANSIENT = {
    "autocast": {"text": (4, 6), "vision": (16, 6)},
    "bf16": {"text": (4, 6), "vision": (16, 6)},
    "fp32": {"text": (8, 12), "vision": (32, 12)},
}
# inputs kept only for the weights' gradients, which frozen weights do not need: LoRA's text base, a frozen tower
LORA_BASE_KEPT = {"autocast": (10, 2), "bf16": (4, 2), "fp32": (12, 4)}
FROZEN_VISION_KEPT = {"autocast": (8, 2), "bf16": (6, 2), "fp32": (12, 4)}


def _tokens(s: Setup, rows: int) -> tuple[int, int, int]:
    """Tokens of ``rows`` rows: all (B x S), completion (B x T), vision-tower patches."""
    return rows * s.seq.total, rows * s.seq.response, rows * s.seq.patches


def block_keep(s: Setup, kind: str) -> float:
    """Bytes per token one block keeps for its backward (no checkpointing)."""
    tower = s.shapes.text if kind == "text" else s.shapes.vision
    ch, cm = KEEP[s.mode][kind]
    b = ch * tower.hidden + cm * tower.mlp + 4 * tower.heads + 8
    if kind == "text":
        b += (4 if s.mode == "fp32" else 2) * s.seq.total  # the padding mask, as an additive bias per layer
        if s.lora:
            kh, km = LORA_BASE_KEPT[s.mode]  # a frozen base keeps no input for its weight's gradient
            lo = s.cfg.model.lora
            per_layer = [(i, o) for n, i, o in adapted(s.shapes, s.cfg) if not _is_vision(n)]
            adapters = sum(2 * i + 2 * lo.r + (i if lo.dropout > 0 else 0) for i, _ in per_layer)
            b += adapters / tower.layers - kh * tower.hidden - km * tower.mlp
    elif not s.vision_trainable:
        kh, km = FROZEN_VISION_KEPT[s.mode]
        b -= kh * tower.hidden + km * tower.mlp
    return b


def transient(s: Setup, kind: str) -> float:
    tower = s.shapes.text if kind == "text" else s.shapes.vision
    ch, cm = TRANSIENT[s.mode][kind]
    return ch * tower.hidden + cm * tower.mlp


def weight_copies(s: Setup, *, text: bool = True) -> float:
    """The bf16 copies autocast caches of the fp32 trainable matmul weights until a forward's end (FSDP's bf16
    weights need none, nor the frozen ones, stored in bf16: LoRA's base, a frozen tower); ``text=False``: the vision
    tower's only (what exists while it runs, before the language model)."""
    if s.mode != "autocast":
        return 0.0
    if s.lora:
        return 2.0 * s.adapters
    vision = s.shapes.vision.matmul_params if s.vision_trainable else 0
    return 2.0 * ((s.shapes.text.matmul_params if text else 0) + vision)


def _recast(s: Setup, kind: str) -> float:
    """A checkpointed block recomputed in the backward casts its fp32 trainable matmul weights to bf16 again
    (autocast) and keeps the copies until its backward ends: the whole block, or its adapters under LoRA (the frozen
    weights are stored in bf16)."""
    if s.mode != "autocast":
        return 0.0
    tower = s.shapes.text if kind == "text" else s.shapes.vision
    if s.lora:
        lo, vision = s.cfg.model.lora, kind == "vision"
        adapters = sum(lo.r * (i + o) for n, i, o in adapted(s.shapes, s.cfg) if _is_vision(n) == vision)
        return 2.0 * adapters / tower.layers
    return 2.0 * tower.block_params if kind == "text" or s.vision_trainable else 0.0


def _fsdp_gathered(s: Setup, backward: bool) -> float:
    """FSDP2: the root's weights (embeddings, head, merger) gathered in bf16 for the whole scoring, plus the running
    and the prefetched block; in the backward a block's unsharded fp32 gradient too."""
    if not s.fsdp:
        return 0.0
    sh = s.shapes
    blocks = sh.text.layers * sh.text.block_params + (
        sh.vision.layers * sh.vision.block_params if sh.vision else 0
    )
    block = max(sh.text.block_params, sh.vision.block_params if sh.vision else 0)
    per = DTYPE_BYTES[s.cfg.model.dtype]
    return per * (sh.params - blocks) + 2 * per * block + (2 * 4 * block if backward else 0)


def _head(s: Setup, rows: int, *, entropy: bool, grad: bool, fp32_weight: bool, trainable: bool) -> float:
    """The chunked head (:mod:`mmrl.model.logprobs`): fp32 logits of ``chunk`` rows at a time (a bf16 weight upcast per
    chunk). Its backward recomputes a chunk (about five logits-sized buffers at once); a trainable weight's gradient
    ``4 V h`` is summed over the chunks out of place (three copies at once)."""
    n = rows * s.seq.response
    c = min(s.cfg.model.logits_chunk_tokens, n)
    V, H = s.shapes.vocab, s.shapes.text.hidden
    logits = 4 * c * V
    copy = 0 if fp32_weight else 4 * V * H
    if not grad:
        return max(copy + logits, (2 + entropy) * logits)
    weight_grad = 0
    if trainable:  # one chunk: its gradient and logits; several: the running sum, the next chunk's, their sum
        weight_grad = 4 * V * H + logits if n <= c else 3 * 4 * V * H
    return copy + max(5 * logits, weight_grad)


def _pixel_elements(s: Setup) -> int:
    """Values per patch in ``pixel_values`` (channels x temporal patch x patch x patch)."""
    return s.shapes.in_channels * s.shapes.temporal_patch * s.shapes.patch**2


def _pixels(s: Setup, patches: int, *, policy: bool) -> float:
    """The micro-batch's pixels, collated in ``model.dtype`` (its first parameter's: fp32 for the policy unless that
    is a frozen weight stored in bf16, Qwen's patch embedding under LoRA or freeze_vision), alive through the
    scoring."""
    per = DTYPE_BYTES[s.cfg.model.dtype] if not policy or s.pixels_low else 4
    return per * _pixel_elements(s) * patches


def _vision_extras(s: Setup, patches: int) -> float:
    """What the vision tower keeps besides its blocks: the patch embedding's bf16 input (for a trainable
    embedding), the rotary tables, the merger's saved tensors and its output."""
    v = s.shapes.vision
    conv_input = 2 * _pixel_elements(s) if s.vision_trainable else 0
    return patches * (conv_input + 8 * (v.hidden // v.heads) + 12 * v.hidden + s.shapes.text.hidden)


def _text_extras(s: Setup, rows: int) -> float:
    """What the language model keeps besides its layers: the final norm's tensors and output, rotary tables, the
    positions, the boolean mask (B x S x S) and the completion's hidden states copied for the chunked head."""
    tok, tokc, _ = _tokens(s, rows)
    t = s.shapes.text
    stream = STREAM[s.mode][0]
    head_dim = t.hidden // t.heads
    return (
        tok * ((2 * stream + 4) * t.hidden + 2 * stream * head_dim + 24)
        + rows * s.seq.total**2
        + 4 * t.hidden * tokc
    )


def update_activations(s: Setup) -> dict[str, float]:
    """Peak of one micro-batch's forward and backward, by phase: the forward (the autocast weight copies alive at
    its end), the head's backward, the backward through the top decoder layer and through the top vision block,
    and the embedding's gradient at the very end."""
    rows, ckpt = s.micro, s.cfg.model.gradient_checkpointing
    tok, _, patches = _tokens(s, rows)
    t, v, sh = s.shapes.text, s.shapes.vision, s.shapes
    in_t, in_v = STREAM[s.mode]
    kept_text = t.layers * tok * (in_t * t.hidden if ckpt else block_keep(s, "text")) + _text_extras(s, rows)
    kept_vis = 0.0
    if s.vision_graph and patches:
        kept_vis = v.layers * patches * (in_v * v.hidden if ckpt else block_keep(s, "vision"))
        kept_vis += _vision_extras(s, patches)
    copies = weight_copies(s)  # a frozen base needs none: the bf16 weight it keeps for the backward is stored
    kept_text += _pixels(s, patches, policy=True)
    kept = kept_text + kept_vis + (0.0 if ckpt else copies) + _fsdp_gathered(s, True)
    head_grad = not s.lora  # LoRA freezes the head and the embedding
    tied = 4.0 * sh.vocab * t.hidden if head_grad and sh.head_params == 0 else 0.0  # waits for the embedding
    phases = {
        "forward": kept_text + kept_vis + copies + transient(s, "text") * tok + _fsdp_gathered(s, False),
        "head": kept
        + _head(s, rows, entropy=True, grad=True, fp32_weight=s.mode != "bf16", trainable=head_grad),
        "text backward": kept + tied + 8 * t.hidden * tok + 6 * t.hidden * t.mlp,
        "embedding": (3 * tied or 4.0 * sh.embed_params * head_grad) + (copies if not ckpt else 0.0),
    }
    if ckpt:
        phases["text backward"] += block_keep(s, "text") * tok + _recast(s, "text")
    if kept_vis:
        vision_back = kept_vis + tied + 8 * v.hidden * patches + _fsdp_gathered(s, True)
        if ckpt:
            vision_back += block_keep(s, "vision") * patches + _recast(s, "vision")
        phases["vision backward"] = vision_back
    return phases | {"peak": max(phases.values())}


def nograd_activations(s: Setup, *, policy: bool) -> float:
    """Peak of a no-grad log-prob forward of ``micro_nograd`` rows, the policy's (fp32 master weights, autocast
    copies) or the reference's (``model.dtype`` weights), over its phases: the vision tower (its own weight copies
    only), the language model (all of them, the embeddings, one layer's transient and its mask bias), the head."""
    rows = s.micro_nograd
    tok, tokc, patches = _tokens(s, rows)
    t, v, dtype_bytes = s.shapes.text, s.shapes.vision, DTYPE_BYTES[s.cfg.model.dtype]
    stream = STREAM[s.mode][0] if policy else dtype_bytes
    base = (
        (_fsdp_gathered(s, False) if policy else 0.0)
        + tok * stream * t.hidden
        + _pixels(s, patches, policy=policy)
    )
    copies = weight_copies(s) if policy else 0.0
    lingering = 2 * v.hidden * patches if v is not None else 0  # the tower's output, held by the forward
    phases = [base + copies + 2 * tok * stream * t.hidden + 3 * rows * s.seq.total**2 + lingering]
    phases[0] += transient(s, "text") * tok
    if v is not None and patches:
        autocast = policy and s.mode == "autocast" and not s.pixels_low
        cast = 2 * _pixel_elements(s) if autocast else 0  # the patch embedding's input
        per_patch = 2 * v.hidden + 8 * (v.hidden // v.heads) + max(cast, transient(s, "vision"))
        phases.append(base + (weight_copies(s, text=False) if policy else 0.0) + patches * per_patch)
    if (not policy or s.pixels_low) and dtype_bytes != 4:  # collating: the fp32 pixels and their copy
        phases.append(base + 4 * _pixel_elements(s) * patches)
    fp32_head = (policy and s.mode != "bf16") or dtype_bytes == 4
    entropy = policy and _needs_entropy(s.cfg)
    head = _head(s, rows, entropy=entropy, grad=False, fp32_weight=fp32_head, trainable=False)
    phases.append(base + tokc * 4 * t.hidden + head)
    return max(phases)


def gib(x: float) -> str:
    """Bytes as GiB with two decimals, as the plan prints them."""
    return f"{x / GIB:.2f}"
