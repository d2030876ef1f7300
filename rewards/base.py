"""Reward API: a reward is a registered batch function.

    @register_reward("my_reward")
    def my_reward(batch: list[RewardInput], *, option_a: float = 1.0) -> list[RewardResult]: ...

Options are keyword-only arguments with defaults; a recipe passes them per reward (never through the global config)
and :func:`validate_options` checks them against the signature before anything runs, then runs the reward's own
``check`` (``register_reward(..., check=fn)``: a model folder that must exist, nested options). ``heavy=True`` marks
rewards that render (LaTeX, HTML): the composite runs them in its worker-process pool.

:func:`load_reward` accepts a registered name or a user's own ``path/to/file.py:function``; the function there may be
decorated with :func:`register_reward` (its name and ``heavy`` flag are then used) or be a plain batch function with
the same signature (it is then light and named after the function).

:func:`call_reward` is the one place a reward function is invoked (inline, in pool workers and by the CLI): it
validates what the function returned and, when the batch call raises, re-runs the items one at a time so only the
offending samples score 0 with an error (with ``group=True`` it re-runs one group at a time, and a group that
raises alone scores 0 for every one of its items).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
import traceback
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from mmrl.registry import Builtin, Registry
from mmrl.types import RewardInput, RewardResult

RewardFn = Callable[..., list[RewardResult]]
# RewardInput.metadata key of the response's sampled-token log-probs (list[float]), set by the trainer; only group
# rewards see it (mmrl.rewards.compose)
LOGPROBS_KEY = "response_logprobs"


@dataclass(frozen=True)
class RewardSpec:
    name: str
    fn: RewardFn
    heavy: bool = False
    # Pre-flight check of the options beyond their names and kinds (a model folder that must exist, nested options
    # of a preset); raises ValueError naming the option and the fix. Runs wherever options are validated.
    check: Callable[[dict[str, Any]], None] | None = None
    # What the reward judged, drawn on the input image for the run report's gallery: "module:function", imported when
    # a report is drawn; the function takes (image, row, response, view) (``row``: the group's rollouts.jsonl row with
    # ``answer``, ``id`` and ``metadata``; ``view``: :class:`mmrl.model.checkpoint_files.ModelView`) and returns
    # (image, caption) or None when the row is not one it can draw.
    overlay: str | None = None
    # The score of a response depends on its group (the other responses to the same prompt): the composite hands the
    # reward whole groups, retries group by group and keeps it out of the per-response cache.
    group: bool = False

    def __post_init__(self) -> None:
        if self.heavy and self.group:
            raise ValueError(
                f"reward {self.name!r}: heavy=True and group=True cannot be combined (the worker pool cuts batches "
                "into chunks of items and retries single items, which would split groups); make it light and "
                "call a pool of your own inside it if it must render"
            )


# The built-in rewards, imported on first use (``REWARDS.get``): their modules import optional packages (an extra,
# checked first: mmrl.extras), so only the rewards a run names are imported; ``REWARDS.names()`` lists them all.
_GENERAL = "mmrl.rewards.general"
BUILTIN_REWARDS: dict[str, Builtin] = {
    "format_think_answer": Builtin(_GENERAL),
    "math_verify": Builtin(_GENERAL, "render", ("math_verify",)),
    "mc_letter": Builtin(_GENERAL),
    "exact_match": Builtin(_GENERAL),
    "overlong_penalty": Builtin(_GENERAL),
    "gui_action": Builtin("mmrl.rewards.gui"),
    "pathology": Builtin("mmrl.rewards.pathology"),
    "modality_tag": Builtin("mmrl.rewards.medix"),
    "medix": Builtin("mmrl.rewards.medix"),
    "judge": Builtin("mmrl.rewards.judge"),
    "embedding_similarity": Builtin("mmrl.rewards.embedding"),
    "remote": Builtin("mmrl.rewards.remote", "server", ("httpx",)),
    "latex_table": Builtin("mmrl.rewards.latex_table", "render", ("pypdfium2", "lxml", "scipy", "rapidfuzz")),
    "teds": Builtin("mmrl.rewards.latex_table", "render", ("lxml", "scipy", "rapidfuzz")),
    "ttrl": Builtin("mmrl.rewards.labelfree"),
    "scope": Builtin("mmrl.rewards.labelfree"),
    "empo": Builtin("mmrl.rewards.labelfree"),
    "arena": Builtin("mmrl.rewards.arena"),
}
REWARDS: Registry[RewardSpec] = Registry("reward", BUILTIN_REWARDS)

# Reward files loaded from a user's path, by resolved path; modules get a synthetic name (below) so that two files
# called rewards.py do not collide, and pool workers are told the path rather than the unimportable name.
_FILE_MODULES: dict[Path, ModuleType] = {}
_USER_MODULE_PREFIX = "mmrl_user_reward_"


def register_reward(
    name: str,
    *,
    heavy: bool = False,
    check: Callable[[dict[str, Any]], None] | None = None,
    overlay: str | None = None,
    group: bool = False,
) -> Callable[[RewardFn], RewardFn]:
    def deco(fn: RewardFn) -> RewardFn:
        spec = RewardSpec(name=name, fn=fn, heavy=heavy, check=check, overlay=overlay, group=group)
        REWARDS.register(name, module=fn.__module__)(spec)
        return fn

    return deco


def reward_overlay(name: str) -> Callable[..., Any] | None:
    """The report overlay a registered reward declared (:attr:`RewardSpec.overlay`), imported; None when the reward
    declares none or is not registered (a reward loaded from a user's file) or cannot be imported here."""
    try:
        overlay = REWARDS.get(name).overlay if name in REWARDS else None
    except ImportError:
        return None
    if overlay is None:
        return None
    module, _, fn = overlay.partition(":")
    return getattr(importlib.import_module(module), fn)


def load_reward(spec: str) -> RewardSpec:
    """A registered reward by name, ``path/to/file.py:function`` loaded from the user's file, or
    ``package.module:function`` imported (a recipe's own reward, wherever the run starts)."""
    path, sep, func = spec.rpartition(":")
    if sep and path.endswith(".py"):
        return _load_from_file(Path(path), func)
    if sep and path and "/" not in path:
        return _load_from_module(path, func)
    try:
        return REWARDS.get(spec)
    except KeyError as e:
        raise KeyError(
            f"{e.args[0]}; a reward of your own is given as path/to/file.py:function or package.module:function"
        ) from None


def _load_from_module(module_name: str, func: str) -> RewardSpec:
    from mmrl.extras import MissingExtra, import_module

    try:
        module = import_module(module_name, f"reward module {module_name!r}")
    except MissingExtra as e:
        raise KeyError(str(e)) from None
    except ImportError as e:
        raise KeyError(f"reward module {module_name!r} cannot be imported: {e}") from None
    fn = getattr(module, func, None)
    if not callable(fn):
        raise KeyError(f"reward module {module_name}: no function {func!r}")
    for registered in REWARDS.loaded().values():  # importing the module registered its rewards
        if registered.fn is fn:
            return registered
    return RewardSpec(name=func, fn=fn, heavy=False)


def _load_from_file(path: Path, func: str) -> RewardSpec:
    module = load_reward_module(path)
    fn = getattr(module, func, None)
    if not callable(fn):
        defined = sorted(
            n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__
        )
        raise KeyError(
            f"reward file {path}: no function {func!r} (functions defined there: {', '.join(defined)})"
        )
    for registered in REWARDS.loaded().values():
        if registered.fn is fn:
            return registered
    return RewardSpec(name=func, fn=fn, heavy=False)


def load_reward_module(path: Path) -> ModuleType:
    """Import a user's reward file once per process (re-loading it would register its rewards twice)."""
    resolved = path.expanduser().resolve()
    if resolved in _FILE_MODULES:
        return _FILE_MODULES[resolved]
    if not resolved.is_file():
        raise FileNotFoundError(f"reward file not found: {path} (give path/to/file.py:function)")
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    mod_name = f"{_USER_MODULE_PREFIX}{resolved.stem}_{digest}"
    mod_spec = importlib.util.spec_from_file_location(mod_name, resolved)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_name] = module
    try:
        mod_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    _FILE_MODULES[resolved] = module
    return module


