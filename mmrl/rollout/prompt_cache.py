"""A byte-bounded LRU cache of encoded prompts, keyed by what the prompt is made of.

Encoding a prompt (decoding and resizing its images, running the HF processor) costs more than a small model's
forward, and training revisits every record once per epoch. The key is the record's content, not its id: the chat
turns, and each media file's path, size and modification time, so a training and an evaluation record that share an id
(or a record whose image was rewritten) never get each other's tensors. The bound is in bytes (tensors plus the
resized media kept for engines that take raw images), because one video prompt can outweigh thousands of text ones.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mmrl.types import Sample


def content_key(sample: Sample) -> str:
    """A digest of the record's chat turns and media files (path, size, mtime)."""

    def stamp(path: str) -> list[Any]:
        try:
            st = os.stat(path)
            return [path, st.st_size, st.st_mtime_ns]
        except OSError:
            return [path, None, None]

    payload = {
        "messages": sample.messages,
        "images": [stamp(p) if isinstance(p, str) else repr(p) for p in sample.images],
        "videos": [stamp(p) for p in sample.videos],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()


def nbytes(obj: Any) -> int:
    """Approximate memory held by an encoded prompt: tensors, arrays and PIL images inside it."""
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.nelement()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if hasattr(obj, "size") and hasattr(obj, "mode") and hasattr(obj, "getbands"):  # PIL image
        w, h = obj.size
        return w * h * len(obj.getbands())
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(nbytes(getattr(obj, f)) for f in obj.__dataclass_fields__)
    return 0


class PromptCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, sample: Sample, build: Callable[[Sample], Any]) -> Any:
        key = content_key(sample)
        hit = self._items.get(key)
        if hit is not None:
            self._items.move_to_end(key)
            return hit[0]
        value = build(sample)
        size = nbytes(value)
        if size <= self.max_bytes:
            self._items[key] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, s) = self._items.popitem(last=False)
                self.bytes -= s
        return value
