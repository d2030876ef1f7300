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
share, the reward models offloaded, FSDP, LoRA, more GPUs. ``benchmarks/plan_accuracy.py`` holds the components to torch's own accounting of a real
3B and 7B step (within 1-8% each).
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
    Setup,
    adapted,
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
VLLM_WORKSPACE = 2.0 * GIB  # vLLM's profiled activations, sampler and CUDA graphs while awake (an estimate)
VLLM_ASLEEP = 1.0 * GIB  # what a level-1-asleep engine keeps on the GPU (CUDA graphs, buffers; an estimate)
STAGES = ("rollout", "log-probs", "update", "weight sync")


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
    sleep = bool(o.get("sleep_mode", True))  # on by default on CUDA
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
    generates (:meth:`mmrl.train.collect.Collector.one_round`)."""
    chunked = cfg.rollout.engine == "hf" and cfg.train.overlap_rewards and not cfg.rollout.env
    return ("rollout", "log-probs") if chunked else ("log-probs",)


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

    @property
    def peak(self) -> float:
        return self.totals[self.peak_stage]

    @property
    def capacity(self) -> float:
        return self.setup.hw.gpu_gib * GIB

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity and not self.problems


def plan_run(cfg: Config, opts: PlanOptions | None = None, *, advise: bool = True) -> Plan:
    """The memory budget of ``cfg`` per rank, stage by stage; with ``advise``, the cheapest change that fits."""
    s = setup(cfg, opts)
    rows = _components(s)
    torch_part = {st: sum(v[st] for k, v in rows.items() if _torch(k)) for st in STAGES}
    rows["allocator slack"] = {st: ALLOCATOR_SLACK * torch_part[st] for st in STAGES}
    totals = {st: sum(v[st] for v in rows.values()) for st in STAGES}
    p = Plan(s, rows, totals, max(STAGES, key=totals.get), _problems(s), update_activations(s))
    if advise and not p.fits:
        p.advice = _advice(cfg, opts or PlanOptions())
    return p


def _torch(row: str) -> bool:
    """Whether a row is memory torch's caching allocator hands out (not vLLM's, the policy's or a judge's, nor the
    CUDA context)."""
    return not row.startswith("vLLM") and row not in ("CUDA context", "allocator slack")


def torch_peak(p: Plan) -> tuple[float, str]:
    """The bytes torch's caching allocator hands out at the plan's peak (``torch.cuda.max_memory_allocated``'s
    measure: no CUDA context, no vLLM, no allocator slack), and the stage where it happens."""
    part = {st: sum(v[st] for k, v in p.rows.items() if _torch(k)) for st in STAGES}
    stage = max(STAGES, key=part.get)
    return part[stage], stage


def _components(s: Setup) -> dict[str, dict[str, float]]:
    sh, e = s.shapes, engine(s)
    train = s.trainable / s.shard
    ref = DTYPE_BYTES[s.cfg.model.dtype] * sh.params if s.ref_copy else 0.0
    grads = 4.0 * train
    logprobs = max(
        nograd_activations(s, policy=True) if s.old_forward else 0.0,
        nograd_activations(s, policy=False) if s.ref_copy else 0.0,
        nograd_activations(s, policy=True) if s.lora and s.cfg.algo.kl_coef > 0 else 0.0,
    )
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


def _every(x: float) -> dict[str, float]:
    return dict.fromkeys(STAGES, x)


def _only(stage: str, x: float) -> dict[str, float]:
    return {stage: x}


def _hf_generation(s: Setup) -> float:
    """The HF engine's ``generate``: ``rollout.batch_size x n`` sequences at once, their bf16 KV cache, the autocast
    weight copies (one autocast region around the whole call), the prefill's transient and the step's logits."""
    c, t = s.cfg, s.shapes.text
    prompts = max(1, min(c.rollout.batch_size, c.train.prompts_per_step // s.hw.world))
    seqs = prompts * c.rollout.n
    kv = 2 * t.layers * t.kv_heads * (t.hidden // t.heads) * 2 * seqs * s.seq.total
    prefill = seqs * s.seq.prompt * (transient(s, "text") + 12 * t.hidden) + seqs * s.seq.prompt**2
    gathered = DTYPE_BYTES[c.model.dtype] * s.shapes.params if s.fsdp else 0.0  # Policy.full_weights
    return weight_copies(s) + gathered + kv + prefill + 4 * 4 * seqs * s.shapes.vocab


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
    out = [
        f"{m.name}: its gpu_memory_utilization {m.share:g} ({_gib(m.awake or 0.0)} GiB) cannot hold its weights "
        f"({_gib(m.weights or 0.0)} GiB), vLLM's workspace and one max_model_len of KV cache ({_gib(m.needs)} GiB "
        f"in all): vLLM refuses to start it (set {fix})"
        for m, fix in _judge_fixes(s)
    ]
    return out + _engine_problems(s)


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
                    tried.append((p.peak, changes, new_opts))
        lower = min(tried, key=lambda x: x[0], default=None)
        if lower is not None and best is not None and lower[0] < best.peak:
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
    groups.append([(c, opts) for c in _engine_shares(cfg, s)])
    resident = [f"{m.key}.offload=true" for m in reward_models(s) if not m.offload and m.awake]
    if resident:
        groups.append([(resident, opts)])
    if s.hw.world > 1 and not s.fsdp:
        groups.append([(["train.fsdp=true"], opts)])
    if not s.lora:
        groups.append([(["model.lora.r=16"], opts)])
    more = []
    for gpus, nodes in ((2, 1), (4, 1), (8, 1), (8, 2), (8, 4)):
        world = gpus * nodes
        if world > s.hw.world and cfg.train.prompts_per_step % world == 0:
            more.append((["train.fsdp=true"], replace(opts, gpus=gpus, nodes=nodes)))
    groups.append(more)
    return groups


def _engine_shares(cfg: Config, s: Setup) -> list[list[str]]:
    """Smaller vLLM shares, mildest first; with a max_model_len of one planned sequence when the cache cannot hold
    the model's own (then vLLM would not start)."""
    e = engine(s)
    if e is None:
        return []
    key = "rollout.engine_options"
    fix = [f"{key}.max_model_len={s.seq.total}"] if _engine_problems(s) else []
    o = cfg.rollout.engine_options
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


