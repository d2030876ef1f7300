"""One small registry type, used only where users plug things in: rewards, advantage and loss functions,
samplers and rollout engines, envs and benchmarks. Models, optimizers and datasets are built directly.

A registry may list built-in entries it imports on first use (:class:`Builtin`: the module whose import registers
the name, and the optional packages it needs): :meth:`Registry.names` lists them without importing anything, and
:meth:`Registry.get` imports the module, first checking the packages so that a missing one is a
:class:`mmrl.extras.MissingExtra` naming the extra to install."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from mmrl import extras

T = TypeVar("T")


@dataclass(frozen=True)
class Builtin:
    """A built-in entry: importing ``module`` registers it; ``extra`` is the optional dependency group it needs and
    ``needs`` the import names of that group it uses (None: all of them), checked before the import."""

    module: str
    extra: str | None = None
    needs: tuple[str, ...] | None = None


class Registry(Generic[T]):
    def __init__(self, kind: str, builtins: Mapping[str, Builtin] | None = None):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._builtins: dict[str, Builtin] = dict(builtins or {})
        self._ready: set[str] = set()  # built-ins whose packages were found and whose module registered them

    def register(self, name: str, *, module: str | None = None) -> Callable[[T], T]:
        """Register under ``name``; ``module``: where the object is defined (default: its ``__module__``), which
        must be the built-in's own module when ``name`` is a built-in's."""

        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._items[name]!r})")
            builtin = self._builtins.get(name)
            home = module or getattr(obj, "__module__", None)
            if builtin is not None and name not in self._items and home != builtin.module:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (the built-in in {builtin.module})"
                )
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """The entry ``name``, importing a built-in's module on first use; raises KeyError for an unknown name
        (with the nearest known one) and :class:`mmrl.extras.MissingExtra` when a built-in's packages are missing."""
        if name in self._builtins and name not in self._ready:
            self._load(name)
        try:
            return self._items[name]
        except KeyError:
            near = difflib.get_close_matches(name, self.names(), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise KeyError(f"unknown {self.kind} {name!r}{hint} (known: {', '.join(self.names())})") from None

    def _load(self, name: str) -> None:
        """Check the built-in's packages (even when its module is imported already: another built-in's may be) and
        import its module."""
        builtin, what = self._builtins[name], f"{self.kind} {name!r}"
        if builtin.extra is not None:
            extras.require(builtin.extra, what, builtin.needs)
        if name not in self._items:
            extras.import_module(builtin.module, what, builtin.extra)
        if name not in self._items:
            raise RuntimeError(f"{what}: importing {builtin.module} did not register it")
        self._ready.add(name)

    def __contains__(self, name: str) -> bool:
        return name in self._items or name in self._builtins

    def names(self) -> list[str]:
        """Every name, the built-ins' included (none is imported)."""
        return sorted({*self._items, *self._builtins})

    def loaded(self) -> dict[str, T]:
        """The entries registered so far (built-ins whose module is not imported yet are not among them)."""
        return dict(self._items)


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
