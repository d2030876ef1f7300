"""Typed configuration: dataclasses loaded from YAML plus ``key.sub=value`` overrides.

Every field carries its help text once (``help(...)``). Unknown keys are errors that name the key and the nearest
valid one; values are checked against the field's type before anything heavy is built. Reward-specific options live
under each reward's own ``options`` mapping (validated by the reward's signature), never at the top level.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml


class ConfigError(ValueError):
    pass


def opt(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING) -> Any:
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


@dataclass
class LoraConfig:
    r: int = opt("LoRA rank (0 = train the full model)", 0)
    alpha: float = opt("LoRA scaling numerator (the update is alpha / r * B A)", 16.0)
    dropout: float = opt("dropout on the LoRA branch's input (all other dropout stays off)", 0.0)
    target_modules: list[str] | str = opt(
        "module names (or one regex) that get adapters; 'auto': every Linear of the language model, read from the "
        "checkpoint's module names (mmrl.model.layout.lora_targets)",
        "auto",
    )
    vision: bool = opt(
        "with target_modules 'auto', the vision tower's and projector's Linears get adapters too", False
    )
    experts: bool = opt(
        "adapt fused MoE expert weights: refused (peft reaches them only through target_parameters, which mmrl "
        "cannot merge for vLLM or a merged checkpoint); with LoRA the experts stay frozen",
        False,
    )
    save_merged: bool = opt(
        "checkpoints also hold the merged full model (HF format) beside the adapter", False
    )


@dataclass
class ModelConfig:
    path: str = opt("HF model folder or hub id (loaded with from_pretrained)", "assets/tiny-qwen2.5-vl")
    dtype: Literal["float32", "bfloat16"] = opt(
        "compute dtype: bfloat16 runs under autocast over fp32 master weights (frozen copies are stored in it)",
        "float32",
    )
    device: str = opt("'auto' (cuda if present, else cpu), 'cpu', 'cuda', 'cuda:1', ...", "auto")
    attn_implementation: str | None = opt(
        "'auto' (flash_attention_2 on CUDA where flash-attn is installed, else mmrl_sdpa: torch's SDPA that attends "
        "each sequence of a packed micro-batch alone; mmrl/model/attention.py), 'sdpa', 'eager', 'flash_attention_2', or "
        "None for transformers' default",
        "auto",
    )
    gradient_checkpointing: bool = opt("recompute activations in the backward pass to save memory", False)
    min_pixels: int = opt("smallest image size in pixels after smart_resize", 4 * 28 * 28)
    max_pixels: int = opt("largest image size in pixels after smart_resize", 256 * 28 * 28)
    coordinate_frame: Literal["model_pixels", "relative_1000", "relative_1", "original_pixels"] | None = opt(
        "frame the model writes points and boxes in, for grounding rewards and scorers: model_pixels (the resized "
        "image), relative_1000 (0-1000 of width and height), relative_1 (0-1) or original_pixels; None = the "
        "family's own (mmrl.processors.geometry.COORDINATE_FRAMES)",
        None,
    )
    chat_template_kwargs: dict[str, Any] = opt(
        "extra variables for the checkpoint's chat template, e.g. {enable_thinking: false} for Qwen3.5 or GLM-4.5V",
        factory=dict,
    )
    video_max_pixels: int = opt("largest video frame size in pixels", 64 * 28 * 28)
    video_min_pixels: int = opt(
        "smallest video frame size in pixels (qwen-vl-utils' default; lower it for tiny frames)",
        128 * 28 * 28 // 4,
    )
    video_fps: float = opt("frames per second sampled from videos", 2.0)
    video_max_frames: int = opt("most frames taken from one video", 16)
    freeze_vision: bool = opt(
        "keep the vision side's weights fixed (the tower and the projector: all but the language model and its head)",
        False,
    )
    lora: LoraConfig = opt(
        "low-rank adapters (peft); the reference model is the base with adapters disabled", factory=LoraConfig
    )
    logits_chunk_tokens: int = opt(
        "tokens whose full-vocabulary logits exist at once when scoring log-probs (memory: ~3 x chunk x vocab x 4 B)",
        512,
    )
    packing: bool = opt(
        "score a micro-batch as one packed row without padding (positions restart per sequence, M-RoPE included; "
        "each sequence attended alone) where the family and the attention support it (mmrl.model.geometry."
        "packing_support, a varlen attn_implementation); false: left/right-padded rows",
        True,
    )


@dataclass
class DataConfig:
    train: str = opt("training records: .jsonl, .parquet or a saved HF dataset folder", "")
    eval: str | None = opt("held-out records for evaluation during training", None)
    on_bad_record: Literal["error", "skip"] = opt(
        "a record that fails validation stops the run ('error') or is listed in skipped.jsonl ('skip')",
        "error",
    )
    system_prompt: str | None = opt("system message prepended to records that have none", None)
    builder: str | None = opt(
        "'module:function' that writes the records into data.train's folder when data.train does not exist",
        None,
    )
    check_media: bool = opt(
        "decode every image and the first frame of every video while loading, and check their sizes, so bad files "
        "are caught before step 1 (costs about one decode of each image)",
        True,
    )
    max_images_per_record: int = opt(
        "images one record may hold; a record with more is bad (each image adds its vision tokens to all G "
        "rollouts of its group and to the update)",
        64,
    )
    max_pixels_per_record: int = opt(
        "original pixels of all of one record's images at most (384 MB as 8-bit RGB; a processor that tiles gets "
        "them all at once); one image may hold 64M (mmrl.processors.image.DEFAULT_MAX_IMAGE_PIXELS)",
        128_000_000,
    )
    max_prompt_tokens: int | None = opt(
        "text tokens of one record's chat at most, vision tokens not counted (None: no limit). 8192 holds a long "
        "document or a many-turn chat; a runaway record (tens of thousands of tokens) is refused, as every prompt is "
        "held by all G rollouts of its group and by the update",
        8192,
    )
    allowed_special_tokens: list[str] = opt(
        "special tokens record text may hold, encoded as the control tokens they are (e.g. Qwen2-VL's "
        "<|object_ref_start|>); any other special or vision token of the model in a record's text makes it bad",
        factory=list,
    )


@dataclass
class EpisodeConfig:
    """The settings of multi-turn episodes, one type for everything that runs them: ``rollout.episode`` in training
    and SFT warm starts, an env benchmark's options in evaluation (under the same names); the episode driver
    (:func:`mmrl.rollout.episodes.run_episodes`) and the env pool read them from here."""

    max_turns: int = opt("completions per episode at most (the env may end it sooner)", 1)
    env_options: dict[str, Any] = opt(
        "the env's own options, checked against its signature (eval: env_options={max_calls: 2})",
        factory=dict,
    )
    max_total_tokens: int | None = opt(
        "an episode's prompt + response tokens at most: a turn that could pass it does not start", None
    )
    max_images: int | None = opt("images in an episode's context at most (the prompt's included)", None)
    max_context_pixels: int | None = opt(
        "model-input pixels of all images in an episode's context at most (the prompt's included)", None
    )
    image_rule: Literal["downscale", "end"] = opt(
        "over the image budget: 'downscale' an observation's new images to fit, or 'end' the episode",
        "downscale",
    )
    observation_role: Literal["user", "tool"] = opt("the chat role of observation turns", "user")
    env_workers: int = opt("env worker processes (0: in this process, for debugging)", 2)
    env_timeout_s: float = opt("deadline of one env reset or step (the episode ends with an error)", 60.0)
    env_start_timeout_s: float = opt(
        "how long an env worker may take to start, at the run's start and after a restart (a worker that does not "
        "start ends the run)",
        120.0,
    )
    schedule: Literal["lockstep", "continuous"] = opt(
        "'lockstep': each turn, one engine call for every live episode, then all step; 'continuous': an episode "
        "whose step is back generates its next turn while slower steps still run (docs/agents.md#continuous-episodes)",
        "lockstep",
    )
    min_ready: float = opt(
        "continuous: the next engine call starts once this share of the unfinished episodes waits for it (or no "
        "step is running)",
        0.5,
    )
    next_batch_at: float = opt(
        "continuous, in training that runs ahead (rollout.max_staleness >= 1): the next batch's episodes start once at "
        "most this share of this batch's episodes still run (0: each batch starts after the previous one ended; 1: as "
        "soon as the staleness bound allows), so a slow env step at a batch's end holds no engine idle "
        "(docs/async.md#episodes-across-batches)",
        0.0,
    )


@dataclass
class RolloutConfig:
    engine: str = opt("rollout engine (registered): 'hf' (transformers generate) or 'vllm'", "hf")
    engine_options: dict[str, Any] = opt(
        "the engine's own options, e.g. vllm: {gpu_memory_utilization: 0.5, sleep_mode: true}", factory=dict
    )
    n: int = opt("responses per prompt (the group size G)", 8)
    temperature: float = opt("sampling temperature; log-probs are of logits / temperature", 1.0)
    top_p: float = opt("nucleus sampling threshold", 1.0)
    top_k: int = opt("top-k sampling (0 = off)", 0)
    max_new_tokens: int = opt("longest response in tokens; longer ones end with finish_reason 'length'", 64)
    batch_size: int = opt("prompts generated together in one engine call", 16)
    max_staleness: int = opt(
        "asynchronous rollouts: batches may be generated this many policy versions ahead of training (0: each step "
        "generates, then trains, as one process; docs/async.md#asynchronous-rollouts)",
        0,
    )
    placement: Literal["colocated", "separate"] = opt(
        "colocated: every process generates and trains; separate: under a launcher the last "
        "rollout.rollout_processes processes only generate and the others only train, weights pushed to the "
        "generating ones after each update (docs/async.md#separate-placement)",
        "colocated",
    )
    rollout_processes: int = opt("with placement separate: how many of the launched processes generate", 1)
    env: str | None = opt(
        "multi-turn episodes in this env (registered name or module:Class, `mmrl list`); None: one turn each",
        None,
    )
    episode: EpisodeConfig = opt(
        "how episodes run in rollout.env (the env's options, limits, workers)",
        factory=lambda: EpisodeConfig(),
    )


@dataclass
class AlgoConfig:
    preset: str | None = opt(
        "algorithm preset applied before the recipe's own fields: grpo, dr_grpo, dapo, gspo, mssr, spo (mmrl list)",
        None,
    )
    advantage: str = opt(
        "advantage estimator (registered): grpo, dr_grpo, rloo, reinforce_pp, spo, mssr, gigpo, ...", "grpo"
    )
    advantage_options: dict[str, Any] = opt(
        "the estimator's own options (checked against its signature)", factory=dict
    )
    augment: str = opt(
        "batch augmenter (registered): none, aepo: rows the collector adds to each step's batch with advantages of "
        "their own (docs/credit.md#aepo)",
        "none",
    )
    augment_options: dict[str, Any] = opt(
        "the augmenter's own options (checked against its signature)", factory=dict
    )
    loss: str = opt("policy loss (registered): clipped, gspo, reg_grpo", "clipped")
    loss_options: dict[str, Any] = opt(
        "extra options of the loss function (checked against its signature)", factory=dict
    )
    loss_agg: str = opt(
        "how token losses become one number (registered): token-mean, seq-mean-token-mean, seq-mean-token-sum-norm",
        "token-mean",
    )
    loss_agg_constant: float | None = opt(
        "divisor for seq-mean-token-sum-norm (Dr. GRPO); None = max_new_tokens", None
    )
    clip_low: float = opt("epsilon_low of the clipped ratio", 0.2)
    clip_high: float = opt("epsilon_high of the clipped ratio (DAPO uses 0.28)", 0.2)
    dual_clip: float | None = opt("dual-clip constant c for negative advantages (None = off)", 3.0)
    kl_coef: float = opt("beta of the KL to the frozen reference model (0 = no reference model)", 0.0)
    kl_estimator: str = opt("per-token KL estimator (registered): k1, k2, k3", "k3")
    kl_in: Literal["loss", "reward"] = opt(
        "the KL is a loss term, or a penalty subtracted from each reward", "loss"
    )
    entropy_coef: float = opt(
        "entropy bonus: the loss subtracts this times the aggregated token entropy", 0.0
    )
    reward_correction: str = opt("noisy-verifier correction (registered): none, backward, forward", "none")
    fp_rate: float = opt("the verifier's false-positive rate r0 (reward corrections)", 0.0)
    fn_rate: float = opt("the verifier's false-negative rate r1 (reward corrections)", 0.0)
    dynamic_sampling: bool = opt(
        "DAPO: drop groups whose rewards are all equal and sample more prompts until the batch is full", False
    )
    max_sampling_tries: int = opt("dynamic sampling: most rollout rounds per step before a clear error", 10)
    epochs: int = opt("policy updates over each rollout batch (old log-probs fixed)", 1)
    mini_batches: int = opt("optimizer steps per epoch over the rollout batch", 1)
    old_logprobs: Literal["rollout", "recompute", "interpolate"] = opt(
        "take pi_old from the rollout engine, recompute it with a training forward, or interpolate decoupled "
        "PPO's proximal policy per token from the engine's log-probs, the trained policy's and each token's version "
        "(no extra forward; docs/async.md#interpolating-the-proximal-policy)",
        "rollout",
    )
    rollout_correction: str = opt(
        "rollout/training mismatch correction (registered): none, tis_token, tis_seq, mask_token, mask_seq; "
        "needs old_logprobs: recompute",
        "none",
    )
    rollout_correction_cap: float = opt(
        "C of the rollout correction: weights capped at C (tis_*), or ratios outside [1/C, C] dropped (mask_*)",
        2.0,
    )
    adv_eps: float = opt("eps in (r - mean) / (std + eps)", 1e-6)


@dataclass
class OptimConfig:
    lr: float = opt("AdamW learning rate", 1e-6)
    weight_decay: float = opt("AdamW weight decay", 0.0)
    betas: tuple[float, float] = opt("AdamW betas", (0.9, 0.999))
    grad_clip: float = opt("max global gradient norm (0 = off)", 1.0)
    warmup_steps: int = opt("linear warm-up steps", 0)
    scheduler: Literal["constant", "linear", "cosine"] = opt(
        "learning-rate schedule after warm-up", "constant"
    )
    schedule_steps: int | None = opt(
        "steps the schedule spans (None = train.max_steps); fix it when a run stopped early will be resumed further",
        None,
    )
    micro_batch_size: int = opt(
        "sequences per forward/backward (gradient accumulation inside a mini-batch)", 16
    )
    micro_batch_tokens: int = opt(
        "token budget of a micro-batch (prompt + completion tokens); rows are grouped by length into micro-batches "
        "under it (at least one row each) instead of micro_batch_size rows in draw order; 0 = off",
        0,
    )


@dataclass
class SamplerConfig:
    name: str = opt("prompt sampler (registered): uniform, vade (docs/algorithms.md#vade)", "uniform")
    options: dict[str, Any] = opt("sampler options", factory=dict)


@dataclass
class RewardEntry:
    name: str = opt("registered reward name or path/to/file.py:function", "")
    weight: float = opt("weight in the composite reward", 1.0)
    options: dict[str, Any] = opt("the reward's own options", factory=dict)


@dataclass
class EvalConfig:
    every: int = opt("evaluate every N steps (0 = only at start and end)", 0)
    max_samples: int = opt("held-out records scored per evaluation", 200)
    temperature: float = opt("0 = greedy decoding", 0.0)
    max_new_tokens: int | None = opt("None = rollout.max_new_tokens", None)
    group_by: str | None = opt("also report eval/accuracy/<value> for each value of this metadata key", None)
    rewards: list[RewardEntry] = opt(
        "the rewards held-out records are scored with (empty: the run's rewards); a run trained without labels "
        "(ttrl, scope, empo) names a labeled one here, e.g. [{name: exact_match}], to measure its true accuracy",
        factory=list,
    )
    success_threshold: float = opt(
        "a held-out response counts as correct when its reward is at least this", 1.0
    )
    benchmark: str | None = opt(
        "score held-out responses with this benchmark's scorer (mmrl eval's: mathvista, mathv, screenspot, table, "
        "pathvqa, videoqa) instead of the rewards",
        None,
    )
    benchmark_data: str | None = opt("the benchmark's data file or folder, in its published layout", None)
    benchmark_options: dict[str, Any] = opt("the benchmark's options (e.g. screenspot coords)", factory=dict)


@dataclass
class TrainConfig:
    seed: int = opt("seed for data order, sampling and initialisation", 0)
    prompts_per_step: int = opt("prompts per training step (each gets rollout.n responses)", 16)
    max_steps: int = opt("training steps", 100)
    save_every: int = opt("checkpoint every N steps (0 = only at the end)", 0)
    keep_checkpoints: int = opt("most recent checkpoints kept (0 = all)", 2)
    tensorboard: bool = opt("also write TensorBoard event files (as tensorboard in train.trackers)", False)
    trackers: list[str] = opt(
        "experiment trackers that get every metrics.jsonl row and the logged rollouts' images: tensorboard, wandb, "
        "mlflow, swanlab (optional packages: pip install 'mmrl[trackers]'; mmrl/run/trackers.py)",
        factory=list,
    )
    tracker_options: dict[str, dict[str, Any]] = opt(
        "options by tracker, e.g. {wandb: {project: p, mode: online}, mlflow: {tracking_uri: http://host:5000}}",
        factory=dict,
    )
    progress: bool = opt(
        "show progress: a bar on a terminal, a plain line every few steps in a log file", True
    )
    reward_workers: int = opt("worker processes for heavy (rendering) rewards", 2)
    reward_timeout_s: float = opt("per-item timeout of a heavy reward", 30.0)
    overlap_rewards: bool = opt(
        "score each chunk of groups (with vLLM, each group) as soon as it is generated, in a background thread "
        "(heavy rewards in the reward pool), overlapping the rest of generation and the old/reference log-prob "
        "passes (time/reward is then the wait, time/reward_compute the scoring)",
        True,
    )
    keep_renders: bool = opt(
        "rendering rewards keep what they rendered for the groups logged in rollouts.jsonl, under "
        "DIR/renders/step-N/<group>-<response>/ (the report's gallery shows them)",
        False,
    )
    prompt_cache_mb: int = opt(
        "memory for encoded prompts (tensors and resized media), least recently used out", 1024
    )
    fsdp: bool | None = opt(
        "shard the policy over the processes with FSDP2 (mmrl/model/fsdp.py); null: when the launcher asks "
        "(accelerate's FSDP configs); ignored in one process",
        None,
    )
    dist_timeout_s: float = opt(
        "timeout of a collective between processes; it must outlast the longest work one rank does while the others "
        "wait (writing a checkpoint, the last evaluation batch); NCCL's own default is 600 s",
        3600.0,
    )
    image_check_every: int = opt(
        "check at step 1 and every N steps (0 = off) that the media reach the policy and the rollout engine: a few "
        "rows with images or videos are scored with their media and with the media blanked, sanity/* is logged, and "
        "the run stops when the media change nothing (mmrl/train/image_check.py)",
        50,
    )
    image_check_rows: int = opt("rows with media the image check scores (train.image_check_every)", 4)


@dataclass
class SFTConfig:
    lr: float = opt("AdamW learning rate for the supervised warm start", 1e-3)
    steps: int = opt("optimizer steps", 200)
    batch_size: int = opt("records per step", 16)
    max_records: int | None = opt("use only the first N training records (None = all)", None)
    label_smoothing: float = opt(
        "cross-entropy label smoothing: a less over-confident warm start explores in RL", 0.0
    )


@dataclass
class HardwareConfig:
    name: str | None = opt("the GPU the run is written for, in words (e.g. 'H100 80GB')", None)
    gpus_per_node: int = opt("GPUs per node (one process each)", 1)
    nodes: int = opt("nodes", 1)
    gpu_memory_gib: float | None = opt(
        "memory of one GPU in GiB (torch.cuda.mem_get_info's total); mmrl plan checks the run against it (None: 80)",
        None,
    )


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    rewards: list[RewardEntry] = field(default_factory=list)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; build nested dataclasses; return the typed value."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is Literal:
        if value not in args:
            near = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}{hint}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return from_dict(tp, value, prefix=where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{where}: expected {len(args)} values, got {len(value)}")
            return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        item = args[0] if args else Any
        out = [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # PyYAML (YAML 1.1) reads 1e-6, with no dot, as a string
        try:
            return float(value.strip())
        except ValueError:
            pass
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp in (str, float) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    return value


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        where = f"{prefix}.{key}" if prefix else key
        if key not in names:
            near = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
            hint = f"; did you mean '{(prefix + '.' if prefix else '') + near[0]}'?" if near else ""
            raise ConfigError(f"unknown config key '{where}'{hint} (valid here: {', '.join(names)})")
        kwargs[key] = _coerce(value, hints[key], where)
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        return v

    return conv(cfg)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` strings (value parsed as YAML) to a nested dict; list items by index: ``rewards.0.weight=2``."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw != "" else ""
        node: Any = data
        parts = key.split(".")
        for p in parts[:-1]:
            if isinstance(node, list):
                node = node[int(p)]
            else:
                node = node.setdefault(p, {})
        if isinstance(node, list):
            node[int(parts[-1])] = value
        else:
            node[parts[-1]] = value
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        data = yaml.safe_load(p.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping")
        base = p.resolve().parent
        data = _resolve_paths(data, base)
    overrides = list(overrides or [])
    data = apply_preset(data, on_top=False)  # a recipe's preset lies under the recipe's own fields
    cli_preset = [o for o in overrides if o.split("=", 1)[0] == "algo.preset"]
    if (
        cli_preset
    ):  # a preset named on the command line overrides the recipe; later key=value overrides it in turn
        data = apply_preset(apply_overrides(data, cli_preset[-1:]), on_top=True)
    data = apply_overrides(data, [o for o in overrides if o not in cli_preset])
    return from_dict(Config, data)


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_preset(data: dict[str, Any], *, on_top: bool) -> dict[str, Any]:
    """Apply ``algo.preset: NAME``. In a recipe the preset lies under the recipe's fields (``on_top=False``); named on
    the command line it lies over them (``on_top=True``). Other command-line overrides always win."""
    name = data.get("algo", {}).get("preset") if isinstance(data.get("algo"), dict) else None
    if name is None:
        return data
    from mmrl.presets import PRESETS

    if name not in PRESETS:
        near = difflib.get_close_matches(str(name), list(PRESETS), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"algo.preset: unknown preset {name!r}{hint} (known: {', '.join(sorted(PRESETS))})")
    return _deep_merge(data, PRESETS[name]) if on_top else _deep_merge(PRESETS[name], data)


def _resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Paths in a recipe are relative to the recipe file, unless they exist relative to the working directory."""
    for section, key in (("data", "train"), ("data", "eval"), ("model", "path"), ("eval", "benchmark_data")):
        v = data.get(section, {}).get(key) if isinstance(data.get(section), dict) else None
        if isinstance(v, str) and v and not Path(v).is_absolute() and not Path(v).exists():
            cand = base / v
            if cand.exists() or section == "data":
                data[section][key] = str(cand)
    return data
