"""A checkpoint's own files, read without loading the model: where a model path resolves to (a local folder, the
repository's, or the HF cache, never the network), its ``model_type`` and processor geometry, and the
:class:`ModelView` that code holding only the original image (reports, scorers, data builders) rebuilds from a run's
model settings; and a model's weights named and shaped as its checkpoint stores them (:func:`checkpoint_layout`), which
an engine that loads checkpoints (vLLM) is handed."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from mmrl.model.geometry import VisionGeometry, vision_geometry
from mmrl.processors.geometry import DEFAULT_FRAME, coordinate_frame, original_to_frame, smart_resize

if TYPE_CHECKING:
    import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_model_path(path: str) -> str:
    """A local folder (relative to the working directory or the repository) or a hub id, returned as given."""
    for cand in (Path(path), REPO_ROOT / path):
        if cand.is_dir():
            return str(cand)
    return path


def _checkpoint_file(path: str, name: str) -> Path | None:
    """``name`` in the checkpoint at ``path``: a local folder, else a hub id's copy in the local HF cache (never the
    network); None when it is in neither."""
    from mmrl.model.checkpoint_files import resolve_model_path

    folder = Path(resolve_model_path(path))
    if folder.is_dir():
        return folder / name if (folder / name).is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(path, name)
    except ValueError:  # not a hub id either
        return None
    return Path(found) if isinstance(found, str) else None


def checkpoint_model_type(path: str) -> str | None:
    """``model_type`` in the checkpoint's config.json (:func:`_checkpoint_file`); None when it is not there."""
    cfg = _checkpoint_file(path, "config.json")
    return json.loads(cfg.read_text()).get("model_type") if cfg is not None else None


@lru_cache(maxsize=8)
def checkpoint_geometry(path: str) -> VisionGeometry | None:
    """:class:`VisionGeometry` of the checkpoint's processor (a local folder or the HF cache), for code that knows
    the model's path but holds no :class:`~mmrl.model.policy.Policy` (scorers, reports, data builders); None when no
    processor config is there."""
    found = _checkpoint_file(path, "preprocessor_config.json") or _checkpoint_file(
        path, "processor_config.json"
    )
    if found is None:
        return None
    from transformers import AutoProcessor

    return vision_geometry(AutoProcessor.from_pretrained(found.parent, local_files_only=True))


class ModelView(NamedTuple):
    """How a run's model saw an image and writes points in it, rebuilt from the run's model settings, for code that
    holds only the original image (report overlays, scorers, SFT data builders; rollouts.jsonl keeps no sizes).

    ``geometry`` None means no model is known (no checkpoint folder at the path: a prediction file scored on another
    machine, a data builder told only a pixel budget): the 28 px grid of Qwen2/2.5-VL is then assumed, with the
    ``model_pixels`` frame. A bare ``(min_pixels, max_pixels)`` tuple is such a view (:meth:`of`)."""

    min_pixels: int
    max_pixels: int
    geometry: VisionGeometry | None = None
    frame: str = DEFAULT_FRAME

    @classmethod
    def of(cls, view: ModelView | tuple[int, int]) -> ModelView:
        return view if isinstance(view, ModelView) else cls(int(view[0]), int(view[1]))

    @classmethod
    def of_model(cls, model: Any) -> ModelView:
        """From a :class:`~mmrl.config.ModelConfig` or its dict (a run's saved config; missing keys take the
        defaults): the checkpoint at ``path`` gives the geometry and the family's frame."""
        from mmrl.config import ModelConfig

        given = asdict(model) if is_dataclass(model) else dict(model or {})
        m = {
            **asdict(ModelConfig()),
            **{k: v for k, v in given.items() if v is not None or k == "coordinate_frame"},
        }
        path = str(m["path"])
        frame = coordinate_frame(checkpoint_model_type(path), m.get("coordinate_frame"))
        return cls(int(m["min_pixels"]), int(m["max_pixels"]), checkpoint_geometry(path), frame)

    def model_size(self, width: int, height: int) -> tuple[int, int]:
        """``(width, height)`` the model sees for a ``width x height`` image under this budget."""
        if self.geometry is None:  # no model known: Qwen2/2.5-VL's 28 px grid
            h, w = smart_resize(height, width, min_pixels=self.min_pixels, max_pixels=self.max_pixels)
            return w, h
        return self.geometry.model_size(width, height, min_pixels=self.min_pixels, max_pixels=self.max_pixels)

    def metadata(self, width: int, height: int) -> dict[str, Any]:
        """What the collector gives a reward about a ``width x height`` first image (sizes and frame)."""
        return {
            "image_sizes": [[width, height]],
            "model_image_sizes": [list(self.model_size(width, height))],
            "coordinate_frame": self.frame,
        }

    def to_frame(self, x: float, y: float, width: int, height: int) -> tuple[float, float]:
        """Original pixels of a ``width x height`` image as a point in the model's frame."""
        return original_to_frame(x, y, self.frame, (width, height), self.model_size(width, height))


def checkpoint_layout(
    model: Any, items: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``items`` (in-memory names) in the checkpoint's layout, as ``save_pretrained`` writes it: transformers 5
    converts some families' weights on loading (LLaVA-OneVision's ``vision_tower.vision_model.*`` lives in memory as
    ``model.vision_tower.*``) and reverts the conversion on saving (``revert_weight_conversion``); an engine that
    loads checkpoints (vLLM) expects the saved layout. Reverted tensor by tensor, so nothing is gathered; a tensor
    whose conversion needs others (none of the supported families has one) keeps its in-memory name. Weights whose
    release layout is transposed (:func:`mmrl.model.layout.release_transposes`: Qwen3-VL-MoE's experts) are transposed
    here, since transformers' revert leaves them as they are in memory."""
    from transformers.core_model_loading import revert_weight_conversion

    from mmrl.model.layout import release_transposes

    transposes = [(re.compile(p), d0, d1) for p, d0, d1 in release_transposes(model)]
    for key, tensor in items:
        try:
            reverted = revert_weight_conversion(model, {key: tensor}).items()
        except Exception:  # noqa: BLE001  (a many-to-one conversion: the engine gets the in-memory name)
            reverted = [(key, tensor)]
        for name, t in reverted:
            for pattern, d0, d1 in transposes:
                if pattern.search(name) and t.shape == model.get_parameter(key).shape:
                    t = t.transpose(d0, d1).contiguous()
            yield name, t
