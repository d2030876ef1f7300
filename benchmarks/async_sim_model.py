"""The cost model behind ``async_sim.py``: the hardware, model and workload settings, the long-tailed batches,
the generating GPU (continuous batching, KV-cache admission, in-flight weight loads), the bounded queue and the
training and weight-sync times. ``async_sim.py`` runs the synchronous and asynchronous event loops over them."""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

INF = float("inf")


@dataclass(frozen=True)
class Hardware:
    gpus: int = 8
    peak_tflops: float = 989.0  # bf16 dense, H100 SXM
    hbm_tbps: float = 3.35
    bw_eff: float = 0.75  # achieved share of the HBM bandwidth
    decode_mfu: float = 0.5
    prefill_mfu: float = 0.4
    train_mfu: float = 0.35
    step_overhead_ms: float = 2.5  # per decoding step: launch, sampling, scheduling
    max_seqs: int = 256  # active sequences per generating GPU
    kv_cache_gb: float = 50.0  # per generating GPU: what 80 GB leaves after weights, activations and graphs
    sync_gbps: float = 50.0
    sync_overhead_s: float = 0.5


@dataclass(frozen=True)
class Model:
    lm_params: float = 3.09e9
    vision_params: float = 0.67e9
    kv_bytes: float = 36_864.0  # per token: 36 layers x 2 KV heads x 128 x (K, V) x 2 bytes
    patches_per_image_token: int = 4  # the 2x2 merge: the vision tower sees 4 patches per image token
    # FLOPs per parameter per trained token: update 6, recomputed old log-probs 2, reference forward 2
    train_factor: float = 10.0
    weight_bytes: float = 2.0  # bf16


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: int
    group: int
    turns: tuple[int, int] = (1, 1)  # inclusive range, uniform
    gen_median: float = 400.0  # lognormal generated tokens per turn
    gen_sigma: float = 0.85
    gen_min: int = 16
    gen_max: int = 2048
    env_median: float = 0.0  # lognormal environment latency after each turn, seconds (0: none)
    env_sigma: float = 0.0
    env_clip: tuple[float, float] = (0.0, 0.0)
    text_tokens: int = 100  # the prompt's text
    image_tokens: int = 400  # per image: the prompt's, and one per later observation
    obs_text_tokens: int = 0  # text of each later observation


SETTINGS = {
    "geometry3k-3b": Workload("geometry3k-3b", prompts=64, group=8),
    "gui-agent": Workload(
        "gui-agent",
        prompts=32,
        group=8,
        turns=(5, 15),
        gen_median=90.0,
        gen_sigma=0.5,
        gen_min=16,
        gen_max=512,
        env_median=1.5,
        env_sigma=0.9,
        env_clip=(0.5, 10.0),
        text_tokens=300,
        image_tokens=256,
        obs_text_tokens=50,
    ),
}
PUBLISHED = (
    "published, not measured here: AReaL 2.77x (AReaL: A Large-Scale Asynchronous Reinforcement Learning System "
    "for Language Reasoning; 1.5B); verl fully-async 2.35-2.67x (verl's Fully Async Policy Trainer; Qwen2.5-7B, "
    "128 GPUs); ROLL Flash 2.24x RLVR / 2.72x agentic (Part II: ROLL Flash - Accelerating RLVR and Agentic "
    "Training with Asynchrony); PipelineRL ~2x (PipelineRL: Faster On-policy Reinforcement Learning for Long "
    "Sequence Generation). Text models, other sizes, GPU counts and baselines: for context only"
)


# --------------------------------------------------------------------------------------------------------- batches
@dataclass
class Batch:
    # per episode, per turn: (context at decode start, tokens to generate, prefill s with the earlier context
    # cached, prefill s of the whole context, environment s after the turn)
    episodes: list[list[tuple[float, int, float, float, float]]]
    train_flops: float
    gen_tokens: int
    capped: int  # turns that generated gen_max tokens


def lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(n)) if sigma > 0 else np.full(n, float(median))


def make_batch(w: Workload, m: Model, hw: Hardware, seed: int, b: int) -> Batch:
    """Batch ``b``'s episodes, the same in every mode (drawn from (seed, setting, b)). An episode is one sequence:
    turn j decodes after the prompt, every earlier turn's tokens and j observations (text and one image each)."""
    rng = np.random.default_rng([seed, sum(map(ord, w.name)), b])
    n = w.prompts * w.group
    turns = rng.integers(w.turns[0], w.turns[1] + 1, n)
    total = int(turns.sum())
    gen = np.clip(np.rint(lognormal(rng, w.gen_median, w.gen_sigma, total)), w.gen_min, w.gen_max).astype(int)
    if w.env_median > 0:
        env = np.clip(lognormal(rng, w.env_median, w.env_sigma, total), *w.env_clip)
    else:
        env = np.zeros(total)
    flop_s = hw.peak_tflops * 1e12 * hw.prefill_mfu
    vision = 2 * m.vision_params * m.patches_per_image_token * w.image_tokens  # FLOPs to encode one image
    first = (
        (2 * m.lm_params * (w.text_tokens + w.image_tokens) + vision) / flop_s / w.group
    )  # shared by the group
    later = (
        2 * m.lm_params * (w.obs_text_tokens + w.image_tokens) + vision
    ) / flop_s  # the new observation only
    episodes, train, pos = [], 0.0, 0
    for e in range(n):
        ctx, turns_e = float(w.text_tokens + w.image_tokens), []
        for j in range(int(turns[e])):
            if j:
                ctx += w.obs_text_tokens + w.image_tokens
                full = (2 * m.lm_params * ctx + (j + 1) * vision) / flop_s  # the cached prefix was evicted
                cheap = later
            else:
                cheap = full = first
            g = int(gen[pos])
            turns_e.append((ctx, g, cheap, full, float(env[pos])))
            ctx += g
            pos += 1
        images = int(turns[e]) * m.patches_per_image_token * w.image_tokens
        train += m.train_factor * (m.lm_params * ctx + m.vision_params * images)
        episodes.append(turns_e)
    return Batch(episodes, train, int(gen.sum()), int((gen == w.gen_max).sum()))


def request(b: int, e: int, j: int, batch: Batch) -> list:
    """[batch, episode, turn, ctx0, gen, prefill cached, env s, start step (set on admission), prefill full]."""
    ctx, g, cheap, full, env = batch.episodes[e][j]
    return [b, e, j, ctx, g, cheap, env, 0.0, full]


