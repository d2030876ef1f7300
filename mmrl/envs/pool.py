"""EnvPool: many live episodes in worker processes, stepped in parallel, with per-step deadlines and crash recovery.

``workers`` processes (``forkserver`` context where the platform has it, else ``spawn``; never ``fork``, unsafe once
torch or CUDA threads exist) each host several live episodes, keyed by episode id; a new episode goes to the worker
with the fewest. :meth:`EnvPool.step` sends every worker its episodes' actions in one message; a worker steps them
one after the other and answers each as it finishes, so workers run in parallel and each step has its own deadline:
``timeout_s`` from the moment the worker starts it (when it answered the previous one).

Failures never stop training and nothing waits forever:

- An env that raises (a bug; malformed actions are the env's to answer, :mod:`mmrl.envs.base`) ends its episode:
  ``done=True``, reward 0, ``info["error"]`` names the exception. The worker and its other episodes carry on.
- A step (or reset) past its deadline ends its episode with ``info["error"] = "timeout"``; a worker that dies
  (segfault, ``os._exit``, the OOM killer) ends the episode it was running with ``info["error"] = "worker crashed
  (exit code N)"``. Either way the worker is killed (its whole process group: a browser the env started dies with
  it) and restarted, and the OTHER episodes that lived in it are rebuilt or ended:
  * an episode of a ``deterministic`` env (:attr:`mmrl.envs.Env.deterministic`) is re-created in the fresh worker by
    replaying its action history (reset, then every action it took; budget ``timeout_s`` per call), and checked:
    the replayed state key must equal the one the model last saw. It then carries on unnoticed, the step it was
    waiting for included. Envs are not snapshotted; replay is exact for deterministic envs and costs their steps
    again;
  * an episode of any other env, or one whose replay fails, diverges or times out, ends with ``done=True``, reward
    0 and ``info["error"]`` starting ``"worker restarted"``: returned by the step it was waiting for, or by its next
    :meth:`EnvPool.step`.
  Each failure removes the command that caused it, so recovery always finishes.
- ``workers=0`` runs the envs in this process (tests, debugging): exceptions are caught the same way, but there are
  no deadlines (a hung env hangs the caller) and no crash recovery.

:meth:`EnvPool.submit` starts steps without waiting and :meth:`EnvPool.collect` returns them as they come in (the
continuous episode schedule); a worker still running earlier commands gets the new ones once it has answered those,
so the pipe never fills both ways. The deadlines and the recovery are the same.

:meth:`EnvPool.oracle` asks live episodes' envs for their next correct action (:meth:`mmrl.envs.Env.oracle`) in
their workers, in parallel, with the same deadlines and recovery; it changes no episode. Unlike a step, a failing
oracle (an env without one, an exception) raises to the caller, naming the env and the episode: it is a bug or a
misconfiguration, not something the model did. The episode stays live (a timed-out one is replayed like its
neighbours).

An episode that ends (``done``) is closed at once; :meth:`EnvPool.close_episode` closes the ones the driver abandons
(a turn limit). :meth:`EnvPool.close` (also run at interpreter exit and when the pool is garbage-collected) stops the
workers, killing those that do not stop within 5 s: no process outlives the pool. Workers are daemonic processes,
so an env starts its helpers with ``subprocess``, not ``multiprocessing``. Files the envs wrote under ``root`` stay
(the trainer reads the observation images again at the update); removing them is the caller's.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import multiprocessing
import os
import re
import signal
import sys
import time
import weakref
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from mmrl.config import EpisodeConfig
from mmrl.envs.base import (
    Env,
    Observation,
    StepResult,
    env_ref,
    get_env,
    resolve_env_ref,
    validate_env_options,
)
from mmrl.rewards.base import describe_exception
from mmrl.types import Sample

_PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 5.0  # close(): how long a worker may take to close its envs and exit before it is killed

# ---------------------------------------------------------------------------------------------- inside a worker


def _execute(envs: dict[str, Env], cmd: tuple[str, str, Any]) -> tuple[str, bool, Any]:
    """Run one command on this process's envs; never raises. Returns ``(episode id, ok, value or error text)``."""
    kind, eid, arg = cmd
    try:
        if kind == "step":
            env = envs.get(eid)
            if env is None:
                raise KeyError(f"episode {eid!r} is not live in this worker")
            result = _checked_step(env.step(arg))
            if result.done:
                _close_quietly(envs.pop(eid))
            return eid, True, result
        if kind == "close":
            env = envs.pop(eid, None)
            if env is not None:
                env.close()
            return eid, True, None
        if kind == "oracle":
            return _oracle(envs, eid)
        return eid, True, _start(envs, eid, *arg)  # "reset", "replay"
    except Exception as exc:
        env = envs.pop(eid, None)
        if env is not None:
            _close_quietly(env)
        return eid, False, describe_exception(exc)


