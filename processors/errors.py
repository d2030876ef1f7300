"""The one error type raised for unusable media, and the path checks shared by the image and video loaders.

Every message starts with ``sample '<record_id>': `` and goes on with the cause and what to do, so a failure deep in a
data loader names the record to fix without a traceback hunt.
"""

from __future__ import annotations

import os
from pathlib import Path


class MediaError(ValueError):
    """An image or video of one sample cannot be used; the message names the sample, the cause and the fix."""

    def __init__(self, record_id: str, cause: str):
        self.record_id = record_id
        self.cause = cause
        super().__init__(f"sample '{record_id}': {cause}")

    def __reduce__(self):
        # Exceptions pickle through ``self.args`` by default, which would call ``MediaError(message)``; data-loader
        # workers send errors across processes, so rebuild from the two fields instead.
        return (type(self), (self.record_id, self.cause))


def resolve_media_path(
    path: str | os.PathLike[str], *, base_dir: str | os.PathLike[str] | None, record_id: str, kind: str
) -> Path:
    """Return ``path`` (a ``file://`` prefix stripped, relative paths joined to ``base_dir``) once it is known to be
    an existing, non-empty file; otherwise raise :class:`MediaError`. ``kind`` is ``"image"`` or ``"video"``."""
    text = os.fspath(path)
    p = Path(text[len("file://") :] if text.startswith("file://") else text)
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    if not p.exists():
        where = (
            "the dataset folder"
            if base_dir is not None
            else "the current directory (no dataset folder given)"
        )
        raise MediaError(
            record_id, f"{kind} file not found: {p} (check the path; relative paths resolve against {where})"
        )
    if p.is_dir():
        raise MediaError(
            record_id, f"{kind} path is a directory, not a file: {p} (point it at the {kind} file)"
        )
    if p.stat().st_size == 0:
        raise MediaError(
            record_id, f"{kind} file is empty (0 bytes): {p} (re-export the file or drop the sample)"
        )
    return p
