"""End-of-run report: start and final held-out accuracy, a reward-curve PNG and a markdown summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmrl.logging import read_metrics


def _smooth(values: list[float], k: int = 5) -> list[float]:
    out = []
    for i in range(len(values)):
        window = values[max(0, i - k + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out


def write_report(output_dir: str | Path) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(output_dir)
    rows = read_metrics(out / "metrics.jsonl")
    train = [r for r in rows if r.get("reward/mean") is not None]
    evals = [r for r in rows if r.get("eval/accuracy") is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        steps = [r["step"] for r in train]
        rewards = [r["reward/mean"] for r in train]
        ax.plot(steps, rewards, color="tab:blue", alpha=0.3, label="train reward (per step)")
        ax.plot(steps, _smooth(rewards), color="tab:blue", label="train reward (5-step mean)")
    if evals:
        ax.plot(
            [r["step"] for r in evals],
            [r["eval/accuracy"] for r in evals],
            "o-",
            color="tab:red",
            label="held-out accuracy (greedy)",
        )
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, max(1.02, max((r["reward/mean"] for r in train), default=1) + 0.02))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(out.name)
    fig.tight_layout()
    fig.savefig(out / "reward_curve.png", dpi=110)
    plt.close(fig)
    summary: dict[str, Any] = {
        "steps": train[-1]["step"] if train else 0,
        "plot": str(out / "reward_curve.png"),
    }
    if evals:
        summary["start_accuracy"] = evals[0]["eval/accuracy"]
        summary["final_accuracy"] = evals[-1]["eval/accuracy"]
    if train:
        times = [sum(v for k, v in r.items() if k.startswith("time/")) for r in train]
        summary["train_seconds"] = sum(times)
    lines = [f"# Run report: {out.name}", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in summary.items()]
    lines += ["", "![reward curve](reward_curve.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    return summary
