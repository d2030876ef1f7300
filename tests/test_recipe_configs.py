"""Every shipped recipe config loads, and every registered name and option in it resolves against its function's
signature, without downloading anything: rewards (with their options), engine (with engine_options), sampler,
advantage estimator, loss, aggregation, KL estimator, reward correction, presets, data builder, numbers."""

import importlib
from pathlib import Path

import pytest

from mmrl.config import load_config
from mmrl.train.checks import check_components, check_data, check_env, check_numbers, check_rewards

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "recipes").glob("*/*.yaml") if p.parent.name != "accelerate")


def test_every_recipe_has_configs():
    names = {p.parent.name for p in CONFIGS}
    domains = {
        "shapes",
        "table2latex",
        "gui",
        "pathology",
        "geometry",
        "video",
        "medvqa",
        "zoom",
        "gui_agent",
    }
    assert domains <= names
    for n in domains:  # a tiny config for the CPU and a GPU config (geometry: one per variant, MSSR and VADE)
        assert list((ROOT / "recipes" / n).glob("tiny*.yaml")) and list(
            (ROOT / "recipes" / n).glob("gpu*.yaml")
        ), n


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_config_resolves_every_name_and_option(path, monkeypatch):
    from mmrl.rollout import ENGINES

    # vLLM lives in .venv-vllm (its engine is tested there); here its name and options are what is checked
    monkeypatch.setattr(ENGINES.get("vllm"), "check", staticmethod(lambda: None))
    if path.name.startswith("gpu"):  # the judge and encoder folders of a GPU config are the user's, not here
        import mmrl.rewards.embedding
        import mmrl.rewards.judge

        def named_folder(reward: str, option: str, value: str) -> None:
            assert value, f"{path}: reward {reward!r} needs option {option!r}"

        monkeypatch.setattr(mmrl.rewards.judge, "check_model_folder", named_folder)
        monkeypatch.setattr(mmrl.rewards.embedding, "check_model_folder", named_folder)
    cfg = load_config(path)
    check_numbers(cfg)
    check_data(cfg)
    check_env(cfg)
    if not path.name.startswith("sft"):  # sft configs are for `mmrl sft`: no rewards, no RL components
        check_rewards(cfg)
        check_components(cfg)
    if cfg.data.builder:
        module, _, fn = cfg.data.builder.partition(":")
        assert callable(getattr(importlib.import_module(module), fn))
    if path.name == "gpu.yaml":  # real checkpoints: bf16 over fp32 master weights, memory-saving settings on
        assert cfg.model.dtype == "bfloat16" and cfg.model.gradient_checkpointing
        assert cfg.model.path.startswith("Qwen/Qwen2.5-VL")
