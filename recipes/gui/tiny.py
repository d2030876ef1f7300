"""The gui recipe's tiny split: small phone screens of one fixed app family, for the bundled ~1M-parameter model.

The full generator (:mod:`mmrl.recipes.gui.data`) draws font sizes, paddings, icons and list contents at random and
renders up to 1280x800 screenshots with text the model must read. The bundled tiny model (2 layers, hidden 128) sees
a screenshot as ~45 image tokens and cannot read text at that size, so the tiny split keeps what it can learn in
minutes: one phone layout family with fixed sizes (app bar with a back or menu icon and two of four icons, an
optional search field, the first 3-6 items of an app's list in their usual order, an optional tab bar), so where a
named element sits follows from the app's layout and from what is visible (is there a search field pushing the list
down? a tab bar?). Screens are 360x640 CSS pixels at device scale 0.5 (180x320 screenshots), which the policy
resizes to 140x252 (:data:`TINY_PIXELS`), so predicted clicks go through the reward's model-to-original mapping.

Three splits, disjoint by seed: ``train`` (RL prompts), ``eval`` (held out) and ``sft`` (the warm start's records,
whose ``answer`` is the full-marks response text in model-input coordinates, :func:`~.data.target_response`, and
whose ``metadata.reference`` keeps the action). Actions: click (most), input_text into the search field,
navigate_back, in UI-R1's schema (docs/rewards.md#domain-rewards).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

from mmrl.model.checkpoint_files import ModelView
from mmrl.recipes.gui.data import (
    LISTS,
    TABS,
    Layout,
    Screen,
    ScreenRenderer,
    _Builder,
    _page,
    _style,
    make_record,
    target_response,
)
from mmrl.rewards.html_sandbox import LeftOut

logger = logging.getLogger("mmrl.recipes.gui")

TINY_SCREEN = Screen("phone_small", "phone", 360, 640, 0.5)
# model.min_pixels / max_pixels of tiny.yaml and sft.yaml: 180x320 screenshots become 140x252 = 5x9 = 45 tokens
TINY_PIXELS = (3136, 36000)
# sft.yaml's model.path (tiny.yaml starts from its warm start, with the same processor)
TINY_MODEL = "assets/tiny-qwen2.5-vl"
TINY_METRICS = {"font": 16, "icon": 48, "pad": 10, "radius": 8, "row": 14}
TINY_WEIGHTS = {"click": 0.7, "input_text": 0.15, "navigate_back": 0.15}
BAR_ICONS = ("search", "settings", "share", "more")
# The tiny model learns the answer format from its warm start, so its prompt is the instruction alone (a real
# checkpoint gets data.PROMPT, which spells the action schema out).
TINY_PROMPT = "<image>Instruction: {instruction}"


def make_tiny_layout(rng: random.Random, screen: Screen, *, home: bool = False) -> Layout:
    """One screen of the tiny app family (``home`` is ignored: the family has no home screens)."""
    b = _Builder()
    css, m = _style(rng, screen.device, TINY_METRICS)
    title = rng.choice(tuple(LISTS))
    back = rng.random() < 0.7
    left = b.icon("back" if back else "menu", m["icon"], m["font"] + 8)
    icons = sorted(rng.sample(BAR_ICONS, 2), key=BAR_ICONS.index)
    right = "".join(b.icon(i, m["icon"], m["font"] + 8) for i in icons)
    parts = [f'<div class="bar">{left}<h1>{title}</h1>{right}</div>']
    if rng.random() < 0.5:
        parts.append('<div style="height:8px"></div>' + b.field("search", search=True))
    items = LISTS[title][: rng.randint(3, 6)]
    parts.append("<ul>" + "".join(f"<li {b.mark('list_item', it)}><span>{it}</span></li>" for it in items))
    parts.append("</ul>")
    if rng.random() < 0.5:
        tabs = "".join(f"<div {b.mark('tab', t)}>{t}</div>" for t in TABS[:4])
        parts.append(f'<div class="nav">{tabs}</div>')
    return Layout(_page(css, "".join(parts)), "app", b.elements, back)


def model_view() -> ModelView:
    """How :data:`TINY_MODEL` sees the tiny screenshots under :data:`TINY_PIXELS`, and the frame it writes in."""
    lo, hi = TINY_PIXELS
    return ModelView.of_model({"path": TINY_MODEL, "min_pixels": lo, "max_pixels": hi})


def model_size() -> tuple[int, int]:
    """The tiny screenshot's size ``(w, h)`` as the policy sees it: :data:`TINY_MODEL`'s geometry under
    :data:`TINY_PIXELS`."""
    return model_view().model_size(*TINY_SCREEN.pixel_size)


def _has_field(rec: dict[str, Any]) -> bool:
    return any(e["kind"] == "field" for e in rec["metadata"]["elements"])


def _sft_record(rec: dict[str, Any]) -> dict[str, Any]:
    """The warm start's form of a record: the answer is the response text that earns full marks."""
    text = target_response(rec["answer"], image_size=TINY_SCREEN.pixel_size, view=model_view())
    return {**rec, "answer": text, "metadata": {**rec["metadata"], "reference": rec["answer"]}}


