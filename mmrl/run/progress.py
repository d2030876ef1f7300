"""What ``mmrl train`` shows while it runs: a live bar on a terminal, plain lines in a log.

A batch job's stdout is a file, where a redrawn bar writes nothing readable until the run ends. There, one line is
printed on the first step, every ``every`` steps, on every step with a held-out score and on the last step:
``step 40/500 reward 0.612 eval 0.705 2.31 s/step 17m42s left``. The speed is measured over the steps this process
ran (a resumed run's earlier steps are not counted), so the time left is what this machine needs for the rest.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

Advance = Callable[[int, dict[str, Any]], None]


def summary(metrics: dict[str, Any]) -> str:
    """The step's reward and, when it was evaluated, its held-out score."""
    out = f"reward {metrics['reward/mean']:.3f}" if "reward/mean" in metrics else ""
    for key in ("eval/accuracy", "eval/reward"):
        if key in metrics:
            return f"{out} eval {metrics[key]:.3f}".strip()
    return out


def duration(seconds: float) -> str:
    s = round(seconds)
    h, m = divmod(s // 60, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s % 60:02d}s" if m else f"{s}s"


@contextmanager
def plain_lines(total: int, start: int, stream: TextIO, every: int) -> Iterator[Advance]:
    t0, first = time.perf_counter(), start

    def advance(step: int, metrics: dict[str, Any]) -> None:
        evaluated = any(k in metrics for k in ("eval/accuracy", "eval/reward"))
        if not (step == first + 1 or step % every == 0 or step == total or evaluated):
            return
        per_step = (time.perf_counter() - t0) / max(1, step - first)
        left = duration(per_step * (total - step))
        line = f"step {step}/{total} {summary(metrics)} {per_step:.2f} s/step {left} left"
        print(" ".join(line.split()), file=stream, flush=True)

    yield advance


@contextmanager
def bar(total: int, start: int) -> Iterator[Advance]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    cols = [
        TextColumn("[bold]train"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    ]
    with Progress(*cols, transient=False) as prog:
        task = prog.add_task("train", total=total, completed=start, info="")
        yield lambda step, metrics: prog.update(task, completed=step, info=summary(metrics))


@contextmanager
def progress(total: int, start: int, enabled: bool, stream: TextIO | None = None) -> Iterator[Advance]:
    """``advance(step, metrics)`` after each step: a bar when ``stream`` (stdout) is a terminal, else plain lines
    about 20 times in the run; nothing when not ``enabled`` (``train.progress: false``, or not rank 0)."""
    stream = stream or sys.stdout
    if not enabled:
        yield lambda step, metrics: None
    elif stream.isatty():
        with bar(total, start) as advance:
            yield advance
    else:
        with plain_lines(total, start, stream, every=max(1, total // 20)) as advance:
            yield advance
