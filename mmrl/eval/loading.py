"""Reading benchmark files as they are published: JSON (a list, or a dict keyed by id), JSONL, parquet or a saved
HF dataset folder; media by path relative to the data file (or a given folder) or embedded (HF ``Image`` structs
``{"bytes", "path"}``, raw bytes, base64 strings, data URIs, PIL images).

Embedded images stay in memory and go to the policy as they are (:func:`mmrl.processors.image.load_image` reads
bytes, base64 and PIL); paths are checked for existence at load time so that a bad record fails before the model
is loaded, with a message naming the record and the folder the path was resolved against.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from mmrl import extras
from mmrl.eval.base import EvalError

_BASE64 = re.compile(r"[A-Za-z0-9+/\s]{64,}={0,2}")


@dataclass
class Record:
    where: str  # "file:line" or "file row N" / "file key K", for messages
    data: dict[str, Any]
    key: str | None = None  # the dict key when the file is a JSON object keyed by id


def read_records(path: Path) -> list[Record]:
    """Every record of ``path``; raises :class:`EvalError` naming the line/row when one is not a JSON object."""
    if path.is_dir():
        _needs(path, "datasets")
        import datasets

        try:
            ds = datasets.load_from_disk(str(path))
        except FileNotFoundError as e:
            raise EvalError(
                f"{path}: not a saved HF dataset folder ({e}); pass the data file itself"
            ) from None
        if isinstance(ds, datasets.DatasetDict):
            raise EvalError(f"{path}: holds several splits {list(ds)}; pass one split's folder")
        return [Record(f"{path} row {i}", dict(r)) for i, r in enumerate(ds)]
    if not path.is_file():
        raise EvalError(f"data file not found: {path}")
    if path.suffix == ".parquet":
        _needs(path, "pyarrow")
        import pyarrow.parquet as pq

        return [Record(f"{path} row {i}", r) for i, r in enumerate(pq.read_table(path).to_pylist())]
    if path.suffix == ".jsonl":
        out = []
        with path.open("rb") as f:
            for n, raw in enumerate(f, 1):
                if raw.strip():
                    where = f"{path}:{n}"
                    out.append(Record(where, _object(_loads(_utf8(raw, where), where), where)))
        return out
    data = _loads(_utf8(path.read_bytes(), str(path)), str(path))
    if isinstance(data, dict):
        return [Record(f"{path} key {k!r}", _object(v, f"{path} key {k!r}"), str(k)) for k, v in data.items()]
    if isinstance(data, list):
        return [Record(f"{path} item {i}", _object(v, f"{path} item {i}")) for i, v in enumerate(data)]
    raise EvalError(f"{path}: expected a JSON list or object of records, got {type(data).__name__}")


def _needs(path: Path, module: str) -> None:
    """Saved HF datasets and parquet files are read with the ``data`` extra's packages."""
    try:
        extras.require("data", str(path), (module,))
    except extras.MissingExtra as e:
        raise EvalError(str(e)) from None


def _utf8(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EvalError(
            f"{where}: not valid UTF-8 (byte {raw[e.start]:#04x} at offset {e.start}); re-save the file as UTF-8"
        ) from None


def _loads(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise EvalError(f"{where}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise EvalError(f"{where}: invalid JSON (nested too deeply to parse)") from None


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EvalError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def require(rec: Record, *keys: str) -> None:
    """Raise naming the record when any of ``keys`` is missing."""
    missing = [k for k in keys if rec.data.get(k) is None]
    if missing:
        raise EvalError(f"{rec.where}: missing field(s) {missing} (have {sorted(rec.data)})")


def media(value: Any, base: Path, rec: Record, kind: str = "image", check: bool = True) -> Any:
    """A media source the policy can read: an absolute path (checked to exist unless ``check`` is off, as when
    only scoring a prediction file), bytes, an inline string, or a PIL image."""
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, Image.Image):
        return value
    if not isinstance(value, str) or not value.strip():
        raise EvalError(
            f"{rec.where}: the {kind} field is empty or not a path/bytes ({type(value).__name__})"
        )
    if kind == "image" and (value.startswith("data:") or _BASE64.fullmatch(value[:200])):
        return value  # inline image data
    p = Path(value)
    p = p if p.is_absolute() else base / p
    if check and not p.is_file():
        raise EvalError(f"{rec.where}: {kind} file not found: {p} (paths resolve against {base})")
    return str(p)


def image_size(src: Any) -> tuple[int, int]:
    """(width, height) from the header of a path, bytes or PIL image (EXIF rotation applied, as load_image does)."""
    from mmrl.processors.image import load_image

    if isinstance(src, str) and Path(src).is_file():
        with Image.open(src) as im:
            orientation = im.getexif().get(0x0112, 1)
            w, h = im.size
        return (h, w) if orientation in (5, 6, 7, 8) else (w, h)
    return load_image(src).size


def sha256_files(paths: list[Path]) -> str:
    """One digest over the record files (in the given order), so metrics name exactly the data they scored."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def data_files(path: Path) -> list[Path]:
    """The files a saved HF dataset folder consists of (for hashing); the path itself when it is a file."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file())
    return [path]


def user_turn(text: str, n_images: int = 0, n_videos: int = 0) -> list[dict[str, Any]]:
    """A chat with the media first and then the text, the layout Qwen2.5-VL's own evaluations use."""
    parts: list[dict[str, Any]] = [{"type": "image"} for _ in range(n_images)]
    parts += [{"type": "video"} for _ in range(n_videos)]
    parts.append({"type": "text", "text": text})
    return [{"role": "user", "content": parts}]


def fill(template: str, fields: dict[str, Any], where: str) -> str:
    """``template.format(**fields)``, with a message naming the record and the known fields on a bad key."""
    try:
        return template.format(**fields)
    except KeyError as e:
        raise EvalError(
            f"{where}: prompt template uses {{{e.args[0]}}}, not a field of this record "
            f"(fields: {sorted(fields)})"
        ) from None
