"""The run report (``mmrl report RUN_DIR``, also written at the end of ``mmrl train``).

Writes into the run directory: ``reward_curve.png`` (train reward and held-out accuracy), ``plots/*.png`` (reward and
each reward's parts, KL, entropy, response length, groups with signal, eval accuracy overall and per group, and for
multi-turn runs the ``episode/*`` metrics: rates such as success in one plot, counts such as turns in another),
``report.md`` and ``report.html`` (the plots and a gallery of the latest logged rollouts, see
:mod:`mmrl.run.report_html`). It reads only what the run wrote, so it runs on a finished run or on one in progress: a torn
last line (a row being appended) is left out, and files are replaced atomically so a reader never sees half a page.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmrl.model.checkpoint_files import ModelView

GALLERY_STEPS = 4  # logged steps shown in the HTML gallery (each logs a few groups)
_NOT_PARTS = {"reward/mean", "reward/std", "reward/errors"}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file that a run may still be appending to: an unparsable last line is skipped."""
    if not path.exists():
        return []
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break  # being written right now
            raise ValueError(f"{path}:{i + 1}: not a JSON object ({e}); remove or repair that line") from e
    return [r for r in rows if isinstance(r, dict)]


def read_run_metrics(out: Path) -> list[dict[str, Any]]:
    """metrics.jsonl by step; where a resumed run logged a step twice, the later row wins."""
    rows = {int(r["step"]): r for r in read_jsonl(out / "metrics.jsonl") if "step" in r}
    return [rows[k] for k in sorted(rows)]