def _oracle(envs: dict[str, Env], eid: str) -> tuple[str, bool, Any]:
    """The episode's next correct action; a failure is answered, and the env stays live (the caller raises)."""
    env = envs.get(eid)
    if env is None:
        return eid, False, f"episode {eid!r} is not live in this worker"
    try:
        text = env.oracle()
    except Exception as exc:
        return eid, False, describe_exception(exc)
    if text is not None and not isinstance(text, str):
        return eid, False, f"oracle returned {type(text).__name__}; return the action's text or None"
    return eid, True, text


def _start(
    envs: dict[str, Env],
    eid: str,
    ref: tuple[str, str, str],
    options: dict[str, Any],
    sample: Sample,
    workdir: str,
    actions: list[str],
    expect_key: str | None,
) -> Observation:
    """Make and reset the episode's env, then replay ``actions``; the last observation."""
    old = envs.pop(eid, None)
    if old is not None:
        _close_quietly(old)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    env = resolve_env_ref(ref)(workdir=Path(workdir), **options)
    envs[eid] = env
    obs = _checked_observation(env.reset(sample), "reset")
    for i, action in enumerate(actions):
        result = _checked_step(env.step(action))
        if result.done:
            raise RuntimeError(f"replay diverged: step {i + 1} of {len(actions)} ended the episode")
        obs = result.observation
    if expect_key is not None and obs.state_key != expect_key:
        raise RuntimeError(f"replay diverged: state {obs.state_key!r}, expected {expect_key!r}")
    return obs


def _checked_step(result: Any) -> StepResult:
    if not isinstance(result, StepResult):
        raise TypeError(f"step returned {type(result).__name__}; return a StepResult")
    if not (isinstance(result.reward, (int, float)) and math.isfinite(result.reward)):
        raise ValueError(f"step returned the reward {result.reward!r}; return a finite number")
    if result.observation is not None or not result.done:
        _checked_observation(result.observation, "step")
    if not isinstance(result.info, dict):
        raise TypeError(f"step returned info of type {type(result.info).__name__}; return a dict")
    return result


def _checked_observation(obs: Any, where: str) -> Observation:
    if not isinstance(obs, Observation):
        raise TypeError(f"{where} returned {type(obs).__name__} as its observation; return an Observation")
    if not (isinstance(obs.text, str) and isinstance(obs.state_key, str)):
        raise TypeError(f"{where} returned an Observation whose text or state_key is not a string")
    if not (isinstance(obs.images, list) and all(isinstance(p, str) for p in obs.images)):
        raise TypeError(f"{where} returned an Observation whose images are not a list of file paths")
    return obs


