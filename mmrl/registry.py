"""One small registry type, used only where users plug things in: rewards, advantage and loss functions,
samplers and rollout engines. Models, optimizers and datasets are built directly."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._items[name]!r})")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            near = difflib.get_close_matches(name, list(self._items), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise KeyError(
                f"unknown {self.kind} {name!r}{hint} (known: {', '.join(sorted(self._items))})"
            ) from None

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        return sorted(self._items)


def validate_kwargs(fn: Callable, options: dict, what: str, *, skip: tuple[str, ...] = ()) -> None:
    """Check ``options`` against ``fn``'s keyword parameters (a class: its ``__init__``) before anything is built:
    an unknown name is an error naming the nearest valid one; a value must have its default's kind."""
    import inspect

    target = fn.__init__ if inspect.isclass(fn) else fn
    signature = inspect.signature(target).parameters
    # **options: passed on, not checked here
    open_ended = any(p.kind is p.VAR_KEYWORD for p in signature.values())
    params = {
        n: p
        for n, p in signature.items()
        if n not in ("self", *skip) and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    for key, value in options.items():
        if key not in params and open_ended:
            continue
        if key not in params:
            near = difflib.get_close_matches(key, list(params), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(
                f"{what}: unknown option {key!r}{hint} (valid options: {', '.join(sorted(params)) or 'none'})"
            )
        default = params[key].default
        if value is None or default is None or default is inspect.Parameter.empty:
            continue  # None: the function decides whether it accepts it
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"{what}: option {key!r} expects true or false, got {value!r}")
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{what}: option {key!r} expects a number like {default!r}, got {value!r}")
        if isinstance(default, str) and not isinstance(value, str):
            raise ValueError(f"{what}: option {key!r} expects a string like {default!r}, got {value!r}")
