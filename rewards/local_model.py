"""What the model-based rewards (``judge``, ``embedding_similarity``) share: where their model lives, one loaded copy
per process, a content cache, and sleeping between calls.

- **Placement** (``device`` option): ``auto`` is the rank's own GPU (``cuda:$LOCAL_RANK``) when CUDA is available,
  else the CPU; ``cpu``, ``cuda`` or ``cuda:N`` name one. A judge on a GPU of its own, or on another machine, is a
  reward server (``mmrl reward serve --rewards judge`` there, the ``remote`` reward here).
- **Sleeping** (``offload`` option): colocated with the policy, the model's weights go back to host memory after each
  reward call and return before the next, so they hold no accelerator memory during the update (rewards are always
  resolved before the update stage starts). A vLLM judge uses vLLM's own sleep mode instead.
- **One copy per process**: models are loaded on first use and kept, keyed by everything that changes them (path,
  engine, device, dtype); a lock serialises calls (the trainer's reward thread and a reward server's scorer thread
  may both call).
- **Content cache**: an LRU keyed by a hash of what the model sees (prompt text and image bytes), so a GRPO group's
  repeated answers and a re-scored held-out set cost nothing; the composite's own cache is keyed by sample and would
  miss the same content under another id.

mmrl never downloads: a model is a local folder, checked at pre-flight (:func:`check_model_folder`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Generic, TypeVar

from PIL import Image

T = TypeVar("T")


def resolve_device(device: str) -> str:
    import torch

    if device != "auto":
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: CUDA is not available here; use device: cpu or auto")
        return device
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return "cpu"


def resolve_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r}: use auto, float32, bfloat16 or float16") from None


def check_model_folder(reward: str, option: str, path: str) -> None:
    """Pre-flight: the option names a local model folder with a config (mmrl never downloads)."""
    if not path:
        raise ValueError(
            f"reward {reward!r}: option {option!r} is required: the path of a local model folder"
        )
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        what = "is not a folder" if not folder.is_dir() else "has no config.json"
        raise ValueError(
            f"reward {reward!r}: option {option}={path!r} {what}; give a local model folder saved with "
            "save_pretrained (mmrl never downloads models)"
        )


class Loaded:
    """Per-process registry of loaded models: ``Loaded.get(key, build)`` builds once, then returns the same object."""

    _items: dict[tuple[Any, ...], Any] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, key: tuple[Any, ...], build: Callable[[], T]) -> T:
        with cls._lock:
            if key not in cls._items:
                cls._items[key] = build()
            return cls._items[key]

    @classmethod
    def clear(cls) -> None:
        """Drop every loaded model, closing those that hold an engine (``close``) before they are dropped."""
        with cls._lock:
            items = list(cls._items.values())
            cls._items.clear()
        for item in items:
            close = getattr(item, "close", None)
            if close is not None:
                close()


class LRU(Generic[T]):
    """A small thread-safe LRU of computed results."""

    def __init__(self, size: int):
        self.size = size
        self._data: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, key: str) -> T | None:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]

    def put(self, key: str, value: T) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)


def content_key(*parts: str, images: Iterable[Image.Image] = ()) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    for im in images:
        h.update(f"{im.mode}{im.size}".encode())
        h.update(im.tobytes())
    return h.hexdigest()


def open_images(items: Iterable[Any], sample_id: str) -> list[Image.Image]:
    """RGB PIL images from paths or PIL images; a missing file names the sample."""
    out = []
    for it in items:
        if isinstance(it, Image.Image):
            out.append(it.convert("RGB"))
            continue
        try:
            with Image.open(it) as im:
                out.append(im.convert("RGB"))
        except OSError as e:
            raise ValueError(f"sample {sample_id!r}: cannot read image {it!r}: {e}") from None
    return out


def clean_reference(reference: Any) -> list[str]:
    """A reference as its list of acceptable strings (a string, or a list of variants, first the canonical one)."""
    if reference is None:
        return []
    if isinstance(reference, str):
        return [reference]
    if isinstance(reference, (list, tuple)) and all(isinstance(r, str) for r in reference):
        return list(reference)
    return [str(reference)]
