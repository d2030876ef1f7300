"""Environment API for multi-turn episodes: an env is a registered class.

    @register_env("my_env")
    class MyEnv(Env):
        deterministic = True  # the same actions from the same sample give the same observations

        def __init__(self, *, workdir: Path, max_turns: int = 4) -> None:
            super().__init__(workdir=workdir)
            ...

        def reset(self, sample: Sample) -> Observation: ...
        def step(self, action_text: str) -> StepResult: ...
        def close(self) -> None: ...
        def oracle(self) -> str | None: ...  # optional: the next correct action (teacher-forced episodes, SFT)
        @classmethod
        def check_options(cls, options) -> None: ...  # optional: value checks at pre-flight

Options are the keyword-only parameters of ``__init__`` with defaults (``workdir`` is given by the pool: the
episode's own folder, where the env writes its image files); a recipe passes them per env and
:func:`validate_env_options` checks names and kinds against the signature, plus the class's own
:meth:`Env.check_options`, before anything runs. Envs run in worker processes (:class:`mmrl.envs.pool.EnvPool`), so
everything that crosses a process boundary is plain data: a :class:`~mmrl.types.Sample` in, observations whose
images are PNG paths out, never PIL objects.

The first turn: the sample's own messages and images ARE the first user turn. :meth:`Env.reset` returns the
initial :class:`Observation` for its ``state_key``; its ``text`` and ``images``, when not empty, are appended to that
first user turn (text after the prompt's text, images after the prompt's images). Every later observation is the
next user (tool) turn: its text, then its images.

Model output is hostile input: :meth:`Env.step` never raises on a malformed action. It answers with an observation
saying what was wrong (``"invalid action: expected ..."``), reward 0 and ``info["invalid"] = True``. An exception that
escapes an env anyway (a bug) ends that episode with reward 0 and ``info["error"]``; it never stops training.

The oracle (optional): :meth:`Env.oracle` gives the FULL TEXT of the next correct action, written as the model
should write it (its action format, coordinates in the model's frame from the sample's metadata, as the env parses
them), or None when the episode needs no more actions. It drives teacher-forced episodes
(:func:`mmrl.rollout.episodes.run_episodes` with ``teacher="oracle"``) and through them the multi-turn SFT warm start
(:mod:`mmrl.train.sft`). An env without one raises NotImplementedError; unlike :meth:`Env.step`, the oracle is not fed
model output, so any exception from it is a bug or a misconfiguration and reaches the caller
(:meth:`mmrl.envs.pool.EnvPool.oracle`).

:func:`get_env` accepts a registered name or ``package.module:Class`` (a class of the user's own package; it need not
be registered). A worker process finds the class again by module and qualified name (:func:`env_ref`), importing the
module by its file when the worker's ``sys.path`` cannot: so an env defined in a test folder or a script's sibling
module works in workers too, one defined in ``__main__`` or inside a function does not.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mmrl.config import EpisodeConfig
from mmrl.registry import Builtin, Registry, validate_kwargs
from mmrl.types import Sample


@dataclass
class Observation:
    """What the env shows the model after a reset or a step.

    ``text``: what the next user/tool turn says; ``images``: paths of NEW image files of this turn (PNG files the env
    wrote under its ``workdir``); ``state_key``: the anchor state, the observation without history (GiGPO groups the
    steps of one task's episodes by it, docs/agents.md#step-level-credit): equal keys mean the same environment state."""

    text: str
    images: list[str]
    state_key: str


@dataclass
class StepResult:
    """One step's outcome. ``observation`` is None when the episode is over (``done``); ``reward`` is this step's
    reward (an outcome env gives it on the last step); ``info`` is plain data for logs and metrics: ``invalid`` (a
    malformed action), ``error`` (a failure outside the model's control: ``"timeout"``, ``"worker restarted"``, an
    exception), and whatever the env reports."""

    observation: Observation | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """One episode's environment. A fresh instance per episode: ``reset`` once, then ``step`` until ``done``.

    ``deterministic``: the same sample and the same actions give the same observations (and files). The pool then
    rebuilds such an episode after its worker died by replaying its actions in a fresh worker; an episode of a
    non-deterministic env is ended instead (:mod:`mmrl.envs.pool`).

    ``points_on_latest_image``: the model points on the LATEST observation's image but the env maps the point with
    the first image's model size (the env never learns the size the driver showed a later image at), so later
    images must be seen at the first one's size: pre-flight refuses ``rollout.image_rule: downscale`` with a pixel
    budget for such an env (``browser_app``: every screenshot is the same screen size)."""

    name: ClassVar[str] = ""
    deterministic: ClassVar[bool] = False
    points_on_latest_image: ClassVar[bool] = False

    def __init__(self, *, workdir: Path) -> None:
        self.workdir = Path(workdir)

    @abstractmethod
    def reset(self, sample: Sample) -> Observation:
        """Start the episode of ``sample``; the first observation (see the module docstring)."""

    @abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Apply the model's whole turn ``action_text``; never raises on a malformed action."""

    @abstractmethod
    def close(self) -> None:
        """Release what the episode holds (a browser page, open files); called once, also after ``done``."""

    def oracle(self) -> str | None:
        """The next correct action's full text in the model's format and coordinate frame, or None when the
        episode needs no more actions (module docstring). Optional: envs without a teacher do not override it."""
        raise NotImplementedError(
            f"env {self.name or type(self).__name__!r} ({type(self).__qualname__}) has no oracle: it cannot drive "
            "teacher-forced episodes or a multi-turn SFT warm start; implement Env.oracle() or warm-start "
            "single-turn (no rollout.env)"
        )

    @classmethod  # noqa: B027  (an optional hook: no checks by default)
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Pre-flight check of option values beyond names and kinds; raise ValueError naming the option and the
        fix."""


EnvClass = type[Env]
# the built-in envs, imported on first use (browser_app drives Chromium through playwright: the gui extra)
ENVS: Registry[EnvClass] = Registry(
    "env",
    {"zoom": Builtin("mmrl.envs.zoom"), "browser_app": Builtin("mmrl.envs.browser", "gui", ("playwright",))},
)


def register_env(name: str) -> Callable[[EnvClass], EnvClass]:
    def deco(cls: EnvClass) -> EnvClass:
        if not (inspect.isclass(cls) and issubclass(cls, Env)):
            raise TypeError(f"env {name!r}: register a subclass of mmrl.envs.Env, got {cls!r}")
        cls.name = name
        env_options(cls)  # the option contract is checked at registration, not at the first episode
        return ENVS.register(name)(cls)

    return deco


def get_env(name: str) -> EnvClass:
    """A registered env by name, or ``package.module:Class``."""
    module_name, sep, qualname = name.partition(":")
    if not sep:
        return ENVS.get(name)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise KeyError(f"env module {module_name!r} cannot be imported: {e}") from None
    for attr in qualname.split("."):
        obj = getattr(obj, attr, None)
    if not (inspect.isclass(obj) and issubclass(obj, Env)):
        raise KeyError(f"env {name!r}: {module_name} has no Env subclass {qualname!r}")
    env_options(obj)
    return obj


def env_options(cls: EnvClass) -> dict[str, inspect.Parameter]:
    """The env's options (``__init__``'s keyword-only parameters but ``workdir``); raises if the class breaks the
    contract (a positional parameter, an option without a default, ``*args``/``**kwargs``)."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    names = [p.name for p in params]
    if "workdir" not in names:
        raise TypeError(f"env {cls.__name__}: __init__ must take the keyword-only parameter `workdir`")
    options: dict[str, inspect.Parameter] = {}
    for p in params:
        if p.name == "workdir":
            continue
        if p.kind is not p.KEYWORD_ONLY or p.default is p.empty:
            raise TypeError(
                f"env {cls.__name__}: parameter {p.name!r} must be keyword-only with a default "
                f"(write `def __init__(self, *, workdir, {p.name}=...)`)"
            )
        options[p.name] = p
    return options


