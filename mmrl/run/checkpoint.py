"""Atomic checkpoints: a step is either complete on disk or absent.

``DIR/checkpoints/step-N/`` holds ``model/`` (HF format: loadable by transformers and vLLM on its own), the optimizer
state, ``scheduler.pt``, ``rng.pt`` (python, numpy, torch CPU and CUDA generators; ``rng-R.pt`` for the other
processes) and ``state.json`` (step, sampler state with the data position, metrics line count). The optimizer state
is ``optimizer.pt`` for an unsharded policy, and for an FSDP2-sharded one ``optimizer/``: torch's distributed
checkpoint, every rank writing its own shard in parallel (no rank gathers the whole state; a resume reads only its
shard, resharded by DCP if the number of processes changed).

It is written into ``step-N.tmp`` (:func:`staging` names it, :func:`begin` makes it empty on rank 0; sharded state is
written into it by every rank before :func:`save_checkpoint` completes it on rank 0), its files and the folder
fsync'ed, and renamed into place; a ``step-N`` that already exists (the same step saved again) is first renamed to
``step-N.old`` and deleted only after the new one is in place, so at every instant a complete copy exists. Pruning old
steps happens last. ``--resume`` takes the highest complete ``step-N`` and ignores leftover ``.tmp``/``.old`` folders.
Everything is loaded onto the CPU first (``map_location``): the optimizer moves its state to its parameters' device,
so no process puts another's tensors on the first GPU.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with p.open("rb") as f:
                os.fsync(f.fileno())
        elif p.is_dir():
            _fsync_dir(p)
    _fsync_dir(path)


def staging(root: Path, step: int) -> Path:
    return root / f"step-{step}.tmp"


def begin(root: Path, step: int) -> Path:
    """An empty staging folder for ``step`` (rank 0; the others wait, then write their shards into it)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = staging(root, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def save_checkpoint(
    root: Path,
    step: int,
    *,
    policy: Any,
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
    keep: int = 0,
    rank_rng: list[dict[str, Any]] | None = None,
    weights: dict[str, Any] | None = None,
    staged: bool = False,
) -> Path:
    """Write ``root/step-N`` atomically. ``weights``: a sharded (FSDP) policy's gathered full weights, saved instead
    of reading the model. ``optimizer`` None: its state is already in the staging folder (``staged``: the folder was
    made by :func:`begin` and holds what the ranks wrote)."""
    final = root / f"step-{step}"
    tmp = staging(root, step) if staged else begin(root, step)
    if weights is None:
        policy.save(tmp / "model")
    else:
        policy.save(tmp / "model", state_dict=weights)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    for r, rng in enumerate(rank_rng or [], start=1):  # other processes' generators (multi-process training)
        torch.save(rng, tmp / f"rng-{r}.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    _fsync_tree(tmp)
    previous = root / f"step-{step}.old"
    if final.exists():
        if previous.exists():
            shutil.rmtree(previous)
        os.replace(final, previous)
    os.replace(tmp, final)
    _fsync_dir(root)
    if previous.exists():
        shutil.rmtree(previous)
    if keep > 0:
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(root)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and p.name[5:].isdigit()]
    return sorted(done, key=lambda p: int(p.name[5:]))


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint. A ``step-N.old`` without its ``step-N`` (a crash between the two renames
    of a re-save) is complete and is put back first."""
    if root.is_dir():
        for old in root.glob("step-*.old"):
            final = old.with_suffix("")
            if not final.exists():
                os.replace(old, final)
    ckpts = list_checkpoints(root)
    return ckpts[-1] if ckpts else None


def load_training_state(
    path: Path, optimizer: Any, scheduler: Any, rank: int = 0, model: Any = None, group: Any = None
) -> dict[str, Any]:
    """Restore the optimizer, scheduler and this rank's RNG; return ``state.json``. ``model``: the sharded (FSDP)
    model, whose optimizer state was saved sharded (``optimizer/``, read back shard by shard by the processes of
    ``group``)."""
    sharded = (path / "optimizer").is_dir()
    if sharded != (model is not None):
        saved, now = ("sharded (FSDP)", "unsharded") if sharded else ("unsharded", "sharded (FSDP)")
        raise ValueError(
            f"{path}: the checkpoint's optimizer state comes from a run that was {saved} and this run is {now}; resume "
            "with the same train.fsdp setting"
        )
    if model is not None:
        from mmrl.model.fsdp import load_sharded_optimizer

        load_sharded_optimizer(model, optimizer, path / "optimizer", group)
    else:
        optimizer.load_state_dict(_load(path / "optimizer.pt"))
    scheduler.load_state_dict(_load(path / "scheduler.pt"))
    # The next step's rate follows THIS run's schedule: the optimizer state holds the rate the saved run's schedule
    # set after its last step, which differs when the schedule's length changed (a run stopped early with a
    # smaller --max-steps and resumed further). With the same settings this is the saved rate, bit for bit.
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is not None:
        rates = [base * f(scheduler.last_epoch) for base, f in zip(scheduler.base_lrs, lambdas)]
        for group, lr in zip(optimizer.param_groups, rates):
            group["lr"] = lr
        scheduler._last_lr = rates
    rng = path / ("rng.pt" if rank == 0 else f"rng-{rank}.pt")
    if not rng.exists():
        raise FileNotFoundError(
            f"{rng} is missing: the checkpoint was written by fewer processes than are resuming"
        )
    set_rng_state(_load(rng))
    return json.loads((path / "state.json").read_text())


def _load(path: Path) -> Any:
    """A checkpoint file, onto the CPU whatever device its tensors were saved from."""
    return torch.load(path, map_location="cpu", weights_only=False)
