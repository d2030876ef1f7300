"""Experiment trackers: TensorBoard, Weights & Biases, MLflow and SwanLab get every ``metrics.jsonl`` row and the images
of the rollouts each step logs (:func:`mmrl.run.metrics.rollout_images`).

``train.trackers`` names them (``train.tensorboard: true`` adds ``tensorboard``); ``train.tracker_options.<name>``
holds a tracker's options: the keyword parameters of its class here, checked at pre-flight like every registered
component's. Each library is an optional package (``pip install 'mmrl[trackers]'`` installs them all), imported only
when its tracker opens; a missing one is refused at pre-flight, naming the package to install. Only rank 0 opens
trackers. By default everything is written inside the run directory and nothing leaves the machine:

- ``tensorboard``: ``DIR/tensorboard``; on ``--resume``, events of the steps after the checkpoint are purged
  (``purge_step``), so no step appears twice.
- ``wandb``: ``DIR/wandb``, offline unless ``WANDB_MODE`` or ``WANDB_API_KEY`` says otherwise (or ``mode: online``;
  an offline run uploads later with ``wandb sync DIR/wandb/offline-run-*``).
- ``mlflow``: a SQLite store ``DIR/mlflow/mlflow.db`` with artifacts in ``DIR/mlflow/artifacts`` (MLflow's plain
  file store is deprecated), unless ``tracking_uri`` or ``MLFLOW_TRACKING_URI`` names another;
  ``mlflow ui --backend-store-uri sqlite:///DIR/mlflow/mlflow.db`` shows it. Metric names are kept to the characters
  MLflow allows (others become ``_``).
- ``swanlab``: ``DIR/swanlog``, offline unless ``SWANLAB_MODE`` or ``SWANLAB_API_KEY`` says otherwise (an offline run
  uploads with ``swanlab sync``).

``--resume`` continues the same tracker run (its id is kept in ``DIR/trackers.json``). W&B and MLflow cannot remove a
logged point: the steps a crashed run logged after its last checkpoint stay (W&B ignores the resumed run's values for
them; MLflow keeps both). With a fixed seed they are the same numbers, bar the ``time/*`` and ``sys/*`` diagnostics.
A new tracker is a class registered here: ``__init__(out, *, config, run_id, resume_step, **options)``,
``log_metrics``, ``log_images``, ``close``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrl.config import ConfigError, TrainConfig
from mmrl.registry import Registry, validate_kwargs

IDS_FILE = "trackers.json"  # name -> the tracker's run id, for --resume
EVERY_PACKAGE = "pip install 'mmrl[trackers]'"


@dataclass
class LoggedImage:
    key: str  # e.g. rollouts/0/input: one series per logged group position, stepped through by the tracker's slider
    image: Any  # PIL.Image, RGB
    caption: str


class Tracker(ABC):
    """What every tracker does. ``run_id``: the id of the tracker's run, kept so ``--resume`` continues it."""

    PACKAGES: dict[str, str] = {}  # module -> pip package
    run_id: str | None = None

    @classmethod
    def packages(cls, options: dict[str, Any]) -> dict[str, str]:
        """The modules this tracker imports with these options, and the pip package of each."""
        return dict(cls.PACKAGES)

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    @abstractmethod
    def log_images(self, images: list[LoggedImage], step: int) -> None: ...

    @abstractmethod
    def close(self, failed: bool) -> None: ...


TRACKERS: Registry[type[Tracker]] = Registry("tracker")
BUILT = ("out", "config", "run_id", "resume_step")  # passed by the logger, not options


def wanted(train: TrainConfig) -> list[str]:
    """The trackers a run writes to: ``train.trackers``, plus ``tensorboard`` when ``train.tensorboard``."""
    return list(dict.fromkeys([*train.trackers, *(["tensorboard"] if train.tensorboard else [])]))


def _missing(name: str, needs: dict[str, str]) -> str | None:
    absent = [pip for module, pip in needs.items() if importlib.util.find_spec(module) is None]
    if not absent:
        return None
    what = "package" if len(absent) == 1 else "packages"
    return (
        f"train.trackers: {name!r} needs the Python {what} {', '.join(absent)}: pip install {' '.join(absent)} "
        f"(every tracker's: {EVERY_PACKAGE})"
    )


