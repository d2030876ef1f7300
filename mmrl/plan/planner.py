"""``mmrl plan``: the memory a training run needs on each GPU, stage by stage, before anything launches.

Arithmetic over the run's config and the checkpoint's shapes, read from its ``config.json`` with the model built on
the meta device (no weights read; a hub id is looked up in the HF cache, then in ``mmrl/plan/configs/``). The model
of memory (weights, gradients, AdamW, the reference, vLLM awake and asleep, the reward models colocated on each rank,
the update's and the no-grad passes' activations op by op, what lives outside torch's allocator) and how the prompt and episode lengths are chosen are
written out in docs/scaling.md#how-the-plan-is-computed; the per-token arithmetic is :mod:`mmrl.plan.memory`.

Invariants: every stage's total is per rank (one process per GPU); FSDP divides the policy's weights, gradients and
optimizer state by the world size but not the reference; the verdict compares each stage with the GPU
(``--gpu-memory``, else ``hardware.gpu_memory_gib``, else 80 GiB), and a run that does not fit gets the cheapest change
that does, each candidate planned again, in this order: a smaller micro-batch, gradient checkpointing, a smaller vLLM
share, a smaller generation batch (separate placement), the reward models offloaded, FSDP, LoRA, more GPUs.

A separate placement (``rollout.placement: separate``, docs/async.md#separate-placement) plans its two kinds of GPU
apart (:func:`_separate`): a training GPU (the world is the launched processes less ``rollout.rollout_processes``; no
rollout, the held-out evaluation's generation instead, rank 0's weight push) and a generating GPU (a one-process run's
rollout side: the engine's copy of the policy, its KV cache and generation, the reward models, the bucket a push is
received into); the run fits when both do.

``benchmarks/plan_accuracy.py`` holds the components to torch's own accounting of a real 3B and 7B step (within 1-8%
each).
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass, field, replace

from mmrl.config import Config, ConfigError, apply_overrides, from_dict, to_dict
from mmrl.plan.memory import (
    DTYPE_BYTES,
    GIB,
    ConfigNotLocal,
    PlanOptions,
    Sequence,
    Setup,
    adapted,
    gib,
    nograd_activations,
    reward_model_shape,
    setup,
    transient,
    update_activations,
    weight_copies,
)

CUDA_CONTEXT = 1.0 * GIB  # per process, outside torch's allocator: CUDA context, cuBLAS and NCCL workspaces
ALLOCATOR_SLACK = 0.05  # of torch's peak: blocks the caching allocator holds but cannot hand out
VLLM_DEFAULT_UTILIZATION = 0.3  # mmrl/rollout/vllm.py's default gpu_memory_utilization
VLLM_OWN_GPU_UTILIZATION = (
    0.85  # its default in a separate placement's generating process (VLLMEngine own_process)
)
VLLM_WORKSPACE = 2.0 * GIB  # vLLM's profiled activations, sampler and CUDA graphs while awake (an estimate)
VLLM_ASLEEP = 1.0 * GIB  # what a level-1-asleep engine keeps on the GPU (CUDA graphs, buffers; an estimate)
STAGES = ("rollout", "log-probs", "update", "weight sync")
# a separate placement's two kinds of GPU: the training processes evaluate instead of generating; the generating ones
# receive the pushed weights while they generate (the engine paused between two decoding steps, its KV cache kept)
TRAIN_STAGES = ("evaluation", "log-probs", "update", "weight sync")
GEN_STAGES = ("rollout", "weight receive")
# mmrl.train.placement.BUCKET_BYTES (tested equal): the most bytes one pushed bucket holds
BUCKET_BYTES = 64 * 2**20


# ---------------------------------------------------------------------------------------------- vLLM
@dataclass(frozen=True)
class Engine:
    """A colocated vLLM engine's share of one GPU."""

    weights: float
    kv_cache: float
    workspace: float
    sleep: bool
    kv_tokens: int  # tokens the KV cache holds
    max_model_len: int
    tp: int