def worker_ref(spec: RewardSpec) -> tuple[str, str, str]:
    """How a pool worker finds ``spec.fn`` again: ``("file", path, name)`` or ``("module", module, qualname)``."""
    fn = spec.fn
    for path, module in _FILE_MODULES.items():
        if module.__name__ == fn.__module__:
            return ("file", str(path), fn.__qualname__)
    if fn.__module__ == "__main__" or "<locals>" in fn.__qualname__:
        raise ValueError(
            f"reward {spec.name!r} is heavy (runs in worker processes) but is defined in {fn.__module__}."
            f"{fn.__qualname__}, which a worker cannot import; move it to a module-level function in a file and "
            "load it as path/to/file.py:function"
        )
    return ("module", fn.__module__, fn.__qualname__)


def resolve_worker_ref(ref: tuple[str, str, str]) -> RewardFn:
    kind, where, qualname = ref
    obj: Any = load_reward_module(Path(where)) if kind == "file" else importlib.import_module(where)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    return obj


def reward_options(spec: RewardSpec) -> dict[str, inspect.Parameter]:
    """The reward's options (keyword-only parameters); raises if the function breaks the reward contract."""
    params = list(inspect.signature(spec.fn).parameters.values())
    first = params[0] if params else None
    if first is None or first.kind not in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD):
        raise TypeError(f"reward {spec.name!r}: the first parameter must be the batch (list[RewardInput])")
    options: dict[str, inspect.Parameter] = {}
    for p in params[1:]:
        if p.kind is not p.KEYWORD_ONLY or p.default is p.empty:
            raise TypeError(
                f"reward {spec.name!r}: parameter {p.name!r} must be keyword-only with a default "
                f"(write `def {spec.fn.__name__}(batch, *, {p.name}=...)`)"
            )
        options[p.name] = p
    return options


