"""Env API and EnvPool: the registry and option checks, episodes across worker processes, timeouts, crashes, replay
of deterministic episodes and clean shutdown. The envs under test live in tests/env_plugins.py."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import sys
import time
from pathlib import Path

import env_plugins
import pytest

from mmrl.envs import ENVS, Env, EnvPool, Observation, StepResult, env_options, get_env, register_env
from mmrl.envs import validate_env_options as validate
from mmrl.envs.base import env_ref, resolve_env_ref
from mmrl.types import Sample


def _sample(i: int, **metadata) -> Sample:
    return Sample(id=f"s{i}", messages=[{"role": "user", "content": "count"}], metadata=metadata)


def _episodes(n: int, env: str = "test_counter", **options) -> list[tuple[str, str, dict, Sample]]:
    return [(f"e{i}", env, dict(options), _sample(i)) for i in range(n)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (killed, not yet reaped by its parent) counts as dead
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


# -- registry and options ----------------------------------------------------------------------------------------


def test_registry_names_and_lookup():
    assert {"zoom", "test_counter"} <= set(ENVS.names())
    assert get_env("test_counter") is env_plugins.CounterEnv
    assert get_env("env_plugins:VolatileCounterEnv") is env_plugins.VolatileCounterEnv
    with pytest.raises(KeyError, match="did you mean 'test_counter'"):
        get_env("test_countr")
    with pytest.raises(KeyError, match="no Env subclass 'Nope'"):
        get_env("env_plugins:Nope")
    with pytest.raises(ValueError, match="already registered"):
        register_env("test_counter")(env_plugins.VolatileCounterEnv)
    assert list(env_options(env_plugins.CounterEnv)) == ["limit", "reset_sleep", "tag"]


def test_env_contract_is_checked_at_registration():
    class Positional(Env):
        def __init__(self, workdir: Path, limit: int = 3):  # a positional option
            super().__init__(workdir=workdir)

        reset = step = close = None

    class NoDefault(Env):
        def __init__(self, *, workdir: Path, limit: int):
            super().__init__(workdir=workdir)

        reset = step = close = None

    class NoWorkdir(Env):
        def __init__(self, *, limit: int = 3):
            pass

        reset = step = close = None

    for cls, words in (
        (Positional, "parameter 'limit' must be keyword-only with a default"),
        (NoDefault, "parameter 'limit' must be keyword-only with a default"),
        (NoWorkdir, "must take the keyword-only parameter `workdir`"),
    ):
        with pytest.raises(TypeError, match=words):
            register_env(f"bad_{cls.__name__}")(cls)
        assert f"bad_{cls.__name__}" not in ENVS
    with pytest.raises(TypeError, match="subclass of mmrl.envs.Env"):
        register_env("not_an_env")(dict)


def test_validate_options_names_the_nearest_option_and_checks_values():
    assert validate("test_counter", {"limit": 5}) == {"limit": 5}
    with pytest.raises(
        ValueError, match=r"env 'test_counter': unknown option 'limt'; did you mean 'limit'\?"
    ):
        validate("test_counter", {"limt": 5})
    with pytest.raises(ValueError, match="unknown option 'workdir'"):
        validate("test_counter", {"workdir": "/tmp"})
    with pytest.raises(ValueError, match="option 'limit' expects a number"):
        validate("test_counter", {"limit": "five"})
    with pytest.raises(ValueError, match="option 'tag' expects a string"):
        validate("test_counter", {"tag": 3})
    with pytest.raises(ValueError, match="did you mean 'max_calls'"):
        validate("zoom", {"max_call": 2})
    with pytest.raises(ValueError, match="'max_calls' must be >= 0"):
        validate("zoom", {"max_calls": -1})
    with pytest.raises(ValueError, match="min_crop_side 64 squared is more than max_crop_pixels 1000"):
        validate("zoom", {"min_crop_side": 64, "max_crop_pixels": 1000})


def test_a_worker_imports_an_env_module_by_file_when_sys_path_does_not_reach_it(tmp_path):
    """A user's env module loaded from a file the workers' sys.path does not reach: found again by its file."""
    code = (
        "from mmrl.envs import Observation, StepResult\n"
        "from env_plugins import CounterEnv\n\n"
        "class FileEnv(CounterEnv):\n"
        "    def step(self, action_text):\n"
        "        return StepResult(Observation('from file', [], 'k'), 1.0, True, {'module': __name__})\n"
    )
    path = tmp_path / "user_envs" / "my_file_env.py"
    path.parent.mkdir()
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("mmrl_test_file_env", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["mmrl_test_file_env"] = module
    try:
        spec.loader.exec_module(module)
        assert resolve_env_ref(env_ref(module.FileEnv)) is module.FileEnv
        with EnvPool(tmp_path / "episodes", workers=1, timeout_s=20) as pool:
            pool.reset([("e0", "mmrl_test_file_env:FileEnv", {}, _sample(0))])
            r = pool.step({"e0": "go"})["e0"]
            assert r.done and r.reward == 1.0 and r.info == {"module": "mmrl_test_file_env"}
    finally:
        del sys.modules["mmrl_test_file_env"]


# -- the pool, in process ----------------------------------------------------------------------------------------


def test_in_process_pool_runs_episodes_and_catches_env_errors(tmp_path):
    with EnvPool(tmp_path, workers=0) as pool:
        first = pool.reset([*_episodes(2, limit=2), ("bad", "test_counter", {}, _sample(9, fail_reset=True))])
        assert [r.observation.text for r in first[:2]] == ["start s0", "start s1"]
        assert first[2].done and "RuntimeError: cannot start s9" in first[2].info["error"]
        out = pool.step({"e0": "add 2", "e1": "nonsense"})
        assert out["e0"].observation.state_key == "s0:2" and out["e1"].info["invalid"]
        out = pool.step({"e0": "add 3", "e1": "raise"})
        assert out["e0"].done and out["e0"].reward == 5.0
        assert (
            out["e1"].done and out["e1"].reward == 0.0 and "RuntimeError: env bug" in out["e1"].info["error"]
        )
        assert pool.live == [] and pool.stats()["failed"] == 2
        with pytest.raises(KeyError, match="'e0' is not live"):
            pool.step({"e0": "add 1"})
        with pytest.raises(ValueError, match="unknown option 'limt'"):
            pool.reset([("x", "test_counter", {"limt": 1}, _sample(0))])
    with pytest.raises(RuntimeError, match="closed"):
        pool.step({})


# -- the pool, in worker processes -------------------------------------------------------------------------------


def test_episodes_run_in_parallel_across_workers_and_results_reach_their_episode(tmp_path):
    with EnvPool(tmp_path, workers=2, timeout_s=20) as pool:
        first = pool.reset(_episodes(8, limit=3))
        assert [r.observation.state_key for r in first] == [f"s{i}:0" for i in range(8)]
        pids = set()
        for step in range(3):
            out = pool.step({f"e{i}": f"add {i}" for i in range(8)})
            assert list(out) == [f"e{i}" for i in range(8)]
            for i in range(8):
                r = out[f"e{i}"]
                assert r.info["sample"] == f"s{i}" and r.info["total"] == i * (step + 1)
                pids.add(r.info["pid"])
        assert all(r.done and r.reward == 3 * i for i, r in enumerate(out.values()))
        assert len(pids) == 2 and os.getpid() not in pids
        assert (tmp_path / "e0").is_dir()  # each episode's workdir


def test_steps_on_two_workers_run_at_the_same_time(tmp_path):
    """Each step waits (up to 15 s) at a barrier until both have reached it: both get through only if the workers
    run them at once (one after the other, the first gives up alone). No duration is measured: a loaded machine
    slows the steps but cannot make them meet."""
    with EnvPool(tmp_path / "pool", workers=2, timeout_s=30) as pool:
        pool.reset(_episodes(2))  # one per worker
        out = pool.step({e: f"meet {tmp_path / 'barrier'} 2" for e in ("e0", "e1")})
        assert out["e0"].info["pid"] != out["e1"].info["pid"]
        assert [out[e].info["met"] for e in ("e0", "e1")] == [2, 2]


def test_hung_step_times_out_and_the_other_episodes_are_replayed(tmp_path):
    with EnvPool(tmp_path, workers=2, timeout_s=1.5) as pool:
        pool.reset(_episodes(6, limit=4))
        first = pool.step({f"e{i}": "add 1" for i in range(6)})
        hung_pid = first["e0"].info["pid"]
        neighbours = [e for e, r in first.items() if r.info["pid"] == hung_pid and e != "e0"]
        assert "e2" in neighbours  # least-loaded placement: e0, e2 and e4 share a worker
        child = pool.step({"e2": "spawn"})["e2"].info["child"]
        t0 = time.monotonic()
        out = pool.step({f"e{i}": "hang 60" if i == 0 else f"add {i}" for i in range(6)})
        assert time.monotonic() - t0 < 8
        assert out["e0"].done and out["e0"].reward == 0.0 and out["e0"].info == {"error": "timeout"}
        for i in range(1, 6):  # the neighbours were rebuilt by replay in a fresh worker and took their step
            assert not out[f"e{i}"].done and out[f"e{i}"].info["total"] == 1 + i
        assert {out[e].info["pid"] for e in neighbours} != {hung_pid}
        assert not _alive(hung_pid) and not _alive(child)  # the worker's process group died with it
        assert pool.stats() == {
            "failed": 1,
            "timeouts": 1,
            "crashes": 0,
            "restarts": 1,
            "replays": 2,
            "lost": 0,
        }
        more = pool.step({f"e{i}": "add 10" for i in range(1, 6)})  # the pool goes on
        assert more["e2"].done and more["e2"].reward == 13  # its 4th step: add 1, spawn, add 2, add 10
        last = pool.step({f"e{i}": "add 0" for i in (1, 3, 4, 5)})
        assert [r.reward for r in last.values()] == [11 + i for i in (1, 3, 4, 5)]
        assert pool.live == []


def test_crashed_worker_ends_its_step_and_volatile_neighbours_end_too(tmp_path):
    with EnvPool(tmp_path, workers=2, timeout_s=20) as pool:
        pool.reset(_episodes(4, env="test_counter_volatile", limit=5))
        out = pool.step({"e0": "crash", "e1": "add 1", "e3": "add 1"})  # e2 idles on e0's worker
        assert out["e0"].done and out["e0"].info["error"] == "worker crashed (exit code 3)"
        assert not out["e1"].done and not out["e3"].done
        assert pool.stats()["lost"] == 1
        later = pool.step({"e1": "add 1", "e2": "add 1"})  # e2 learns of its end at its next step
        assert later["e2"].done and later["e2"].info["error"] == "worker restarted"
        assert not later["e1"].done
        pool.close_episode("e1", "e3", "never-was")
        assert pool.live == []


def test_queued_step_behind_a_crash_is_replayed_or_ended(tmp_path):
    """e0 crashes its worker while e2's step waits behind it in the same worker: e2 (deterministic) is replayed and
    takes its step; the same episode of a volatile env is ended in that same call."""
    for env, lost in (("test_counter", False), ("test_counter_volatile", True)):
        with EnvPool(tmp_path / env, workers=2, timeout_s=20) as pool:
            pool.reset(_episodes(3, env=env, limit=5))
            pool.step({"e2": "add 4"})
            out = pool.step({"e0": "crash", "e1": "add 1", "e2": "add 1"})
            assert out["e2"].done is lost
            assert out["e2"].info.get("error") == ("worker restarted" if lost else None)
            assert lost or out["e2"].info["total"] == 5


def test_replay_that_diverges_ends_the_episode(tmp_path):
    with EnvPool(tmp_path, workers=1, timeout_s=20) as pool:
        pool.reset(_episodes(2, env="test_counter_pid_state", limit=5))
        pool.step({"e1": "add 1"})
        out = pool.step({"e0": "crash", "e1": "add 1"})
        assert out["e1"].done and out["e1"].info["error"].startswith("worker restarted; replay failed:")
        assert "replay diverged" in out["e1"].info["error"]


def test_reset_timeout_ends_only_that_episode(tmp_path):
    with EnvPool(tmp_path, workers=1, timeout_s=1.0) as pool:
        first = pool.reset([("slow", "test_counter", {"reset_sleep": 30.0}, _sample(0)), *_episodes(2)])
        assert first[0].done and first[0].info == {"error": "timeout"}
        assert [r.observation.text for r in first[1:]] == ["start s0", "start s1"]
        assert [r.info["total"] for r in pool.step({"e0": "add 1", "e1": "add 2"}).values()] == [1, 2]


def test_close_leaves_no_process_behind(tmp_path):
    pool = EnvPool(tmp_path, workers=2, timeout_s=20)
    pool.reset(_episodes(2))
    out = pool.step({"e0": "spawn", "e1": "spawn"})
    pids = {r.info["pid"] for r in out.values()} | {r.info["child"] for r in out.values()}
    pool.close()
    pool.close()  # idempotent
    assert not any(_alive(p) for p in pids)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("mmrl-env")]


def test_garbage_collected_pool_stops_its_workers(tmp_path):
    pool = EnvPool(tmp_path, workers=1, timeout_s=20)
    pid = pool.reset(_episodes(1))[0] and pool.step({"e0": "add 1"})["e0"].info["pid"]
    del pool
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_oracle_is_asked_in_the_workers_and_its_failures_name_env_and_episode(tmp_path, workers):
    """An oracle's text comes back per episode and changes nothing; an env without one, or one that raises, is an
    error for the caller naming the env and the episode, and the episode stays live."""
    cases = [("e0", {}), ("none", {"oracle": "none"}), ("raise", {"oracle": "raise"})]
    with EnvPool(tmp_path, workers=workers, timeout_s=20) as pool:
        pool.reset([(eid, "test_counter", {"limit": 2}, _sample(i, **m)) for i, (eid, m) in enumerate(cases)])
        assert pool.oracle(["e0"]) == {"e0": "add 1"}
        with pytest.raises(
            RuntimeError, match="env 'test_counter', episode 'none': .*NotImplementedError: env"
        ):
            pool.oracle(["e0", "none"])
        with pytest.raises(
            RuntimeError, match="episode 'raise': the oracle failed: RuntimeError: oracle bug"
        ):
            pool.oracle(["raise"])
        out = pool.step({eid: "add 1" for eid, _ in cases})
        assert all(r.info["total"] == 1 and not r.done for r in out.values())
        assert pool.stats()["failed"] == 0
        with pytest.raises(KeyError, match="'nope' is not live"):
            pool.oracle(["nope"])


def test_a_hung_oracle_times_out_and_the_episode_is_replayed(tmp_path):
    with EnvPool(tmp_path, workers=1, timeout_s=1.0) as pool:
        pool.reset(
            [("hang", "test_counter", {"limit": 3}, _sample(0, oracle="hang")), *_episodes(1, limit=3)]
        )
        pool.step({"hang": "add 2", "e0": "add 3"})
        with pytest.raises(RuntimeError, match="episode 'hang': the oracle failed: timeout"):
            pool.oracle(["e0", "hang"])
        out = pool.step({"hang": "add 1", "e0": "add 1"})  # both rebuilt by replay in the fresh worker
        assert [r.info["total"] for r in out.values()] == [3, 4] and pool.stats()["restarts"] == 1


def test_result_types_are_plain_data():
    r = StepResult(Observation("t", ["a.png"], "k"), 1.0, False, {"x": 1})
    assert r.observation.images == ["a.png"] and StepResult(None, 0.0, True).info == {}


def test_a_worker_that_does_not_start_in_time_names_the_setting_to_raise(tmp_path):
    """A worker's start (its imports) has its own deadline, rollout.episode.env_start_timeout_s: on a machine under
    heavy load a restart mid-run can miss the default 120 s, and the error says which setting gives it longer."""
    from mmrl.config import EpisodeConfig

    pool = EnvPool.for_episodes(tmp_path, EpisodeConfig(env_workers=1, env_start_timeout_s=0.001))
    assert pool.start_timeout_s == 0.001
    with pytest.raises(
        RuntimeError, match=r"did not start within 0 s .*rollout\.episode\.env_start_timeout_s"
    ):
        pool.reset(_episodes(1))
    pool.close()