# ------------------------------------------------------------------------------------------------------- generator
class Generator:
    """The generating GPUs. Per GPU the active sequences decode in lockstep; between two events (an admission, a
    finish, a pause) their count n is fixed and every context grows by one token per step, so after x steps a step
    takes ``a(n) + kv * (C + n x)`` (C: the contexts' sum) and time and steps convert in closed form.

    An episode waiting for its environment leaves its slot but keeps its KV cache on its GPU (prefix caching) until
    that GPU needs the memory for others: the parked caches are evicted oldest first whenever active and parked
    contexts together pass ``kv_cache_gb``. The next turn goes back to that GPU when it has a free slot and the
    queue is empty; it prefills only its new observation when its cache is still there, its whole context when
    not."""

    def __init__(self, g: int, hw: Hardware, m: Model):
        self.g, self.slots = g, hw.max_seqs
        bw = hw.hbm_tbps * 1e12 * hw.bw_eff
        self.t0 = hw.step_overhead_ms * 1e-3
        self.w = m.lm_params * m.weight_bytes / bw
        self.c = 2 * m.lm_params / (hw.peak_tflops * 1e12 * hw.decode_mfu)
        self.kv = m.kv_bytes / bw
        self.budget = hw.kv_cache_gb * 1e9 / m.kv_bytes if m.kv_bytes > 0 else INF  # tokens per GPU
        self.t = [0.0] * g  # last update
        self.free = [0.0] * g  # stalled (prefill, sync pause, colocated update) until
        self.D = [0.0] * g  # decoding steps taken (fluid)
        self.n = [0] * g
        self.C = [0.0] * g
        self.heap: list[list] = [[] for _ in range(g)]  # (finish step, seq, request)
        self.nt = [INF] * g  # next finish time
        self.busy = [0.0] * g  # decoding or prefilling seconds
        self.tokens = [0.0] * g
        self.vD: list[list[float]] = [[0.0] for _ in range(g)]  # version change points: step, version
        self.vv: list[list[int]] = [[0] for _ in range(g)]
        self.parked: list[OrderedDict] = [
            OrderedDict() for _ in range(g)
        ]  # (batch, episode) -> cached tokens
        self.parked_tok = [0.0] * g
        self.home: dict[tuple[int, int], int] = {}
        self.later_turns = self.reprefills = 0
        self.seq = 0

    def _a(self, n: int) -> float:
        return self.t0 + max(self.w, self.c * n)

    def advance(self, i: int, T: float) -> None:
        start = self.t[i] if self.t[i] > self.free[i] else self.free[i]
        n = self.n[i]
        if T > start and n:
            dt = T - start
            A = self._a(n) + self.kv * self.C[i]
            B = self.kv * n
            x = 2 * dt / (A + math.sqrt(A * A + 2 * B * dt))
            self.D[i] += x
            self.C[i] += n * x
            self.busy[i] += dt
            self.tokens[i] += n * x
        if T > self.t[i]:
            self.t[i] = T

    def _next(self, i: int) -> None:
        n = self.n[i]
        if not n:
            self.nt[i] = INF
            return
        x = max(self.heap[i][0][0] - self.D[i], 0.0)
        A = self._a(n) + self.kv * self.C[i]
        start = self.t[i] if self.t[i] > self.free[i] else self.free[i]
        self.nt[i] = start + x * (A + 0.5 * self.kv * n * x)

    def admit(self, i: int, T: float, req: list) -> None:
        self.advance(i, T)
        key, prefill = (req[0], req[1]), req[5]
        if req[2]:  # a later turn: is its context still cached on this GPU?
            self.later_turns += 1
            h = self.home.get(key)
            if h is not None and key in self.parked[h]:
                self.parked_tok[h] -= self.parked[h].pop(key)
                if h != i:
                    prefill = req[8]
                    self.reprefills += 1
            else:
                prefill = req[8]
                self.reprefills += 1
        self.home[key] = i
        self.n[i] += 1
        self.C[i] += req[3]
        req[7] = self.D[i]
        heapq.heappush(self.heap[i], (self.D[i] + req[4], self.seq, req))
        self.seq += 1
        self.free[i] = max(self.free[i], T) + prefill
        self.busy[i] += prefill
        self._evict(i)
        self._next(i)

    def pop(self, i: int, T: float) -> list[tuple[list, float, int]]:
        """The sequences GPU ``i`` finishes at ``T``: (request, version-weighted tokens, lowest version)."""
        self.advance(i, T)
        h = self.heap[i]
        self.D[i] = max(self.D[i], h[0][0])
        out = []
        while h and h[0][0] <= self.D[i] + 1e-7:
            end, _, req = heapq.heappop(h)
            self.n[i] -= 1
            self.C[i] -= req[3] + (self.D[i] - req[7])
            out.append((req, *self._versions(i, req[7], end)))
        if not self.n[i]:
            self.C[i] = 0.0
        self._next(i)
        return out

    def _versions(self, i: int, d0: float, d1: float) -> tuple[float, int]:
        vD, vv = self.vD[i], self.vv[i]
        j = bisect_right(vD, d0) - 1
        lowest, s, cur = vv[j], 0.0, d0
        while j + 1 < len(vD) and vD[j + 1] < d1:
            s += vv[j] * (vD[j + 1] - cur)
            cur = vD[j + 1]
            j += 1
        return s + vv[j] * (d1 - cur), lowest

    def park(self, req: list) -> None:
        """The turn is done and the episode goes on after its environment step: keep its cache while it fits."""
        key = (req[0], req[1])
        i = self.home[key]
        self.parked[i][key] = req[3] + req[4]
        self.parked_tok[i] += req[3] + req[4]
        self._evict(i)

    def finish(self, req: list) -> None:
        self.home.pop((req[0], req[1]), None)

    def _evict(self, i: int) -> None:
        p = self.parked[i]
        while p and self.C[i] + self.parked_tok[i] > self.budget:
            self.parked_tok[i] -= p.popitem(last=False)[1]

    def flush(self) -> None:
        """Colocated: the trainer takes the memory, every parked cache is lost."""
        for i in range(self.g):
            self.parked[i].clear()
            self.parked_tok[i] = 0.0

    def pause(self, T: float, dur: float, version: int | None = None) -> None:
        """Every GPU stops decoding for ``dur`` from ``T`` (between two decoding steps, running sequences keep
        their KV cache); tokens after ``T`` carry ``version``."""
        for i in range(self.g):
            self.advance(i, T)
            self.free[i] = max(self.free[i], T) + dur
            if version is not None:
                self.vD[i].append(self.D[i])
                self.vv[i].append(version)
            self._next(i)

    def least_loaded(self) -> int:
        i = min(range(self.g), key=self.n.__getitem__)
        return i if self.n[i] < self.slots else -1

    def next_event(self) -> tuple[float, int]:
        i = min(range(self.g), key=self.nt.__getitem__)
        return self.nt[i], i

    def snapshot(self, T: float) -> tuple[float, float]:
        for i in range(self.g):
            self.advance(i, T)
            self._next(i)
        return sum(self.busy), sum(self.tokens)


