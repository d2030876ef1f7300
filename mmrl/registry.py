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
