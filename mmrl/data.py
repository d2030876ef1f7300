"""Dataset records: load, validate, and list what was skipped.

A record is one JSON object (a JSONL line, a parquet row, or a saved HF dataset row) with:

- ``id`` (unique string), and either ``prompt`` (a string; ``<image>``/``<video>`` mark where media go, otherwise
  media come first) or ``messages`` (chat turns whose content parts are ``{"type": "text"|"image"|"video"}``);
- ``images`` / ``videos``: paths relative to the dataset file's folder (or absolute);
- ``answer``: the reference a reward compares against (any JSON value);
- ``metadata``: a mapping passed to rewards untouched.

Validation happens on load. A bad record either stops the run with an error naming the record and the fix
(``on_bad_record: error``) or is left out and written to ``skipped.jsonl`` with the reason (``skip``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl.config import DataConfig
from mmrl.extras import import_module, require
from mmrl.types import Sample

ALLOWED_KEYS = {"id", "prompt", "messages", "images", "videos", "answer", "metadata"}
ROLES = {"system", "user", "assistant"}


class DataError(ValueError):
    pass


@dataclass
class LoadedData:
    samples: list[Sample]
    skipped: list[dict[str, Any]] = field(default_factory=list)

    def write_skipped(self, path: Path) -> None:
        """Append the skipped records (with their reasons) to ``path``; nothing is written when none was skipped."""
        if not self.skipped:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            for s in self.skipped:
                f.write(json.dumps(s) + "\n")


def _drop_nulls(value: Any) -> Any:
    """Columnar formats (parquet, HF datasets) have no 'absent': a field one record lacks comes back as null once
    the schemas are unified. Such nulls mean "not given", as in the JSONL the record came from."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _read_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Return ``(where, row)`` pairs; ``where`` names the row for error messages."""
    if path.is_dir():
        require("data", f"records {path}", ("datasets",))
        import datasets

        ds = datasets.load_from_disk(str(path))
        return [(f"{path} row {i}", _drop_nulls(dict(r))) for i, r in enumerate(ds)]
    if path.suffix == ".parquet":
        require("data", f"records {path}", ("pyarrow",))
        import pyarrow.parquet as pq

        return [(f"{path} row {i}", _drop_nulls(r)) for i, r in enumerate(pq.read_table(path).to_pylist())]
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                row = {"__error__": f"invalid JSON ({e.msg} at column {e.colno})", "__raw__": line[:200]}
            rows.append((f"{path}:{lineno}", row))
    return rows


def _messages_from_prompt(prompt: str, n_images: int, n_videos: int) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if "<image>" in prompt or "<video>" in prompt:
        text = prompt
        while text:
            i, v = text.find("<image>"), text.find("<video>")
            cands = [(p, t) for p, t in ((i, "image"), (v, "video")) if p >= 0]
            if not cands:
                parts.append({"type": "text", "text": text})
                break
            pos, kind = min(cands)
            if pos:
                parts.append({"type": "text", "text": text[:pos]})
            parts.append({"type": kind})
            text = text[pos + len(kind) + 2 :]
    else:
        parts = [{"type": "image"}] * n_images + [{"type": "video"}] * n_videos
        parts = [dict(p) for p in parts] + [{"type": "text", "text": prompt}]
    return [{"role": "user", "content": parts}]


def _count_parts(messages: list[dict[str, Any]], kind: str) -> int:
    n = 0
    for m in messages:
        c = m.get("content")
        if isinstance(c, list):
            n += sum(1 for p in c if isinstance(p, dict) and p.get("type") == kind)
    return n


def _check_media(paths: list[str], kind: str, rid: str) -> None:
    for p in paths:
        if not Path(p).is_file():
            raise DataError(
                f"sample '{rid}': {kind} file not found: {p} (paths resolve against the dataset's folder)"
            )
        if kind == "image":
            from PIL import Image

            try:
                with Image.open(p) as im:
                    im.size  # noqa: B018 - reading the header is the check
            except Exception as e:
                raise DataError(
                    f"sample '{rid}': cannot read image {p}: {e} (re-export it as PNG or JPEG)"
                ) from e


