"""``mmrl plan``'s printed report of a :class:`mmrl.plan.planner.Plan`: the budget table per stage, the placement,
the reward models, the verdict, the cheapest change that fits and a time estimate."""

from __future__ import annotations

import math

from mmrl.plan.memory import Setup, gib
from mmrl.plan.planner import (
    Plan,
    bucket_bytes,
    engine,
    eval_sequences,
    evaluates,
    evaluates_with_rewards,
    push_transient,
    reward_models,
    rollout_sequences,
    scoring_stages,
)


def format_plan(p: Plan, name: str) -> str:
    s, sh = p.setup, p.setup.shapes
    lines = [
        f"mmrl plan: {name}",
        f"model: {sh.params / 1e9:.2f} B parameters ({sh.vision_params / 1e9:.2f} B in the vision tower), "
        f"shapes from {sh.source}/config.json",
        f"hardware: {s.hw.nodes} node(s) x {s.hw.gpus_per_node} GPU(s) of {s.hw.gpu_gib:g} GiB"
        + (f" ({s.hw.name})" if s.hw.name else "")
        + f", from {s.hw.source}",
        *_placement_lines(p),
        f"run: {_run_text(s)}",
        f"sequence: {_sequence_text(s)}",
        "",
        *[line for g in p.groups for line in (*_table(g), "")],
        "peak: "
        + "; ".join(
            f"{'' if len(p.groups) == 1 else g.role + ' '}{gib(g.peak)} GiB in the {g.peak_stage} stage"
            for g in p.groups
        ),
        "update activations by phase, GiB: "
        + ", ".join(f"{k} {gib(v)}" for k, v in p.update.items() if k != "peak")
        + f" (gradient checkpointing {'on' if s.cfg.model.gradient_checkpointing else 'off'})",
    ]
    e = engine(s) if p.generating is None else None
    if p.generating is not None:
        lines += _separate_lines(p)
    if e is not None:
        lines.append(
            f"vLLM: weights {gib(e.weights)} GiB, KV cache {gib(e.kv_cache)} GiB = {e.kv_tokens:,} tokens "
            f"({e.kv_tokens // max(1, s.seq.total):,} sequences of {s.seq.total:,} at once), "
            f"{'asleep (level 1) outside the rollout' if e.sleep else 'awake throughout (no sleep_mode)'}"
        )
    lines += _reward_model_lines(s, p.generating is not None)
    lines += [f"verdict: {verdict(p)}"] + [f"  {x}" for x in p.problems]
    if not p.fits:
        lines.append(f"cheapest change that fits: {advice_text(p)}")
    est = time_estimate(s)
    if est:
        lines.append(est)
    return "\n".join(lines)


def _placement_lines(p: Plan) -> list[str]:
    hw = p.setup.hw
    if p.generating is None:
        return []
    return [
        f"placement: separate: {hw.world} training GPU(s) and {hw.generating} generating GPU(s) of the "
        f"{hw.launched} launched (rollout.rollout_processes {hw.generating}, the last processes)"
    ]


def _separate_lines(p: Plan) -> list[str]:
    """What a separate placement's rows are made of: the generation at once on a generating GPU, the held-out
    evaluation's on a training GPU, the pushed buckets."""
    s, g = p.setup, p.generating.setup
    c = s.cfg
    rows = p.generating.rows
    received = (
        f"pushed weights received in buckets of {gib(bucket_bytes(s))} GiB at most (64 MiB, or the largest trained "
        "parameter alone) while it generates"
    )
    if "vLLM weights" in rows:
        lines = [
            f"generating GPU: vLLM in a process of its own (its CUDA context too), its weights "
            f"{gib(rows['vLLM weights']['rollout'])} GiB and its KV cache and workspace "
            f"{gib(rows['vLLM KV cache and workspace']['rollout'])} GiB (engine_options.gpu_memory_utilization or "
            f"kv_cache_memory_bytes); the policy that takes the push stays in host memory; {received}, then "
            "written to shared memory and reloaded in vLLM's keep-mode pause"
        ]
    else:
        kv = rows["KV cache (rollout)"]["rollout"]
        seqs = rollout_sequences(g)
        lines = [
            f"generating GPU: the engine's copy of the policy as the trainer loads it (fp32 master weights), "
            f"{seqs:,} sequences ({seqs // c.rollout.n:,} prompts x {c.rollout.n} in one generate call, "
            f"rollout.batch_size) of {g.seq.total:,} tokens at once: KV cache {gib(kv)} GiB; {received}"
        ]
    if evaluates(c):
        n, q = eval_sequences(s)
        lines.append(
            f"training GPU: no rollout; the held-out evaluation generates {n:,} greedy sequence(s) of {q.total:,} "
            f"tokens at once with the rank's own weights"
            + (" (gathered from the FSDP2 shards)" if s.fsdp else "")
            + f"; training rank 0 packs the push one bucket at a time ({gib(push_transient(s))} GiB)"
        )
    else:
        lines.append(
            f"training GPU: no rollout, no evaluation (no data.eval); training rank 0 packs the push one bucket at "
            f"a time ({gib(push_transient(s))} GiB)"
        )
    return lines


