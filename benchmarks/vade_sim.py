"""Simulated prompt selection: uniform sampling, DAPO-style filtering and VADE (docs/algorithms.md#vade) at equal rollout
budgets, plus VADE's selection time over a 1,000,000-record pool.

The stand-in policy: record i succeeds with hidden probability sigmoid(skill - d_i), difficulties d_i ~ N(0, spread),
and ``skill`` rises linearly with the rollouts spent so far (the same schedule for every method, so the policy improves
at the same pace per rollout whatever the sampler picks; only the choice of records differs). A group is informative
when its G rewards are not all equal, i.e. when group-normalised advantages are not all zero.

- uniform: mmrl's ``uniform`` sampler, every group trained.
- DAPO-style filtering: uniform batches are generated and only informative groups kept until a batch of B is full;
  uninformative groups and the surplus beyond B are discarded (their rollouts are spent for nothing).
- VADE: mmrl's ``vade`` sampler, every group trained.
- oracle: picks the records most likely to be informative from the hidden probabilities (an upper bound, not a method).

The default skill schedule (-1 -> 6, difficulty spread 2.5) makes uniform sampling's informative share fall from about
0.6 to about 0.1 over the run, the uniform curve the VADE paper reports. VADE can only prefer records it has seen, so
its gain grows with the prompt visits per record (steps x batch / records); the README gives a sweep.

    OMP_NUM_THREADS=1 python benchmarks/vade_sim.py [--records 100000 --steps 2000 --batch 256 --group 8 --seeds 3]

The last line is ``informative share: vade X uniform Y ratio Z; select 1M pool: T ms``, with T the median time
``select`` takes in a step loop when every record of the 1M pool holds counts (the steady state of a long run, the
slowest case). The Thompson draws themselves (~40 ms per million here) are made in the background during the rest of
the step (``--work`` seconds stand for it) and printed beside it, as is a select that must draw in place.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import numpy as np

from mmrl.algos.beta import BetaTracker
from mmrl.samplers import UniformSampler, VadeSampler


class DriftingTasks:
    """Bernoulli rewards with success probabilities that drift upward as the rollout budget is spent."""

    def __init__(self, n: int, budget: int, seed: int, skill: tuple[float, float], spread: float):
        self.rng = np.random.default_rng(seed)
        self.difficulty = self.rng.normal(0.0, spread, n)  # [n]
        self.budget, self.spent, self.skill = budget, 0, skill

    def left(self) -> int:
        return self.budget - self.spent

    def success_prob(self, idx: np.ndarray | list[int] | slice = slice(None)) -> np.ndarray:
        skill = self.skill[0] + (self.skill[1] - self.skill[0]) * self.spent / self.budget
        return 1.0 / (1.0 + np.exp(self.difficulty[idx] - skill))

    def rollout(self, idx: list[int], G: int) -> np.ndarray:
        q = self.success_prob(idx)  # [k]
        self.spent += len(idx) * G
        return (self.rng.random((len(idx), G)) < q[:, None]).astype(np.float64)  # [k, G]


class Oracle:
    """Knows the hidden probabilities: picks the B records most likely to give a non-uniform group. An upper bound
    for any sampler, not a method."""

    def __init__(self, tasks: DriftingTasks, G: int):
        self.tasks, self.G = tasks, G

    def select(self, k: int) -> list[int]:
        q = self.tasks.success_prob()
        h = 1.0 - q**self.G - (1.0 - q) ** self.G  # P(group rewards not all equal)
        return np.argpartition(h, len(h) - k)[len(h) - k :].tolist()

    def update(self, indices: list[int], rewards: np.ndarray) -> None:
        return None


@dataclass
class Result:
    groups: int = 0  # generated
    informative: int = 0  # generated and informative
    trained_informative: int = 0  # informative groups that entered a training batch
    trained_groups: int = 0
    discarded_rollouts: int = 0
    step_shares: list[float] = field(default_factory=list)  # informative share per generated batch


def informative(r: np.ndarray) -> np.ndarray:
    return r.min(axis=1) != r.max(axis=1)  # [k]


def run_sampler(sampler, tasks: DriftingTasks, B: int, G: int) -> Result:
    res = Result()
    while tasks.left() >= B * G:
        idx = sampler.select(B)
        r = tasks.rollout(idx, G)
        sampler.update(idx, r)
        inf = int(informative(r).sum())
        res.groups += B
        res.trained_groups += B
        res.informative += inf
        res.trained_informative += inf
        res.step_shares.append(inf / B)
    return res


def run_dapo(tasks: DriftingTasks, B: int, G: int, seed: int) -> Result:
    sampler, res, kept = UniformSampler(len(tasks.difficulty), seed=seed), Result(), 0
    while tasks.left() >= B * G:
        r = tasks.rollout(sampler.select(B), G)
        inf = int(informative(r).sum())
        take = min(inf, B - kept)
        kept += take
        res.groups += B
        res.informative += inf
        res.discarded_rollouts += (B - take) * G
        res.step_shares.append(inf / B)
        if kept == B:
            res.trained_groups += B
            res.trained_informative += B
            kept = 0
    res.discarded_rollouts += kept * G  # an unfinished batch when the budget ran out never trains
    return res


def simulate(args: argparse.Namespace, seed: int) -> dict[str, Result]:
    budget = args.steps * args.batch * args.group
    n = args.records

    def tasks() -> DriftingTasks:
        return DriftingTasks(n, budget, seed, (args.skill_start, args.skill_end), args.spread)

    oracle_tasks = tasks()
    return {
        "uniform": run_sampler(UniformSampler(n, seed=seed), tasks(), args.batch, args.group),
        "dapo": run_dapo(tasks(), args.batch, args.group, seed),
        "vade": run_sampler(
            VadeSampler(n, seed=seed, l1=args.l1, l2=args.l2, pool_size=args.pool_size),
            tasks(),
            args.batch,
            args.group,
        ),
        "oracle": run_sampler(Oracle(oracle_tasks, args.group), oracle_tasks, args.batch, args.group),
    }


def time_ms(fn, repeats: int) -> tuple[float, float]:
    """Median and fastest of ``repeats`` calls after a warm-up (the fastest is the least disturbed by a shared CPU)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times)), min(times)


