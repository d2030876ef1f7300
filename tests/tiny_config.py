"""A tiny run's config for tests: the shapes recipe's data built under the test's folder and a config file that
trains the tiny Qwen2.5-VL on it, with the test's own sections after."""

from __future__ import annotations

from pathlib import Path

TINY = str(Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl")


def shapes_config(tmp_path: Path, body: str, *, n_train: int = 8, n_eval: int = 4, seed: int = 5) -> Path:
    """``tmp_path/cfg.yaml``: the tiny model at 56x56 pixels and ``data/train.jsonl``, then ``body`` (YAML)."""
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=n_train, n_eval=n_eval, seed=seed)
    cfg = tmp_path / "cfg.yaml"
    head = f"model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}\ndata: {{train: data/train.jsonl}}\n"
    cfg.write_text(head + body)
    return cfg
