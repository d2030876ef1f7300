"""Checkpoint key layouts: a model handed back as if loaded from the released key layout, so that its
``save_pretrained`` writes the names vLLM reads."""

from __future__ import annotations

from typing import Any


def reload_in_release_layout(model: Any) -> Any:
    """The same model, reloaded from a checkpoint in the released key layout (``vision_tower.vision_model.*``), so
    that its ``save_pretrained`` writes that layout too.

    transformers 5 keeps SigLIP without its ``vision_model`` level and maps the released names onto it when loading
    (and back when saving a model it loaded); a model made with ``from_config`` saves ``vision_tower.embeddings...``,
    which vLLM's LLaVA-OneVision cannot load ("There is no module or parameter named 'vision_tower.embeddings'")."""
    import re
    import tempfile
    from pathlib import Path

    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForImageTextToText

    generation_config = model.generation_config
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        for f in Path(tmp).glob("*.safetensors"):
            state = load_file(f)
            renamed = {
                re.sub(r"^((?:model\.)?vision_tower\.)(?!vision_model\.)", r"\1vision_model.", k): v
                for k, v in state.items()
            }
            save_file(renamed, f, metadata={"format": "pt"})
        reloaded = AutoModelForImageTextToText.from_pretrained(tmp)
    reloaded.generation_config = generation_config
    return reloaded.train(model.training)
