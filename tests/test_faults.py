"""Faults under torchrun (2 CPU processes, gloo), injected on one rank by tests/fault_launch.py: a rank SIGKILLed in
the middle of a step's update (DDP and FSDP2), a rank killed while the checkpoint is written (rank 0 before the
staging folder is promoted; under FSDP rank 1 after writing its optimizer shard), and a rank that raises (an OOM).
Each time the job ends within the collective timeout with a non-zero exit code; the surviving rank names the rank that
is gone; torchrun's summary names the failed rank as the root cause; the last promoted checkpoint is intact and the
staging folder never promoted; and ``--resume`` continues to the same metrics as an uninterrupted run, row for row."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from multiproc import BASE_ENV, WALL_CLOCK, shapes_run_config, torchrun

from mmrl.run.checkpoint import latest_checkpoint
from mmrl.run.metrics import read_metrics

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STEPS = "6"
TIMEOUT_S = 120  # train.dist_timeout_s: the bound on how long a survivor may wait for a lost peer


def _rows(run: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "sys/")) and k not in WALL_CLOCK}
        for r in read_metrics(run / "metrics.jsonl")
    ]


def _train(cfg: Path, out: Path, *args: str, cwd: Path) -> None:
    """A 2-process `mmrl train` of ``cfg`` into ``out`` that must succeed."""
    torchrun(2, "-m", "mmrl", "train", str(cfg), "--output-dir", str(out), *args, cwd=cwd)


@pytest.fixture(scope="module")
def faults_cfg(tmp_path_factory):
    """A folder and the shapes run config in it."""
    tmp = tmp_path_factory.mktemp("faults")
    return tmp, shapes_run_config(tmp, micro_batch_size=4)


@pytest.fixture(scope="module")
def runs(faults_cfg):
    """The shapes run config and each layout's uninterrupted 6-step run (checkpoints every 2 steps); the tests that
    use them are one xdist group, so that one worker trains them once."""
    tmp, cfg = faults_cfg
    full = {}
    for layout, extra in (("ddp", []), ("fsdp", ["train.fsdp=true"])):
        out = tmp / f"full-{layout}"
        _train(cfg, out, "--max-steps", STEPS, *extra, cwd=tmp)
        full[layout] = _rows(out)
    return tmp, cfg, full


def _launch(
    cfg: Path | str, out: Path, fault: str, *args: str, cwd: Path
) -> tuple[subprocess.CompletedProcess, float]:
    """`mmrl train` of ``cfg`` on 2 processes with ``fault`` injected (tests/fault_launch.py), and its seconds."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [
        str(ROOT / "tests" / "fault_launch.py"),
        fault,
        "--",
        "train",
        str(cfg),
        "--output-dir",
        str(out),
        *args,
    ]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=BASE_ENV, timeout=TIMEOUT_S + 480)
    return r, time.monotonic() - t0


def _faulty(
    tmp: Path, cfg: Path, out: Path, fault: str, extra: list[str]
) -> tuple[subprocess.CompletedProcess, float]:
    """A run that the fault must stop (the collective timeout at TIMEOUT_S)."""
    return _launch(
        cfg, out, fault, "--max-steps", STEPS, f"train.dist_timeout_s={TIMEOUT_S}", *extra, cwd=tmp
    )


def _root_cause(stderr: str) -> str:
    """torchrun's "Root Cause (first observed failure)" section."""
    assert "Root Cause (first observed failure)" in stderr, stderr[-3000:]
    return stderr.split("Root Cause (first observed failure)", 1)[1]


@pytest.mark.xdist_group("faults_full_runs")
@pytest.mark.parametrize(
    "layout,fault,saved",
    [
        ("ddp", "kill:1:3", 2),  # rank 1 dies inside step 3's gradient all-reduce
        ("fsdp", "kill:1:3", 2),
        ("ddp", "kill_saving:0:4", 2),  # rank 0 dies with step 4's files written, before the promotion
        ("fsdp", "kill_saving:1:4", 2),  # rank 1 dies after writing its shard of step 4's optimizer
    ],
)
def test_a_rank_killed_stops_the_job_names_it_and_resume_continues_exactly(runs, layout, fault, saved):
    tmp, cfg, full = runs
    extra = ["train.fsdp=true"] if layout == "fsdp" else []
    out = tmp / f"{layout}-{fault.replace(':', '-')}"
    r, _ = _faulty(tmp, cfg, out, fault, extra)
    _, dead, step = fault.split(":")
    survivor = 1 - int(dead)
    assert r.returncode != 0  # no silent success
    # the survivor names the rank that is gone; torchrun's summary puts the killed rank first
    assert f"mmrl: rank {survivor} of 2 stops" in r.stderr, r.stderr[-3000:]
    assert f"mmrl: rank(s) {dead} ended before this one" in r.stderr, r.stderr[-3000:]
    cause = _root_cause(r.stderr)
    assert f"rank      : {dead} (local_rank: {dead})" in cause and "SIGKILL" in cause, cause
    ckpts = out / "checkpoints"
    assert latest_checkpoint(ckpts) == ckpts / f"step-{saved}"  # the last promoted one, nothing newer
    if fault.startswith("kill_saving"):
        assert (ckpts / f"step-{step}.tmp").is_dir()  # written, never promoted
        assert not (ckpts / f"step-{step}").exists()
    _train(cfg, out, "--max-steps", STEPS, "--resume", *extra, cwd=tmp)
    assert _rows(out) == full[layout]  # every step's metrics, the steps before the fault and after the resume
    assert not list(ckpts.glob("*.tmp"))  # the stale staging folder was replaced and promoted


