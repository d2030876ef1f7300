"""Pre-flight checks: everything in a config that can be verified without loading a model is verified first.

A run that would die after minutes of model loading and data building because of a misspelt reward, an unknown
engine or a sampler option is refused at once, with one line naming the field and the fix. Rewards are checked first
and without importing torch, so ``mmrl train`` with a wrong reward name answers within a couple of seconds.
"""

from __future__ import annotations

from pathlib import Path

from mmrl.config import Config, ConfigError


def check_rewards(cfg: Config) -> None:
    from mmrl.rewards.base import load_reward, validate_options

    if not cfg.rewards:
        raise ConfigError("no rewards configured: list at least one under `rewards:` (see `mmrl list`)")
    for i, entry in enumerate(cfg.rewards):
        where = f"rewards[{i}] ({entry.name!r})"
        try:
            spec = load_reward(entry.name)
            validate_options(spec, entry.options)
        except (KeyError, ValueError, TypeError, FileNotFoundError, ImportError) as e:
            raise ConfigError(f"{where}: {e.args[0] if e.args else e}") from None


def check_components(cfg: Config) -> None:
    """Registered names and their options: engine, sampler, advantage, loss."""
    from mmrl.algos import ADVANTAGES, LOSSES
    from mmrl.registry import validate_kwargs
    from mmrl.rollout import ENGINES
    from mmrl.samplers import SAMPLERS

    def lookup(registry, name: str, field: str):
        try:
            return registry.get(name)
        except KeyError as e:
            raise ConfigError(f"{field}: {e.args[0]}") from None

    lookup(ENGINES, cfg.rollout.engine, "rollout.engine")
    sampler = lookup(SAMPLERS, cfg.sampler.name, "sampler.name")
    try:
        validate_kwargs(sampler, cfg.sampler.options, f"sampler.options ({cfg.sampler.name})", skip=("num_records",))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    lookup(ADVANTAGES, cfg.algo.advantage, "algo.advantage")
    lookup(LOSSES, cfg.algo.loss, "algo.loss")


def check_numbers(cfg: Config) -> None:
    positive = {
        "rollout.n": cfg.rollout.n,
        "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
        "rollout.batch_size": cfg.rollout.batch_size,
        "train.prompts_per_step": cfg.train.prompts_per_step,
        "optim.micro_batch_size": cfg.optim.micro_batch_size,
        "algo.epochs": cfg.algo.epochs,
        "algo.mini_batches": cfg.algo.mini_batches,
        "model.logits_chunk_tokens": cfg.model.logits_chunk_tokens,
        "train.prompt_cache_mb": cfg.train.prompt_cache_mb,
    }
    for name, v in positive.items():
        if v < 1:
            raise ConfigError(f"{name} must be at least 1, got {v}")
    if cfg.rollout.temperature < 0 or not 0 < cfg.rollout.top_p <= 1 or cfg.rollout.top_k < 0:
        raise ConfigError("rollout: temperature must be >= 0, top_p in (0, 1], top_k >= 0")
    if cfg.optim.lr <= 0:
        raise ConfigError(f"optim.lr must be positive, got {cfg.optim.lr}")


def check_data(cfg: Config) -> None:
    if not cfg.data.train:
        raise ConfigError("data.train is empty: give the training records' path")
    if not Path(cfg.data.train).exists() and not cfg.data.builder:
        raise ConfigError(f"data.train not found: {cfg.data.train} (build it first, or set data.builder)")
    if cfg.data.eval and not Path(cfg.data.eval).exists() and not cfg.data.builder:
        raise ConfigError(f"data.eval not found: {cfg.data.eval} (build it first, or set data.builder)")


def check_config(cfg: Config) -> None:
    """All pre-flight checks, cheapest first; raises :class:`ConfigError` with one line."""
    check_rewards(cfg)
    check_numbers(cfg)
    check_data(cfg)
    check_components(cfg)