def validate_record(
    row: dict[str, Any],
    where: str,
    base_dir: Path,
    system_prompt: str | None = None,
    check_media: bool = True,
) -> Sample:
    if "__error__" in row:
        raise DataError(f"{where}: {row['__error__']} (each line must be one JSON object)")
    rid = row.get("id")
    if not isinstance(rid, (str, int)) or str(rid).strip() == "":
        raise DataError(f"{where}: record has no 'id' (add a unique string id to every record)")
    rid = str(rid)
    extra = set(row) - ALLOWED_KEYS
    if extra:
        raise DataError(
            f"sample '{rid}' ({where}): unknown field(s) {sorted(extra)}; allowed: {sorted(ALLOWED_KEYS)} "
            "(put extra information under 'metadata')"
        )
    images = row.get("images") or []
    videos = row.get("videos") or []
    for name, val in (("images", images), ("videos", videos)):
        if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
            raise DataError(f"sample '{rid}': '{name}' must be a list of file paths")
    images = [str(p) if Path(p).is_absolute() else str(base_dir / p) for p in images]
    videos = [str(p) if Path(p).is_absolute() else str(base_dir / p) for p in videos]
    if ("prompt" in row) == ("messages" in row):
        raise DataError(f"sample '{rid}': give exactly one of 'prompt' (a string) or 'messages' (chat turns)")
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise DataError(f"sample '{rid}': 'prompt' must be a non-empty string")
        messages = _messages_from_prompt(row["prompt"], len(images), len(videos))
    else:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError(f"sample '{rid}': 'messages' must be a non-empty list of chat turns")
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in ROLES or "content" not in m:
                raise DataError(
                    f"sample '{rid}': each message needs a 'role' in {sorted(ROLES)} and 'content'"
                )
    for kind, paths in (("image", images), ("video", videos)):
        n = _count_parts(messages, kind)
        if n != len(paths):
            raise DataError(
                f"sample '{rid}': the prompt has {n} {kind} placeholder(s) but {len(paths)} {kind} file(s) are listed"
            )
    if system_prompt and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise DataError(f"sample '{rid}': 'metadata' must be a mapping")
    if check_media:
        _check_media(images, "image", rid)
        _check_media(videos, "video", rid)
    return Sample(
        id=rid, messages=messages, images=images, videos=videos, answer=row.get("answer"), metadata=metadata
    )


BUILD_STAMP = ".mmrl-build.json"


def _builder(builder: str) -> Any:
    module, _, fn = builder.partition(":")
    if not fn:
        raise DataError(f"data.builder {builder!r} must look like 'package.module:function'")
    return getattr(import_module(module, f"data.builder {builder!r}"), fn)


def _builder_digest(fn: Any) -> str:
    """sha256 of the source of the module that defines the builder: what its output depends on, short of running it."""
    import hashlib
    import inspect

    return hashlib.sha256(inspect.getsource(inspect.getmodule(fn)).encode()).hexdigest()


def ensure_built(train: str, builder: str | None) -> None:
    """Run the recipe's data builder when its records are not on disk yet, and stamp the folder with the builder's
    source digest (``.mmrl-build.json``). Records already there are kept, but if the builder's module changed since
    it stamped them, a warning says the data may be stale and how to rebuild it."""
    if not builder:
        return
    folder = Path(train).parent
    stamp = folder / BUILD_STAMP
    if Path(train).exists():
        if stamp.is_file():
            built = json.loads(stamp.read_text())
            if built.get("builder") == builder and built.get("source_sha256") != _builder_digest(
                _builder(builder)
            ):
                import warnings

                warnings.warn(
                    f"{folder} was built by an earlier version of {builder} (its module has changed since): the "
                    f"records may differ from what it builds now; delete {folder} to rebuild them",
                    stacklevel=2,
                )
        return
    fn = _builder(builder)
    fn(folder)
    if not Path(train).exists():
        raise DataError(f"data.builder {builder!r} ran but did not write {train}")
    stamp.write_text(json.dumps({"builder": builder, "source_sha256": _builder_digest(fn)}) + "\n")


def load_dataset(
    path: str | Path,
    *,
    on_bad_record: str = "error",
    system_prompt: str | None = None,
    check_media: bool = True,
) -> LoadedData:
    p = Path(path)
    if not p.exists():
        raise DataError(f"dataset not found: {p}")
    base = p if p.is_dir() else p.parent
    samples: list[Sample] = []
    skipped: list[dict[str, Any]] = []
    seen: set[str] = set()
    for where, row in _read_rows(p):
        try:
            s = validate_record(row, where, base, system_prompt, check_media)
            if s.id in seen:
                raise DataError(f"sample '{s.id}' ({where}): duplicate id (ids must be unique)")
            seen.add(s.id)
            samples.append(s)
        except DataError as e:
            if on_bad_record == "error":
                raise DataError(f"{e} — or set data.on_bad_record=skip to skip bad records") from None
            skipped.append({"where": where, "id": row.get("id"), "reason": str(e)})
    if not samples:
        raise DataError(f"{p}: no valid records ({len(skipped)} skipped)")
    return LoadedData(samples=samples, skipped=skipped)


def load_split(cfg: DataConfig, path: str, skipped_to: Path | None) -> list[Sample]:
    """Load one split with the run's data settings, listing skipped records in ``skipped_to`` (when given)."""
    data = load_dataset(
        path, on_bad_record=cfg.on_bad_record, system_prompt=cfg.system_prompt, check_media=cfg.check_media
    )
    if skipped_to is not None:
        data.write_skipped(skipped_to)
    return data.samples
