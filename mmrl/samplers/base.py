"""The sampler interface."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from mmrl.registry import Registry


class Sampler(Protocol):
    def select(self, k: int) -> list[int]:
        """Indices of the ``k`` records for the next step."""
        ...

    def update(self, indices: list[int], rewards: torch.Tensor) -> None:
        """Feedback after the rewards of the selected records are known: ``rewards [k, G]``."""
        ...

    def stats(self) -> dict[str, float]:
        """Numbers to log for the last selection (``vade/p_mean``, ...); empty when there is nothing to say."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


SAMPLERS: Registry[type] = Registry("sampler")