def _close_quietly(env: Env) -> None:
    with contextlib.suppress(Exception):
        env.close()


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when its parent (the forkserver, which exits with the trainer) dies."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _worker_main(conn: Connection) -> None:
    """A worker: own process group (so a kill takes the env's helpers along), built-in envs imported before
    ``ready`` (not counted in any deadline), then batches of commands until ``None`` or the pipe closes."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it then closes the pool
    if os.getpgid(0) == os.getpid():  # never signal the trainer's own group
        # terminate() (multiprocessing's exit handler) takes the env's helpers along, as a kill of the group does
        signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
    import mmrl.envs  # noqa: F401  (registers and imports the built-in envs)

    envs: dict[str, Env] = {}
    conn.send(("ready", os.getpid()))
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            break
        if batch is None:
            break
        for cmd in batch:
            reply = _execute(envs, cmd)
            try:
                conn.send(reply)
            except (EOFError, OSError):
                return
            except Exception as exc:  # a result that cannot be pickled (a PIL image in info)
                env = envs.pop(cmd[1], None)
                if env is not None:
                    _close_quietly(env)
                conn.send((cmd[1], False, f"result cannot be sent to the trainer: {describe_exception(exc)}"))
    for env in envs.values():
        _close_quietly(env)


# ---------------------------------------------------------------------------------------------- the trainer side


@dataclass
class _Episode:
    eid: str
    env: str  # the name the episode was reset with
    worker: int
    ref: tuple[str, str, str]
    options: dict[str, Any]
    sample: Sample
    workdir: str
    deterministic: bool
    actions: list[str] = field(default_factory=list)
    state_key: str | None = None


@dataclass
class _Cmd:
    kind: str  # "reset", "replay", "step", "oracle" or "close"
    eid: str
    arg: Any
    budget_s: float
    ok: bool | None = None  # None until answered
    value: Any = None

    def wire(self) -> tuple[str, str, Any]:
        return self.kind, self.eid, self.arg


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, index: int):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), name=f"mmrl-env-{index}", daemon=True)
        self.proc.start()
        child.close()

    def wait_ready(self, timeout_s: float) -> None:
        if wait([self.conn, self.proc.sentinel], timeout=timeout_s) and self.conn.poll():
            with contextlib.suppress(EOFError, OSError):
                if self.conn.recv()[0] == "ready":
                    return
        self.proc.join(timeout=0.5)
        code = self.proc.exitcode
        self.kill()
        if code is not None:
            raise RuntimeError(
                f"env worker {self.proc.name} exited with code {code} while starting; its stderr says why"
            )
        raise RuntimeError(
            f"env worker {self.proc.name} did not start within {timeout_s:.0f} s (its imports and its env's set-up; "
            "a machine under heavy load starts workers slowly: raise rollout.episode.env_start_timeout_s); its "
            "stderr says why"
        )

    def exit_text(self) -> str:
        self.proc.join(timeout=1.0)
        return f"exit code {self.proc.exitcode}"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own group: the env's helpers die with it
        with contextlib.suppress(Exception):
            self.proc.kill()
        self.proc.join(timeout=5.0)
        self.conn.close()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        with contextlib.suppress(Exception):
            w.conn.send(None)
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
        w.kill()
    workers.clear()


def _failed(error: str) -> StepResult:
    return StepResult(observation=None, reward=0.0, done=True, info={"error": error})


def _folder_name(eid: str) -> str:
    """A folder name for an episode id: the id itself when it is a safe name, else a sanitised prefix and a digest."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", eid)[:80]
    if safe == eid and eid not in (".", ".."):
        return eid
    return f"{safe}-{hashlib.sha1(eid.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}"


