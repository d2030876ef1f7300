"""A vLLM engine in a process of its own (``VLLMEngine(own_process=True)``, docs/async.md#vllm-in-a-separate-placement):
the process settings that spawn its engine core outside the launcher's group, and the weights written as safetensors
shards for its worker extension (:class:`mmrl.rollout.vllm_worker.WeightFiles`) to read."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from mmrl.model.policy import Policy

WEIGHT_SHARD_BYTES = (
    256 * 2**20
)  # own_process: the weights go to the engine in safetensors shards of about this size


@contextmanager
def weight_shards(policy: Policy, dtype: torch.dtype) -> Iterator[list[str]]:
    """The policy's weights (:meth:`Policy.stream_weights`: HF names, in ``dtype``, LoRA merged) as safetensors shards
    of about :data:`WEIGHT_SHARD_BYTES` in a temporary folder in shared memory (``/dev/shm`` where it has room, else
    the temporary directory), removed on exit (after a hard exit, by the next engine's start:
    :func:`remove_stale_shards`); one shard's tensors are held at a time."""
    from safetensors.torch import save_file

    nbytes = sum(p.numel() for p in policy.model.parameters()) * torch.empty(0, dtype=dtype).element_size()
    prefix = f"{SHARD_PREFIX}{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=shard_root(nbytes)) as tmp:
        files: list[str] = []
        shard: dict[str, torch.Tensor] = {}
        size = 0
        ptrs: set[int] = set()  # the storages in this shard

        def flush() -> None:
            nonlocal shard, size
            if shard:
                files.append(str(Path(tmp) / f"shard-{len(files):05d}.safetensors"))
                save_file(shard, files[-1])
            shard, size = {}, 0
            ptrs.clear()

        for name, t in policy.stream_weights(dtype):
            t = t.detach().to("cpu").contiguous()
            if t.untyped_storage().data_ptr() in ptrs:  # tied weights (embeddings and lm_head), views of one
                t = t.clone()  # tensor: safetensors stores no shared memory
            ptrs.add(t.untyped_storage().data_ptr())
            shard[name] = t
            size += t.numel() * t.element_size()
            if size >= WEIGHT_SHARD_BYTES:
                flush()
        flush()
        yield files


def own_process_env(tp: int) -> None:
    """vLLM's engine core in a process of its own (``own_process``), spawned: it makes its own one-process group,
    outside the launcher's (a forked child would inherit the parent's threads and process group)."""
    if tp != 1:
        raise ValueError(
            f"rollout engine 'vllm' in a generating process of its own: tensor_parallel_size {tp}; one generating "
            "process drives one device for now, use rollout.rollout_processes for more engines"
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    remove_stale_shards()


def narrow_visible_devices() -> None:
    """``CUDA_VISIBLE_DEVICES`` narrowed to this process's GPU while vLLM spawns its engine core (which puts itself
    on the first visible device); the caller restores it. This process's CUDA context is made already."""
    if torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        index = torch.cuda.current_device()
        os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[index] if visible else str(index)


SHARD_PREFIX = "mmrl-weights-"  # own_process: the shard folders, named <prefix><pid>-<random>


def shard_root(nbytes: int) -> str | None:
    """Where the shards of a ``nbytes`` model go: ``/dev/shm`` when it has room for them with a margin (a container's
    default /dev/shm is 64 MiB), else the temporary directory (None: tempfile's choice)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 1.25 * nbytes:
        return str(shm)
    return None


def remove_stale_shards() -> None:
    """Shard folders left by a process that no longer exists (one killed while it pushed: SIGKILL, os._exit), in
    every place :func:`shard_root` may choose, so a crash does not keep a model's copy in shared memory."""
    for root in {Path("/dev/shm"), Path(tempfile.gettempdir())}:
        if not root.is_dir():
            continue
        for d in root.glob(f"{SHARD_PREFIX}*"):
            pid = d.name[len(SHARD_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(d, ignore_errors=True)