def _require(name: str, module: str, needs: dict[str, str]) -> Any:
    """Import ``module`` for tracker ``name``; a missing package is an error naming what to install."""
    message = _missing(name, needs)
    if message:
        raise ImportError(message)
    return importlib.import_module(module)


def check_trackers(train: TrainConfig) -> None:
    """Pre-flight: known names, each listed once, options the tracker takes, packages installed (not imported)."""
    if len(set(train.trackers)) != len(train.trackers):
        raise ConfigError(f"train.trackers: a tracker is listed twice: {train.trackers}")
    names = wanted(train)
    for name in names:
        try:
            cls = TRACKERS.get(name)
        except KeyError as e:
            raise ConfigError(f"train.trackers: {e.args[0]}") from None
        options = train.tracker_options.get(name) or {}
        where = f"train.tracker_options.{name}"
        if not isinstance(options, dict):
            raise ConfigError(f"{where}: expected a mapping of options, got {options!r}")
        try:
            validate_kwargs(cls, options, where, skip=BUILT)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        message = _missing(name, cls.packages(options))
        if message:
            raise ConfigError(message)
    for name in train.tracker_options:
        if name not in names:
            raise ConfigError(
                f"train.tracker_options.{name}: {name!r} is not in train.trackers {names}; add it there, or drop "
                "its options"
            )


def open_trackers(
    out: Path, names: list[str], options: dict[str, dict[str, Any]], *, resume_step: int | None, config: dict
) -> list[Tracker]:
    """Open the named trackers; resuming (``resume_step`` set), each continues the run whose id ``DIR/trackers.json``
    kept."""
    ids_path = out / IDS_FILE
    ids = json.loads(ids_path.read_text()) if resume_step is not None and ids_path.exists() else {}
    opened: dict[str, Tracker] = {}
    try:
        for name in names:
            cls = TRACKERS.get(name)
            opened[name] = cls(
                out, config=config, run_id=ids.get(name), resume_step=resume_step, **(options.get(name) or {})
            )
    except BaseException:
        for tracker in opened.values():
            tracker.close(failed=True)
        raise
    ids |= {name: t.run_id for name, t in opened.items() if t.run_id}
    if ids:
        ids_path.write_text(json.dumps(ids, indent=1))
    return list(opened.values())


def _mode(prefix: str, mode: str | None) -> str | None:
    """A hosted tracker's mode: the option; else the library's own ``<PREFIX>_MODE``; else online with an API key in
    ``<PREFIX>_API_KEY``, offline without one (never an interactive login prompt in the middle of a run)."""
    if mode is not None or os.environ.get(f"{prefix}_MODE"):
        return mode
    return "online" if os.environ.get(f"{prefix}_API_KEY") else "offline"


@TRACKERS.register("tensorboard")
class TensorBoardTracker(Tracker):
    """TensorBoard event files in ``DIR/tensorboard``; captions as text summaries beside the images."""

    PACKAGES = {"tensorboard": "tensorboard"}

    def __init__(self, out: Path, *, config: dict, run_id: str | None, resume_step: int | None):
        _require("tensorboard", "tensorboard", self.PACKAGES)
        from torch.utils.tensorboard import SummaryWriter

        # on resume, events from steps >= purge_step (logged after the checkpoint by the crashed run) are dropped
        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=resume_step)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_images(self, images: list[LoggedImage], step: int) -> None:
        import numpy as np

        for im in images:
            self.writer.add_image(im.key, np.asarray(im.image), step, dataformats="HWC")
            self.writer.add_text(f"{im.key}/caption", im.caption, step)
        self.writer.flush()

    def close(self, failed: bool) -> None:
        self.writer.close()


