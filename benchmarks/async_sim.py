"""Synchronous against asynchronous (bounded-staleness) RL training, projected to one 8-GPU node by a discrete-event
simulation (docs/async.md). No model runs here: every cost follows from the hardware and model assumptions stated
below, so the numbers are a projection, not a measurement.

    OMP_NUM_THREADS=1 python benchmarks/async_sim.py [--setting all|geometry3k-3b|gui-agent] [--steps 50]
        [--warmup 10] [--ks 1,2,4] [--seed 0] [--colocated-async] [hardware and workload options, see --help]

Prints, per setting: the workload drawn, the synchronous stage times and the bound (t_gen + t_train) /
max(t_gen, t_train) computed from them, then a table with one row per mode: k, generating / training GPUs, s/step
(steady state: the ``--steps`` steps after ``--warmup``), speed-up against the synchronous run of the same batches,
the generator's and the trainer's idle shares, decode tokens/s per generating GPU, the staleness of the trained
tokens (mean / max, in policy versions) and, multi-turn, the share of later turns that had to prefill their whole
context again; then s/step at every split for each k, and the published speed-ups of other systems, marked as
published. The last line is ``speed-up async/sync: geometry3k-3b X (k=.., g/t) gui-agent Y (k=.., g/t)``, the best
k and split of each setting. The default run takes about 15 s on one core.

Modes

- sync: colocated. All GPUs generate the whole batch (the step's generation lasts until its slowest sequence, or
  episode, ends), then all GPUs train on it, then the weights are synced; nothing overlaps.
- async k, g/t: separate placement, g GPUs generate and t = 8 - g train, with ``rollout.max_staleness: k`` counted
  as mmrl counts it: version v is the weights after v updates, step b trains with version b - 1, and batch b may join
  the generator's queue once the generator holds version b - 1 - k. Generation is continuous: a finished sequence's
  slot is refilled from the queue (older batches first), so the next batches fill the current one's tail. The
  trainer takes batch b as soon as it is complete and the previous update and sync are done. Every sync is an
  in-flight update: the generating GPUs pause for the sync time between two decoding steps, keep their running
  sequences with their KV cache, and the tokens after it carry the new version. The generator idles only when the
  bound leaves it nothing to do (or, multi-turn, every episode waits for its environment). For each k every split
  g = 1..7 is run, from g = 1 up, until the trainer alone (its training time on 8 - g GPUs plus the sync) is slower
  than the best split found: those splits cannot win and are printed as ``>= X``.
- ``--colocated-async`` adds colocated k rows: the same queue and bound on all 8 GPUs, time-shared, so generation
  pauses for every update and sync and the episodes' cached contexts are dropped (the trainer takes the memory).

Every mode generates exactly the same batches (drawn from ``--seed``, the setting and the batch index), so the
ratios are paired. Batches past the last measured one are admitted as the bound allows, so the measured steps see
no end effect.

Assumptions (each one a CLI option; the defaults describe 8 x H100 SXM 80 GB and Qwen2.5-VL-3B in bf16)

- Model: 3.09e9 language-model parameters and 0.67e9 in the vision tower; KV cache 36,864 bytes per token (36
  layers x 2 KV heads x 128 dims x K and V x 2 bytes); an image token costs the vision tower 4 patches (2x2 merge).
- Decoding (roofline, continuous batching): a GPU decodes its n active sequences in lockstep; one decoding step
  takes ``2.5 ms + max(weights / BW, 2 x P_lm x n / (peak x 0.5)) + (sum of the n contexts) x kv_bytes / BW`` with
  BW = 3.35 TB/s x 0.75 achieved and peak = 989 TFLOP/s (bf16 dense): reading the weights bounds it up to about 200
  sequences, compute beyond, and the KV reads grow with every context. The 2.5 ms stand for launch, sampling and
  scheduling. At most 256 active sequences per GPU (vLLM's default ``max_num_seqs``). Between two events (an
  admission, a finish, a pause) n is fixed and every context grows one token per step, so the step time grows
  linearly with the steps taken; the simulation converts time to steps in closed form (fluid progress).
- Prefill: compute-bound at MFU 0.4: 2 x P_lm FLOPs per context token and 2 x P_vision per vision patch, charged as a
  stall of the GPU that admits the sequence. A prompt's G = 8 samples share its prefill (1/8 each).
- Multi-turn: an episode is one sequence (each turn appends its tokens and the next observation, as mmrl's episodes
  do). Waiting for its environment it leaves its slot but keeps its KV cache on its GPU (prefix caching) until that
  GPU needs the memory: 50 GB of KV cache per GPU, the waiting episodes' caches evicted oldest first when active and
  cached contexts together exceed it. The next turn returns to that GPU when it has a free slot and nobody queues; it
  prefills only the new observation (its text and one image) when its cache is still there, its whole context with
  every image otherwise. The environment runs off the GPUs, as many steps at once as needed.
- Training: 10 x (P_lm x tokens + P_vision x patches) FLOPs per sample (6 for the update's forward and backward, 2 for
  the recomputed old log-probs, 2 for the reference model's forward) at MFU 0.35, split evenly over the training
  GPUs (perfect data-parallel scaling, no fixed cost per step).
- Weight sync: 2 bytes x 3.76e9 parameters at 50 GB/s plus 0.5 s fixed, 0.65 s, colocated and separate alike; the
  trainer is busy for it and the generating GPUs pause for it. Colocated runs pay nothing to switch the GPUs between
  the engine and the trainer (this favours the synchronous baseline).
- geometry3k-3b (EasyR1's Qwen2.5-VL-3B Geometry3k setting): 64 prompts x 8 = 512 rollouts per step, one turn;
  prompt 500 tokens (400 image tokens: a small diagram scaled up to the 512 x 512-pixel minimum, and 100 text);
  response length lognormal with median 400 tokens and sigma 0.85, rounded, 16 at least, clipped at 2,048 (about
  2.7% at the cap, mean about 547). The reward costs nothing.
- gui-agent: 32 tasks x 8 = 256 episodes per step (the batch of mmrl's gui_agent GPU recipe); 5-15 turns,
  uniform; each turn generates a lognormal number of tokens (median 90, sigma 0.5, 16-512: mean about 100) and is
  followed by an environment step of lognormal latency (median 1.5 s, sigma 0.9, clipped to 0.5-10 s), the last
  turn's too (the reward). Prompt 300 text tokens and a 256-token screenshot; each observation 50 text tokens and a
  256-token screenshot. The whole episode is trained as one sample.

Measures, over the measured steps. s/step: (end of the last measured step's sync - end of the warm-up's) / steps.
Generator idle: share of the generating GPUs' time with no sequence to decode and no prefill (waiting for the bound,
the environment, the other GPUs' slowest sequence, a sync or, colocated, an update); a GPU decoding one sequence
counts as busy, so the tokens/s column shows how well the busy time is used. Trainer idle: share of the trainer's
time neither training nor syncing. Staleness: per generated token, the trained step's version (b - 1) minus the
version that generated it; token-weighted mean, and maximum. The bound (t_gen + t_train) / max(t_gen, t_train) is
what overlapping the two stages gives if each keeps its synchronous duration. Separate placement changes both: each
stage gets fewer GPUs (with perfectly linear stages a split gains nothing over sync), while refilling the tail and
running more sequences per generating GPU (and, multi-turn, more episodes per environment wait) gain more than
overlap alone; the tests check both ends.
"""