# ---------------------------------------------------------------------------------------------- report
def _gib(x: float) -> str:
    return f"{x / GIB:.2f}"


def format_plan(p: Plan, name: str) -> str:
    s, sh = p.setup, p.setup.shapes
    lines = [
        f"mmrl plan: {name}",
        f"model: {sh.params / 1e9:.2f} B parameters ({sh.vision_params / 1e9:.2f} B in the vision tower), "
        f"shapes from {sh.source}/config.json",
        f"hardware: {s.hw.nodes} node(s) x {s.hw.gpus_per_node} GPU(s) of {s.hw.gpu_gib:g} GiB"
        + (f" ({s.hw.name})" if s.hw.name else "")
        + f", from {s.hw.source}",
        f"run: {_run_text(s)}",
        f"sequence: {_sequence_text(s)}",
        "",
        *_table(p),
        "",
        f"peak: {_gib(p.peak)} GiB in the {p.peak_stage} stage",
        "update activations by phase, GiB: "
        + ", ".join(f"{k} {_gib(v)}" for k, v in p.update.items() if k != "peak")
        + f" (gradient checkpointing {'on' if s.cfg.model.gradient_checkpointing else 'off'})",
    ]
    e = engine(s)
    if e is not None:
        lines.append(
            f"vLLM: weights {_gib(e.weights)} GiB, KV cache {_gib(e.kv_cache)} GiB = {e.kv_tokens:,} tokens "
            f"({e.kv_tokens // max(1, s.seq.total):,} sequences of {s.seq.total:,} at once), "
            f"{'asleep (level 1) outside the rollout' if e.sleep else 'awake throughout (no sleep_mode)'}"
        )
    lines += _reward_model_lines(s)
    lines += [f"verdict: {verdict(p)}"] + [f"  {x}" for x in p.problems]
    if not p.fits:
        lines.append(f"cheapest change that fits: {advice_text(p)}")
    est = time_estimate(s)
    if est:
        lines.append(est)
    return "\n".join(lines)


