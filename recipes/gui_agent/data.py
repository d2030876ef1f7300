"""Records for the gui_agent recipe: one generated app and task per record (:mod:`.apps`), its first screen
rendered by the ``browser_app`` env (:mod:`mmrl.envs.browser`) into the record.

Splits (each its own app seeds, so they are disjoint draws; app kinds cycle through ``kinds`` in turn):

- ``train.jsonl`` / ``eval.jsonl``: ``prompt`` is the task instruction and the action schema, ``images`` the first
  screenshot (the env's first observation: it checks at reset that it renders the same pixels), ``metadata`` holds
  what the env needs to build the app again (``app``, ``seed``, ``viewport``) and, for checks and logs, ``task``,
  ``instruction`` and ``image_sizes``. No ``answer``: the env judges success from the app's state.
- ``sft.jsonl``: oracle demonstrations, one record per step of an oracle episode (``n_sft`` episodes): that
  step's screenshot, the same prompt, and ``answer`` = the full-marks response ``<think></think><answer>[action]
  </answer>`` in ``view``'s coordinate frame (:class:`mmrl.model.checkpoint_files.ModelView`; page pixels when None), with
  ``metadata.reference`` the action in page pixels and ``metadata.step`` its index. Each step is a single-turn record
  (the screen alone, without the earlier turns).

:func:`build_tiny` mixes the GPU recipe's app kinds (:data:`.apps.KINDS`); :func:`build_tiny_panel` writes only the
tiny recipe's ``panel`` apps (:data:`.apps.TINY_KINDS`). ``kinds`` may name any kind :data:`.apps.BUILDERS` knows.

Everything follows from ``seed``: the apps from their seeds, the screenshots from Chromium drawing the same page to
the same pixels (on one machine), so a build is reproducible byte for byte there.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from mmrl.envs.browser import BrowserAppEnv, action_response
from mmrl.model.checkpoint_files import ModelView
from mmrl.recipes.gui_agent.apps import BUILDERS, KINDS, TINY_KINDS
from mmrl.rewards.html_sandbox import LeftOut
from mmrl.types import Sample

logger = logging.getLogger("mmrl.recipes.gui_agent")

PROMPT = (
    "<image>You are using an app. Task: {instruction}\n"
    "Each turn, think inside <think></think>, then give ONE action inside <answer></answer> as "
    "[{{'action': 'click', 'coordinate': [x, y]}}]. Actions: click (coordinate), input_text (the text in "
    "'input_text'; a 'coordinate' on the field first clicks it; it replaces the field's text), scroll "
    "('direction': 'up' or 'down'), navigate_back. You then see the new screen."
)
VIEWPORT = (480, 360)
# app seeds of split s are seed * SEED_STRIDE + SPLIT_OFFSET[s] + i: disjoint while a split has < 3M records
SEED_STRIDE = 10_000_000
SPLIT_OFFSET = {"train": 0, "eval": 5_000_000, "sft": 8_000_000}


def response(action: dict[str, Any], viewport: tuple[int, int], view: ModelView | None) -> str:
    """The full-marks response for an oracle ``action`` (page pixels), its coordinate in ``view``'s frame (page
    pixels when None), as the env's oracle writes it (:func:`mmrl.envs.browser.action_response`)."""
    if view is None:
        return action_response(action, "original_pixels", viewport, viewport)
    return action_response(action, view.frame, viewport, view.model_size(*viewport))


def _metadata(env: BrowserAppEnv, kind: str, seed: int, viewport: tuple[int, int]) -> dict[str, Any]:
    return {
        "app": kind,
        "seed": seed,
        "task": env.app.task,
        "instruction": env.app.instruction,
        "viewport": list(viewport),
        "image_sizes": [list(viewport)],
    }


def _episode(
    root: Path,
    work: Path,
    rid: str,
    kind: str,
    seed: int,
    viewport: tuple[int, int],
    demo: bool,
    view: ModelView | None,
) -> list[dict[str, Any]]:
    """The record of one app (``demo``: the oracle's per-step records instead), its images written."""
    env = BrowserAppEnv(workdir=work / rid, max_steps=20)
    try:
        first = env.reset(
            Sample(id=rid, messages=[], metadata={"app": kind, "seed": seed, "viewport": viewport})
        )
        meta = _metadata(env, kind, seed, viewport)
        prompt = PROMPT.format(instruction=env.app.instruction)
        if not demo:
            shutil.copyfile(first.images[0], root / f"images/{rid}.png")
            return [{"id": rid, "prompt": prompt, "images": [f"images/{rid}.png"], "metadata": meta}]
        records, shot = [], first.images[0]
        for k in range(env.max_steps):
            action = env.oracle_action()
            if action is None:
                raise RuntimeError(f"app {kind!r} seed {seed}: the oracle gives no action at step {k}")
            name = f"{rid}-s{k}"
            shutil.copyfile(shot, root / f"images/{name}.png")
            rec_meta = meta | {
                "step": k,
                "reference": action,
                "frame": view.frame if view else "original_pixels",
            }
            answer = response(action, viewport, view)
            records.append({"id": name, "prompt": prompt, "images": [f"images/{name}.png"], "answer": answer})
            records[-1]["metadata"] = rec_meta
            result = env.step(response(action, viewport, None))  # the env's frame here: page pixels
            if result.done:
                if result.reward != 1.0:
                    raise RuntimeError(f"app {kind!r} seed {seed}: the oracle failed ({result.info})")
                return records
            shot = result.observation.images[0]
        raise RuntimeError(f"app {kind!r} seed {seed}: the oracle did not finish in {env.max_steps} steps")
    finally:
        env.close()


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)