def _smooth(values: list[float], k: int = 5) -> list[float]:
    out = []
    for i in range(len(values)):
        window = values[max(0, i - k + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def _plot(path: Path, title: str, rows: list[dict[str, Any]], keys: list[str], smooth: bool = True) -> bool:
    """One figure of ``keys`` against step (a faint raw line and its 5-step mean); False when nothing to draw."""
    import matplotlib.pyplot as plt

    drawn = [(k, *_series(rows, k)) for k in keys]
    drawn = [d for d in drawn if d[1]]
    if not drawn:
        return False
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, (key, steps, values) in enumerate(drawn):
        colour = f"C{i % 10}"
        if smooth and len(values) > 5:
            ax.plot(steps, values, color=colour, alpha=0.25)
            ax.plot(steps, _smooth(values), color=colour, label=f"{key} (5-step mean)")
        else:
            ax.plot(steps, values, "o-" if len(values) < 30 else "-", color=colour, label=key, markersize=3)
    ax.set_xlabel("step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    _atomic(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)
    return True


def _atomic(path: Path, write: Callable[[Path], Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def _reward_curve(out: Path, train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        steps, rewards = _series(train, "reward/mean")
        ax.plot(steps, rewards, color="tab:blue", alpha=0.3, label="train reward (per step)")
        ax.plot(steps, _smooth(rewards), color="tab:blue", label="train reward (5-step mean)")
    if evals:
        steps, acc = _series(evals, "eval/accuracy")
        ax.plot(steps, acc, "o-", color="tab:red", label="held-out accuracy (greedy)")
    top = max((r["reward/mean"] for r in train), default=1.0)
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, max(1.02, top + 0.02))
    ax.grid(alpha=0.3)
    if train or evals:
        ax.legend(loc="lower right")
    ax.set_title(out.name)
    fig.tight_layout()
    path = out / "reward_curve.png"
    _atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def _curves(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """The per-topic plots under ``plots/``; a topic the run did not log is left out."""
    keys = sorted({k for r in rows for k in r})
    rewards = [k for k in keys if k.startswith("reward/") and k not in _NOT_PARTS]
    names = [k for k in rewards if k.count("/") == 1]
    topics: list[tuple[str, str, list[str], bool]] = [
        ("reward", "reward: total and per reward", ["reward/mean", *names], True)
    ]
    for name in names:
        parts = [k for k in rewards if k.startswith(f"{name}/")]
        if parts:
            topics.append((f"reward_{name[7:]}", f"{name[7:]}: score and parts", [name, *parts], True))
    episode = [k for k in keys if k.startswith("episode/")]
    rates = [k for k in episode if all(0.0 <= v <= 1.0 for v in _series(rows, k)[1])]
    topics += [
        ("episode", "episodes: rates (success, step accuracy, ...)", rates, True),
        ("episode_counts", "episodes: counts (turns, ...)", [k for k in episode if k not in rates], True),
        ("kl", "KL to the reference", ["kl"], True),
        # with its target where a method holds it at one (aepo/target_entropy)
        ("entropy", "policy entropy", ["entropy", *[k for k in keys if k.endswith("/target_entropy")]], True),
        (
            "response_length",
            "response length (tokens)",
            ["response_length/mean", "response_length/max"],
            True,
        ),
        ("groups_with_signal", "share of groups whose rewards differ", ["rollout/groups_with_signal"], True),
        (
            "eval_accuracy",
            "held-out accuracy, overall and per group",
            ["eval/accuracy", *[k for k in keys if k.startswith("eval/accuracy/")]],
            False,
        ),
    ]
    (out / "plots").mkdir(exist_ok=True)
    made = []
    for stem, title, series, smooth in topics:
        path = out / "plots" / f"{stem.replace('/', '_')}.png"
        if _plot(path, title, rows, series, smooth):
            made.append(path)
    return made


def _model_view(config: dict[str, Any]) -> ModelView:
    """How the run's model saw images (its checkpoint's geometry and frame under its image budget)."""
    return ModelView.of_model(config.get("model") or {})


def _summary(out: Path, train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"steps": train[-1]["step"] if train else 0}
    if evals:
        summary["start_accuracy"] = evals[0]["eval/accuracy"]
        summary["final_accuracy"] = evals[-1]["eval/accuracy"]
    if train:
        summary["train_seconds"] = sum(
            v for r in train for k, v in r.items() if k.startswith("time/") and isinstance(v, (int, float))
        )
        summary["final_reward_mean"] = train[-1]["reward/mean"]
        episode = {
            k: v for k, v in train[-1].items() if k.startswith("episode/") and isinstance(v, (int, float))
        }
        summary |= {f"final_{k}": v for k, v in sorted(episode.items())}
    return summary


def _fmt(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def write_report(output_dir: str | Path, gallery_steps: int = GALLERY_STEPS) -> dict[str, Any]:
    """Write the plots, ``report.md`` and ``report.html`` of a run directory; return the summary numbers and paths
    (``steps``, ``start_accuracy``/``final_accuracy`` when it evaluated, ``train_seconds``, ``plot``, ``plots``,
    ``markdown``, ``html``)."""
    import matplotlib

    matplotlib.use("Agg")
    from mmrl.run.report_html import gallery, render_page

    out = Path(output_dir)
    if not (out / "metrics.jsonl").exists() and not (out / "rollouts.jsonl").exists():
        raise FileNotFoundError(
            f"{out}: no metrics.jsonl or rollouts.jsonl, not a run directory; give the --output-dir of `mmrl train`"
        )
    rows = read_run_metrics(out)
    train = [r for r in rows if isinstance(r.get("reward/mean"), (int, float))]
    evals = [r for r in rows if isinstance(r.get("eval/accuracy"), (int, float))]
    summary = _summary(out, train, evals)
    summary["plot"] = str(_reward_curve(out, train, evals))
    plots = _curves(out, rows)
    summary["plots"] = [str(p) for p in plots]
    config_path = out / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    rollouts = read_jsonl(out / "rollouts.jsonl")
    names = [str(x.get("name")) for x in config.get("rewards") or [] if isinstance(x, dict)]
    groups = gallery(rollouts, out, _model_view(config), gallery_steps, names if config else None)
    rel = [Path(p).relative_to(out).as_posix() for p in [summary["plot"], *summary["plots"]]]
    table = [(k, _fmt(v)) for k, v in summary.items() if k not in ("plot", "plots")]
    env = (config.get("rollout") or {}).get("env")
    table += [("rewards", ", ".join(str(r.get("name")) for r in config.get("rewards") or []) or "?")]
    if env:  # an env's own reward (the env's return), beside any reward functions
        table[-1] = ("rewards", f"env {env}" + (f", {table[-1][1]}" if table[-1][1] != "?" else ""))
    table += [("model", str((config.get("model") or {}).get("path", "?")))]
    page = render_page(
        out.name, table, rel, groups, len({g.step for g in groups}), len({r.get("step") for r in rollouts})
    )
    html = out / "report.html"
    _atomic(html, lambda tmp: tmp.write_text(page, encoding="utf-8"))
    lines = [f"# Run report: {out.name}", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in table]
    lines += ["", "Sample rollouts with what each reward saw: [report.html](report.html)", ""]
    lines += [f"![{Path(p).stem}]({p})" for p in rel] + [""]
    md = out / "report.md"
    _atomic(md, lambda tmp: tmp.write_text("\n".join(lines)))
    summary["markdown"], summary["html"] = str(md), str(html)
    return summary
