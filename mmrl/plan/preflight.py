"""``mmrl train``'s memory check before any model loads (:func:`preflight`): a run bound for a GPU is planned on this
machine and refused, with the cheapest change that fits, when it cannot fit."""

from __future__ import annotations

from mmrl.config import Config, ConfigError
from mmrl.plan.memory import GIB, ConfigNotLocal, PlanOptions
from mmrl.plan.planner import Plan, plan_run
from mmrl.plan.report import advice_text, verdict


def would_use_cuda(cfg: Config) -> bool:
    """Whether ``mmrl train`` would put the policy on a GPU: the one question that decides whether the pre-flight
    plan runs."""
    device = cfg.model.device
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def preflight(cfg: Config, *, force: bool = False) -> Plan | None:
    """``mmrl train``'s memory check before any model loads: a run bound for a GPU is planned on this machine (the
    launcher's process count, the GPU's memory, else the config's ``hardware:``) and refused with the cheapest change
    that fits when it cannot fit, unless ``force``. A model whose config is not local is not planned (a warning)."""
    if not would_use_cuda(cfg):
        return None
    try:
        p = plan_run(cfg, _this_machine(cfg))
    except ConfigNotLocal as e:
        import logging

        logging.getLogger("mmrl.plan.preflight").warning("memory plan skipped: %s", e)
        return None
    if p.fits or force:
        return p
    raise ConfigError(
        f"the run {verdict(p)}; cheapest change that fits: {advice_text(p)} "
        "(`mmrl plan CONFIG` prints the budget; `mmrl train --force` starts it anyway)"
    )


def _this_machine(cfg: Config) -> PlanOptions:
    import os

    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    memory = None
    if torch.cuda.is_available():
        # the total from the device's properties, which open no CUDA context (cudaMemGetInfo opens one)
        memory = torch.cuda.get_device_properties(_own_gpu(cfg)).total_memory / GIB
    return PlanOptions(gpus=local, nodes=max(1, world // local), gpu_memory_gib=memory)


def _own_gpu(cfg: Config) -> int:
    """The GPU this process will train on, named explicitly: pre-flight runs before the launcher's rank has set its
    device, and a query of the current one (cuda:0 until then) would touch GPU 0 from every rank. The config's
    ``cuda:N``, else the launcher's local rank modulo the visible GPUs (as accelerate sets each process's device)."""
    import os

    import torch

    index = torch.device(cfg.model.device).index if cfg.model.device.startswith("cuda") else None
    if index is not None:
        return index
    return int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
