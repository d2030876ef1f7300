"""mmrl envs: multi-turn environments for agentic episodes. The built-in envs (``zoom``, ``browser_app``) are
imported on first use (``ENVS.get``, ``get_env``; ``browser_app`` needs the ``gui`` extra); ``base.py`` has the API,
``pool.py`` the worker pool that runs episodes."""

from mmrl.envs.base import (
    ENVS,
    Env,
    Observation,
    StepResult,
    env_options,
    get_env,
    register_env,
    validate_env_options,
    validate_episode_settings,
)
from mmrl.envs.pool import EnvPool

__all__ = [
    "ENVS",
    "Env",
    "EnvPool",
    "Observation",
    "StepResult",
    "env_options",
    "get_env",
    "register_env",
    "validate_env_options",
    "validate_episode_settings",
]