def engine(s: Setup) -> Engine | None:
    if s.cfg.rollout.engine != "vllm":
        return None
    o, sh = s.cfg.rollout.engine_options, s.shapes
    tp = int(o.get("tensor_parallel_size", 1))
    per = DTYPE_BYTES.get(str(o.get("dtype", s.cfg.model.dtype)), 2)
    weights = per * sh.params / tp
    if o.get("kv_cache_memory_bytes") is not None:
        kv = float(o["kv_cache_memory_bytes"])
    else:
        util = float(o.get("gpu_memory_utilization", VLLM_DEFAULT_UTILIZATION))
        kv = max(0.0, util * s.hw.gpu_gib * GIB - weights - VLLM_WORKSPACE)
    t = sh.text
    kv_per_token = 2 * t.layers * max(1, t.kv_heads // tp) * (t.hidden // t.heads) * per
    # on by default on CUDA, but never when it runs ahead of training (it keeps generating while the trainer updates)
    sleep = bool(o.get("sleep_mode", s.cfg.rollout.max_staleness == 0))
    max_len = int(o.get("max_model_len", sh.max_positions))
    return Engine(weights, kv, VLLM_WORKSPACE, sleep, int(kv // kv_per_token), max_len, tp)


# ---------------------------------------------------------------------------------------------- reward models
# the built-in rewards that load a model on each rank: (role, where its options sit in the reward's: None = its own)
REWARD_MODELS = {
    "judge": (("judge", None),),
    "embedding_similarity": (("encoder", None),),
    "medix": (("judge", "judge"), ("encoder", "embedding")),
    "arena": (("judge", None),),
}


@dataclass(frozen=True)
class RewardModel:
    """A reward's model on this rank's GPU (:mod:`mmrl.rewards.local_model`: one copy per process, on the rank's own
    device), by stage: ``awake`` while rewards are scored, ``asleep`` between the calls (vLLM's level-1 sleep, or
    the weights moved to host memory, with ``offload``). ``None``: its size is unknown (no config.json here)."""

    name: str  # the plan's row
    key: str  # where its options are overridden: rewards.0.options.judge
    path: str
    engine: str  # vllm, hf
    offload: bool
    share: float  # a vLLM judge's gpu_memory_utilization
    weights: float | None
    awake: float | None
    asleep: float | None
    needs: float | None = None  # what a vLLM judge's share must hold to start (see _reward_model)


def reward_models(s: Setup) -> list[RewardModel]:
    """The judges and encoders of the run's rewards that live on the GPU (not ``device: cpu``), their options
    completed by the reward functions' own defaults."""
    from mmrl.rewards.base import REWARDS

    out: list[RewardModel] = []
    for i, entry in enumerate(s.cfg.rewards):
        for role, nested in REWARD_MODELS.get(entry.name, ()):
            given = entry.options.get(nested) if nested else entry.options
            reward = "judge" if role == "judge" else "embedding_similarity"
            params = inspect.signature(REWARDS.get(reward).fn).parameters
            o = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
            o |= given if isinstance(given, dict) else {}
            if str(o["device"]) == "cpu":
                continue
            label, key = entry.name, f"rewards.{i}.options"
            if nested:
                label, key = f"{label}.{nested}", f"{key}.{nested}"
            if any(f"({label})" in m.name for m in out):
                label += f" #{i}"
            out.append(_reward_model(s, role, o, label, key))
    return out


def _reward_model(s: Setup, role: str, o: dict, label: str, key: str) -> RewardModel:
    vllm, offload = role == "judge" and o["engine"] == "vllm", bool(o["offload"])
    kind = "encoder" if role == "encoder" else "image_judge" if o["use_image"] else "judge"
    try:
        shape = reward_model_shape(str(o["model"]), kind)
    except (ConfigNotLocal, ValueError, OSError):
        shape = None
    if role == "encoder":  # loaded in the checkpoint's own dtype (transformers' default)
        per = DTYPE_BYTES.get(shape.dtype if shape and shape.dtype else "float32", 4)
    else:  # the judge's dtype option; auto: bf16 on a GPU (mmrl.rewards.local_model.resolve_dtype, vLLM alike)
        per = DTYPE_BYTES.get(str(o["dtype"]), 2)
    weights = None if shape is None else float(per * shape.params)
    share = float(o["gpu_memory_utilization"]) if vllm else 0.0
    needs = None
    if vllm:
        awake: float | None = share * s.hw.gpu_gib * GIB
        asleep = VLLM_ASLEEP if offload else awake
        if shape is not None:  # vLLM refuses an engine whose KV cache cannot hold one max_model_len sequence
            needs = per * shape.params + VLLM_WORKSPACE + shape.kv_per_token * shape.max_positions
    else:
        awake, asleep = weights, (0.0 if offload or weights is None else weights)
    return RewardModel(
        name=f"{'vLLM judge' if vllm else role} ({label})",
        key=key,
        path=str(o["model"]),
        engine=o["engine"] if role == "judge" else "hf",
        offload=offload,
        share=share,
        weights=weights,
        awake=awake,
        asleep=asleep,
        needs=needs,
    )


def scoring_stages(cfg: Config) -> tuple[str, ...]:
    """The stages a reward model is awake in. Rewards are resolved before the update: they are scored while the
    old/reference log-prob passes run (``train.overlap_rewards``) or waited for just before them (the same memory
    but those passes' activations), and, for the HF engine's chunks of a single-turn rollout, while the next chunk
    generates, and for the vLLM engine's groups as each finishes while the others generate
    (:meth:`mmrl.train.collect.Collector.one_round`)."""
    from mmrl.train.collect import reward_uses_vllm

    overlapped = cfg.train.overlap_rewards and not cfg.rollout.env and cfg.rollout.engine in ("hf", "vllm")
    if cfg.rollout.engine == "vllm" and any(reward_uses_vllm(r.options) for r in cfg.rewards):
        overlapped = (
            False  # a vLLM judge never runs while the policy's engine steps (Collector.judges_in_process)
        )
    return ("rollout", "log-probs") if overlapped else ("log-probs",)


def _reward_rows(s: Setup) -> dict[str, dict[str, float]]:
    awake_in = scoring_stages(s.cfg)
    return {
        m.name: {st: (m.awake if st in awake_in else m.asleep) or 0.0 for st in STAGES}
        for m in reward_models(s)
        if m.awake is not None
    }


# ---------------------------------------------------------------------------------------------- stages
@dataclass
class Plan:
    setup: Setup
    rows: dict[str, dict[str, float]]  # component -> stage -> bytes
    totals: dict[str, float]  # stage -> bytes
    peak_stage: str
    problems: list[str] = field(default_factory=list)  # reasons it cannot start, besides the peak
    update: dict[str, float] = field(default_factory=dict)  # the update's activation phases
    advice: list[str] | None = None  # the cheapest change that fits (overrides and options), when it does not
    stages: tuple[str, ...] = STAGES  # the keys of every row and of the totals
    role: str = "GPU"  # a separate placement's plans: "training GPU", "generating GPU"
    # a separate placement's generating GPU (this plan is then the training GPU's)
    generating: Plan | None = None

    @property
    def peak(self) -> float:
        return self.totals[self.peak_stage]

    @property
    def capacity(self) -> float:
        return self.setup.hw.gpu_gib * GIB

    @property
    def fits(self) -> bool:
        return (
            self.peak <= self.capacity
            and not self.problems
            and (self.generating is None or self.generating.fits)
        )

    @property
    def groups(self) -> list[Plan]:
        """The plans of each kind of GPU: this one, and a separate placement's generating GPU."""
        return [self] if self.generating is None else [self, self.generating]

    @property
    def worst(self) -> float:
        """The highest peak over the kinds of GPU (the peak, colocated): what the advice lowers."""
        return max(g.peak for g in self.groups)


def plan_run(cfg: Config, opts: PlanOptions | None = None, *, advise: bool = True) -> Plan:
    """The memory budget of ``cfg`` per rank, stage by stage; with ``advise``, the cheapest change that fits."""
    s = setup(cfg, opts)
    if s.hw.generating:
        p = _separate(cfg, s, opts or PlanOptions())
    else:
        p = _assemble(s, _components(s), STAGES, _problems(s), update_activations(s))
    if advise and not p.fits:
        p.advice = _advice(cfg, opts or PlanOptions())
    return p


def _assemble(
    s: Setup,
    rows: dict[str, dict[str, float]],
    stages: tuple[str, ...],
    problems: list[str],
    update: dict[str, float],
    role: str = "GPU",
) -> Plan:
    """One kind of GPU's plan: its rows, the allocator's slack over torch's part, each stage's total and the peak."""
    torch_part = {st: sum(v[st] for k, v in rows.items() if _torch(k)) for st in stages}
    rows["allocator slack"] = {st: ALLOCATOR_SLACK * torch_part[st] for st in stages}
    totals = {st: sum(v[st] for v in rows.values()) for st in stages}
    return Plan(s, rows, totals, max(stages, key=totals.get), problems, update, stages=stages, role=role)


def _torch(row: str) -> bool:
    """Whether a row is memory torch's caching allocator hands out (not vLLM's, the policy's or a judge's, nor the
    CUDA context)."""
    return not row.startswith("vLLM") and row not in ("CUDA context", "allocator slack")


def torch_peak(p: Plan) -> tuple[float, str]:
    """The bytes torch's caching allocator hands out at the plan's peak (``torch.cuda.max_memory_allocated``'s
    measure: no CUDA context, no vLLM, no allocator slack), and the stage where it happens."""
    part = {st: sum(v[st] for k, v in p.rows.items() if _torch(k)) for st in p.stages}
    stage = max(p.stages, key=part.get)
    return part[stage], stage


def _components(s: Setup) -> dict[str, dict[str, float]]:
    e = engine(s)
    train = s.trainable / s.shard
    ref = _reference(s)
    grads = 4.0 * train
    logprobs = _logprob_activations(s)
    rows = {
        "policy weights (fp32)": _every(_policy_weights(s)),
        "gradients (fp32)": _every(grads) if s.ddp else _only("update", grads),
        "AdamW state (2 x fp32)": _every(8.0 * train),
        "reference model": _every(ref),
        "activations": {
            "rollout": _hf_generation(s) if e is None else 0.0,
            "log-probs": logprobs,
            "update": max(update_activations(s)["peak"], 4.0 * train),  # the step's foreach temporaries
            "weight sync": _sync_transient(s) if e is not None else 0.0,
        },
        "CUDA context": _every(CUDA_CONTEXT),
    }
    if e is not None:
        rows |= _engine_rows(e)
    rows |= _reward_rows(s)
    return {k: {st: float(v.get(st, 0.0)) for st in STAGES} for k, v in rows.items()}


def _reference(s: Setup) -> float:
    """The frozen reference copy, in ``model.dtype``, not sharded (0 without KL, or under LoRA)."""
    return DTYPE_BYTES[s.cfg.model.dtype] * s.shapes.params if s.ref_copy else 0.0


def _logprob_activations(s: Setup) -> float:
    """The no-grad passes' peak: pi_old recomputed, the reference's, LoRA's policy with its adapters off."""
    return max(
        nograd_activations(s, policy=True) if s.old_forward else 0.0,
        nograd_activations(s, policy=False) if s.ref_copy else 0.0,
        nograd_activations(s, policy=True) if s.lora and s.cfg.algo.kl_coef > 0 else 0.0,
    )


def _policy_weights(s: Setup) -> float:
    """fp32 master weights (adapters included), the frozen Linear/Conv weights in ``model.dtype``; sharded by FSDP."""
    low = DTYPE_BYTES[s.cfg.model.dtype] * s.frozen_low
    return (4.0 * (s.shapes.params + s.adapters - s.frozen_low) + low) / s.shard


def _engine_rows(e: Engine) -> dict[str, dict[str, float]]:
    """vLLM is awake for the rollout; asleep (level 1) through the log-probs and the update; the weight sync wakes
    the weights, and the KV cache only after it. Without sleep mode it keeps everything throughout."""
    if not e.sleep:
        return {
            "vLLM weights": _every(e.weights),
            "vLLM KV cache and workspace": _every(e.kv_cache + e.workspace),
        }
    return {
        "vLLM weights": {"rollout": e.weights, "weight sync": e.weights},
        "vLLM KV cache and workspace": {"rollout": e.kv_cache + e.workspace},
        "vLLM asleep": {"log-probs": VLLM_ASLEEP, "update": VLLM_ASLEEP},
    }


def _every(x: float, stages: tuple[str, ...] = STAGES) -> dict[str, float]:
    return dict.fromkeys(stages, x)


def _only(stage: str, x: float) -> dict[str, float]:
    return {stage: x}


def _hf_generation(s: Setup) -> float:
    """The HF engine's ``generate``: ``rollout.batch_size x n`` sequences at once, their bf16 KV cache, the autocast
    weight copies (one autocast region around the whole call), the prefill's transient and the step's logits."""
    return sum(_hf_generation_parts(s).values())


def rollout_sequences(s: Setup) -> int:
    """Sequences one HF ``generate`` call holds: ``rollout.batch_size`` prompts (fewer when the rank has fewer) x n."""
    c = s.cfg
    return max(1, min(c.rollout.batch_size, c.train.prompts_per_step // s.hw.world)) * c.rollout.n


def _hf_generation_parts(s: Setup, seqs: int | None = None, seq: Sequence | None = None) -> dict[str, float]:
    """:func:`_hf_generation`'s terms: the KV cache of ``seqs`` sequences of ``seq`` (default: the rollout's), and
    the rest (the autocast weight copies, FSDP's gathered weights, the prefill's transient, the step's logits)."""
    c, t, q = s.cfg, s.shapes.text, seq or s.seq
    seqs = rollout_sequences(s) if seqs is None else seqs
    kv = 2 * t.layers * t.kv_heads * (t.hidden // t.heads) * 2 * seqs * q.total
    prefill = seqs * q.prompt * (transient(s, "text") + 12 * t.hidden) + seqs * q.prompt**2
    gathered = DTYPE_BYTES[c.model.dtype] * s.shapes.params if s.fsdp else 0.0  # Policy.full_weights
    return {"kv": kv, "rest": weight_copies(s) + gathered + prefill + 4 * 4 * seqs * s.shapes.vocab}


def _sync_transient(s: Setup) -> float:
    """The weight sync streams one tensor at a time in the engine's dtype (the largest: the embedding); a LoRA layer
    is merged in fp32 (base, delta, sum)."""
    sh = s.shapes
    largest = max([sh.embed_params] + [i * o for _, i, o in sh.linears])
    merge = 12.0 * max((i * o for _, i, o in adapted(sh, s.cfg)), default=0) if s.lora else 0.0
    return 2.0 * largest + merge


def _problems(s: Setup) -> list[str]:
    """What stops the run from starting whatever the peak: vLLM's KV cache too small for one sequence, a vLLM judge
    whose share cannot hold its weights, workspace and one sequence."""
    return _judge_problems(s) + _engine_problems(s)


def _judge_problems(s: Setup) -> list[str]:
    return [
        f"{m.name}: its gpu_memory_utilization {m.share:g} ({gib(m.awake or 0.0)} GiB) cannot hold its weights "
        f"({gib(m.weights or 0.0)} GiB), vLLM's workspace and one max_model_len of KV cache ({gib(m.needs)} GiB "
        f"in all): vLLM refuses to start it (set {fix})"
        for m, fix in _judge_fixes(s)
    ]


def _judge_fixes(s: Setup) -> list[tuple[RewardModel, str]]:
    """Each vLLM judge whose share is too small to start, with the smallest share that is not (steps of 0.05)."""
    gpu = s.hw.gpu_gib * GIB
    return [
        (m, f"{m.key}.gpu_memory_utilization={math.ceil(m.needs / gpu / 0.05 - 1e-9) * 0.05:.2f}")
        for m in reward_models(s)
        if m.needs is not None and m.needs > (m.awake or 0.0)
    ]


def _engine_problems(s: Setup) -> list[str]:
    e = engine(s)
    if e is None:
        return []
    need = min(e.max_model_len, s.shapes.max_positions)
    if e.kv_tokens < need:
        return [
            f"vLLM's KV cache holds {e.kv_tokens:,} tokens, fewer than max_model_len {need:,}: vLLM refuses to "
            f"start (set rollout.engine_options.max_model_len: {s.seq.total} or raise gpu_memory_utilization)"
        ]
    if e.kv_tokens < s.seq.total:
        return [f"vLLM's KV cache holds {e.kv_tokens:,} tokens, fewer than one sequence ({s.seq.total:,})"]
    return []


# ---------------------------------------------------------------------------------------------- separate placement
def _separate(cfg: Config, s: Setup, opts: PlanOptions) -> Plan:
    """A separate placement: the training GPU's plan (``s``: its world is the training processes), holding the
    generating GPU's as ``generating``."""
    g = generating_setup(cfg, opts)
    train = _assemble(
        s,
        _training_components(s),
        TRAIN_STAGES,
        _judge_problems(s) + _separate_problems(s),
        update_activations(s),
        role="training GPU",
    )
    train.generating = _assemble(
        g, _generating_components(g, s), GEN_STAGES, _engine_problems(g), {}, role="generating GPU"
    )
    return train


def generating_setup(cfg: Config, opts: PlanOptions) -> Setup:
    """A generating process as memory sees it: a one-process run's rollout side on one GPU (no FSDP, no DDP; the
    policy loaded as the trainer loads it, :func:`mmrl.train.placement.serve`), its collector generating its share
    of the step's prompts (``Dist.rollouts``: ``rollout.rollout_processes`` share a batch)."""
    gen = copy.deepcopy(cfg)
    gen.rollout.placement, gen.train.fsdp = "colocated", False
    if gen.rollout.engine == "vllm":  # vLLM has the generating GPU to itself, and never sleeps there
        gen.rollout.engine_options.setdefault("gpu_memory_utilization", VLLM_OWN_GPU_UTILIZATION)
        gen.rollout.engine_options["sleep_mode"] = False
    gen.train.prompts_per_step = max(1, cfg.train.prompts_per_step // max(1, cfg.rollout.rollout_processes))
    return setup(gen, replace(opts, gpus=1, nodes=1))


def evaluates(cfg: Config) -> bool:
    """Whether the run generates held-out responses (``data.eval`` or ``eval.benchmark``)."""
    return bool(cfg.data.eval) or cfg.eval.benchmark is not None


def eval_sequences(s: Setup) -> tuple[int, Sequence]:
    """A held-out evaluation's ``generate`` on a training rank: one greedy response for each of up to
    ``rollout.batch_size`` of its share of ``eval.max_samples`` records, ``eval.max_new_tokens`` long (an episode's
    longest, in an env)."""
    c = s.cfg
    seqs = max(1, min(c.rollout.batch_size, math.ceil(c.eval.max_samples / s.hw.world)))
    if c.rollout.env:
        return seqs, s.seq
    return seqs, replace(s.seq, response=c.eval.max_new_tokens or c.rollout.max_new_tokens)


def _eval_generation(s: Setup) -> float:
    if not evaluates(s.cfg):
        return 0.0
    seqs, seq = eval_sequences(s)
    return sum(_hf_generation_parts(s, seqs, seq).values())


def bucket_bytes(s: Setup) -> float:
    """One pushed bucket (:func:`mmrl.train.placement.buckets`): at most ``BUCKET_BYTES`` of consecutive trained
    parameters, a bigger one alone (the embedding, in fp32 as the policy keeps it); LoRA pushes only its adapters."""
    sh = s.shapes
    if s.lora:
        largest = max((s.cfg.model.lora.r * max(i, o) for _, i, o in adapted(sh, s.cfg)), default=0)
    else:
        largest = max([sh.embed_params, sh.head_params] + [i * o for _, i, o in sh.linears])
    return float(max(BUCKET_BYTES, 4 * largest))


def push_transient(s: Setup) -> float:
    """Training rank 0 packs one bucket at a time into a flat tensor; under FSDP2 the bucket's parameters are first
    gathered whole (``full_tensor``), so two buckets' bytes live at once."""
    return (2.0 if s.fsdp else 1.0) * bucket_bytes(s)


def _training_components(s: Setup) -> dict[str, dict[str, float]]:
    """A separate placement's training GPU: the policy's shard (or replica), gradients, AdamW, the reference, the
    log-prob and update activations as colocated; no rollout engine, no KV cache of the rollout: the held-out
    evaluation generates here (the training ranks' own weights, FSDP's gathered), and the push packs a bucket."""
    train = s.trainable / s.shard
    grads = 4.0 * train
    rows = {
        "policy weights (fp32)": _every(_policy_weights(s), TRAIN_STAGES),
        "gradients (fp32)": _every(grads, TRAIN_STAGES) if s.ddp else {"update": grads},
        "AdamW state (2 x fp32)": _every(8.0 * train, TRAIN_STAGES),
        "reference model": _every(_reference(s), TRAIN_STAGES),
        "activations": {
            "evaluation": _eval_generation(s),
            "log-probs": _logprob_activations(s),
            "update": max(update_activations(s)["peak"], 4.0 * train),
            "weight sync": push_transient(s),
        },
        "CUDA context": _every(CUDA_CONTEXT, TRAIN_STAGES),
    }
    if evaluates_with_rewards(s.cfg):  # loaded at the first evaluation, offloaded between the calls or not
        for m in reward_models(s):
            if m.awake is not None:
                rows[m.name] = {
                    st: (m.awake if st == "evaluation" else m.asleep) or 0.0 for st in TRAIN_STAGES
                }
    return {k: {st: float(v.get(st, 0.0)) for st in TRAIN_STAGES} for k, v in rows.items()}


def evaluates_with_rewards(cfg: Config) -> bool:
    """Whether the training ranks score held-out responses with the run's rewards (:class:`mmrl.train.validation.
    Validator`: not a benchmark's scorer, not an env's episodes): their reward models then load there too."""
    return bool(cfg.data.eval) and cfg.eval.benchmark is None and not cfg.rollout.env and bool(cfg.rewards)


def _generating_components(g: Setup, s: Setup) -> dict[str, dict[str, float]]:
    """A separate placement's generating GPU (``g``: :func:`generating_setup`; ``s``: the training GPU's, whose
    trained parameters are pushed): the engine's copy of the policy, the rollout's KV cache and the rest of HF
    generation (with vLLM: its weights, KV cache and workspace, and its engine process's CUDA context), the reward models (rewards are scored where generation runs, awake throughout: the next chunk
    generates while one is scored), and the bucket a push is received into, which arrives while generation runs."""
    e = engine(g)
    if e is None:
        parts = _hf_generation_parts(g)
        rows = {
            "engine weights (fp32 policy)": _every(_policy_weights(g), GEN_STAGES),
            "KV cache (rollout)": _every(parts["kv"], GEN_STAGES),
            "activations": _every(parts["rest"], GEN_STAGES),
        }
    else:  # vLLM in a process of its own (its own CUDA context); the policy that takes the push stays in host memory
        rows = {
            "vLLM weights": _every(e.weights, GEN_STAGES),
            "vLLM KV cache and workspace": _every(e.kv_cache + e.workspace, GEN_STAGES),
            "vLLM CUDA context": _every(CUDA_CONTEXT, GEN_STAGES),
        }
    rows |= {
        "weight-receive bucket": {"weight receive": bucket_bytes(s)},
        "CUDA context": _every(CUDA_CONTEXT, GEN_STAGES),
    }
    for m in reward_models(g):
        if m.awake is not None:
            rows[m.name] = _every(m.awake, GEN_STAGES)
    return {k: {st: float(v.get(st, 0.0)) for st in GEN_STAGES} for k, v in rows.items()}


def _separate_problems(s: Setup) -> list[str]:
    if s.cfg.rollout.engine in ("hf", "vllm"):
        return []
    return [
        f"rollout.placement: separate generates with the hf or the vllm engine: pre-flight refuses rollout.engine "
        f"{s.cfg.rollout.engine!r} (set rollout.engine: hf or vllm)"
    ]


# ---------------------------------------------------------------------------------------------- advice
def _with(cfg: Config, overrides: list[str]) -> Config:
    return from_dict(Config, apply_overrides(copy.deepcopy(to_dict(cfg)), overrides))


def _try(cfg: Config, overrides: list[str], opts: PlanOptions) -> Plan | None:
    try:
        return plan_run(_with(cfg, overrides), opts, advise=False)
    except (ConfigError, ValueError):
        return None


def _advice(cfg: Config, opts: PlanOptions) -> list[str] | None:
    """The cheapest change that fits: each group of changes is tried (with the micro-batch as configured, then
    halved: ``optim.micro_batch_tokens`` where set, else ``optim.micro_batch_size``) on top of the best change of the
    groups before it (the one that lowered the peak most and keeps the run startable), in the module docstring's
    order; a vLLM judge too small to start gets the share it needs first."""
    s = setup(cfg, opts)
    given, done = opts, [fix for _, fix in _judge_fixes(s)]
    key = "micro_batch_tokens" if cfg.optim.micro_batch_tokens > 0 else "micro_batch_size"
    best = _try(cfg, done, opts)
    for group in _change_groups(cfg, s, opts):
        tried = []
        for changes, new_opts in group:
            for micro in [None, *_halvings(getattr(cfg.optim, key))]:
                trial = done + changes + ([f"optim.{key}={micro}"] if micro else [])
                p = _try(cfg, trial, new_opts)
                if p is not None and p.fits:
                    return trial + _options_text(new_opts, given)
                if micro is None and p is not None and not p.problems:
                    tried.append((p.worst, changes, new_opts))
        lower = min(tried, key=lambda x: x[0], default=None)
        if lower is not None and best is not None and lower[0] < best.worst:
            done, opts = done + lower[1], lower[2]
            best = _try(cfg, done, opts)
    return None


def _halvings(n: int) -> list[int]:
    out = []
    while n > 1:
        n //= 2
        out.append(n)
    return out


def _change_groups(cfg: Config, s: Setup, opts: PlanOptions) -> list[list[tuple[list[str], PlanOptions]]]:
    groups: list[list[tuple[list[str], PlanOptions]]] = [[([], opts)]]  # the micro-batch alone
    if not cfg.model.gradient_checkpointing:
        groups.append([(["model.gradient_checkpointing=true"], opts)])
    # a separate placement's vLLM runs on the generating GPUs, at their own default share
    at = generating_setup(cfg, opts) if cfg.rollout.placement == "separate" else s
    groups.append([(c, opts) for c in _engine_shares(at)])
    if s.hw.generating:  # a separate placement's generating GPU: fewer sequences at once (KV cache, prefill)
        key = "rollout.batch_size"
        groups.append([([f"{key}={b}"], opts) for b in _halvings(cfg.rollout.batch_size)])
    resident = [f"{m.key}.offload=true" for m in reward_models(s) if not m.offload and m.awake]
    if resident:
        groups.append([(resident, opts)])
    if s.hw.world > 1 and not s.fsdp:
        groups.append([(["train.fsdp=true"], opts)])
    if not s.lora:
        groups.append([(["model.lora.r=16"], opts)])
    more = []
    for gpus, nodes in ((2, 1), (4, 1), (8, 1), (8, 2), (8, 4)):
        # more launched processes; a separate placement's extra ones all train (its generating count is the
        # config's), and its trainers take a balanced split of the batch (no multiple of their number needed)
        world = gpus * nodes - s.hw.generating
        even = s.hw.generating > 0 or cfg.train.prompts_per_step % world == 0
        if world > s.hw.world and even:
            more.append((["train.fsdp=true"], replace(opts, gpus=gpus, nodes=nodes)))
    groups.append(more)
    return groups


def _engine_shares(s: Setup) -> list[list[str]]:
    """Smaller vLLM shares, mildest first; with a max_model_len of one planned sequence when the cache cannot hold
    the model's own (then vLLM would not start). ``s``: the GPU vLLM runs on (its config's engine options)."""
    e = engine(s)
    if e is None:
        return []
    key = "rollout.engine_options"
    fix = [f"{key}.max_model_len={s.seq.total}"] if _engine_problems(s) else []
    o = s.cfg.rollout.engine_options
    if o.get("kv_cache_memory_bytes") is not None:
        kv = int(o["kv_cache_memory_bytes"])
        return [fix + [f"{key}.kv_cache_memory_bytes={kv >> k}"] for k in range(1, 5) if kv >> k >= GIB]
    util = float(o.get("gpu_memory_utilization", VLLM_DEFAULT_UTILIZATION))
    shares = [round(util - 0.05 * k, 2) for k in range(1, 20) if util - 0.05 * k >= 0.1 - 1e-9]
    return ([fix] if fix else []) + [fix + [f"{key}.gpu_memory_utilization={u}"] for u in shares]


def _options_text(new: PlanOptions, old: PlanOptions) -> list[str]:
    out = []
    if new.gpus != old.gpus:
        out.append(f"--gpus {new.gpus}")
    if new.nodes != old.nodes:
        out.append(f"--nodes {new.nodes}")
    return out