from __future__ import annotations

import argparse
import heapq
from dataclasses import replace

import numpy as np
from async_sim_model import (  # the cost model; SETTINGS, Hardware, Model are read by tests/test_async_sim.py too
    PUBLISHED,
    SETTINGS,
    Batch,
    Generator,
    Hardware,
    Model,
    Queue,
    Result,
    Workload,
    make_batch,
    request,
    sync_time,
    train_time,
    turn_done,
)


# ---------------------------------------------------------------------------------------------- generation alone
def generate(batches: dict[int, Batch], gen: Generator, order: list[int]) -> dict[int, float]:
    """The generator alone with every batch of ``order`` queued at time 0: each batch's completion time (its last
    episode's last environment step)."""
    q, events, left, done, seq = Queue(gen), [], {}, {}, [0]

    def push(T: float, kind: str, payload) -> None:
        heapq.heappush(events, (T, seq[0], kind, payload))
        seq[0] += 1

    def episode_done(b: int, T: float) -> None:
        left[b] -= 1
        if not left[b]:
            done[b] = T

    for b in order:
        left[b] = len(batches[b].episodes)
        for e in range(left[b]):
            q.push(request(b, e, 0, batches[b]), 0.0)
    while len(done) < len(order):
        tg, i = gen.next_event()
        if events and events[0][0] <= tg:
            T, _, kind, payload = heapq.heappop(events)
            if kind == "turn":
                q.arrive(request(payload[0], payload[1], payload[2] + 1, batches[payload[0]]), T)
            else:
                episode_done(payload, T)
            continue
        for req, _, _ in gen.pop(i, tg):
            if turn_done(gen, batches, req, tg, push):
                episode_done(req[0], tg)
        q.dispatch(tg)
    return done


