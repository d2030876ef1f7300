"""VADE sampler (docs/algorithms.md#vade): decay arithmetic, Thompson draws, seeding, checkpoint round trips, reward forms,
bad input, and an exact ``--resume`` through the trainer on the tiny model."""

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from mmrl.cli import main
from mmrl.samplers import SAMPLERS, VadeSampler

TINY = str(Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl")


def _run(sampler: VadeSampler, steps: int, k: int, G: int, seed: int = 0) -> list[list[int]]:
    """Select and feed back Bernoulli rewards whose success rate depends on the record, as a stand-in policy."""
    rng = np.random.default_rng(seed)
    q = np.linspace(0.0, 1.0, sampler.n)
    picks = []
    for _ in range(steps):
        idx = sampler.select(k)
        picks.append(idx)
        sampler.update(idx, torch.tensor((rng.random((k, G)) < q[idx, None]).astype(np.float32)))
    return picks


def test_registered_under_vade():
    assert SAMPLERS.get("vade") is VadeSampler


def test_worked_example_selected_and_other_records():
    s = VadeSampler(2, l1=0.2, l2=0.999)
    s.set_counts([0, 1], [0.1, 0.1], [8.4, 8.4])
    s.update([0], torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 0]]))  # G = 8, one success
    a, b = s.counts()
    np.testing.assert_allclose([a[0], b[0]], [1.02, 8.68], rtol=1e-12)
    np.testing.assert_allclose([a[1], b[1]], [0.1 * 0.999, 8.4 * 0.999], rtol=1e-12)
    np.testing.assert_allclose(s.posterior_mean(), (a + 1) / (a + b + 2), rtol=1e-12)


def test_lazy_decay_equals_exact_arithmetic_through_renormalisation():
    """The lazily decayed counts equal the eager decay computed in exact rational arithmetic (a float64 eager
    reference is itself off by up to 1e-7 relative on some selection paths, so it cannot be the yardstick)."""
    n, G, l1, l2 = 50, 4, 0.3, 0.5  # scale 0.5^t falls below 1e-30 after 100 steps: renormalised on the way
    s = VadeSampler(n, seed=1, l1=l1, l2=l2)
    alpha, beta = [Fraction(0)] * n, [Fraction(0)] * n
    L1, L2 = Fraction(l1), Fraction(l2)
    rng = np.random.default_rng(7)
    scales = []
    for _ in range(250):
        idx = s.select(5)
        r = rng.integers(0, 2, (5, G)).astype(np.float64)
        s.update(idx, r)
        alpha, beta = [a * L2 for a in alpha], [b * L2 for b in beta]
        for i, k in zip(idx, r.sum(1)):
            alpha[i] = alpha[i] / L2 * L1 + Fraction(k)
            beta[i] = beta[i] / L2 * L1 + G - Fraction(k)
        scales.append(s.scale)
    assert min(scales) < 1e-29 and s.scale > 1e-20  # the running scale was folded into the counts
    a, b = s.counts()
    np.testing.assert_allclose(a, [float(x) for x in alpha], rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(b, [float(x) for x in beta], rtol=1e-12, atol=1e-300)


def test_thompson_draws_follow_the_posterior():
    s = VadeSampler(40_000, seed=2)
    s.set_counts(np.arange(20_000), 2.0, 5.0)  # the other 20,000 records are unseen: Beta(1, 1)
    p = s._thompson(None)
    assert stats.kstest(p[:20_000], stats.beta(3.0, 6.0).cdf).pvalue > 1e-3
    assert stats.kstest(p[20_000:], stats.uniform.cdf).pvalue > 1e-3


def test_selection_prefers_records_near_one_third():
    s = VadeSampler(300, seed=3)
    s.set_counts(np.arange(0, 100), 0.0, 60.0)  # always failed
    s.set_counts(np.arange(100, 200), 60.0, 0.0)  # always solved
    s.set_counts(np.arange(200, 300), 20.0, 40.0)  # posterior mean about 1/3: the most informative
    picked = s.select(50)
    assert len(set(picked)) == 50 and all(200 <= i < 300 for i in picked)
    assert s.stats()["vade/p_mean"] == pytest.approx(21 / 62)


def test_draws_are_reproducible_under_a_seed():
    a, b, c = (_run(VadeSampler(200, seed=sd), steps=6, k=8, G=4) for sd in (5, 5, 6))
    assert a == b and a != c
    assert all(len(set(step)) == 8 for step in a)


@pytest.mark.parametrize("pool_size", [None, 60])
def test_state_round_trip_through_json_gives_identical_next_selections(pool_size):
    s = VadeSampler(200, seed=4, pool_size=pool_size)
    _run(s, steps=5, k=8, G=4)
    state = json.loads(json.dumps(s.state_dict()))
    restored = VadeSampler(200, seed=999, pool_size=pool_size)
    restored.load_state_dict(state)
    assert restored.stats()["vade/seen"] == s.stats()["vade/seen"]
    assert _run(restored, steps=5, k=8, G=4, seed=1) == _run(s, steps=5, k=8, G=4, seed=1)
    np.testing.assert_array_equal(restored.counts()[0], s.counts()[0])


def test_graded_rewards_count_fractionally_and_out_of_range_rewards_are_clipped():
    s = VadeSampler(3, l2=1.0)
    s.update([0], torch.tensor([[0.25, 0.5, 1.0, 0.0]]))
    np.testing.assert_allclose([c[0] for c in s.counts()], [1.75, 2.25])
    with pytest.warns(UserWarning, match="clipped"):
        s.update([1], np.array([[1.5, -0.5, 0.5]]))
    np.testing.assert_allclose([c[1] for c in s.counts()], [1.5, 1.5])


def test_success_threshold_turns_scores_into_counts():
    s = VadeSampler(2, l2=1.0, success_threshold=1.5)
    s.update([0], np.array([[2.0, 1.5, 1.0, 0.2]]))  # accuracy + format, say: 2 at or above 1.5
    np.testing.assert_allclose([c[0] for c in s.counts()], [2.0, 2.0])


def test_single_rollout_groups():
    s = VadeSampler(10, seed=1, l1=0.5, l2=0.9)
    idx = s.select(3)
    s.update(idx, torch.tensor([[1.0], [0.0], [0.4]]))
    a, b = s.counts(idx)
    np.testing.assert_allclose(a, [1.0, 0.0, 0.4])
    np.testing.assert_allclose(b, [0.0, 1.0, 0.6])
    assert s.stats()["vade/seen"] == 3
    assert len(_run(s, steps=4, k=3, G=1)[-1]) == 3


def test_pool_size_limits_the_candidates():
    def times_chosen(pool_size):
        s = VadeSampler(1000, seed=8, pool_size=pool_size)
        s.set_counts(np.arange(1000), 0.0, 500.0)  # all hopeless but record 7, the one informative record
        s.set_counts([7], 20.0, 40.0)
        picks = [s.select(5) for _ in range(50)]
        assert all(len(set(p)) == 5 for p in picks)
        return sum(7 in p for p in picks)

    assert times_chosen(None) == 50  # the whole dataset: always found
    assert times_chosen(20) < 10  # only when a random pool of 20 holds it (about 2% of the steps)
    assert VadeSampler(10, pool_size=50).pool_size is None  # larger than the dataset: the whole dataset


def test_stats_report_the_batch_and_the_records_seen():
    s = VadeSampler(100, seed=0)
    assert s.stats() == {"vade/seen": 0.0}
    idx = s.select(10)
    st = s.stats()
    assert st["vade/p_mean"] == pytest.approx(0.5) and st["vade/select_ms"] >= 0.0
    s.update(idx, np.ones((10, 2)))
    s.update(idx[:5], np.zeros((5, 2)))
    assert s.stats()["vade/seen"] == 10.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"l1": 1.5}, "l1"),
        ({"l2": 0.0}, "l2"),
        ({"l2": "0.9"}, "l2"),
        ({"pool_size": 0}, "pool_size"),
        ({"pool_size": True}, "pool_size"),
        ({"success_threshold": float("nan")}, "success_threshold"),
    ],
)
def test_bad_options_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VadeSampler(10, **kwargs)