def _reward_model_lines(s: Setup) -> list[str]:
    """Why each reward model's row is what it is, and which ones the plan could not size."""
    models = reward_models(s)
    if not models:
        return []
    stages = " and ".join(scoring_stages(s.cfg))
    lines = [f"reward models (on each rank's GPU; awake while rewards are scored, in the {stages} stage):"]
    for m in models:
        if m.share:
            sleep = "asleep (offload: vLLM's level-1 sleep) otherwise" if m.offload else "awake throughout"
            why = f"gpu_memory_utilization {m.share:g} of the GPU ({_gib(m.awake or 0.0)} GiB) awake, {sleep}"
            if m.weights is not None:
                why += f"; its weights {_gib(m.weights)} GiB of that share"
        elif m.weights is None:
            why = "no config.json here: NOT COUNTED (name a local model folder to plan its weights)"
        else:
            why = f"weights {_gib(m.weights)} GiB" + (
                ", moved to host memory between calls (offload)" if m.offload else ", on the GPU throughout"
            )
        lines.append(f"  {m.name}: {m.path}: {why}")
    return lines


def _table(p: Plan) -> list[str]:
    lines = [f"{'per GPU, GiB':34s}" + "".join(f"{st:>12s}" for st in STAGES)]
    for name, row in p.rows.items():
        if any(row.values()):
            lines.append(
                f"  {name:32s}" + "".join(f"{_gib(row[st]) if row[st] else '-':>12s}" for st in STAGES)
            )
    return lines + [f"  {'total':32s}" + "".join(f"{_gib(p.totals[st]):>12s}" for st in STAGES)]


def verdict(p: Plan) -> str:
    cap = f"{p.setup.hw.gpu_gib:g} GiB per GPU"
    if p.fits:
        return f"fits: peak {_gib(p.peak)} GiB of {cap} ({_gib(p.capacity - p.peak)} GiB to spare)"
    if p.peak > p.capacity:
        return f"does not fit: peak {_gib(p.peak)} GiB in the {p.peak_stage} stage > {cap}"
    return f"does not fit: {p.problems[0]}"


def advice_text(p: Plan) -> str:
    if not p.advice:
        return (
            "none found among smaller micro-batches, checkpointing, a smaller vLLM share, offloaded reward models, "
            "FSDP, LoRA, more GPUs"
        )
    gpus = [a for a in p.advice if a.startswith("--")]
    overrides = [a for a in p.advice if not a.startswith("--")]
    return " ".join(overrides + gpus) + (
        "" if not gpus else " (launch that many processes, torchrun/accelerate)"
    )


def _run_text(s: Setup) -> str:
    c = s.cfg
    kind = f"LoRA r={c.model.lora.r}" if s.lora else "full fine-tuning"
    precision = {"autocast": "bf16 autocast over fp32 master weights", "bf16": "FSDP bf16 mixed precision"}
    frozen = f" ({s.frozen_low / 1e9:.2f} B frozen Linear/Conv weights in bf16)" if s.frozen_low else ""
    parts = [
        f"{kind} ({s.trainable / 1e9:.2f} B trainable)",
        precision.get(s.mode, "fp32") + frozen,
        "gradient checkpointing" if c.model.gradient_checkpointing else "no gradient checkpointing",
        f"{s.hw.world} process(es)" + (", FSDP2" if s.fsdp else ", DDP" if s.ddp else ""),
        ("a reference copy" if s.ref_copy else "no reference copy"),
        f"{c.rollout.engine} rollouts",
    ]
    return ", ".join(parts)


def _sequence_text(s: Setup) -> str:
    q, m = s.seq, s.cfg.model
    media = []
    if q.images:
        media.append(f"{q.images} image(s) at max_pixels {m.max_pixels:,}")
    if q.videos:
        media.append(f"{q.videos} video(s) of {m.video_max_frames} frames at {m.video_max_pixels:,} px")
    return (
        f"prompt {q.prompt:,} tokens ({q.text_tokens:,} text + {q.visual_tokens:,} visual"
        + (f": {', '.join(media)}" if media else "")
        + f") + response {q.response:,} = {q.total:,}; micro-batch {s.micro} rows (update), "
        f"{s.micro_nograd} (log-probs)"
    )