def test_a_rank_that_raises_ends_the_job_with_its_error_first(faults_cfg):
    tmp, cfg = faults_cfg
    r, _ = _faulty(tmp, cfg, tmp / "raise", "raise:1:3", [])
    assert r.returncode != 0
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 200.00 GiB (injected by the test)"
    assert oom in r.stderr
    # the raising rank's error is printed before anything the survivor says about it
    assert r.stderr.index(oom) < r.stderr.index("mmrl: rank 0 of 2 stops"), r.stderr[-4000:]
    cause = _root_cause(r.stderr)
    assert "rank      : 1 (local_rank: 1)" in cause and "OutOfMemoryError" in cause, cause
    assert (
        "exitcode  : 1 " in cause
    )  # ended by its error, not by an abort in the interpreter's teardown (134)


def test_a_rank_that_stops_answering_ends_the_job_after_the_collective_timeout(faults_cfg):
    """Rank 1 is SIGSTOPped inside step 3's update (alive, silent): rank 0's collective gives up after
    train.dist_timeout_s (20 s here) and says which rank did not answer; the launcher then ends the stopped rank; the
    job ends, failed, instead of hanging (tests/fault_launch.py's watcher ends it as soon as the launcher asks)."""
    tmp, cfg = faults_cfg
    r, seconds = _faulty(tmp, cfg, tmp / "stop", "stop:1:3", ["train.dist_timeout_s=20"])
    assert r.returncode != 0
    assert "mmrl: rank 0 of 2 stops" in r.stderr, r.stderr[-3000:]
    assert (
        "mmrl: 1 did not answer a collective within train.dist_timeout_s = 20 s (the process is stopped"
        in r.stderr
    )
    print(
        f"stopped rank: the job ended after {seconds:.0f} s"
    )  # for the record: start-up, 2 steps and the timeout


def _faulty_finishes(cwd: Path, cfg: Path | str, out: Path, fault: str, *args: str) -> None:
    r, _ = _launch(cfg, out, fault, *args, cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory):
    """A config with a slow reward in a worker pool beside exact_match, and its uninterrupted 3-step run."""
    tmp = tmp_path_factory.mktemp("reward_faults")
    cfg = shapes_run_config(tmp, micro_batch_size=8)
    plugin = ROOT / "tests" / "fault_rewards.py"
    text = cfg.read_text().replace(
        "rewards: [{name: exact_match}]",
        f'rewards: [{{name: exact_match}}, {{name: "{plugin}:slow_parity", weight: 0.5}}]',
    )
    cfg.write_text(text)
    _train(cfg, tmp / "full", "--max-steps", "3", cwd=tmp)
    return tmp, cfg


@pytest.mark.xdist_group("faults_reward_run")
@pytest.mark.parametrize("fault", ["kill_reward_worker:1:3", "kill_idle_reward_worker:1:3"])
def test_a_reward_worker_killed_costs_nothing(reward_run, fault):
    """A heavy reward's worker dies on rank 1, mid-chunk or idle between two calls: the pool is rebuilt, what was in
    flight re-scored, the run finishes with every metric equal to the uninterrupted run's; the restart is counted
    (summed over the ranks)."""
    tmp, cfg = reward_run
    killed_dir = tmp / f"killed-{fault.split(':')[0]}"
    _faulty_finishes(tmp, cfg, killed_dir, fault, "--max-steps", "3")
    full, killed = read_metrics(tmp / "full" / "metrics.jsonl"), read_metrics(killed_dir / "metrics.jsonl")
    assert _rows(killed_dir) == _rows(tmp / "full")
    assert sum(r.get("sys/reward_pool_restarts", 0) for r in killed) >= 1
    assert sum(r.get("sys/reward_pool_restarts", 0) for r in full) == 0
    assert "reward/fault_slow_parity" in full[1]


def test_an_env_worker_killed_ends_one_episode_and_the_run_goes_on(tmp_path):
    """The zoom world's worker on rank 1 is SIGKILLed between two turns: the episode whose step reached the dead
    worker ends with the error (the pool cannot tell a kill from an action that crashes the env), the worker's other
    episodes are replayed on a new worker (the world is deterministic) and go on, and the run finishes with the
    crash, the restart and the replays counted over the ranks."""
    zoom = ["--max-steps", "3", "train.prompts_per_step=2", "rollout.n=4", "eval.max_samples=4"]
    _faulty_finishes(ROOT, "recipes/zoom/tiny.yaml", tmp_path / "run", "kill_env_worker:1:3", *zoom)
    rows = [x for x in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in x]
    assert [x["step"] for x in rows] == [1, 2, 3]
    total = {k: sum(x[f"sys/env_{k}"] for x in rows) for k in ("crashes", "restarts", "replays", "lost")}
    assert total["crashes"] == 1 and total["restarts"] == 1 and total["replays"] >= 1 and total["lost"] == 0
    assert sum(x["episode/errors"] for x in rows) == 1  # the one episode in flight, nothing else
