"""The run directory's life cycle: start fresh, refuse to mix two runs, resume without duplicate rows.

- A directory that already holds a run (``metrics.jsonl`` or a checkpoint) is refused unless ``--resume`` continues
  it or ``--overwrite`` replaces it: two runs appended into one ``metrics.jsonl`` cannot be told apart afterwards.
- ``--resume`` continues from the newest complete checkpoint ``step-N``. Rows that a crashed run logged after step N
  (it got further than its last checkpoint) would appear twice once the resumed run reaches those steps again, so they
  move from ``metrics.jsonl``, ``rollouts.jsonl`` and ``reward_errors.jsonl`` into ``discarded/<file>``: kept, never
  deleted, and out of the curves. TensorBoard's events from those steps are purged by the writer (``purge_step``).
  ``skipped.jsonl`` is rewritten at every start, so it lists each skipped record once.
- ``--overwrite`` removes only the files a run writes, never anything else in the directory.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mmrl.config import ConfigError
from mmrl.run.checkpoint import latest_checkpoint, list_checkpoints

STEP_LOGS = ("metrics.jsonl", "rollouts.jsonl", "reward_errors.jsonl")
RUN_FILES = (
    *STEP_LOGS,
    "skipped.jsonl",
    "config.json",
    "resolved.json",
    "report.md",
    "report.html",
    "reward_curve.png",
    "checkpoints",
    "tensorboard",
    "trackers.json",
    "wandb",
    "mlflow",
    "swanlog",
    "discarded",
    "plots",
    "renders",
)


class RunFinished(Exception):
    """``--resume`` of a run that already reached ``train.max_steps``."""


def holds_run(out: Path) -> bool:
    return (out / "metrics.jsonl").exists() or bool(list_checkpoints(out / "checkpoints"))


def prepare(out: Path, *, resume: bool, overwrite: bool, max_steps: int) -> Path | None:
    """Make ``out`` ready for a run; return the checkpoint to resume from (None for a fresh run)."""
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: choose one")
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in RUN_FILES:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    if not resume:
        if holds_run(out):
            raise ConfigError(
                f"{out} already holds a run; pass --resume to continue it, --overwrite to replace it, or choose "
                "another --output-dir"
            )
        (out / "skipped.jsonl").unlink(missing_ok=True)
        return None
    ckpt = latest_checkpoint(out / "checkpoints")
    if ckpt is None:
        raise ConfigError(
            f"--resume: no complete checkpoint under {out / 'checkpoints'} (start without --resume)"
        )
    step = int(ckpt.name.removeprefix("step-"))
    if step >= max_steps:
        raise RunFinished(f"the run in {out} already finished at step {step} (train.max_steps={max_steps})")
    for name in STEP_LOGS:
        discard_after(out / name, step, out / "discarded" / name)
    (out / "skipped.jsonl").unlink(missing_ok=True)
    return ckpt


def resume_point(out: Path, max_steps: int) -> Path:
    """The checkpoint a resumed run starts from (read-only: what ranks other than 0 call after rank 0 prepared)."""
    ckpt = latest_checkpoint(out / "checkpoints")
    if ckpt is None:
        raise ConfigError(
            f"--resume: no complete checkpoint under {out / 'checkpoints'} (start without --resume)"
        )
    step = int(ckpt.name.removeprefix("step-"))
    if step >= max_steps:
        raise RunFinished(f"the run in {out} already finished at step {step} (train.max_steps={max_steps})")
    return ckpt


def discard_after(path: Path, step: int, aside: Path) -> int:
    """Move the rows of ``path`` whose ``step`` is beyond ``step`` to ``aside`` (appended); return how many moved."""
    if not path.exists():
        return 0
    keep, moved = [], []
    for line in path.read_text().splitlines(keepends=True):
        try:
            row_step = json.loads(line).get("step") if line.strip() else None
        except json.JSONDecodeError:
            row_step = None  # a torn last line from a crash: set aside too
            moved.append(line if line.endswith("\n") else line + "\n")
            continue
        (moved if isinstance(row_step, int) and row_step > step else keep).append(line)
    if not moved:
        return 0
    aside.parent.mkdir(parents=True, exist_ok=True)
    with aside.open("a") as f:
        f.writelines(moved)
        f.flush()
        os.fsync(f.fileno())
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(keep))
    os.replace(tmp, path)
    return len(moved)
