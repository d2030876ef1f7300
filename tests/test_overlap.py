"""Rewards overlap generation and the log-prob passes (train.overlap_rewards): each chunk of groups is scored as soon
as it is generated, in a background thread; the trainer waits only for what is left after the old/reference passes.

Shown by the order of events, not by timings: with overlap the first chunk's scoring starts while the second chunk is
being generated, and the last chunk's generation can wait for the first chunk's scoring to begin (a sequential
collector would deadlock there: the waits time out and the test fails). The run is the same with and without overlap
(up to wall-clock timings), and time/reward (the wait) and time/reward_compute (the scoring) are logged."""

import threading
from pathlib import Path

import pytest

from mmrl.cli import main
from mmrl.rewards.base import register_reward
from mmrl.rollout.hf import HFEngine
from mmrl.run.metrics import read_metrics
from mmrl.types import RewardInput, RewardResult

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"
WAIT_S = 60.0  # far longer than any step here: only a collector that does not overlap ever reaches it


class Probe:
    def __init__(self, handshake: bool):
        self.handshake = handshake
        self.generated = 0
        self.second_chunk_started = threading.Event()
        self.first_scoring_started = threading.Event()
        self.seen: dict[str, bool] = {}
        self.scoring_threads: set[str] = set()


PROBE = Probe(handshake=False)


@register_reward("test_overlap_probe")
def _probe_reward(batch: list[RewardInput]) -> list[RewardResult]:
    PROBE.scoring_threads.add(threading.current_thread().name)
    if PROBE.handshake and not PROBE.first_scoring_started.is_set():
        PROBE.first_scoring_started.set()
        PROBE.seen["second chunk generating while the first is scored"] = PROBE.second_chunk_started.wait(
            WAIT_S
        )
    return [RewardResult(score=float(len(x.response.split()))) for x in batch]


def _run(tmp_path: Path, overlap: bool, monkeypatch) -> list[dict]:
    from mmrl.recipes.shapes.data import build

    real = HFEngine.generate

    def generate(self, prompts, params):
        k = PROBE.generated
        PROBE.generated += 1
        if PROBE.handshake and k == 1:
            PROBE.second_chunk_started.set()
        if PROBE.handshake and k == 3:  # the step's last chunk: its generation starts after scoring began
            PROBE.seen["first chunk scored before the last is generated"] = PROBE.first_scoring_started.wait(
                WAIT_S
            )
        return real(self, prompts, params)

    monkeypatch.setattr(HFEngine, "generate", generate)
    if not (tmp_path / "data").exists():
        build(tmp_path / "data", n_train=16, n_eval=4, seed=3)
    return _train(tmp_path, "test_overlap_probe", 8, overlap)


def _train(tmp_path: Path, reward: str, prompts: int, overlap: bool) -> list[dict]:
    """Two steps of the tiny model on the shapes data in ``tmp_path / data``, scored by ``reward``."""
    cfg = tmp_path / f"cfg-{overlap}.yaml"
    cfg.write_text(
        f"""
model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl}}
rollout: {{n: 4, max_new_tokens: 12, batch_size: 2, temperature: 1.0}}
algo: {{kl_coef: 0.05}}
optim: {{lr: 0.001, micro_batch_size: 8}}
rewards: [{{name: {reward}}}]
train: {{prompts_per_step: {prompts}, progress: false, seed: 4, overlap_rewards: {str(overlap).lower()}}}
"""
    )
    out = tmp_path / f"out-{overlap}"
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "2"]) == 0
    return read_metrics(out / "metrics.jsonl")


def test_overlapped_rewards_run_beside_generation_and_give_the_same_run(tmp_path, monkeypatch):
    global PROBE
    PROBE = Probe(handshake=True)  # 8 groups in chunks of 2: four generate calls per step
    on = _run(tmp_path, True, monkeypatch)
    assert PROBE.seen == {
        "second chunk generating while the first is scored": True,
        "first chunk scored before the last is generated": True,
    }
    assert PROBE.scoring_threads == {"mmrl-reward_0"}  # the collector's background thread, not the main one
    PROBE = Probe(handshake=False)
    off = _run(tmp_path, False, monkeypatch)
    assert PROBE.scoring_threads == {"mmrl-reward_0"}
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("time/", "sys/"))} for r in rows]  # noqa: E731
    assert strip(on) == strip(off)
    for row in on + off:
        assert row["time/reward"] >= 0 and row["time/reward_compute"] > 0


@pytest.fixture(autouse=True)
def _reset_probe():
    global PROBE
    yield
    PROBE = Probe(handshake=False)


class Streamed:
    def __init__(self):
        self.scoring = threading.Semaphore(0)  # released by each scoring call
        self.batch_sizes: list[int] = []
        self.waits: list[bool] = []


STREAMED = Streamed()


@register_reward("test_overlap_streamed")
def _streamed_reward(batch: list[RewardInput]) -> list[RewardResult]:
    STREAMED.batch_sizes.append(len(batch))
    STREAMED.scoring.release()
    return [RewardResult(score=float(len(x.response.split())) + 0.1 * int(x.id[-5:])) for x in batch]


def test_an_engine_that_finishes_groups_one_by_one_has_each_scored_before_the_next_comes(
    tmp_path, monkeypatch
):
    """An engine that schedules the whole round itself (``owns_weights``, as vLLM) and finishes its groups out of
    order (here: last first): each group's rewards start as soon as it is handed over, before the engine hands over
    the next (it waits for that; a collector that scored the round at the end would time out), and every reward lands
    on its own group: the run equals the one scored after the whole round."""
    from mmrl.recipes.shapes.data import build

    global STREAMED
    real_init, real = HFEngine.__init__, HFEngine.generate

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.owns_weights = True  # it gets the whole round at once, as vLLM does

    def generate_streaming(self, prompts, params, on_group):
        groups = real(self, prompts, params)
        for i in reversed(range(len(groups))):
            on_group(i, groups[i])
            STREAMED.waits.append(STREAMED.scoring.acquire(timeout=WAIT_S))
        return groups

    monkeypatch.setattr(HFEngine, "__init__", init)
    monkeypatch.setattr(HFEngine, "generate_streaming", generate_streaming)
    build(tmp_path / "data", n_train=16, n_eval=4, seed=3)
    runs = {}
    for overlap in (True, False):
        STREAMED = Streamed()
        runs[overlap] = _train(tmp_path, "test_overlap_streamed", 4, overlap)
        if overlap:  # one scoring call per group (4 responses), each before the next group came
            assert STREAMED.batch_sizes == [4] * 8 and STREAMED.waits == [True] * 8
        else:  # the round scored at once, after generation
            assert STREAMED.batch_sizes == [16] * 2 and STREAMED.waits == []
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("time/", "sys/"))} for r in rows]  # noqa: E731
    assert strip(runs[True]) == strip(runs[False])