def validate_options(spec: RewardSpec, options: Mapping[str, Any]) -> dict[str, Any]:
    """Check option names (unknown -> error naming the nearest valid one) and value kinds against the defaults."""
    known = reward_options(spec)
    hints = _literal_hints(spec.fn)
    for key, value in options.items():
        if key not in known:
            near = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            valid = ", ".join(sorted(known)) or "none"
            raise ValueError(f"reward {spec.name!r}: unknown option {key!r}{hint} (valid options: {valid})")
        _check_value(spec.name, key, value, known[key].default, hints.get(key))
    if spec.check is not None:
        spec.check(dict(options))
    return dict(options)


def _literal_hints(fn: RewardFn) -> dict[str, tuple[Any, ...]]:
    # Annotations that cannot be evaluated (a user's forward reference) only lose the Literal check below.
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):
        return {}
    return {k: typing.get_args(t) for k, t in hints.items() if typing.get_origin(t) is typing.Literal}


def _check_value(reward: str, key: str, value: Any, default: Any, choices: tuple[Any, ...] | None) -> None:
    if choices is not None and value not in choices:
        raise ValueError(f"reward {reward!r}: option {key!r} must be one of {list(choices)}, got {value!r}")
    if default is None:
        return
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and (isinstance(default, float) or isinstance(value, int) or float(value).is_integer())
        kind = "a number"
    elif isinstance(default, str):
        ok, kind = isinstance(value, str), "a string"
    else:
        ok, kind = isinstance(value, type(default)), f"a {type(default).__name__}"
    if not ok:
        raise ValueError(
            f"reward {reward!r}: option {key!r} expects {kind} like its default {default!r}, "
            f"got {value!r} ({type(value).__name__})"
        )


def call_reward(
    fn: RewardFn,
    name: str,
    batch: Sequence[RewardInput],
    options: Mapping[str, Any],
    *,
    group: bool = False,
) -> list[RewardResult]:
    """Run ``fn`` on ``batch``; never raises. A raising batch call is retried one item at a time, so a sample that
    raises alone scores 0 with ``error`` set and the others keep their real scores. With ``group`` (a group reward)
    the retry goes one group at a time (:func:`group_spans`), and a group that raises alone scores 0 for all its
    items, each with the error."""
    try:
        return _checked(name, batch, fn(list(batch), **options))
    except Exception as exc:
        units = group_spans(batch) if group else [range(i, i + 1) for i in range(len(batch))]
        if len(units) == 1:
            error = describe_exception(exc)
            if group:
                error += f" (the whole group of {len(batch)} scored 0)"
            return [RewardResult(score=0.0, error=error) for _ in batch]
    return [
        r
        for span in units
        for r in call_reward(fn, name, batch[span.start : span.stop], options, group=group)
    ]


def group_spans(batch: Sequence[RewardInput]) -> list[range]:
    """The groups of a batch: runs of consecutive items with the same sample id (the trainer lays each prompt's G
    responses side by side). Two groups of one sample placed side by side are one run, scored as one group."""
    spans: list[range] = []
    start = 0
    for i in range(1, len(batch) + 1):
        if i == len(batch) or batch[i].id != batch[start].id:
            spans.append(range(start, i))
            start = i
    return spans


def _checked(name: str, batch: Sequence[RewardInput], results: Any) -> list[RewardResult]:
    if not isinstance(results, list) or len(results) != len(batch):
        got = len(results) if isinstance(results, list) else type(results).__name__
        raise TypeError(
            f"reward {name!r} returned {got} results for {len(batch)} inputs; return one per input"
        )
    out = []
    for item, r in zip(batch, results):
        if not isinstance(r, RewardResult):
            raise TypeError(
                f"reward {name!r} returned {type(r).__name__} for sample {item.id!r}; return RewardResult"
            )
        if r.score is not None and not math.isfinite(r.score):
            r = RewardResult(score=0.0, parts=r.parts, error=f"non-finite score {r.score!r}")
        elif r.error is not None and r.score != 0.0:
            r = RewardResult(score=0.0, parts=r.parts, error=r.error)
        out.append(r)
    return out


def describe_exception(exc: BaseException) -> str:
    """``Type: message (at file:line in function)`` for the innermost frame: enough to find a bug in a log line."""
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
    return text


__all__ = [
    "LOGPROBS_KEY",
    "REWARDS",
    "RewardFn",
    "RewardInput",
    "RewardResult",
    "RewardSpec",
    "call_reward",
    "group_spans",
    "load_reward",
    "register_reward",
    "reward_options",
    "validate_options",
]
