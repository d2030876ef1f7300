"""The synchronous-vs-asynchronous projection (benchmarks/async_sim.py): its event-driven asynchronous run against
independent references (the synchronous loop, the generator alone, a linear pipeline's closed form) and the
staleness bound."""

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _sim():
    if str(ROOT / "benchmarks") not in sys.path:  # its cost model, async_sim_model.py, is a sibling module
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("async_sim", ROOT / "benchmarks" / "async_sim.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["async_sim"] = module
    spec.loader.exec_module(module)
    return module


sim = _sim()
HW, MODEL = sim.Hardware(), sim.Model()
GEO = replace(sim.SETTINGS["geometry3k-3b"], prompts=16)  # 128 rollouts a step: fast, still long-tailed
GUI = replace(sim.SETTINGS["gui-agent"], prompts=4, turns=(3, 8))  # 32 episodes a step


@pytest.mark.parametrize("w", [GEO, GUI], ids=["geometry", "gui"])
def test_staleness_zero_is_the_synchronous_run(w):
    """k = 0 admits batch b only once the weights trained on b - 1 are synced, so the event-driven run must give the
    synchronous loop's s/step, colocated and in a separate placement, with no stale token; and a seed repeats."""
    sync = sim.run_sync(w, HW, MODEL, 0, 6, 2)
    coloc = sim.run_async(w, HW, MODEL, 0, 6, 2, k=0, g=HW.gpus, colocated=True)
    assert coloc.s_step == pytest.approx(sync.s_step, rel=0.01)
    split_sync = sim.run_sync(w, HW, MODEL, 0, 6, 2, g=3)
    split = sim.run_async(w, HW, MODEL, 0, 6, 2, k=0, g=3)
    assert split.s_step == pytest.approx(split_sync.s_step, rel=0.01)
    assert split.s_step > sync.s_step  # generation on 3 GPUs and training on 5, in turn: slower than on all 8
    assert coloc.stale_max == split.stale_max == 0 and abs(split.stale_mean) < 1e-9
    again = sim.run_async(w, HW, MODEL, 0, 6, 2, k=0, g=3)
    assert again == split
    assert sim.run_async(w, HW, MODEL, 1, 6, 2, k=0, g=3).s_step != split.s_step


@pytest.mark.parametrize("w", [GEO, GUI], ids=["geometry", "gui"])
def test_staleness_never_exceeds_k(w):
    """Whatever the split, no trained token is more than k versions old, and with k >= 1 some are stale."""
    for k in (1, 2, 3):
        for g, colocated in ((1, False), (2, False), (5, False), (HW.gpus, True)):
            r = sim.run_async(w, HW, MODEL, 0, 8, 2, k=k, g=g, colocated=colocated)
            assert 0 < r.stale_mean <= r.stale_max <= k, (k, g, colocated, r)


def test_free_training_leaves_generation_only():
    """With training and the weight sync costing nothing, the trainer never holds the generator back; only the
    bound does: at most k + 1 batches are in flight, and a batch lasts as long as its slowest sequence, so a small k
    caps the throughput. As k grows, the steps come as fast as the generator alone (every batch queued at once)
    delivers them, never faster, and far faster than the synchronous step, which waits for each batch's tail."""
    hw = replace(HW, sync_overhead_s=0.0, sync_gbps=1e15)
    m = replace(MODEL, train_factor=0.0)
    w = sim.SETTINGS["geometry3k-3b"]
    alone = sim.generation_only(w, hw, m, 0, g=4, steps=12, warmup=3)
    steps = [sim.run_async(w, hw, m, 0, 12, 3, k=k, g=4) for k in (1, 2, 4, 8)]
    assert all(r.train_idle > 0.99 for r in steps)
    s = [r.s_step for r in steps]
    assert s == sorted(s, reverse=True) and s[0] > 2 * s[-1]
    assert min(s) >= 0.99 * alone
    assert s[-1] == pytest.approx(alone, rel=0.03)
    sync = sim.run_sync(w, hw, m, 0, 12, 3)
    assert sync.s_step > 3 * alone  # 8 GPUs in lockstep batches against 4 streaming ones


def test_linear_pipeline_matches_closed_form_and_stays_under_the_bound():
    """Constant lengths, no environment, and a decode cost per token that does not depend on concurrency (no step
    overhead, no weight or KV reads): generation and training then scale linearly with their GPUs, so an
    asynchronous step at split g/t is max(t_gen * N / g, t_train * N / t) + t_sync, and the speed-up over the
    synchronous run stays below the overlap bound (t_gen + t_train) / max(t_gen, t_train)."""
    hw = replace(HW, step_overhead_ms=0.0, hbm_tbps=1e9, max_seqs=4096, decode_mfu=0.01)
    m = replace(MODEL, kv_bytes=0.0)
    w = replace(GEO, gen_sigma=0.0)
    sync = sim.run_sync(w, hw, m, 0, 6, 2)
    bound = (sync.t_gen + sync.t_train) / max(sync.t_gen, sync.t_train)
    assert bound > 1.2
    n = hw.gpus
    for g in range(1, n):
        r = sim.run_async(w, hw, m, 0, 30, 10, k=4, g=g)
        expect = max(sync.t_gen * n / g, sync.t_train * n / (n - g)) + sync.t_sync
        assert r.s_step == pytest.approx(expect, rel=0.02), g
        assert sync.s_step / r.s_step <= bound