def step_times(sampler: VadeSampler, k: int, group: int, repeats: int, work_s: float) -> dict[str, float]:
    """Selection as a trainer runs it: select, then ``work_s`` seconds of other work (the rollouts, rewards and
    policy update, during which the next draws are prepared), then the update. Medians over ``repeats`` steps after a
    warm-up step: the time ``select`` took (critical path), the draws' own time (in the background), and the
    update's."""
    rng = np.random.default_rng(1)
    sel, draw, upd = [], [], []
    for step in range(repeats + 1):
        t0 = time.perf_counter()
        idx = sampler.select(k)
        t1 = time.perf_counter()
        time.sleep(work_s)
        t2 = time.perf_counter()
        sampler.update(idx, (rng.random((k, group)) < 0.5).astype(np.float64))
        t3 = time.perf_counter()
        if step:
            sel.append((t1 - t0) * 1e3)
            draw.append(sampler.stats()["vade/draw_ms"])
            upd.append((t3 - t2) * 1e3)
    return {"select": float(np.median(sel)), "draws": float(np.median(draw)), "update": float(np.median(upd))}


def pool_times(
    args: argparse.Namespace,
) -> tuple[dict[str, dict[str, float]], dict[str, tuple[float, float]]]:
    """Per-step select / draw / update times over the large pool for several states of the counts, and the update
    against an eager l2 decay of every record."""
    n, k, rng = args.pool, args.batch, np.random.default_rng(0)
    out = {}
    fresh = VadeSampler(n, seed=0)
    out["fresh pool (no record seen yet)"] = step_times(fresh, k, args.group, args.repeats, args.work)
    half = VadeSampler(n, seed=0)
    some = np.flatnonzero(rng.random(n) < 0.5)  # a random half, as a run leaves them
    half.set_counts(some, rng.random(len(some)) * 6, rng.random(len(some)) * 6)
    out["a random half of the records hold counts"] = step_times(half, k, args.group, args.repeats, args.work)
    full = VadeSampler(n, seed=0)
    full.set_counts(np.arange(n), rng.random(n) * 6, rng.random(n) * 6)
    out["every record holds counts"] = step_times(full, k, args.group, args.repeats, args.work)
    sub = VadeSampler(n, seed=0, pool_size=100_000)
    sub.set_counts(np.arange(n), rng.random(n) * 6, rng.random(n) * 6)
    out["every record holds counts, pool_size=100000"] = step_times(
        sub, k, args.group, args.repeats, args.work
    )
    inplace = VadeSampler(n, seed=0)
    inplace.set_counts(np.arange(n), rng.random(n) * 6, rng.random(n) * 6)

    def in_place() -> None:  # set_counts invalidates the prepared draws: select draws the whole pool itself
        inplace.set_counts([0], 1.0, 1.0)
        inplace.select(k)

    upd = {"select with the draws made in place (no step to hide them in)": time_ms(in_place, args.repeats)}
    idx = full.select(k)
    r = (rng.random((k, args.group)) < 0.5).astype(np.float64)
    upd["update, lazy l2 decay (as shipped)"] = time_ms(lambda: full.update(idx, r), args.repeats)
    eager = BetaTracker(n)

    def eager_update() -> None:  # the same step with the l2 decay applied to every record's counts
        eager.decay_all(args.l2, exclude=np.asarray(idx))
        eager.update(idx, r.sum(1), args.group - r.sum(1), decay=args.l1)

    upd["update, eager l2 decay of every record"] = time_ms(eager_update, args.repeats)
    return out, upd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=2000, help="rollout budget = steps x batch x group")
    ap.add_argument("--batch", type=int, default=256, help="prompts per training batch (B)")
    ap.add_argument("--group", type=int, default=8, help="rollouts per prompt (G)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--l1", type=float, default=0.2)
    ap.add_argument("--l2", type=float, default=0.999)
    ap.add_argument(
        "--pool-size", type=int, default=None, help="VADE's candidate pool (default: every record)"
    )
    ap.add_argument("--spread", type=float, default=2.5, help="std of the difficulty logits")
    ap.add_argument(
        "--skill-start", type=float, default=-1.0, help="uniform's informative share starts near 0.6"
    )
    ap.add_argument(
        "--skill-end", type=float, default=6.0, help="... and ends near 0.1, as in the VADE paper"
    )
    ap.add_argument("--pool", type=int, default=1_000_000, help="pool size for the selection timing")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument(
        "--work",
        type=float,
        default=1.0,
        help="seconds of other work per step in the timing loop (rollouts, rewards, update: ~1 s for the tiny CPU "
        "recipes, tens of seconds for a real model)",
    )
    args = ap.parse_args()

    budget = args.steps * args.batch * args.group
    print(
        f"{args.records} records, budget {budget} rollouts ({args.steps} x {args.batch} prompts x G={args.group}, "
        f"{args.steps * args.batch / args.records:.1f} prompt visits per record), l1={args.l1} l2={args.l2}, "
        f"VADE pool {args.pool_size or 'all records'}, seeds {args.seeds}"
    )
    runs = [simulate(args, seed) for seed in range(args.seeds)]
    head = (
        f"{'method':<8} {'inform. share':>14} {'first 10%':>10} {'last 10%':>9} {'trained groups':>15} "
        f"{'discarded rollouts':>19} {'rollouts / inform. trained group':>33}"
    )
    print(head)  # shares are means over seeds
    share = {}
    for name in ("uniform", "dapo", "vade", "oracle"):
        rs = [run[name] for run in runs]
        s = np.array([r.informative / r.groups for r in rs])
        tenth = max(1, len(rs[0].step_shares) // 10)
        first = np.mean([np.mean(r.step_shares[:tenth]) for r in rs])
        last = np.mean([np.mean(r.step_shares[-tenth:]) for r in rs])
        trained = np.mean([r.trained_groups for r in rs])
        discarded = np.mean([r.discarded_rollouts for r in rs])
        per = np.mean([budget / max(r.trained_informative, 1) for r in rs])
        share[name] = float(s.mean())
        print(
            f"{name:<8} {s.mean():>8.4f}±{s.std():.4f} {first:>10.3f} {last:>9.3f} {trained:>15.0f} "
            f"{discarded:>19.0f} {per:>33.2f}"
        )
    print(
        "inform. share: informative groups / generated groups (DAPO trains only informative ones); "
        "± is the std over seeds"
    )
    times, updates = pool_times(args)
    for what, t in times.items():
        print(
            f"step over {args.pool} records, {what}: select {t['select']:.2f} ms (critical path), "
            f"draws {t['draws']:.2f} ms (prepared during the step's other {args.work:.1f} s), "
            f"update {t['update']:.3f} ms"
        )
    for what, (med, best) in updates.items():
        print(
            f"{what}, {args.batch} x G={args.group} over {args.pool} records: median {med:.2f} ms, fastest {best:.2f} ms"
        )
    ratio = share["vade"] / share["uniform"]
    print(
        f"informative share: vade {share['vade']:.3f} uniform {share['uniform']:.3f} ratio {ratio:.2f}; "
        f"select 1M pool: {times['every record holds counts']['select']:.1f} ms"
    )


if __name__ == "__main__":
    main()