def test_bad_calls_name_the_record_and_the_fix():
    s = VadeSampler(10, pool_size=4)
    with pytest.raises(ValueError, match="raise pool_size or lower train.prompts_per_step"):
        s.select(5)
    with pytest.raises(ValueError, match=r"shape \[k, G\] for the k=2"):
        s.update([1, 2], np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"record 2 has a non-finite reward"):
        s.update([1, 2], np.array([[1.0, 0.0], [np.nan, 1.0]]))
    with pytest.raises(ValueError, match="record 1 appears twice"):
        s.update([1, 1], np.ones((2, 2)))
    with pytest.raises(IndexError, match="record index 10 is outside"):
        s.update([10], np.ones((1, 2)))
    with pytest.raises(ValueError, match="resume with the same training data"):
        VadeSampler(11).load_state_dict(s.state_dict())
    with pytest.raises(TypeError, match="pool"):
        VadeSampler(10, pool=3)
    with pytest.raises(ValueError, match="at least one record"):
        VadeSampler(0)


def test_trainer_resume_with_vade_repeats_the_same_choices(tmp_path):
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=24, n_eval=4, seed=5)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl}}
rollout: {{n: 2, max_new_tokens: 2, batch_size: 8}}
optim: {{lr: 0.001}}
rewards: [{{name: exact_match}}]
sampler: {{name: vade, options: {{l1: 0.2, l2: 0.9}}}}
train: {{prompts_per_step: 4, save_every: 2, progress: false, seed: 3}}
"""
    )
    full, split = tmp_path / "full", tmp_path / "split"
    assert main(["train", str(cfg), "--output-dir", str(full), "--max-steps", "4"]) == 0
    assert main(["train", str(cfg), "--output-dir", str(split), "--max-steps", "2"]) == 0
    assert main(["train", str(cfg), "--output-dir", str(split), "--max-steps", "4", "--resume"]) == 0

    def chosen(run):
        return [
            (r["step"], r["id"]) for r in map(json.loads, (run / "rollouts.jsonl").read_text().splitlines())
        ]

    assert len(chosen(full)) == 8 and chosen(full) == chosen(split)
    a, b = (
        json.loads((r / "checkpoints" / "step-4" / "state.json").read_text())["sampler"]
        for r in (full, split)
    )
    assert a == b and a["rng"]["bit_generator"] == "PCG64" and len(a["seen"]) > 4


def test_draws_prepared_ahead_follow_the_posteriors_after_the_update():
    """The next selection's draws are prepared while the step runs: records the update changed are redrawn from
    their new posteriors, all others come from their counts times the next scale (KS tests against Beta)."""
    n, k, G, l1, l2 = 6000, 3000, 8, 0.2, 0.5
    s = VadeSampler(n, seed=3, l1=l1, l2=l2)
    s.set_counts(np.arange(n), 2.0, 6.0)
    chosen = np.array(s.select(k))
    r = np.zeros((k, G))
    r[:, :7] = 1.0  # 7 of 8 succeed: the chosen records' posterior moves far from the others'
    s.update(chosen.tolist(), r)
    pool, p, _, _, _ = s._prepared(k)  # the draws the next select() would use
    assert pool is None
    others = np.setdiff1d(np.arange(n), chosen)
    a_new, b_new = l1 * 2.0 + 7, l1 * 6.0 + 1
    assert stats.kstest(p[chosen], stats.beta(a_new + 1, b_new + 1).cdf).pvalue > 1e-3
    assert stats.kstest(p[others], stats.beta(2.0 * l2 + 1, 6.0 * l2 + 1).cdf).pvalue > 1e-3
    # a stale draw (from the old posterior) for the chosen records would be rejected
    assert stats.kstest(p[chosen], stats.beta(2.0 + 1, 6.0 + 1).cdf).pvalue < 1e-6


def test_selection_is_identical_whatever_the_call_pattern_and_resumes_mid_step():
    """Prepared draws are discarded when the state changed in a way they did not foresee (two selects without an
    update), and a state saved between select and update, or after the update, continues identically."""

    def drive(s: VadeSampler, save_at: tuple[int, str] | None = None) -> tuple[list, dict | None]:
        rng, out, saved = np.random.default_rng(11), [], None
        for step in range(8):
            idx = s.select(6)
            if step == 2:
                idx = s.select(6)  # selected again before any update
            if save_at == (step, "before"):
                saved = s.state_dict()
            s.update(idx, (rng.random((6, 4)) < 0.4).astype(np.float64))
            if save_at == (step, "after"):
                saved = s.state_dict()
            out.append(idx)
        return out, saved

    ref, _ = drive(VadeSampler(300, seed=4, pool_size=120))
    assert ref == drive(VadeSampler(300, seed=4, pool_size=120))[0]
    for where in ("before", "after"):
        first, saved = drive(VadeSampler(300, seed=4, pool_size=120), save_at=(4, where))
        resumed = VadeSampler(300, seed=99, pool_size=120)
        resumed.load_state_dict(json.loads(json.dumps(saved)))  # through JSON, as a checkpoint stores it
        rng = np.random.default_rng(11)
        for _ in range(4 if where == "before" else 5):
            rng.random((6, 4))  # the reward stream up to the saved point
        cont = []
        if where == "before":  # the update of step 4 was still to come
            resumed.update(first[4], (rng.random((6, 4)) < 0.4).astype(np.float64))
        for _ in range(5, 8):
            idx = resumed.select(6)
            resumed.update(idx, (rng.random((6, 4)) < 0.4).astype(np.float64))
            cont.append(idx)
        assert cont == ref[5:], where


@pytest.mark.parametrize("pool_size", [None, 700])
def test_top_k_from_the_prepared_candidates_equals_the_top_k_of_the_whole_pool(pool_size):
    """The background finds the top k of the records the update does not touch; with the k redrawn records added
    that candidate set holds the whole pool's top k."""
    s = VadeSampler(2000, seed=8, pool_size=pool_size)
    rng = np.random.default_rng(2)
    s.set_counts(np.arange(2000), rng.random(2000) * 9, rng.random(2000) * 9)
    for _ in range(5):
        idx = s.select(40)
        s.update(idx, (rng.random((40, 8)) < 0.3).astype(np.float64))
        pool, p, gain, cand, _ = s._prepared(40)
        np.testing.assert_allclose(gain, p * (1 - p) ** 2)
        assert cand is not None and len(cand) <= 80
        assert set(cand[np.argsort(-gain[cand])[:40]].tolist()) == set(np.argsort(-gain)[:40].tolist())
        s._prepare(np.asarray(idx), 40, s._updates)  # put prepared draws back for the next select