class EnvPool:
    """Live episodes of registered envs (:mod:`mmrl.envs.base`) in ``workers`` processes; see the module docstring.

    ``root``: the folder under which each episode gets its own ``workdir``; ``timeout_s``: the deadline of one
    reset or step; ``start_timeout_s``: how long a worker may take to start (imports; not part of any deadline)."""

    def __init__(
        self, root: str | Path, *, workers: int = 2, timeout_s: float = 60.0, start_timeout_s: float = 120.0
    ):
        if workers < 0 or not timeout_s > 0 or not start_timeout_s > 0:
            raise ValueError(
                f"EnvPool needs workers >= 0 and positive timeouts; got workers={workers}, "
                f"timeout_s={timeout_s}, start_timeout_s={start_timeout_s}"
            )
        self.root = Path(root).resolve()
        self.workers, self.timeout_s, self.start_timeout_s = workers, timeout_s, start_timeout_s
        self._episodes: dict[str, _Episode] = {}
        self._ended: dict[str, StepResult] = {}  # ended while not stepped; returned by their next step
        self._local: dict[str, Env] = {}  # workers=0
        self._procs: list[_Worker] = []
        self._ctx: Any = None
        self._counts: Counter[str] = Counter()
        # commands sent and not yet answered, per worker, in the order it runs them, and when it started the first
        self._queues: dict[int, deque[_Cmd]] = {}
        self._started: dict[int, float] = {}
        # the tail of a busy worker's queue, held back until it has answered what it was sent: a worker reads a
        # message only between batches, so sending more to a busy one could fill the pipe both ways (a deadlock)
        self._unsent: dict[int, list[_Cmd]] = {}
        self._submitted: list[_Cmd] = []  # steps started by submit(), until collect() returns them
        self._answered: dict[
            str, StepResult
        ] = {}  # submitted steps answered without a worker (ended episodes)
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._procs)

    @classmethod
    def for_episodes(cls, root: str | Path, settings: EpisodeConfig) -> EnvPool:
        """The pool that runs episodes as ``settings`` say (its ``env_workers``, ``env_timeout_s`` and
        ``env_start_timeout_s``)."""
        return cls(
            root,
            workers=settings.env_workers,
            timeout_s=settings.env_timeout_s,
            start_timeout_s=settings.env_start_timeout_s,
        )

    # -- public ------------------------------------------------------------------------------------------------

    def episode_dir(self, episode_id: str) -> Path:
        """The folder episode ``episode_id`` works in (its observation images): under :attr:`root`."""
        return self.root / _folder_name(episode_id)

    @property
    def live(self) -> list[str]:
        """Ids of the episodes that can be stepped."""
        return [*self._episodes, *self._ended]

    def stats(self) -> dict[str, int]:
        """Counters since construction: ``failed`` (resets and steps that ended their episode with an error: an
        exception, a timeout, a crash), ``timeouts``, ``crashes``, worker ``restarts``, ``replays`` and ``lost``
        (episodes ended by a restart)."""
        return {k: self._counts[k] for k in ("failed", "timeouts", "crashes", "restarts", "replays", "lost")}

    def reset(self, episodes: Sequence[tuple[str, str, Mapping[str, Any], Sample]]) -> list[StepResult]:
        """Start episodes ``(episode id, env name, options, sample)``; one result each, in order: the first
        observation with ``done=False``, or, when the env could not start (it raised, timed out, its worker died),
        ``done=True``, ``observation=None`` and ``info["error"]``. A result, not an exception, so that one broken
        sample or browser ends its episode like any other failure and the batch goes on."""
        self._check_open()
        ids = [e[0] for e in episodes]
        dup = sorted({i for i in ids if ids.count(i) > 1 or i in self._episodes or i in self._ended})
        if dup:
            raise ValueError(f"episode {dup[0]!r} is already live or given twice; close it or use a new id")
        checked = [
            (eid, name, get_env(name), validate_env_options(name, opts), s) for eid, name, opts, s in episodes
        ]
        load = Counter(ep.worker for ep in self._episodes.values())
        cmds = []
        for eid, name, cls, opts, sample in checked:
            worker = min(range(max(self.workers, 1)), key=lambda w: (load[w], w))
            load[worker] += 1
            workdir = str(self.episode_dir(eid))
            ep = _Episode(eid, name, worker, env_ref(cls), opts, sample, workdir, cls.deterministic)
            self._episodes[eid] = ep
            cmds.append(_Cmd("reset", eid, (ep.ref, opts, sample, workdir, [], None), self.timeout_s))
        self._run(cmds)
        return [self._result(c) for c in cmds]

    def step(self, actions: Mapping[str, str]) -> dict[str, StepResult]:
        """Apply each episode's action (its whole turn's text), in parallel across workers; a result per episode.
        An episode ended by a worker restart since its last step gets that ending. Unknown ids raise KeyError."""
        self._check_open()
        unknown = [eid for eid in actions if eid not in self._episodes and eid not in self._ended]
        if unknown:
            raise KeyError(f"episode {unknown[0]!r} is not live (never reset, closed, or already done)")
        self._not_in_flight(actions)
        out = {eid: self._ended.pop(eid) for eid in actions if eid in self._ended}
        cmds = [
            _Cmd("step", eid, str(text), self.timeout_s) for eid, text in actions.items() if eid not in out
        ]
        self._run(cmds)
        out.update({c.eid: self._result(c) for c in cmds})
        return {eid: out[eid] for eid in actions}

    def submit(self, actions: Mapping[str, str]) -> None:
        """Start steps and return at once (the continuous episode schedule, docs/agents.md#continuous-episodes):
        each episode's action goes to its worker now, behind what that worker is already running, with the same
        deadline and recovery as :meth:`step`; :meth:`collect` returns each result once it is in. An episode has
        at most one step in flight. Unknown ids raise KeyError."""
        self._check_open()
        unknown = [eid for eid in actions if eid not in self._episodes and eid not in self._ended]
        if unknown:
            raise KeyError(f"episode {unknown[0]!r} is not live (never reset, closed, or already done)")
        self._not_in_flight(actions)
        for eid in [e for e in actions if e in self._ended]:
            self._answered[eid] = self._ended.pop(eid)
        cmds = [
            _Cmd("step", eid, str(t), self.timeout_s)
            for eid, t in actions.items()
            if eid not in self._answered
        ]
        self._submitted.extend(cmds)
        if self.workers == 0:
            self._run(cmds)
        else:
            self._guarded(self._enqueue, cmds)

    def _not_in_flight(self, episode_ids: Any) -> None:
        busy = ({c.eid for c in self._submitted} | set(self._answered)) & set(episode_ids)
        if busy:
            raise ValueError(f"episode {sorted(busy)[0]!r} already has a step in flight; collect() it first")

    @property
    def in_flight(self) -> int:
        """Submitted steps not yet returned by :meth:`collect`."""
        return len(self._submitted) + len(self._answered)

    def collect(self, timeout_s: float | None = None) -> dict[str, StepResult]:
        """The submitted steps answered since the last call, by episode id; waits until at least one is in (or
        ``timeout_s`` has passed: then possibly none). Empty when nothing is in flight."""
        self._check_open()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            done = [c for c in self._submitted if c.ok is not None or not self._is_queued(c)]
            if done or self._answered or not self._submitted:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._guarded(self._pump, left)
        out, self._answered = self._answered, {}
        for c in done:
            self._submitted.remove(c)
            out[c.eid] = self._result(c) if c.ok is not None else _failed("the env pool lost this step")
        return out

    def oracle(self, episode_ids: Sequence[str]) -> dict[str, str | None]:
        """Each episode's next correct action (:meth:`mmrl.envs.Env.oracle`: the full text as the model should
        write it, or None when the episode needs no more actions), asked in parallel in the workers; None too for
        an episode a worker restart ended (its next :meth:`step` returns that ending). Changes no episode. Raises
        RuntimeError naming the env and the episode when an env has no oracle or its oracle fails or times out (a
        bug or a misconfiguration); unknown ids raise KeyError."""
        self._check_open()
        unknown = [eid for eid in episode_ids if eid not in self._episodes and eid not in self._ended]
        if unknown:
            raise KeyError(f"episode {unknown[0]!r} is not live (never reset, closed, or already done)")
        self._not_in_flight(episode_ids)
        out: dict[str, str | None] = {eid: None for eid in episode_ids if eid in self._ended}
        cmds = [
            _Cmd("oracle", eid, None, self.timeout_s) for eid in dict.fromkeys(episode_ids) if eid not in out
        ]
        self._run(cmds)
        for c in cmds:
            if c.ok is None and c.eid in self._ended:  # a restart lost it while its oracle was queued
                c.ok = True
        failed = [c for c in cmds if not c.ok]
        if failed:
            c, ep = failed[0], self._episodes.get(failed[0].eid)
            more = f" ({len(failed) - 1} more episodes failed too)" if len(failed) > 1 else ""
            raise RuntimeError(
                f"env {ep.env if ep else '?'!r}, episode {c.eid!r}: the oracle failed: {c.value}{more}"
            )
        out.update({c.eid: c.value for c in cmds})
        return {eid: out[eid] for eid in episode_ids}

    def close_episode(self, *episode_ids: str, wait: bool = True) -> None:
        """Close live episodes (ids that are not live are ignored): their envs' ``close`` runs in their workers
        (after a step still running there; its result is dropped). ``wait=False``: queue the closes and return at
        once (their answers are taken by later calls), so a close never waits behind another episode's steps.
        Nothing to do once the pool is closed."""
        if self._closed:  # closed (Ctrl-C in a wait closes it): every episode went with it
            return
        for eid in episode_ids:
            self._ended.pop(eid, None)
            self._answered.pop(eid, None)
        gone = set(episode_ids)  # a submitted step of a closed episode is never collected
        self._submitted = [c for c in self._submitted if c.eid not in gone]
        cmds = [_Cmd("close", e, None, self.timeout_s) for e in episode_ids if e in self._episodes]
        if wait or self.workers == 0 or not cmds:
            self._run(cmds)
        else:
            self._guarded(self._enqueue, cmds)

    def close(self) -> None:
        """Close every env and stop the workers (idempotent); no process outlives this call."""
        if self._closed:
            return
        self._closed = True
        for env in self._local.values():
            _close_quietly(env)
        self._local.clear()
        self._episodes.clear()
        self._ended.clear()
        self._queues.clear()
        self._unsent.clear()
        self._submitted.clear()
        self._answered.clear()
        self._finalizer()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- execution ---------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("EnvPool is closed")

    def _result(self, cmd: _Cmd) -> StepResult:
        if cmd.ok and cmd.kind == "reset":
            return StepResult(observation=cmd.value, reward=0.0, done=False, info={})
        return cmd.value if cmd.ok else _failed(cmd.value)

    def _settle(self, cmd: _Cmd) -> None:
        """Book-keeping once ``cmd`` is answered (or has failed)."""
        ep = self._episodes.get(cmd.eid)
        if cmd.kind == "step" and cmd.eid in self._ended:  # its episode was lost while this step was queued
            cmd.ok, cmd.value = True, self._ended.pop(cmd.eid)
            return
        if ep is None or cmd.kind == "oracle":  # an oracle changes no episode; its failure is the caller's
            return
        if not cmd.ok:
            self._counts["failed"] += cmd.kind in ("reset", "step")
            self._episodes.pop(cmd.eid)
            if cmd.kind == "replay":
                self._lose(ep, f"worker restarted; replay failed: {cmd.value}")
            return
        if cmd.kind == "close" or (cmd.kind == "step" and cmd.value.done):
            self._episodes.pop(cmd.eid)
        elif cmd.kind == "step":
            ep.actions.append(cmd.arg)
            ep.state_key = cmd.value.observation.state_key
        elif cmd.kind == "reset":
            ep.state_key = cmd.value.state_key

    def _lose(self, ep: _Episode, error: str) -> None:
        self._episodes.pop(ep.eid, None)
        self._ended[ep.eid] = _failed(error)
        self._counts["lost"] += 1

    def _run(self, cmds: list[_Cmd]) -> None:
        """Run ``cmds`` to their answers (or failures), behind whatever the workers are already running."""
        if not cmds:
            return
        if self.workers == 0:
            for cmd in cmds:
                cmd.ok, cmd.value = _execute(self._local, cmd.wire())[1:]
                self._settle(cmd)
            return
        self._guarded(self._enqueue, cmds)
        while any(self._is_queued(c) for c in cmds):
            self._guarded(self._pump, None)

    def _guarded(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except (
            BaseException
        ):  # Ctrl-C, a worker that cannot restart: answers may be in flight, so stop it all
            self.close()
            raise

    def _is_queued(self, cmd: _Cmd) -> bool:
        return (
            any(c is cmd for c in self._queues.get(self._episodes[cmd.eid].worker, ()))
            if (cmd.eid in self._episodes)
            else any(c is cmd for q in self._queues.values() for c in q)
        )

    def _enqueue(self, cmds: list[_Cmd]) -> None:
        """Queue ``cmds`` on their episodes' workers and send them: an idle worker starts on them now, a busy one
        after what it runs."""
        self._ensure_workers()
        queues, started = self._queues, self._started
        new: dict[int, list[_Cmd]] = {}
        for cmd in cmds:
            new.setdefault(self._episodes[cmd.eid].worker, []).append(cmd)
        for w, mine in new.items():
            if w in queues:  # busy: its answers come in order, these after the rest, sent once it is done
                queues[w].extend(mine)
                self._unsent.setdefault(w, []).extend(mine)
                continue
            queues[w] = deque(mine)
            if not self._procs[w].proc.is_alive():  # died while idle: no command to blame
                self._recover(w, queues, None, "")
            self._send(w, queues, started)

    def _pump(self, timeout_s: float | None) -> None:
        """Wait for the next answer, deadline or crash (at most ``timeout_s``) and take what came in."""
        queues, started = self._queues, self._started
        if not queues:
            return
        first = min(started[w] + queues[w][0].budget_s for w in queues) - time.monotonic()
        handles = [h for w in queues for h in (self._procs[w].conn, self._procs[w].proc.sentinel)]
        wait(handles, timeout=max(0.0, first if timeout_s is None else min(first, timeout_s)))
        for w in list(queues):
            self._poll(w, queues, started)

    def _send(self, w: int, queues: dict[int, deque[_Cmd]], started: dict[int, float]) -> None:
        """Send worker ``w`` (idle or fresh) its whole queue."""
        started[w] = time.monotonic()
        self._unsent.pop(w, None)
        if not queues[w]:
            del queues[w]
            return
        with contextlib.suppress(OSError):  # a dead worker is found by _poll
            self._procs[w].conn.send([c.wire() for c in queues[w]])

    def _poll(self, w: int, queues: dict[int, deque[_Cmd]], started: dict[int, float]) -> None:
        """Take worker ``w``'s answers; on a deadline passed or a dead worker, recover it."""
        worker, queue = self._procs[w], queues[w]
        crashed = False
        try:
            while queue and worker.conn.poll():
                eid, ok, value = worker.conn.recv()
                cmd = queue.popleft()
                assert cmd.eid == eid, (cmd.eid, eid)
                cmd.ok, cmd.value = ok, value
                self._settle(cmd)
                started[w] = time.monotonic()
        except (EOFError, OSError):
            crashed = True
        unsent = self._unsent.get(w)
        if unsent and not crashed and len(queue) == len(unsent):  # it answered all it was sent: now the rest
            del self._unsent[w]
            with contextlib.suppress(OSError):  # a dead worker is found below
                worker.conn.send([c.wire() for c in unsent])
        if not queue:
            del queues[w]
            return
        if crashed or not worker.proc.is_alive():
            self._counts["crashes"] += 1
            self._recover(w, queues, queue.popleft(), f"worker crashed ({worker.exit_text()})")
        elif time.monotonic() >= started[w] + queue[0].budget_s:
            self._counts["timeouts"] += 1
            self._recover(w, queues, queue.popleft(), "timeout")
        else:
            return
        self._send(w, queues, started)

    def _recover(self, w: int, queues: dict[int, deque[_Cmd]], culprit: _Cmd | None, error: str) -> None:
        """Fail ``culprit`` with ``error``, restart worker ``w``, and queue (before its unstarted commands) the replay
        of every other episode that lived there (or end it: module docstring)."""
        if culprit is not None:
            culprit.ok, culprit.value = False, error
            self._settle(culprit)
        self._procs[w].kill()
        self._procs[w] = self._start_worker(w)
        self._counts["restarts"] += 1
        rest = queues.get(w, deque())
        for c in [c for c in rest if c.kind == "close"]:  # closing anyway: nothing to rebuild
            self._episodes.pop(c.eid, None)
            self._ended.pop(c.eid, None)
        resetting = {c.eid for c in rest if c.kind == "reset"}
        replays: deque[_Cmd] = deque()
        for ep in [e for e in self._episodes.values() if e.worker == w and e.eid not in resetting]:
            if ep.deterministic:
                self._counts["replays"] += 1
                arg = (ep.ref, ep.options, ep.sample, ep.workdir, list(ep.actions), ep.state_key)
                replays.append(_Cmd("replay", ep.eid, arg, self.timeout_s * (1 + len(ep.actions))))
            else:
                self._lose(ep, "worker restarted")
        for c in rest:
            if c.kind == "step" and c.eid in self._ended:  # lost above: answered without a worker
                c.ok, c.value = True, self._ended.pop(c.eid)
        queues[w] = deque([*replays, *(c for c in rest if c.eid in self._episodes)])

    def _ensure_workers(self) -> None:
        if self._procs:
            return
        methods = multiprocessing.get_all_start_methods()
        self._ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        self.root.mkdir(parents=True, exist_ok=True)
        started = [_Worker(self._ctx, i) for i in range(self.workers)]
        try:
            for worker in started:
                worker.wait_ready(self.start_timeout_s)
        except BaseException:
            _shutdown(started)
            raise
        self._procs.extend(started)

    def _start_worker(self, index: int) -> _Worker:
        worker = _Worker(self._ctx, index)
        worker.wait_ready(self.start_timeout_s)
        return worker

    def __repr__(self) -> str:
        return f"EnvPool(workers={self.workers}, live={len(self.live)}, root={str(self.root)!r})"


__all__ = ["EnvPool"]