class Queue:
    """Requests waiting for a slot: older batches first, then by arrival."""

    def __init__(self, gen: Generator) -> None:
        self.gen, self.h, self.seq = gen, [], 0

    def push(self, req: list, T: float) -> None:
        heapq.heappush(self.h, (req[0], self.seq, req))
        self.seq += 1
        self.dispatch(T)

    def arrive(self, req: list, T: float) -> None:
        """A later turn goes back to its episode's GPU when that has a free slot and nobody waits."""
        h = self.gen.home.get((req[0], req[1]))
        if h is not None and not self.h and self.gen.n[h] < self.gen.slots:
            self.gen.admit(h, T, req)
        else:
            self.push(req, T)

    def dispatch(self, T: float) -> None:
        while self.h:
            i = self.gen.least_loaded()
            if i < 0:
                return
            self.gen.admit(i, T, heapq.heappop(self.h)[2])


@dataclass
class Result:
    s_step: float
    gen_idle: float
    train_idle: float
    tok_s_gpu: float
    stale_mean: float
    stale_max: int
    reprefill: float  # share of later turns whose cached context had been evicted
    t_gen: float = 0.0  # synchronous stage times (run_sync only)
    t_train: float = 0.0
    t_sync: float = 0.0


def train_time(batch: Batch, hw: Hardware, gpus: int) -> float:
    return batch.train_flops / (gpus * hw.peak_tflops * 1e12 * hw.train_mfu)


def sync_time(hw: Hardware, m: Model) -> float:
    return (m.lm_params + m.vision_params) * m.weight_bytes / (hw.sync_gbps * 1e9) + hw.sync_overhead_s


def turn_done(gen: Generator, batches: dict[int, Batch], req: list, T: float, push) -> bool:
    """After a finished turn: schedule the next turn or the episode's end; True when the episode ends now."""
    if req[2] + 1 < len(batches[req[0]].episodes[req[1]]):
        gen.park(req)
        push(T + req[6], "turn", req)
        return False
    gen.finish(req)
    if req[6] > 0:
        push(T + req[6], "end", req[0])
        return False
    return True
