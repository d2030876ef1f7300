"""A benchmark's items checked as training records are (:mod:`mmrl.data`), before the model sees any of them.

A benchmark's loader reads its published layout and refuses what it cannot read (a line that is not JSON, a
missing field or file) with an :class:`~mmrl.eval.base.EvalError`. What a loader lets through can still be unusable:
a truncated image, a decompression bomb, an aspect ratio the model refuses, text holding the model's special tokens,
a prompt over ``data.max_prompt_tokens``. Such items are skipped, each listed with its reason in
``DIR/skipped.jsonl`` (rewritten on every run, as the items are checked again) and counted in one line on stderr,
so the run finishes with the rest rather than stopping mid-way; the metrics are over the items scored
(``metrics.json``'s ``items``). The limits are :class:`~mmrl.config.DataConfig`'s defaults.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mmrl.config import DataConfig, ModelConfig
from mmrl.data import check_samples, check_with_tokenizer, model_processor
from mmrl.eval.base import EvalItem
from mmrl.model.checkpoint_files import resolve_model_path


def screen(items: list[EvalItem], model: ModelConfig, skipped_to: Path | None) -> list[EvalItem]:
    """The items the model can be given; the others listed in ``skipped_to`` (None: counted on stderr only, as a
    training run's ranks other than 0 do)."""
    cfg = DataConfig(on_bad_record="skip")
    data = check_samples([it.sample for it in items], cfg, "benchmark")
    data = check_with_tokenizer(data, model_processor(resolve_model_path(model.path)), cfg)
    if skipped_to is not None:
        skipped_to.unlink(missing_ok=True)
        data.write_skipped(skipped_to)
    if data.skipped and skipped_to is not None:
        print(
            f"eval: {len(data.skipped)} item(s) skipped, each with its reason in {skipped_to}",
            file=sys.stderr,
        )
    kept = {id(s) for s in data.samples}
    return [it for it in items if id(it.sample) in kept]