def _reward_model_lines(s: Setup, separate: bool = False) -> list[str]:
    """Why each reward model's row is what it is, and which ones the plan could not size."""
    models = reward_models(s)
    if not models:
        return []
    stages = " and ".join(scoring_stages(s.cfg))
    lines = [f"reward models (on each rank's GPU; awake while rewards are scored, in the {stages} stage):"]
    if separate:
        where = "on each generating GPU, awake throughout: rewards are scored while generation runs"
        if evaluates_with_rewards(s.cfg):
            where += (
                "; on each training GPU too, loaded at the first held-out evaluation, whose responses the "
                "training ranks score: awake in the evaluation stage"
            )
        lines = [f"reward models ({where}):"]
    for m in models:
        if m.share:
            sleep = "asleep (offload: vLLM's level-1 sleep) otherwise" if m.offload else "awake throughout"
            why = f"gpu_memory_utilization {m.share:g} of the GPU ({gib(m.awake or 0.0)} GiB) awake, {sleep}"
            if m.weights is not None:
                why += f"; its weights {gib(m.weights)} GiB of that share"
        elif m.weights is None:
            why = "no config.json here: NOT COUNTED (name a local model folder to plan its weights)"
        else:
            why = f"weights {gib(m.weights)} GiB" + (
                ", moved to host memory between calls (offload)" if m.offload else ", on the GPU throughout"
            )
        lines.append(f"  {m.name}: {m.path}: {why}")
    return lines


def _table(p: Plan) -> list[str]:
    head = "per GPU, GiB" if p.role == "GPU" else f"per {p.role}, GiB"
    width = max(12, 1 + max(len(st) for st in p.stages))
    lines = [f"{head:34s}" + "".join(f"{st:>{width}s}" for st in p.stages)]
    for name, row in p.rows.items():
        if any(row.values()):
            lines.append(
                f"  {name:32s}" + "".join(f"{gib(row[st]) if row[st] else '-':>{width}s}" for st in p.stages)
            )
    return lines + [f"  {'total':32s}" + "".join(f"{gib(p.totals[st]):>{width}s}" for st in p.stages)]


def verdict(p: Plan) -> str:
    cap = f"{p.setup.hw.gpu_gib:g} GiB per GPU"
    if p.generating is not None:
        return _separate_verdict(p, cap)
    if p.fits:
        return f"fits: peak {gib(p.peak)} GiB of {cap} ({gib(p.capacity - p.peak)} GiB to spare)"
    if p.peak > p.capacity:
        return f"does not fit: peak {gib(p.peak)} GiB in the {p.peak_stage} stage > {cap}"
    return f"does not fit: {p.problems[0]}"


def _separate_verdict(p: Plan, cap: str) -> str:
    """Both kinds of GPU against the GPU's memory; a misfit names the kind that does not fit."""
    if p.fits:
        return (
            f"fits: training GPU peak {gib(p.peak)} GiB, generating GPU peak {gib(p.generating.peak)} GiB of "
            f"{cap} ({gib(p.capacity - p.worst)} GiB to spare on the fuller)"
        )
    over = [
        f"the {g.role}'s peak {gib(g.peak)} GiB in the {g.peak_stage} stage > {cap}"
        for g in p.groups
        if g.peak > g.capacity
    ]
    if over:
        return "does not fit: " + "; ".join(over)
    problems = [f"the {g.role}: {x}" for g in p.groups for x in g.problems]
    return f"does not fit: {problems[0]}"


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
    c, hw = s.cfg, s.hw
    kind = f"LoRA r={c.model.lora.r}" if s.lora else "full fine-tuning"
    precision = {"autocast": "bf16 autocast over fp32 master weights", "bf16": "FSDP bf16 mixed precision"}
    frozen = f" ({s.frozen_low / 1e9:.2f} B frozen Linear/Conv weights in bf16)" if s.frozen_low else ""
    parts = [
        f"{kind} ({s.trainable / 1e9:.2f} B trainable)",
        precision.get(s.mode, "fp32") + frozen,
        "gradient checkpointing" if c.model.gradient_checkpointing else "no gradient checkpointing",
        f"{hw.world} {'training ' if hw.generating else ''}process(es)"
        + (", FSDP2" if s.fsdp else ", DDP" if s.ddp else ""),
        ("a reference copy" if s.ref_copy else "no reference copy"),
        f"{c.rollout.engine} rollouts"
        + (
            f" in {hw.generating} generating process(es), max_staleness {c.rollout.max_staleness}"
            if hw.generating
            else ""
        ),
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
    gen_rows = c.train.prompts_per_step * c.rollout.n / s.hw.generating if s.hw.generating else rows
    text = sh.params - sh.vision_params - sh.embed_params
    forward = 2 * rows * (text * s.seq.total + sh.vision_params * s.seq.patches)
    update = c.algo.epochs * forward * (3 + c.model.gradient_checkpointing)
    logprobs = forward * (s.old_forward + (c.algo.kl_coef > 0))
    e = engine(s) if not s.hw.generating else None
    concurrent = (
        max(1, e.kv_tokens // max(1, s.seq.total)) if e else max(1, c.rollout.batch_size * c.rollout.n)
    )
    decode = (
        s.seq.response * math.ceil(gen_rows / concurrent) * 2 * sh.params / (e.tp if e else 1) / bandwidth
    )
    sustained = MFU * flops
    where = " on a generating GPU" if s.hw.generating else ""
    prefill = (forward * gen_rows / rows if s.hw.generating else forward) / 3
    return (
        f"time per step (rough; {MFU:.0%} of the {s.hw.name}'s bf16 peak, decoding at its memory bandwidth): "
        f"rollout >= {decode + prefill / sustained:.0f} s{where}, "
        f"log-probs {logprobs / sustained:.0f} s, update {update / sustained:.0f} s"
    )
