"""Pre-flight touches only the GPU its process will train on: under a launcher every rank runs ``mmrl train``'s
memory check before its device is set, and a query of the current device (cuda:0 until then) would open a CUDA
context on GPU 0 from every rank. CUDA is faked here (no GPU on CI): the calls that address a device are recorded."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmrl.config import load_config
from mmrl.plan import preflight

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"
GIB = 1024**3


class FakeCuda:
    """``torch.cuda``'s device queries over GPUs of the given sizes (GiB); ``touched`` lists the device each call
    addressed, in order (a call without a device addresses the current one, as torch's do)."""

    def __init__(self, sizes_gib: list[float]):
        self.sizes, self.current, self.touched = sizes_gib, 0, []

    def _touch(self, device) -> int:
        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
        index = self.current if d.index is None else d.index
        self.touched.append(index)
        return index

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.sizes))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "set_device", self.set_device)
        monkeypatch.setattr(torch.cuda, "mem_get_info", self.mem_get_info)
        monkeypatch.setattr(torch.cuda, "get_device_properties", self.get_device_properties)

    def set_device(self, device) -> None:
        self.current = self._touch(device)

    def mem_get_info(self, device=None) -> tuple[int, int]:
        total = int(self.sizes[self._touch(device)] * GIB)
        return total // 2, total

    def get_device_properties(self, device=None) -> SimpleNamespace:
        i = self._touch(device)
        return SimpleNamespace(name=f"fake-{i}", total_memory=int(self.sizes[i] * GIB))


def _launch(monkeypatch, world: int, local_world: int, local_rank: int | None) -> None:
    """The environment a launcher (torchrun, accelerate) gives one process; none for ``local_rank=None``."""
    for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK"):
        monkeypatch.delenv(k, raising=False)
    if local_rank is not None:
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setenv("RANK", str(local_rank))


@pytest.mark.parametrize(
    ("sizes", "local_rank", "device", "expected"),
    [
        ([40, 80], 0, "auto", 0),  # 2 GPUs, 2 ranks: each its own
        ([40, 80], 1, "auto", 1),
        ([40, 80, 40, 80], 3, "auto", 3),
        ([80], 1, "auto", 0),  # one GPU visible per rank (CUDA_VISIBLE_DEVICES set per process)
        ([40, 80], None, "cuda:1", 1),  # one process, told its GPU
        ([40, 80], None, "auto", 0),
    ],
)
def test_preflight_queries_only_the_gpu_its_process_trains_on(
    monkeypatch, sizes, local_rank, device, expected
):
    cuda = FakeCuda(sizes)
    cuda.install(monkeypatch)
    _launch(monkeypatch, world=max(2, len(sizes)), local_world=len(sizes), local_rank=local_rank)
    cfg = load_config(ROOT / "recipes/shapes/tiny.yaml", [f"model.path={TINY}", f"model.device={device}"])
    p = preflight.preflight(cfg, force=True)
    assert cuda.touched and set(cuda.touched) == {expected}, cuda.touched
    assert p.setup.hw.gpu_gib == sizes[expected]  # the memory of that GPU, not of GPU 0