@TRACKERS.register("wandb")
class WandbTracker(Tracker):
    """A Weights & Biases run in ``DIR/wandb``; ``mode``: online, offline (default without an API key), disabled."""

    PACKAGES = {"wandb": "wandb"}

    def __init__(
        self,
        out: Path,
        *,
        config: dict,
        run_id: str | None,
        resume_step: int | None,
        project: str = "mmrl",
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        mode: str | None = None,
    ):
        self.wandb = _require("wandb", "wandb", self.PACKAGES)
        self.run = self.wandb.init(
            project=project,
            entity=entity,
            name=name or out.name,
            group=group,
            tags=tags,
            mode=_mode("WANDB", mode),
            dir=str(out),
            id=run_id,
            resume="allow" if run_id else None,
            config=config,
            allow_val_change=True,  # a resumed run may change max_steps
        )
        self.run_id = self.run.id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_images(self, images: list[LoggedImage], step: int) -> None:
        self.run.log({im.key: self.wandb.Image(im.image, caption=im.caption) for im in images}, step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


_MLFLOW_BAD = re.compile(r"[^\w./ :-]")  # MLflow's names: alphanumerics, _ - . space : /


def _mlflow_uri(out: Path, tracking_uri: str | None) -> tuple[str, bool]:
    """The tracking URI: the option, else ``MLFLOW_TRACKING_URI``, else the run's own SQLite store; and whether it is
    the run's own."""
    given = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if given:
        return given, False
    return f"sqlite:///{out.resolve() / 'mlflow' / 'mlflow.db'}", True


@TRACKERS.register("mlflow")
class MlflowTracker(Tracker):
    """An MLflow run, by default in a SQLite store under ``DIR/mlflow``; images as MLflow's stepped images (MLflow
    images carry no caption)."""

    PACKAGES = {"mlflow": "mlflow-skinny"}
    SQLITE = {
        "sqlalchemy": "sqlalchemy",
        "alembic": "alembic",
    }  # mlflow-skinny leaves out its SQL store's needs

    def __init__(
        self,
        out: Path,
        *,
        config: dict,
        run_id: str | None,
        resume_step: int | None,
        tracking_uri: str | None = None,
        experiment: str = "mmrl",
        run_name: str | None = None,
    ):
        _require("mlflow", "mlflow", self.packages({"tracking_uri": tracking_uri}))
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri, local = _mlflow_uri(out, tracking_uri)
        if local:
            (out / "mlflow").mkdir(exist_ok=True)
        self.client = MlflowClient(uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            where = (out / "mlflow" / "artifacts").resolve().as_uri() if local else None
            experiment_id = self.client.create_experiment(experiment, artifact_location=where)
        self.run_id = None
        if run_id:
            try:
                self.client.update_run(run_id, status="RUNNING")
                self.run_id = run_id
            except MlflowException:  # the store no longer has it: start a new run
                pass
        if self.run_id is None:
            self.run_id = self.client.create_run(experiment_id, run_name=run_name or out.name).info.run_id
            self.client.log_dict(self.run_id, config, "config.json")

    @staticmethod
    def uri(out: Path | None, tracking_uri: str | None) -> str:
        if tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"):
            return tracking_uri or os.environ["MLFLOW_TRACKING_URI"]
        return f"sqlite:///{(out or Path('.')).resolve() / 'mlflow' / 'mlflow.db'}"

    @classmethod
    def packages(cls, options: dict[str, Any]) -> dict[str, str]:
        sqlite = _mlflow_uri(Path("."), options.get("tracking_uri"))[0].startswith("sqlite")
        return cls.PACKAGES | (cls.SQLITE if sqlite else {})

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(_MLFLOW_BAD.sub("_", k), v, now, step) for k, v in metrics.items()]
        for s in range(0, len(rows), 1000):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, metrics=rows[s : s + 1000])

    def log_images(self, images: list[LoggedImage], step: int) -> None:
        for im in images:
            self.client.log_image(self.run_id, im.image, key=_MLFLOW_BAD.sub("_", im.key), step=step)

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


@TRACKERS.register("swanlab")
class SwanLabTracker(Tracker):
    """A SwanLab run in ``DIR/swanlog``; ``mode``: online, offline (default without an API key), local, disabled."""

    PACKAGES = {"swanlab": "swanlab"}

    def __init__(
        self,
        out: Path,
        *,
        config: dict,
        run_id: str | None,
        resume_step: int | None,
        project: str = "mmrl",
        workspace: str | None = None,
        name: str | None = None,
        mode: str | None = None,
    ):
        self.swanlab = _require("swanlab", "swanlab", self.PACKAGES)
        self.run = self.swanlab.init(
            project=project,
            workspace=workspace,
            name=name or out.name,
            mode=_mode("SWANLAB", mode),
            log_dir=str(out / "swanlog"),
            id=run_id,
            resume="allow" if run_id else None,
            config=config,
        )
        self.run_id = self.run.id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_images(self, images: list[LoggedImage], step: int) -> None:
        self.run.log({im.key: self.swanlab.Image(im.image, caption=im.caption) for im in images}, step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(state="crashed" if failed else "success")