def run_sync(
    w: Workload, hw: Hardware, m: Model, seed: int, steps: int, warmup: int, g: int | None = None
) -> Result:
    """Synchronous: each batch is generated alone on ``g`` GPUs (default: all, colocated), then trained on the
    others (all when colocated), then the weights are synced; nothing overlaps."""
    g = g or hw.gpus
    n_train = hw.gpus if g == hw.gpus else hw.gpus - g
    ts = sync_time(hw, m)
    gen_t, train_t, busy, tokens, later, re = [], [], 0.0, 0.0, 0, 0
    for b in range(warmup + 1, warmup + steps + 1):
        batch = make_batch(w, m, hw, seed, b)
        gen = Generator(g, hw, m)
        gen_t.append(generate({b: batch}, gen, [b])[b])
        busy_b, tok_b = gen.snapshot(gen_t[-1])
        busy, tokens = busy + busy_b, tokens + tok_b
        later, re = later + gen.later_turns, re + gen.reprefills
        train_t.append(train_time(batch, hw, n_train))
    tg, tt = float(np.mean(gen_t)), float(np.mean(train_t))
    wall = (tg + tt + ts) * steps
    return Result(
        s_step=tg + tt + ts,
        gen_idle=1 - busy / (g * wall),
        train_idle=1 - (tt + ts) * steps / wall,
        tok_s_gpu=tokens / (g * wall),
        stale_mean=0.0,
        stale_max=0,
        reprefill=re / later if later else 0.0,
        t_gen=tg,
        t_train=tt,
        t_sync=ts,
    )


def generation_only(w: Workload, hw: Hardware, m: Model, seed: int, g: int, steps: int, warmup: int) -> float:
    """Seconds per batch of the generator alone on ``g`` GPUs with every batch queued at once (no bound, no
    training, no sync): the throughput limit of generation."""
    order = list(range(1, 2 * (warmup + steps) + 1))  # as many after: the queue never drains in the window
    done = generate({b: make_batch(w, m, hw, seed, b) for b in order}, Generator(g, hw, m), order)
    return (done[warmup + steps] - done[warmup]) / steps