# GPU: (dense bf16 FLOP/s, memory bandwidth B/s), for the rough time
GPUS = {
    "H200": (989e12, 4.8e12),
    "H100": (989e12, 3.35e12),
    "A100": (312e12, 2.0e12),
    "B200": (2250e12, 8e12),
}
MFU = 0.4  # sustained share of the bf16 peak assumed for the forwards and backwards


def time_estimate(s: Setup) -> str | None:
    """Seconds per step, roughly: forwards and backwards at ``MFU`` of the GPU's bf16 peak, decoding at its memory
    bandwidth (each decode step reads the weights once); None for a GPU not in :data:`GPUS`."""
    gpu = next((v for k, v in GPUS.items() if k in (s.hw.name or "")), None)
    if gpu is None:
        return None
    flops, bandwidth = gpu
    c, sh = s.cfg, s.shapes
    rows = c.train.prompts_per_step * c.rollout.n / s.hw.world
    text = sh.params - sh.vision_params - sh.embed_params
    forward = 2 * rows * (text * s.seq.total + sh.vision_params * s.seq.patches)
    update = c.algo.epochs * forward * (3 + c.model.gradient_checkpointing)
    logprobs = forward * (s.old_forward + (c.algo.kl_coef > 0))
    e = engine(s)
    concurrent = (
        max(1, e.kv_tokens // max(1, s.seq.total)) if e else max(1, c.rollout.batch_size * c.rollout.n)
    )
    decode = s.seq.response * math.ceil(rows / concurrent) * 2 * sh.params / (e.tp if e else 1) / bandwidth
    sustained = MFU * flops
    return (
        f"time per step (rough; {MFU:.0%} of the {s.hw.name}'s bf16 peak, decoding at its memory bandwidth): "
        f"rollout >= {decode + forward / 3 / sustained:.0f} s, log-probs {logprobs / sustained:.0f} s, "
        f"update {update / sustained:.0f} s"
    )


# ---------------------------------------------------------------------------------------------- pre-flight
def would_use_cuda(cfg: Config) -> bool:
    """Whether ``mmrl train`` would put the policy on a GPU: the one question that decides whether the pre-flight
    plan runs."""
    device = cfg.model.device
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def preflight(cfg: Config, *, force: bool = False) -> Plan | None:
    """``mmrl train``'s memory check before any model loads: a run bound for a GPU is planned on this machine (the
    launcher's process count, the GPU's memory, else the config's ``hardware:``) and refused with the cheapest change
    that fits when it cannot fit, unless ``force``. A model whose config is not local is not planned (a warning)."""
    if not would_use_cuda(cfg):
        return None
    try:
        p = plan_run(cfg, _this_machine(cfg))
    except ConfigNotLocal as e:
        import logging

        logging.getLogger("mmrl.plan.planner").warning("memory plan skipped: %s", e)
        return None
    if p.fits or force:
        return p
    raise ConfigError(
        f"the run {verdict(p)}; cheapest change that fits: {advice_text(p)} "
        "(`mmrl plan CONFIG` prints the budget; `mmrl train --force` starts it anyway)"
    )


def _this_machine(cfg: Config) -> PlanOptions:
    import os

    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    memory = None
    if torch.cuda.is_available():
        # the total from the device's properties, which open no CUDA context (cudaMemGetInfo opens one)
        memory = torch.cuda.get_device_properties(_own_gpu(cfg)).total_memory / GIB
    return PlanOptions(gpus=local, nodes=max(1, world // local), gpu_memory_gib=memory)


def _own_gpu(cfg: Config) -> int:
    """The GPU this process will train on, named explicitly: pre-flight runs before the launcher's rank has set its
    device, and a query of the current one (cuda:0 until then) would touch GPU 0 from every rank. The config's
    ``cuda:N``, else the launcher's local rank modulo the visible GPUs (as accelerate sets each process's device)."""
    import os

    import torch

    index = torch.device(cfg.model.device).index if cfg.model.device.startswith("cuda") else None
    if index is not None:
        return index
    return int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
