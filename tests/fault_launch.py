"""``torchrun ... tests/fault_launch.py FAULT -- <mmrl train arguments>``: `mmrl train` with one fault injected on one
rank, for tests/test_faults.py. FAULT is ``kind:rank:step``:

- ``kill:R:S``: rank R SIGKILLs itself in the middle of step S's update (after the first micro-batch's backward
  started the gradient all-reduce, so the peers are inside a collective with it);
- ``stop:R:S``: rank R SIGSTOPs itself at the same point (alive but silent: its peers wait out the collective
  timeout); a watcher SIGKILLs it once the launcher has sent it SIGTERM, instead of torchrun's 30 s grace;
- ``raise:R:S``: rank R raises ``torch.OutOfMemoryError`` at the start of step S's update (an OOM, a bad record);
- ``kill_saving:R:S``: rank R SIGKILLs itself while writing step S's checkpoint: rank 0 after every file is written
  and before the staging folder is promoted, another rank after writing its optimizer shard (FSDP);
- ``kill_reward_worker:R:N``: on rank R, a worker of the reward pool is SIGKILLed while it scores, in the N-th call
  of the pool (0.3 s into it); ``kill_idle_reward_worker:R:N``: the same just before the N-th call (an idle worker);
- ``kill_env_worker:R:N``: on rank R, the env pool's worker (its process group) is SIGKILLed just before the N-th
  call of ``EnvPool.step``, between two turns of the episodes it holds.
"""

import os
import signal
import sys
import time

import torch


def main() -> None:
    kind, rank, step = sys.argv[1].split(":")
    rank, step = int(rank), int(step)
    me = int(os.environ.get("RANK", "0"))
    args = sys.argv[sys.argv.index("--") + 1 :]
    if me == rank:
        install(kind, step)
    from mmrl.cli import main as mmrl_main

    sys.exit(mmrl_main(args))


# Watches a stopped rank: once a SIGTERM is pending on it (the launcher asking it to end, which a stopped process
# cannot act on), SIGKILL it. torchrun would do the same after its own 30 s grace period, a wait the test has no use
# for; the rank still ends only after the launcher asked. Bit 14 of the pending masks is SIGTERM (signal 15).
_WATCH = """
import os, signal, sys, time
pid = int(sys.argv[1])
while True:
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        break
    masks = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    if any(m & (1 << (signal.SIGTERM - 1)) for m in masks):
        os.kill(pid, signal.SIGKILL)
        break
    time.sleep(0.1)
"""


def _end_when_asked(pid: int) -> None:
    """Start the watcher of ``pid`` in its own session, out of reach of the launcher's process-group kill."""
    import subprocess

    subprocess.Popen([sys.executable, "-c", _WATCH, str(pid)], start_new_session=True)


def install(kind: str, step: int) -> None:
    from mmrl.run import checkpoint
    from mmrl.train import update

    if kind in ("kill", "stop", "raise"):
        real = update.PolicyUpdate.__call__
        micro = update.PolicyUpdate._micro_step

        def call(self, batch, step=0, **kw):
            if step == fault_step and kind == "raise":
                raise torch.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 200.00 GiB (injected by the test)"
                )
            self._fault_now = step == fault_step
            return real(self, batch, step=step, **kw)

        def micro_step(self, *a, **kw):
            out = micro(self, *a, **kw)
            if getattr(self, "_fault_now", False):
                if kind == "stop":
                    _end_when_asked(os.getpid())
                os.kill(os.getpid(), signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
            return out

        fault_step = step
        update.PolicyUpdate.__call__ = call
        update.PolicyUpdate._micro_step = micro_step
    elif kind == "kill_saving":
        if int(os.environ.get("RANK", "0")) == 0:
            fsync = checkpoint._fsync_tree

            def fsync_tree(path):
                fsync(path)
                if path.name == f"step-{step}.tmp":
                    os.kill(os.getpid(), signal.SIGKILL)

            checkpoint._fsync_tree = fsync_tree
        else:
            from mmrl.model import fsdp

            save = fsdp.save_sharded_optimizer

            def save_sharded(model, opt, path, group=None):
                save(model, opt, path, group)
                if path.parent.name == f"step-{step}.tmp":
                    os.kill(os.getpid(), signal.SIGKILL)

            fsdp.save_sharded_optimizer = save_sharded
    elif kind in ("kill_reward_worker", "kill_idle_reward_worker"):
        import threading

        from mmrl.rewards import compose

        run_pool, calls = compose.CompositeReward._run_pool, [0]

        def kill_one(reward):
            procs = list((getattr(reward._pool, "_processes", None) or {}).values())
            os.kill(procs[0].pid, signal.SIGKILL)

        def patched(self, term, items):
            calls[0] += 1
            if calls[0] == step and kind == "kill_idle_reward_worker" and self._pool is not None:
                kill_one(self)
                time.sleep(0.5)  # the executor's manager thread sees the death and marks the pool broken
            elif calls[0] == step:
                threading.Timer(0.3, kill_one, args=(self,)).start()
            return run_pool(self, term, items)

        compose.CompositeReward._run_pool = patched
    elif kind == "kill_env_worker":
        from mmrl.envs import pool

        env_step, calls = pool.EnvPool.step, [0]

        def patched_step(self, actions):
            calls[0] += 1
            if calls[0] == step:
                os.killpg(self._procs[0].proc.pid, signal.SIGKILL)
            return env_step(self, actions)

        pool.EnvPool.step = patched_step
    else:
        raise SystemExit(f"unknown fault {kind!r}")


if __name__ == "__main__":
    main()
