"""mmrl's optional dependencies: which ``pip install 'mmrl[EXTRA]'`` provides which import, and the one error that
says so.

The core install (torch, transformers, peft and a few small packages) trains and evaluates with the plain rewards;
the rest are extras (pyproject.toml's ``[project.optional-dependencies]``; ``all`` installs every one but ``vllm``
and ``dev``). Code that needs one calls :func:`require` before it imports the package, or imports its own module
through :func:`import_module`: a missing package is then a :class:`MissingExtra` naming the extra to install, which
the pre-flight (``mmrl train``, ``mmrl eval``) reports as one line before any model loads.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Sequence
from types import ModuleType

# extra -> the top-level import names of its packages (pyproject.toml lists the distributions); a name in two extras
# is found under the first (render before pathology)
EXTRAS: dict[str, tuple[str, ...]] = {
    # the rendering and scoring rewards (latex_table, teds, math_verify) and scorers (table, mathvista, mathv)
    "render": ("pypdfium2", "lxml", "scipy", "rapidfuzz", "math_verify"),
    # the browser_app env, HTML rendering (rewards/html_sandbox.py), the data builders that take screenshots
    "gui": ("playwright", "psutil"),
    # whole-slide images (recipes/pathology/wsi.py, data.py)
    "pathology": ("openslide", "scipy"),
    # mmrl reward serve (rewards/server.py) and the remote reward's client (rewards/remote.py)
    "server": ("fastapi", "uvicorn", "httpx"),
    # saved HF datasets and parquet files as records (mmrl/data.py, mmrl/eval/loading.py)
    "data": ("datasets", "pyarrow"),
    # the faster video reader (processors/video.py reads with OpenCV without it)
    "video": ("decord",),
    # train.trackers (mmrl/run/trackers.py, which names the packages itself)
    "trackers": ("tensorboard", "wandb", "mlflow", "swanlab"),
}


class MissingExtra(ImportError):
    """``{what}: needs the '{extra}' extra (pip install 'mmrl[{extra}]'): No module named '{module}'``.
    ``reason`` is the message without ``what``, for a caller that names the place itself."""

    def __init__(self, what: str, extra: str, module: str):
        self.what, self.extra, self.module = what, extra, module
        self.reason = f"needs the {extra!r} extra (pip install 'mmrl[{extra}]'): No module named {module!r}"
        super().__init__(f"{what}: {self.reason}" if what else self.reason, name=module)

    def __reduce__(self):  # raised in a worker process, it travels back pickled
        return (MissingExtra, (self.what, self.extra, self.module))


def extra_of(module: str) -> str | None:
    """The extra that provides import name ``module`` (its top-level package), or None when no extra does."""
    top = module.partition(".")[0]
    return next((extra for extra, names in EXTRAS.items() if top in names), None)


def available(module: str) -> bool:
    """Whether top-level module ``module`` can be found (not imported: cheap, for checks before a model loads)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(extra: str, what: str, modules: Sequence[str] | None = None) -> None:
    """Raise :class:`MissingExtra` for ``what`` (e.g. ``"reward 'latex_table'"``) unless every one of ``modules``
    (default: every import of ``extra``) can be found."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r} (known: {', '.join(EXTRAS)})")
    for module in EXTRAS[extra] if modules is None else modules:
        if not available(module):
            raise MissingExtra(what, extra, module)


def import_module(name: str, what: str, extra: str | None = None) -> ModuleType:
    """``importlib.import_module(name)``; a missing package that an extra provides is a :class:`MissingExtra`
    (``extra``: the one to name when the package is in several)."""
    try:
        return importlib.import_module(name)
    except MissingExtra:
        raise
    except ImportError as e:
        found = e.name or (re.findall(r"No module named '([\w.]+)'", str(e)) or [""])[0]
        top = found.partition(".")[0]
        if extra is None or top not in EXTRAS.get(extra, ()):
            extra = extra_of(top) if top else None
        if extra is None:
            raise
        raise MissingExtra(what, extra, top) from e