def build(
    folder: str | Path,
    *,
    n_train: int = 2000,
    n_eval: int = 200,
    n_sft: int = 500,
    seed: int = 0,
    viewport: tuple[int, int] = VIEWPORT,
    kinds: tuple[str, ...] = KINDS,
    view: ModelView | None = None,
) -> dict[str, Path]:
    """Write ``train.jsonl``, ``eval.jsonl``, ``sft.jsonl`` (``n_sft`` oracle episodes, one record per step;
    none when 0) and ``images/`` under ``folder``. ``viewport`` ``(w, h)``: the app's screen in CSS pixels (device
    scale 1: screenshot pixels); ``view``: the model whose frame the SFT answers are written in (module docstring).
    Logs the rate in screens/s. The env survives Chromium's crashes (:mod:`mmrl.envs.browser`); an app it still
    crashes under is left out with a warning (:class:`~mmrl.rewards.html_sandbox.LeftOut`; every app has its own
    seed, so the other records are those of a clean build), three in a row stop the build."""
    unknown = [k for k in kinds if k not in BUILDERS]
    if unknown or not kinds:
        raise ValueError(f"gui_agent data: unknown app kind(s) {unknown}; kinds: {tuple(BUILDERS)}")
    viewport = (int(viewport[0]), int(viewport[1]))
    root = Path(folder)
    (root / "images").mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    t0, screens, left_out = time.perf_counter(), 0, LeftOut("gui_agent data")
    with tempfile.TemporaryDirectory(prefix="gui-agent-") as work:
        for split, n in (("train", n_train), ("eval", n_eval), ("sft", n_sft)):
            if split == "sft" and n == 0:
                continue
            records: list[dict[str, Any]] = []
            for i in range(n):
                app_seed = seed * SEED_STRIDE + SPLIT_OFFSET[split] + i
                rid = f"gui-agent-{split}-{i:05d}"
                kind = kinds[i % len(kinds)]
                with left_out.item(rid):
                    records += _episode(root, Path(work), rid, kind, app_seed, viewport, split == "sft", view)
            screens += len(records)
            paths[split] = root / f"{split}.jsonl"
            _write_jsonl(paths[split], records)
    seconds = time.perf_counter() - t0
    logger.info(
        "gui_agent data: %d screens in %.1f s (%.2f/s)", screens, seconds, screens / max(seconds, 1e-9)
    )
    if left_out.items:
        logger.warning("gui_agent data: left out after Chromium crashes: %s", ", ".join(left_out.items))
    return paths


def build_tiny(folder: str | Path, *, n_train: int = 200, n_eval: int = 50, n_sft: int = 100, seed: int = 0):
    """A small build (all kinds, the default 480 x 360 viewport, SFT answers in page pixels) for smoke runs."""
    return build(folder, n_train=n_train, n_eval=n_eval, n_sft=n_sft, seed=seed)


def build_tiny_panel(
    folder: str | Path, *, n_train: int = 400, n_eval: int = 100, n_sft: int = 0, seed: int = 0
) -> dict[str, Path]:
    """The tiny recipe's build: only :data:`.apps.TINY_KINDS` apps (``panel_cue``: the page marks the next control,
    which a model too small to read text can learn to find), the default viewport, SFT answers in page pixels."""
    return build(folder, n_train=n_train, n_eval=n_eval, n_sft=n_sft, seed=seed, kinds=TINY_KINDS)


def build_tiny_panel_demo(folder: str | Path, *, n: int = 400, seed: int = 1) -> dict[str, Path]:
    """Demonstration tasks for the tiny recipe's warm start (``mmrl sft recipes/gui_agent/sft.yaml`` plays the env's
    oracle on them): panel apps from another seed, so none is an RL or held-out app."""
    return build(folder, n_train=n, n_eval=0, n_sft=0, seed=seed, kinds=TINY_KINDS)