# ------------------------------------------------------------------------------------------------------ async run
def run_async(
    w: Workload,
    hw: Hardware,
    m: Model,
    seed: int,
    steps: int,
    warmup: int,
    k: int,
    g: int,
    colocated: bool = False,
) -> Result:
    """Bounded staleness k: batch b joins the queue once the generator holds version b - 1 - k. Separate
    placement: g generating GPUs and gpus - g training ones; each sync pauses the generator in flight. Colocated:
    every GPU does both, and generation pauses for every update and sync (the parked caches are lost)."""
    total = warmup + steps
    n_train = hw.gpus if colocated else hw.gpus - g
    if n_train < 1 or g < 1:
        raise ValueError(f"no GPU left for a role: {g} generating, {n_train} training")
    gen = Generator(hw.gpus if colocated else g, hw, m)
    q = Queue(gen)
    ts = sync_time(hw, m)
    batches: dict[int, Batch] = {}
    events: list = []
    left: dict[int, int] = {}
    vsum: dict[int, float] = {}
    vmin: dict[int, int] = {}
    complete: set[int] = set()
    state = {"version": 0, "admitted": 0, "training": False, "seq": 0, "train_busy": 0.0}
    step_end: dict[int, float] = {0: 0.0}
    snaps: dict[int, tuple[float, float, float, int, int]] = {0: (0.0, 0.0, 0.0, 0, 0)}
    stale_tok, stale_w, stale_max = 0.0, 0.0, 0

    def push(T: float, kind: str, payload) -> None:
        heapq.heappush(events, (T, state["seq"], kind, payload))
        state["seq"] += 1

    def admit(T: float) -> None:
        while state["admitted"] + 1 <= state["version"] + 1 + k:  # past ``total`` too: no end effect
            b = state["admitted"] = state["admitted"] + 1
            batches[b] = make_batch(w, m, hw, seed, b)
            left[b], vsum[b], vmin[b] = len(batches[b].episodes), 0.0, total
            for e in range(left[b]):
                q.push(request(b, e, 0, batches[b]), T)

    def start_training(T: float) -> None:
        b = state["version"] + 1
        if state["training"] or b not in complete:
            return
        state["training"] = True
        dur = train_time(batches[b], hw, n_train)
        if colocated:  # the GPUs train and sync: no decoding until both are done
            gen.pause(T, dur + ts)
            gen.flush()
        push(T + dur, "trained", (b, dur))

    def episode_done(b: int, T: float) -> None:
        left[b] -= 1
        if not left[b]:
            complete.add(b)
            start_training(T)

    admit(0.0)
    while state["version"] < total:
        tg, i = gen.next_event()
        if not events or tg < events[0][0]:
            for req, vs, lo in gen.pop(i, tg):
                vsum[req[0]] += vs
                vmin[req[0]] = min(vmin[req[0]], lo)
                if turn_done(gen, batches, req, tg, push):
                    episode_done(req[0], tg)
            q.dispatch(tg)
            continue
        T, _, kind, payload = heapq.heappop(events)
        if kind == "turn":
            q.arrive(request(payload[0], payload[1], payload[2] + 1, batches[payload[0]]), T)
        elif kind == "end":
            episode_done(payload, T)
        elif kind == "trained":
            b, dur = payload
            gen.pause(T, 0.0 if colocated else ts, b)  # colocated: already paused until the sync ends
            push(T + ts, "synced", (b, dur))
        else:  # synced: the generator holds version b from now on
            b, dur = payload
            state["version"], state["training"] = b, False
            state["train_busy"] += dur + ts
            step_end[b] = T
            if b > warmup:
                tokens = batches[b].gen_tokens
                stale_tok += tokens
                stale_w += (b - 1) * tokens - vsum[b]
                stale_max = max(stale_max, b - 1 - vmin[b])
            if b in (warmup, total):
                snaps[b] = (*gen.snapshot(T), state["train_busy"], gen.later_turns, gen.reprefills)
            batches.pop(b - 1, None)
            admit(T)
            start_training(T)
    wall = step_end[total] - step_end[warmup]
    (b0, k0, t0, l0, r0), (b1, k1, t1, l1, r1) = snaps[warmup], snaps[total]
    return Result(
        s_step=wall / steps,
        gen_idle=1 - (b1 - b0) / (gen.g * wall),
        train_idle=1 - (t1 - t0) / wall,
        tok_s_gpu=(k1 - k0) / (gen.g * wall),
        stale_mean=stale_w / stale_tok,
        stale_max=stale_max,
        reprefill=(r1 - r0) / (l1 - l0) if l1 > l0 else 0.0,
    )


# ----------------------------------------------------------------------------------------------------------- main
def describe(w: Workload, m: Model, hw: Hardware, seed: int, batches: int) -> str:
    bs = [make_batch(w, m, hw, seed, b) for b in range(1, batches + 1)]
    lens = np.array([t[1] for bt in bs for ep in bt.episodes for t in ep])
    turns = np.array([len(ep) for bt in bs for ep in bt.episodes])
    capped = sum(bt.capped for bt in bs) / len(lens)
    env = (
        f"; environment step after each turn lognormal median {w.env_median} s sigma {w.env_sigma}, clipped to "
        f"{w.env_clip[0]}-{w.env_clip[1]} s"
        if w.env_median
        else ""
    )
    return (
        f"{w.name}: {hw.gpus} GPUs, {w.prompts * w.group} episodes per step ({w.prompts} prompts x {w.group}), "
        + (f"{turns.min()}-{turns.max()} turns (mean {turns.mean():.1f})" if turns.max() > 1 else "1 turn")
        + f"; generated tokens per turn lognormal median "
        f"{w.gen_median:g} sigma {w.gen_sigma:g}, {w.gen_min}-{w.gen_max}: sample median {np.median(lens):.0f}, "
        f"mean {lens.mean():.0f}, {100 * capped:.1f}% at the cap; prompt {w.text_tokens + w.image_tokens} tokens "
        f"({w.image_tokens} image){env}"
    )


