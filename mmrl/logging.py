"""Metrics sinks: ``metrics.jsonl`` (appended, one object per step, never truncated) and optional TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsLogger:
    def __init__(
        self, output_dir: Path, tensorboard: bool = False, purge_step: int | None = None, enabled: bool = True
    ):
        self.enabled = enabled  # only rank 0 writes in multi-process training
        self.path = output_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tb = None
        if tensorboard and enabled:
            from torch.utils.tensorboard import SummaryWriter

            # on resume, events from steps >= purge_step (logged after the checkpoint by the crashed run) are dropped
            self.tb = SummaryWriter(str(output_dir / "tensorboard"), purge_step=purge_step)

    def log(self, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()
        }
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
            f.flush()
        if self.tb is not None:
            step = int(metrics["step"])
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and k != "step" and v is not None:
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl; where a resumed run logged a step twice, the later row wins."""
    rows: dict[int, dict[str, Any]] = {}
    extra: list[dict[str, Any]] = []
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                if n == len(
                    lines
                ):  # a run still writing (or killed mid-line): the torn last row is not a row yet
                    break
                raise ValueError(f"{path}:{n}: not a JSON object") from None
            if "step" in r:
                rows[int(r["step"])] = r
            else:
                extra.append(r)
    return [rows[k] for k in sorted(rows)] + extra