def build(
    folder: str | Path,
    *,
    n_train: int = 1000,
    n_eval: int = 200,
    n_sft: int = 1000,
    sft_keep_field: float = 0.2,
    seed: int = 0,
    renderer: ScreenRenderer | None = None,
) -> dict[str, Path]:
    """Write ``train.jsonl``, ``eval.jsonl``, ``sft.jsonl`` and ``images/`` under ``folder`` (each split its own
    seed, so the splits are disjoint draws). ``renderer``: a running :class:`ScreenRenderer` to reuse, else one
    is started and closed here. Logs the rendering rate in screenshots/s. A record Chromium crashes under again
    and again is left out, as in :func:`~.data.build`.

    The ``sft`` split keeps a screen with a search field with probability ``sft_keep_field`` (half the RL and
    held-out screens have one): the field pushes the list down by about one row, so a warm start that rarely saw
    it clicks list rows where they sit without it. RL on the balanced prompts has to learn to see the field."""
    root = Path(folder)
    (root / "images").mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    t0, shots, left_out = time.perf_counter(), 0, LeftOut("gui tiny data")
    splits = (("train", n_train, seed), ("eval", n_eval, seed + 1_000_003), ("sft", n_sft, seed + 2_000_029))
    with contextlib.nullcontext(renderer) if renderer is not None else ScreenRenderer() as renderer:
        for split, n, s in splits:
            rng = random.Random(s)
            lines: list[str] = []
            i = 0
            while len(lines) < n:
                rid = f"gui-tiny-{split}-{i:05d}"
                i += 1
                with left_out.item(rid):
                    rec, png = make_record(
                        rng,
                        renderer,
                        TINY_SCREEN,
                        rid,
                        TINY_WEIGHTS,
                        layouts=make_tiny_layout,
                        prompt=TINY_PROMPT,
                    )
                    shots += 1
                    if split == "sft" and _has_field(rec) and rng.random() >= sft_keep_field:
                        continue
                    (root / rec["images"][0]).write_bytes(png)
                    lines.append(json.dumps(_sft_record(rec) if split == "sft" else rec))
            paths[split] = root / f"{split}.jsonl"
            tmp = paths[split].with_suffix(".jsonl.tmp")
            tmp.write_text("\n".join(lines) + "\n")
            tmp.replace(paths[split])
    seconds = time.perf_counter() - t0
    logger.info(
        "gui tiny data: %d screenshots in %.1f s (%.2f/s)", shots, seconds, shots / max(seconds, 1e-9)
    )
    if left_out.items:
        logger.warning("gui tiny data: left out after Chromium crashes: %s", ", ".join(left_out.items))
    return paths