def pct(x: float) -> str:
    return f"{100 * max(x, 0.0):.0f}%"


def row(mode: str, k: int, split: str, r: Result, base: float, multi: bool) -> str:
    re = pct(r.reprefill) if multi else "-"
    return (
        f"{mode:<14} {k:>2} {split:>15} {r.s_step:>8.2f} {base / r.s_step:>8.2f}x {pct(r.gen_idle):>9} "
        f"{pct(r.train_idle):>10} {r.tok_s_gpu:>14.0f} {r.stale_mean:>8.2f} / {r.stale_max:<3} {re:>11}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", default="all", choices=["all", *SETTINGS])
    ap.add_argument("--steps", type=int, default=50, help="measured steps, after the warm-up")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--ks", default="1,2,4", help="staleness bounds k of the asynchronous rows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--colocated-async", action="store_true", help="also colocated asynchronous rows (time-shared GPUs)"
    )
    h, d = ap.add_argument_group("hardware (per GPU unless said)"), Hardware()
    h.add_argument("--gpus", type=int, default=d.gpus)
    h.add_argument("--peak-tflops", type=float, default=d.peak_tflops, help="bf16 dense")
    h.add_argument("--hbm-tbps", type=float, default=d.hbm_tbps)
    h.add_argument("--bw-eff", type=float, default=d.bw_eff, help="achieved share of the HBM bandwidth")
    h.add_argument("--decode-mfu", type=float, default=d.decode_mfu)
    h.add_argument("--prefill-mfu", type=float, default=d.prefill_mfu)
    h.add_argument("--train-mfu", type=float, default=d.train_mfu)
    h.add_argument("--step-overhead-ms", type=float, default=d.step_overhead_ms, help="per decoding step")
    h.add_argument("--max-seqs", type=int, default=d.max_seqs, help="active sequences per generating GPU")
    h.add_argument("--kv-cache-gb", type=float, default=d.kv_cache_gb, help="KV cache per generating GPU")
    h.add_argument("--sync-gbps", type=float, default=d.sync_gbps, help="weight sync bandwidth, GB/s")
    h.add_argument("--sync-overhead", type=float, default=d.sync_overhead_s, help="fixed cost per sync, s")
    dm = Model()
    h.add_argument(
        "--train-factor",
        type=float,
        default=dm.train_factor,
        help="training FLOPs per parameter per token (6 update + 2 old log-probs + 2 reference)",
    )
    wl = ap.add_argument_group("workload overrides (applied to every selected setting)")
    for name, typ in (("prompts", int), ("group", int), ("gen-median", float), ("gen-sigma", float)):
        wl.add_argument(f"--{name}", type=typ, default=None)
    wl.add_argument("--gen-max", type=int, default=None)
    wl.add_argument("--env-median", type=float, default=None, help="seconds (multi-turn settings)")
    args = ap.parse_args()

    hw = Hardware(
        gpus=args.gpus,
        peak_tflops=args.peak_tflops,
        hbm_tbps=args.hbm_tbps,
        bw_eff=args.bw_eff,
        decode_mfu=args.decode_mfu,
        prefill_mfu=args.prefill_mfu,
        train_mfu=args.train_mfu,
        step_overhead_ms=args.step_overhead_ms,
        max_seqs=args.max_seqs,
        kv_cache_gb=args.kv_cache_gb,
        sync_gbps=args.sync_gbps,
        sync_overhead_s=args.sync_overhead,
    )
    m = replace(dm, train_factor=args.train_factor)
    ks = [int(k) for k in args.ks.split(",")]
    names = list(SETTINGS) if args.setting == "all" else [args.setting]
    over = {
        "prompts": args.prompts,
        "group": args.group,
        "gen_median": args.gen_median,
        "gen_sigma": args.gen_sigma,
        "gen_max": args.gen_max,
    }
    best_all = []
    print(
        f"roofline: {hw.peak_tflops:g} TFLOP/s bf16, {hw.hbm_tbps:g} TB/s x {hw.bw_eff:g}, decode step "
        f"{hw.step_overhead_ms:g} ms + max(weights, compute at MFU {hw.decode_mfu:g}) + KV reads, prefill MFU "
        f"{hw.prefill_mfu:g}, training {m.train_factor:g} x params FLOPs per token at MFU {hw.train_mfu:g}, "
        f"<= {hw.max_seqs} sequences and {hw.kv_cache_gb:g} GB of KV cache per generating GPU, weight sync "
        f"{sync_time(hw, m):.2f} s; {args.steps} steps measured after {args.warmup}, seed {args.seed}"
    )
    for name in names:
        w = replace(SETTINGS[name], **{key: v for key, v in over.items() if v is not None})
        if args.env_median is not None and w.env_median:
            w = replace(w, env_median=args.env_median)
        multi = w.turns != (1, 1)
        print()
        print(describe(w, m, hw, args.seed, 4))
        sync = run_sync(w, hw, m, args.seed, args.steps, args.warmup)
        bound = (sync.t_gen + sync.t_train) / max(sync.t_gen, sync.t_train)
        print(
            f"synchronous stage times ({hw.gpus} GPUs): generation {sync.t_gen:.2f} s, training {sync.t_train:.2f} s, "
            f"weight sync {sync.t_sync:.2f} s; bound (t_gen + t_train) / max(t_gen, t_train) = {bound:.2f}"
        )
        print(
            f"{'mode':<14} {'k':>2} {'GPUs gen/train':>15} {'s/step':>8} {'speed-up':>9} {'gen idle':>9} "
            f"{'train idle':>10} {'gen tok/s/GPU':>14} {'staleness mean/max':>18} {'re-prefills':>11}"
        )
        print(row("sync", 0, f"{hw.gpus}/{hw.gpus} coloc.", sync, sync.s_step, multi))
        splits: dict[int, dict[int, Result]] = {}
        floor = {g: sync.t_train * hw.gpus / (hw.gpus - g) + sync.t_sync for g in range(1, hw.gpus)}
        for k in ks:
            splits[k] = {}
            for g in range(1, hw.gpus):  # the trainer's floor grows with g: stop once it passes the best
                if splits[k] and floor[g] >= min(r.s_step for r in splits[k].values()):
                    break
                splits[k][g] = run_async(w, hw, m, args.seed, args.steps, args.warmup, k, g)
            g = min(splits[k], key=lambda g: splits[k][g].s_step)
            print(row("async", k, f"{g}/{hw.gpus - g}", splits[k][g], sync.s_step, multi))
        if args.colocated_async:
            for k in ks:
                r = run_async(w, hw, m, args.seed, args.steps, args.warmup, k, hw.gpus, colocated=True)
                print(row("async coloc.", k, f"{hw.gpus}/{hw.gpus} coloc.", r, sync.s_step, multi))
        print(
            "s/step (speed-up) at each split, generating/training GPUs; '>= X': not run, the trainer alone "
            "(training on the other GPUs + sync) takes X, more than the best split's step:"
        )
        for k in ks:
            cells = [
                f"{g}/{hw.gpus - g} {splits[k][g].s_step:.1f} ({sync.s_step / splits[k][g].s_step:.2f}x)"
                if g in splits[k]
                else f"{g}/{hw.gpus - g} >={floor[g]:.1f}"
                for g in range(1, hw.gpus)
            ]
            print(f"  k={k}: " + "  ".join(cells))
        if multi:
            print("published, not measured here (agentic): ROLL Flash 2.72x")
        else:
            print(
                "published, not measured here (RLVR): AReaL 2.77x, verl fully-async 2.35-2.67x, ROLL Flash 2.24x, "
                "PipelineRL ~2x"
            )
        k, g = min(((k, g) for k in ks for g in splits[k]), key=lambda kg: splits[kg[0]][kg[1]].s_step)
        best_all.append(f"{name} {sync.s_step / splits[k][g].s_step:.2f}x (k={k}, {g}/{hw.gpus - g})")
    print()
    print(PUBLISHED + ".")
    print("speed-up async/sync: " + " ".join(best_all))


if __name__ == "__main__":
    main()