def validate_env_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check the options of env ``name`` before anything runs: an unknown name is an error naming the nearest valid
    one, a value must have its default's kind, then the class's own :meth:`Env.check_options`."""
    cls = get_env(name)
    options = dict(options or {})
    validate_kwargs(cls, options, f"env {name!r}", skip=("workdir",))
    cls.check_options(options)
    return options


def validate_episode_settings(name: str, settings: EpisodeConfig, max_new_tokens: int | None = None) -> None:
    """Check episodes of env ``name`` run as ``settings`` say, before anything runs (training's pre-flight, an env
    benchmark's options): the limits, the env's options (:func:`validate_env_options`), and an image budget the env
    can live with. ``max_new_tokens``: one turn's longest completion, which ``max_total_tokens`` must leave room
    for. Raises ValueError whose message starts with the setting's name (KeyError for an unknown env)."""
    s = settings
    if s.max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {s.max_turns}")
    if s.env_workers < 0 or not s.env_timeout_s > 0:
        raise ValueError(
            f"env_workers must be >= 0 and env_timeout_s > 0; got {s.env_workers}, {s.env_timeout_s}"
        )
    if not 0.0 < s.min_ready <= 1.0:
        raise ValueError(f"min_ready must be in (0, 1] (1: lockstep again), got {s.min_ready}")
    if max_new_tokens is not None and s.max_total_tokens is not None and s.max_total_tokens <= max_new_tokens:
        raise ValueError(
            f"max_total_tokens ({s.max_total_tokens}) leaves no room for a prompt and one turn of max_new_tokens "
            f"({max_new_tokens}); raise it or leave it unset"
        )
    cls = get_env(name)  # an unknown env: KeyError naming the nearest
    try:
        validate_env_options(name, s.env_options)
    except (ValueError, TypeError) as e:
        raise ValueError(f"env_options: {e.args[0] if e.args else e}") from None
    if cls.points_on_latest_image and s.image_rule == "downscale" and s.max_context_pixels is not None:
        raise ValueError(
            f"image_rule: env {name!r} maps the model's points on each new screen with the first screen's model "
            "size, so a downscaled later screen would be clicked in the wrong place; use image_rule: end (the "
            "episode ends when the next screen does not fit max_context_pixels)"
        )


def env_ref(cls: EnvClass) -> tuple[str, str, str]:
    """How a worker process finds ``cls`` again: ``(module, qualname, file of the module)``."""
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise ValueError(
            f"env {cls.name or cls.__name__!r} is defined in {cls.__module__}.{cls.__qualname__}, which a worker "
            "process cannot import; move it to a module-level class in a file of its own"
        )
    return cls.__module__, cls.__qualname__, inspect.getfile(cls)


def resolve_env_ref(ref: tuple[str, str, str]) -> EnvClass:
    """The class of :func:`env_ref`, importing its module (by the file when ``sys.path`` does not reach it)."""
    module_name, qualname, path = ref
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
    obj: Any = module
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    return obj
