"""Converters from public GUI formats to mmrl records scored by ``gui_action`` (docs/rewards.md#domain-rewards).

- ScreenSpot (SeeClick): a JSON list of ``{img_filename, instruction, bbox: [x, y, w, h], data_type,
  data_source}`` with the screenshots in ``screenspot_imgs/``; each item becomes a click on the box ``[x, y, x
  + w, y + h]``.
- AndroidControl / GUI-R1 step records (JSONL, a JSON list, or parquet): one step per record with a screenshot
  (``screenshot``/``image``/``image_path``: a path, or GUI-R1's ``{"bytes": ...}``), an instruction
  (``instruction``/``step_instruction``/``goal``), an action type (``action_type``/``gt_action``/``action``),
  and its argument: a point (``x``/``y``, ``coordinate``/``point``, or ``gt_bbox`` with 2 numbers) or a box
  (``gt_bbox`` with 4), and text (``text``/``input_text``/``gt_input_text``, ``app_name`` for open_app,
  ``direction`` for scroll). Action names are mapped to UI-R1's (``type`` -> ``input_text``, ``press_back`` ->
  ``navigate_back``, ``tap`` -> ``click``, ...). Points stay points: ``gui_action`` accepts a click within
  ``point_radius`` of them.

Paths in the written records are relative to the output file's folder, so the dataset can be moved as a whole.
Every bad record raises :class:`ConvertError` naming the file, the record and what to fix.
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any

from PIL import Image

from mmrl.recipes.gui.data import PROMPT

ACTION_ALIASES = {
    "click": "click", "tap": "click", "long_press": "long_press", "long_click": "long_press",
    "input_text": "input_text", "type": "input_text", "input": "input_text",
    "scroll": "scroll", "swipe": "scroll",
    "navigate_back": "navigate_back", "press_back": "navigate_back", "back": "navigate_back",
    "navigate_home": "navigate_home", "press_home": "navigate_home", "home": "navigate_home",
    "open_app": "open_app", "open": "open_app", "wait": "wait", "complete": "complete", "select": "select",
}  # fmt: skip
POINTING = {"click", "long_press"}
TEXT_ACTIONS = {"input_text", "open_app", "scroll", "select"}
_NO_TEXT = {"", "no input text"}


class ConvertError(ValueError):
    pass


def _first(row: dict[str, Any], *keys: str) -> Any:
    return next((row[k] for k in keys if row.get(k) is not None), None)


def _numbers(value: Any, where: str, what: str) -> list[float]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    ok = isinstance(value, (list, tuple)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
    )
    if not ok:
        raise ConvertError(f"{where}: {what} must be a list of numbers, got {value!r}")
    return [float(v) for v in value]


def _image_size(path: Path, where: str) -> tuple[int, int]:
    if not path.is_file():
        raise ConvertError(f"{where}: screenshot not found: {path} (check the image folder)")
    try:
        with Image.open(path) as im:
            return im.size
    except OSError as e:
        raise ConvertError(
            f"{where}: cannot read screenshot {path}: {e} (re-export it as PNG or JPEG)"
        ) from e


def _record(rid: str, instruction: str, device: str, image: str, answer: dict, meta: dict) -> dict[str, Any]:
    return {
        "id": rid,
        "prompt": PROMPT.format(device=device, instruction=instruction),
        "images": [image],
        "answer": answer,
        "metadata": {"instruction": instruction, **meta},
    }


def write_jsonl(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Write ``records`` to ``path`` (atomically) and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)
    return path


def screenspot_records(
    src: str | Path, out_dir: str | Path, *, image_dir: str | Path | None = None
) -> list[dict[str, Any]]:
    """Records for one ScreenSpot file (``screenspot_<platform>.json``), image paths relative to ``out_dir``;
    ids are ``screenspot-<platform>-<index>``. The box must lie inside its screenshot."""
    src, out_dir = Path(src), Path(out_dir)
    images = Path(image_dir) if image_dir is not None else src.parent / "screenspot_imgs"
    platform = src.stem.split("_")[1] if src.stem.startswith("screenspot_") else src.stem
    try:
        items = json.loads(src.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConvertError(
            f"{src}: not valid JSON ({e.msg} at line {e.lineno}); ScreenSpot files are JSON lists"
        ) from None
    if not isinstance(items, list):
        raise ConvertError(f"{src}: a ScreenSpot file is a JSON list of items, got {type(items).__name__}")
    records = []
    for i, item in enumerate(items):
        rid = f"screenspot-{platform}-{i}"
        where = f"{src} item {i} ({rid})"
        if not isinstance(item, dict):
            raise ConvertError(f"{where}: each item must be an object, got {type(item).__name__}")
        missing = [k for k in ("img_filename", "instruction", "bbox") if item.get(k) is None]
        if missing:
            raise ConvertError(
                f"{where}: missing field(s) {missing}; ScreenSpot items need img_filename, instruction, bbox"
            )
        box = _numbers(item["bbox"], where, "bbox [x, y, w, h]")
        if len(box) != 4 or box[2] <= 0 or box[3] <= 0:
            raise ConvertError(
                f"{where}: bbox must be [x, y, w, h] with positive w and h, got {item['bbox']!r}"
            )
        x, y, w, h = box
        path = images / item["img_filename"]
        iw, ih = _image_size(path, where)
        if x < 0 or y < 0 or x + w > iw + 1 or y + h > ih + 1:
            raise ConvertError(
                f"{where}: bbox {item['bbox']!r} lies outside the {iw}x{ih} screenshot "
                "(is it [x1, y1, x2, y2]? ScreenSpot boxes are [x, y, w, h])"
            )
        meta = {
            "source": "screenspot",
            "platform": platform,
            "data_type": item.get("data_type"),
            "data_source": item.get("data_source"),
            "image_size": [iw, ih],
        }
        device = "phone" if platform == "mobile" else "desktop"
        answer = {"action": "click", "bbox": [x, y, x + w, y + h]}
        records.append(
            _record(rid, item["instruction"], device, os.path.relpath(path, out_dir), answer, meta)
        )
    return records


def _read_steps(src: Path) -> list[dict[str, Any]]:
    if src.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(src).to_pylist()
    text = src.read_text(encoding="utf-8")
    if src.suffix == ".json":
        rows = json.loads(text)
        return rows if isinstance(rows, list) else [rows]
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConvertError(
                    f"{src}:{lineno}: invalid JSON ({e.msg}); one step record per line"
                ) from None
    return rows


def _screenshot(value: Any, src: Path, out_dir: Path, rid: str, where: str) -> tuple[str, tuple[int, int]]:
    """The record's image path relative to ``out_dir``: a path as given (relative to the source file), or
    embedded bytes written to ``out_dir/images/<id>.png``."""
    if isinstance(value, dict) and value.get("bytes") is not None:
        try:
            with Image.open(io.BytesIO(value["bytes"])) as im:
                out = out_dir / "images" / f"{rid}.png"
                out.parent.mkdir(parents=True, exist_ok=True)
                im.convert("RGB").save(out)
                return os.path.relpath(out, out_dir), im.size
        except OSError as e:
            raise ConvertError(f"{where}: embedded screenshot bytes are not an image: {e}") from e
    if isinstance(value, dict):
        value = value.get("path")
    if not isinstance(value, str) or not value:
        raise ConvertError(
            f"{where}: no screenshot (give 'screenshot', 'image' or 'image_path': a path or bytes)"
        )
    path = Path(value) if Path(value).is_absolute() else src.parent / value
    return os.path.relpath(path, out_dir), _image_size(path, where)


def _step_answer(row: dict[str, Any], where: str, size: tuple[int, int], coords: str) -> dict[str, Any]:
    raw = _first(row, "action_type", "gt_action", "action")
    if not isinstance(raw, str) or raw.strip().lower() not in ACTION_ALIASES:
        raise ConvertError(
            f"{where}: unknown action {raw!r} (field action_type, gt_action or action); "
            f"known: {sorted(ACTION_ALIASES)}"
        )
    action = ACTION_ALIASES[raw.strip().lower()]
    answer: dict[str, Any] = {"action": action}
    if action in POINTING:
        if row.get("x") is not None and row.get("y") is not None:
            target = _numbers([row["x"], row["y"]], where, "x, y")
        else:
            value = _first(row, "coordinate", "point", "gt_bbox")
            if value is None:
                raise ConvertError(
                    f"{where}: a {action} needs a point (x and y, coordinate, point) or gt_bbox"
                )
            target = _numbers(value, where, "the target")
        if len(target) not in (2, 4):
            raise ConvertError(
                f"{where}: the target must be a point [x, y] or a box [x1, y1, x2, y2], got {target}"
            )
        scale = {"pixels": (1, 1), "normalized": size, "normalized_1000": (size[0] / 1000, size[1] / 1000)}[
            coords
        ]
        target = [v * scale[i % 2] for i, v in enumerate(target)]
        if any(v < 0 for v in target) or any(v > size[i % 2] + 1 for i, v in enumerate(target)):
            raise ConvertError(
                f"{where}: target {target} lies outside the {size[0]}x{size[1]} screenshot "
                f"(coords={coords!r}; pass coords='normalized' or 'normalized_1000' for fractions)"
            )
        answer["point" if len(target) == 2 else "bbox"] = target
    text = _first(row, "text", "input_text", "gt_input_text", "app_name", "direction")
    if text is not None and str(text).strip().lower() not in _NO_TEXT:
        answer["text"] = str(text)
    elif action in TEXT_ACTIONS:
        raise ConvertError(
            f"{where}: a {action} needs its text (text, input_text, gt_input_text, app_name, direction)"
        )
    return answer


def step_records(
    src: str | Path, out_dir: str | Path, *, coords: str = "pixels", device: str = "phone"
) -> list[dict[str, Any]]:
    """Records for AndroidControl/GUI-R1-style step records in ``src``; ids are the record's ``id`` or
    ``<episode_id>-<step_id>`` or ``step-<index>``. ``coords``: ``pixels`` (AndroidControl), ``normalized``
    (0-1) or ``normalized_1000``. GUI-R1's ``history`` goes into the prompt as the previous actions."""
    if coords not in ("pixels", "normalized", "normalized_1000"):
        raise ConvertError(f"coords must be 'pixels', 'normalized' or 'normalized_1000', got {coords!r}")
    src, out_dir = Path(src), Path(out_dir)
    records = []
    for i, row in enumerate(_read_steps(src)):
        if not isinstance(row, dict):
            raise ConvertError(f"{src} record {i}: each step must be an object, got {type(row).__name__}")
        if row.get("id") is not None:
            rid = str(row["id"])
        elif row.get("episode_id") is not None:
            rid = f"{row['episode_id']}-{row.get('step_id', i)}"
        else:
            rid = f"step-{i}"
        where = f"{src} record {i} ({rid})"
        instruction = _first(row, "instruction", "step_instruction", "goal")
        if not isinstance(instruction, str) or not instruction.strip():
            raise ConvertError(f"{where}: no instruction (give 'instruction', 'step_instruction' or 'goal')")
        image, size = _screenshot(_first(row, "screenshot", "image", "image_path"), src, out_dir, rid, where)
        answer = _step_answer(row, where, size, coords)
        history = row.get("history")
        history = None if history is None or str(history).strip().lower() in ("", "none") else str(history)
        prompt_instruction = instruction if not history else f"{instruction}\nPrevious actions: {history}"
        meta = {
            "source": "step",
            "instruction": instruction,
            "image_size": list(size),
            "goal": row.get("goal"),
            "history": history,
        }
        records.append(_record(rid, prompt_instruction, device, image, answer, meta))
    return records
