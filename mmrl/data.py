"""Dataset records: load, validate, and list what was skipped.

A record is one JSON object (a JSONL line, a parquet row, or a saved HF dataset row) with:

- ``id`` (unique string), and either ``prompt`` (a string; ``<image>``/``<video>`` mark where media go, otherwise
  media come first) or ``messages`` (chat turns whose content parts are ``{"type": "text"|"image"|"video"}``);
- ``images`` / ``videos``: paths relative to the dataset file's folder (or absolute);
- ``answer``: the reference a reward compares against (any JSON value);
- ``metadata``: a mapping passed to rewards untouched.

Validation happens in two passes, both before step 1. :func:`load_dataset` checks what needs no model, on every
record: the line decodes as UTF-8 and parses as one JSON object; fields have their types; placeholders match the
media; at most ``data.max_images_per_record`` images; the text is not absurdly long for ``data.max_prompt_tokens``;
and, with ``data.check_media``, every image exists and fully decodes (truncated files and decompression bombs
caught), has an aspect ratio the Qwen towers accept (200:1, :data:`mmrl.processors.geometry.MAX_RATIO`) and the
record's images stay within ``data.max_pixels_per_record``; every video opens and decodes its first frame.
:func:`check_with_tokenizer` then checks what needs the checkpoint's processor: the prompt's text tokens against
``data.max_prompt_tokens``, media the processor cannot take, and text holding the model's own special or vision
tokens.

Such tokens are refused, not escaped. The policy hands the processor the templated chat as one string, in which
``<|image_pad|>`` or ``<|im_start|>`` written by a user cannot be told from the template's own; escaping them
would change the text the model sees in a way the record's author did not write. Refused, the record names the
token and the fix; ``data.allowed_special_tokens`` lets through the ones a data set means as control tokens.
Paired markup tags that some tokenizers make special (GLM's ``<think>``/``</think>`` and ``<answer>``/``</answer>``,
InternVL's ``<ref>``/``</ref>``) are text a prompt may ask for and are allowed, unless the processor names them as a
media token (InternVL's ``<img>``); unpaired ones are control tokens (Gemma's ``<start_of_turn>``, LLaVA's ``<image>``).

A bad record either stops the run with an error naming the record and the fix (``on_bad_record: error``) or is left
out and written to ``skipped.jsonl`` with its reason and a short ``kind`` (``skip``). A split whose records are all
bad stops with the count of each kind.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from mmrl.config import DataConfig
from mmrl.extras import import_module, require
from mmrl.types import Sample

ALLOWED_KEYS = {"id", "prompt", "messages", "images", "videos", "answer", "metadata"}
ROLES = {"system", "user", "assistant"}
PART_TYPES = {"text", "image", "video"}
# No natural-language text averages more characters a token: a longer text cannot fit data.max_prompt_tokens and is
# refused at load without tokenizing it (tokenizing megabytes before step 1 is itself slow).
MAX_CHARS_PER_TOKEN = 16
# a special token that is a markup tag (<think>, </answer>): text a prompt may ask for when paired (see the docstring)
_MARKUP_TAG = re.compile(r"<(/?)([A-Za-z_]+)>")
# inline image data, as evaluation records may hold (the rule of mmrl.processors.image.load_image)
_BASE64 = re.compile(r"[A-Za-z0-9+/\s]{64,}={0,2}")


class DataError(ValueError):
    """A bad record (or data set); ``kind`` is a short name of the reason, counted when every record is bad."""

    def __init__(
        self, message: str, kind: str = "invalid_record", skipped: list[dict[str, Any]] | None = None
    ):
        super().__init__(message)
        self.kind = kind
        self.skipped = skipped or []  # the records skipped before a split turned out to hold none usable


@dataclass
class LoadedData:
    samples: list[Sample]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    where: dict[str, str] = field(default_factory=dict)  # sample id -> the line or row it came from
    source: str = "records"  # the file or folder, for messages

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


def _read_rows(path: Path) -> list[tuple[str, Any]]:
    """Return ``(where, row)`` pairs; ``where`` names the row for error messages. A JSONL line that does not decode
    or parse becomes a row holding ``__error__`` (the reason) and ``__kind__``: one bad line, not a bad file."""
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
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if raw.strip():
                rows.append((f"{path}:{lineno}", _parse_line(raw, lineno == 1)))
    return rows


def _parse_line(raw: bytes, first: bool) -> Any:
    try:
        line = raw.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError as e:
        return {
            "__error__": f"line is not valid UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); "
            "re-save the file as UTF-8",
            "__kind__": "unreadable_line",
        }
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        return {"__error__": f"invalid JSON ({e.msg} at column {e.colno})", "__kind__": "invalid_json"}
    except RecursionError:
        return {"__error__": "invalid JSON (nested too deeply to parse)", "__kind__": "invalid_json"}


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


def texts_of(messages: list[dict[str, Any]]) -> list[str]:
    """Every text of a chat (string contents and text parts), in order."""
    out = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list):
            out += [p["text"] for p in c if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return out


def _check_messages(messages: Any, rid: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"sample '{rid}': 'messages' must be a non-empty list of chat turns")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or "content" not in m:
            raise DataError(f"sample '{rid}': each message needs a 'role' in {sorted(ROLES)} and 'content'")
        c = m["content"]
        parts_ok = isinstance(c, list) and all(
            isinstance(p, dict)
            and p.get("type") in PART_TYPES
            and (p["type"] != "text" or isinstance(p.get("text"), str))
            for p in c
        )
        if not (isinstance(c, str) or parts_ok):
            raise DataError(
                f"sample '{rid}': a message's 'content' must be a string or a list of parts "
                f"{{'type': 'text', 'text': str}} / {{'type': 'image'}} / {{'type': 'video'}}"
            )


# ------------------------------------------------------------------------------------------------------- media
def _media_error(e: Exception, rid: str, kind: str) -> DataError:
    return DataError(f"sample '{rid}': {getattr(e, 'cause', e)}", kind)


def _inline(src: Any) -> bool:
    """An image given as data (bytes, a PIL image, a data URI or base64 text: evaluation records), not a path."""
    if isinstance(src, os.PathLike):
        return False
    if not isinstance(src, str):
        return True
    return src.startswith("data:") or (_BASE64.fullmatch(src) is not None and not _is_file(src))


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # a name too long for the file system, or holding a NUL: not a file
        return False


def _resolve(src: Any, rid: str, kind: str) -> Path:
    """The media file ``src`` (resolved already), checked to exist, to be a file and not to be empty."""
    from mmrl.processors.errors import MediaError, resolve_media_path

    try:  # base_dir "" only makes a message say that paths resolve against the data's folder
        return resolve_media_path(src, base_dir="", record_id=rid, kind=kind)
    except MediaError as e:
        raise _media_error(e, rid, "missing_media") from None
    except (OSError, ValueError) as e:
        raise DataError(
            f"sample '{rid}': unusable {kind} path {str(src)[:200]!r} ({e})", "missing_media"
        ) from None


def _image_size(src: Any, rid: str) -> tuple[int, int]:
    """``(width, height)`` of an image from its header (a path) or its decoded pixels (inline data), checked against
    the per-image pixel limit; raises :class:`DataError` with the reason's kind."""
    from PIL import Image, UnidentifiedImageError

    from mmrl.processors.errors import MediaError
    from mmrl.processors.image import DEFAULT_MAX_IMAGE_PIXELS, load_image

    if _inline(src):  # decoding it is the only way to its size
        try:
            return load_image(src, record_id=rid).size
        except MediaError as e:
            big = "too large" in e.cause or "over the limit" in e.cause
            raise _media_error(e, rid, "image_too_large" if big else "image_unreadable") from None
        except (OSError, ValueError) as e:
            raise DataError(f"sample '{rid}': cannot read inline image: {e}", "image_unreadable") from None
    p = _resolve(src, rid, "image")
    try:
        with Image.open(p) as im:
            w, h = im.size
    except Image.DecompressionBombError as e:
        raise DataError(
            f"sample '{rid}': image {p} is too large to decode safely ({e}); downscale it", "image_too_large"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise DataError(
            f"sample '{rid}': cannot read image {p}: {e} (re-export it as PNG or JPEG)", "image_unreadable"
        ) from None
    if w * h > DEFAULT_MAX_IMAGE_PIXELS:
        raise DataError(
            f"sample '{rid}': image {p} is {w}x{h} = {w * h:,} pixels, over the limit of "
            f"{DEFAULT_MAX_IMAGE_PIXELS:,} (possible decompression bomb); downscale it",
            "image_too_large",
        )
    return w, h


def _check_images(images: list[Any], rid: str, cfg: DataConfig) -> None:
    """Sizes from the headers first (cheap refusals), then a full decode of each image as the policy decodes it."""
    from mmrl.processors.errors import MediaError
    from mmrl.processors.geometry import MAX_RATIO
    from mmrl.processors.image import load_image

    sizes = [_image_size(src, rid) for src in images]
    for i, (src, (w, h)) in enumerate(zip(images, sizes)):
        if max(w, h) / max(1, min(w, h)) > MAX_RATIO:
            name = f"inline image {i + 1}" if _inline(src) else f"image {src}"
            raise DataError(
                f"sample '{rid}': {name} is {w}x{h}, an aspect ratio over {MAX_RATIO}:1 (the most Qwen's image "
                "geometry takes); crop or pad it",
                "aspect_ratio",
            )
    total = sum(w * h for w, h in sizes)
    if total > cfg.max_pixels_per_record:
        raise DataError(
            f"sample '{rid}': its {len(images)} image(s) hold {total:,} pixels, over data.max_pixels_per_record "
            f"{cfg.max_pixels_per_record:,}; downscale them, split the record, or raise the limit",
            "too_many_pixels",
        )
    for src in images:
        if not _inline(src):  # inline images were decoded for their size
            try:
                load_image(src, record_id=rid)
            except MediaError as e:
                raise _media_error(e, rid, "image_unreadable") from None


def _check_videos(videos: list[Any], rid: str) -> None:
    """Each video opens and decodes its first frame, through the policy's own reader (decord, else OpenCV); a
    failure later in the stream can only show when the policy reads the frames it samples."""
    from mmrl.processors.errors import MediaError
    from mmrl.processors.video import load_video

    for src in videos:
        p = _resolve(src, rid, "video")
        try:
            load_video(p, record_id=rid, min_frames=1, max_frames=1, temporal_patch=1,
                       min_pixels=28 * 28, max_pixels=4 * 28 * 28)  # fmt: skip
        except MediaError as e:
            raise _media_error(e, rid, "video_unreadable") from None


def check_sample(sample: Sample, cfg: DataConfig, check_media: bool = True) -> None:
    """The checks of a built sample that need no model (module docstring); raises :class:`DataError`."""
    rid = sample.id
    if len(sample.images) > cfg.max_images_per_record:
        raise DataError(
            f"sample '{rid}': {len(sample.images)} images, over data.max_images_per_record "
            f"{cfg.max_images_per_record}; split the record or raise the limit",
            "too_many_images",
        )
    if cfg.max_prompt_tokens is not None:
        chars = sum(len(t) for t in texts_of(sample.messages))
        if chars > MAX_CHARS_PER_TOKEN * cfg.max_prompt_tokens:
            raise DataError(
                f"sample '{rid}': its text is {chars:,} characters, far more than data.max_prompt_tokens "
                f"{cfg.max_prompt_tokens} tokens can hold; shorten it or raise the limit",
                "prompt_too_long",
            )
    if check_media:
        _check_images(sample.images, rid, cfg)
        _check_videos(sample.videos, rid)


# ------------------------------------------------------------------------------------------------------ records
def validate_record(
    row: Any,
    where: str,
    base_dir: Path,
    system_prompt: str | None = None,
    check_media: bool = True,
    limits: DataConfig | None = None,
) -> Sample:
    """One row as a :class:`Sample`, checked (module docstring) under ``limits`` (DataConfig's defaults when None);
    raises :class:`DataError` naming the record, the reason and the fix."""
    if isinstance(row, dict) and "__error__" in row:
        raise DataError(f"{where}: {row['__error__']} (each line must be one JSON object)", row["__kind__"])
    if not isinstance(row, dict):
        raise DataError(
            f"{where}: a JSON {type(row).__name__}, not an object (each line must be one JSON object)",
            "invalid_json",
        )
    rid = row.get("id")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or str(rid).strip() == "":
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
        if not isinstance(val, list) or not all(isinstance(x, str) and x for x in val):
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
        _check_messages(messages, rid)
    for kind, paths in (("image", images), ("video", videos)):
        n = _count_parts(messages, kind)
        if n != len(paths):
            raise DataError(
                f"sample '{rid}': the prompt has {n} {kind} placeholder(s) but {len(paths)} {kind} file(s) are "
                "listed",
                "placeholder_mismatch",
            )
    if system_prompt and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise DataError(f"sample '{rid}': 'metadata' must be a mapping")
    sample = Sample(
        id=rid, messages=messages, images=images, videos=videos, answer=row.get("answer"), metadata=metadata
    )
    check_sample(sample, limits or DataConfig(), check_media)
    return sample


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


def _skip_or_raise(e: DataError, on_bad_record: str, where: str, rid: Any) -> dict[str, Any]:
    if on_bad_record == "error":
        raise DataError(f"{e} — or set data.on_bad_record=skip to skip bad records", e.kind) from None
    return {"where": where, "id": rid, "kind": e.kind, "reason": str(e)}


def _none_usable(what: str, skipped: list[dict[str, Any]]) -> DataError:
    counts = Counter(s["kind"] for s in skipped)
    by_kind = ", ".join(f"{n} {k}" for k, n in counts.most_common())
    first = skipped[0]["reason"] if skipped else ""
    return DataError(
        f"{what}: no usable records: {len(skipped)} skipped ({by_kind}); the first: {first}",
        "no_records",
        skipped,
    )


def _in_threads(fn: Any, items: list[Any], threads: bool) -> list[Any]:
    """``[fn(x) for x in items]``, on a few threads when ``threads`` (PIL and the video readers release the GIL)."""
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1) if threads else 1) as pool:
        return list(pool.map(fn, items))


def _gather(
    checked: list[tuple[str, Any, Sample | DataError]], on_bad_record: str, source: str
) -> LoadedData:
    """Checked ``(where, id, sample or error)`` triples as :class:`LoadedData`: duplicate ids refused, bad records
    skipped or raised; raises when none is usable."""
    data = LoadedData([], source=source)
    for where, rid, s in checked:
        if isinstance(s, Sample) and s.id in data.where:
            s = DataError(f"sample '{s.id}' ({where}): duplicate id (ids must be unique)", "duplicate_id")
        if isinstance(s, DataError):
            data.skipped.append(_skip_or_raise(s, on_bad_record, where, rid))
            continue
        data.samples.append(s)
        data.where[s.id] = where
    if not data.samples:
        raise _none_usable(source, data.skipped)
    return data


def load_dataset(
    path: str | Path,
    *,
    on_bad_record: str = "error",
    system_prompt: str | None = None,
    check_media: bool = True,
    limits: DataConfig | None = None,
) -> LoadedData:
    """Every record of ``path``, checked (module docstring) under the ``max_*`` limits of ``limits`` (DataConfig's
    defaults when None)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"dataset not found: {p}")
    base = p if p.is_dir() else p.parent

    def check(item: tuple[str, Any]) -> tuple[str, Any, Sample | DataError]:
        where, row = item
        rid = row.get("id") if isinstance(row, dict) and "__error__" not in row else None
        try:
            return where, rid, validate_record(row, where, base, system_prompt, check_media, limits)
        except DataError as e:
            return where, rid, e

    return _gather(_in_threads(check, _read_rows(p), check_media), on_bad_record, str(p))


def check_samples(samples: list[Sample], cfg: DataConfig, source: str) -> LoadedData:
    """:func:`check_sample` on samples built elsewhere (a benchmark's items), under ``cfg``'s limits and
    ``on_bad_record``."""

    def check(s: Sample) -> tuple[str, Any, Sample | DataError]:
        try:
            check_sample(s, cfg, cfg.check_media)
            return f"{source} item {s.id!r}", s.id, s
        except DataError as e:
            return f"{source} item {s.id!r}", s.id, e

    return _gather(_in_threads(check, samples, cfg.check_media), cfg.on_bad_record, source)


# ------------------------------------------------------------------------------------------ with the tokenizer
@lru_cache(maxsize=4)
def model_processor(path: str) -> Any:
    """The checkpoint's processor (its tokenizer alone for a text-only checkpoint), loaded once per path."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path)


def reserved_tokens(processor: Any, allowed: list[str] | tuple[str, ...] = ()) -> set[str]:
    """Tokens record text must not hold: the tokenizer's special tokens but paired markup tags, and every token
    the processor names (``image_token``, ``video_token``, ``boi_token``...: it counts these in the text), less
    ``allowed``."""
    tok = getattr(processor, "tokenizer", processor)
    special = {t.content for t in tok.added_tokens_decoder.values() if t.special}
    special |= set(tok.all_special_tokens)
    tags = {(m[1], m[2]) for m in map(_MARKUP_TAG.fullmatch, special) if m}
    paired = {f"<{slash}{name}>" for slash, name in tags if ("/" if not slash else "", name) in tags}
    return ((special - paired) | media_tokens(processor)) - set(allowed)


def media_tokens(processor: Any) -> set[str]:
    """The tokens a processor names (its and its tokenizer's ``*_token`` attributes: ``image_token``,
    ``video_token``, ``boi_token``...); it counts them in the text, whatever the tokenizer makes of them."""
    tok = getattr(processor, "tokenizer", processor)
    return {
        v
        for obj in (processor, tok)
        for k, v in vars(obj).items()
        if k.endswith("_token") and isinstance(v, str) and v.strip()
    }


def _answer_text(answer: Any) -> str:
    """The answer as SFT tokenizes it (rewards compare it to decoded text, in which no special token survives)."""
    if answer is None:
        return ""
    return answer if isinstance(answer, str) else json.dumps(answer)


class _TokenCheck:
    """Tokenizes the prompts and answers of a batch of samples once, and says what is wrong with each."""

    def __init__(self, processor: Any, cfg: DataConfig):
        self.processor, self.cfg = processor, cfg
        self.tok = getattr(processor, "tokenizer", processor)
        reserved = reserved_tokens(processor, cfg.allowed_special_tokens)
        vocab = self.tok.get_vocab()
        # found in the ids the text becomes, and the processor's own media tokens in the text itself
        self.ids = {vocab[t]: t for t in reserved if t in vocab}
        self.strings = sorted(media_tokens(processor) & reserved)

    def _ids(self, texts: list[str]) -> list[list[int]]:
        return self.tok(texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else []

    def reasons(self, samples: list[Sample]) -> list[DataError | None]:
        prompts = ["".join(texts_of(s.messages)) for s in samples]
        answers = [_answer_text(s.answer) for s in samples]
        rows = zip(samples, prompts, answers, self._ids(prompts), self._ids(answers))
        return [
            self.reason(s, ids, f"{p}\n{a}", self.ids.keys() & {*ids, *aids}) for s, p, a, ids, aids in rows
        ]

    def reason(self, sample: Sample, ids: list[int], text: str, special: set[int]) -> DataError | None:
        rid, limit = sample.id, self.cfg.max_prompt_tokens
        found = sorted({self.ids[i] for i in special} | {t for t in self.strings if t in text})
        if found:
            return DataError(
                f"sample '{rid}': its text holds the model's special token(s) {found}, which the tokenizer would "
                "read as control or vision tokens, not as text; remove or rewrite them (or list them in "
                "data.allowed_special_tokens if they are meant as control tokens)",
                "special_tokens",
            )
        if limit is not None and len(ids) > limit:
            return DataError(
                f"sample '{rid}': its text is {len(ids):,} tokens, over data.max_prompt_tokens {limit}; shorten "
                "it or raise the limit",
                "prompt_too_long",
            )
        for kind, media in (("image", sample.images), ("video", sample.videos)):
            if media and getattr(self.processor, f"{kind}_processor", None) is None:
                return DataError(
                    f"sample '{rid}': this checkpoint's processor ({type(self.processor).__name__}) takes no "
                    f"{kind}; drop the record's {kind}s or use a model that reads them",
                    "unsupported_media",
                )
        return None


def check_with_tokenizer(data: LoadedData, processor: Any, cfg: DataConfig) -> LoadedData:
    """The checks that need the checkpoint's processor (module docstring), on every sample of ``data``: a bad one
    raises under ``cfg.on_bad_record == "error"`` and is moved to ``skipped`` under ``"skip"``."""
    out = LoadedData([], list(data.skipped), {}, data.source)
    for s, bad in zip(data.samples, _TokenCheck(processor, cfg).reasons(data.samples)):
        where = data.where.get(s.id, "")
        if bad is not None:
            out.skipped.append(_skip_or_raise(bad, cfg.on_bad_record, where, s.id))
            continue
        out.samples.append(s)
        out.where[s.id] = where
    if not out.samples:
        raise _none_usable(out.source, out.skipped)
    return out


def load_split(cfg: DataConfig, path: str, skipped_to: Path | None, model: str | None = None) -> list[Sample]:
    """Load one split with the run's data settings, listing skipped records in ``skipped_to`` (when given); with
    ``model`` (a checkpoint folder or hub id) the checks that need its processor run too."""
    try:
        data = load_dataset(
            path,
            on_bad_record=cfg.on_bad_record,
            system_prompt=cfg.system_prompt,
            check_media=cfg.check_media,
            limits=cfg,
        )
        if model is not None:
            data = check_with_tokenizer(data, model_processor(model), cfg)
    except DataError as e:
        if e.skipped and skipped_to is not None:  # every record bad: the reasons are still listed
            LoadedData([], e.skipped).write_skipped(skipped_to)
        raise
    if skipped_to is not None:
        data.write_skipped(skipped_to)
    return data.samples
