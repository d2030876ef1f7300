"""Converters from the public video-QA layouts to mmrl records, so the video recipe trains on real benchmarks'
training-style data as on its generated clips.

- **Video-MME** (``lmms-lab/Video-MME`` on the HF hub: ``videomme/test-00000-of-00001.parquet``, one row per question):
  ``video_id``, ``duration`` (short/medium/long), ``domain``, ``sub_category``, ``url``, ``videoID`` (the YouTube id;
  the released videos are ``<videoID>.mp4``), ``question_id``, ``task_type``, ``question``, ``options`` (four strings
  ``"A. ..."``) and ``answer`` (a letter).
- **MVBench** (``OpenGVLab/MVBench``: ``json/<task>.json``, a list per task): ``video`` (a file name under the task's
  own video folder), ``question``, ``candidates`` (option texts), ``answer`` (the correct option's text) and, for the
  tasks whose clip is a segment of a longer video (STAR's action_sequence/prediction, object_interaction, ...),
  ``start`` and ``end`` in seconds. MVBench evaluates those on the segment only; with ``cut_bounds`` (default) the
  converter writes the segment to ``clips/<id>.mp4`` with OpenCV so training sees what the benchmark shows.
  MVBench's frame-folder tasks (TVQA's episodic_reasoning) are not videos and are refused with a message.

Each record becomes ``{"id", "prompt", "videos", "answer", "metadata"}`` (README "Data format"): the prompt is the
recipe's (:func:`mmrl.recipes.video.data.prompt_text`: question, ``A. option`` lines, the answer instruction), the
answer is the correct option's letter, and ``metadata`` holds ``choices`` (option texts, read by ``mc_letter``),
``kind`` (Video-MME's task type, or the MVBench task), ``source`` and the layout's own fields. Video paths are
written relative to the output file, so the records load from anywhere the videos stay.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import cv2

from mmrl.recipes.video.data import FULL, prompt_text
from mmrl.rewards.text import reference_letters

_LETTERED = re.compile(r"^\(?([A-Z])[.):]\s*")  # "A. text", "(A) text", "A) text"
VIDEOMME_FIELDS = ("videoID", "question_id", "question", "options", "answer")
MVBENCH_FIELDS = ("video", "question", "candidates", "answer")


class ConvertError(ValueError):
    pass


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ConvertError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return data


def _require(row: dict[str, Any], fields: tuple[str, ...], where: str, layout: str) -> None:
    missing = [f for f in fields if row.get(f) in (None, "")]
    if missing:
        raise ConvertError(f"{where}: missing {missing}; a {layout} record needs {list(fields)}")


def _video_file(video_dir: Path, name: str, where: str) -> Path:
    p = video_dir / name
    if not p.is_file():
        raise ConvertError(f"{where}: video not found: {p}; pass the folder holding the videos as video_dir")
    return p


def _record(
    rid: str,
    question: str,
    options: list[str],
    answer: str,
    video: Path,
    out_dir: Path,
    metadata: dict[str, Any],
    instruction: str,
) -> dict[str, Any]:
    try:
        letter = sorted(reference_letters(answer, options, rid))[0]
    except ValueError as e:
        raise ConvertError(str(e)) from None
    return {
        "id": rid,
        "prompt": prompt_text(question.strip(), options, instruction),
        "videos": [os.path.relpath(video.resolve(), out_dir.resolve())],
        "answer": letter,
        "metadata": {"choices": options, **metadata},
    }


def videomme_record(
    row: dict[str, Any], where: str, video_dir: Path, out_dir: Path, instruction: str = FULL.instruction
) -> dict[str, Any]:
    """One Video-MME row as an mmrl record (its option texts lose their ``"A. "`` prefixes)."""
    _require(row, VIDEOMME_FIELDS, where, "Video-MME")
    options = [_LETTERED.sub("", str(o)).strip() for o in row["options"]]
    video = _video_file(video_dir, f"{row['videoID']}.mp4", where)
    meta = {k: row.get(k) for k in ("task_type", "duration", "domain", "sub_category", "video_id", "url")}
    meta |= {"kind": row.get("task_type"), "source": "videomme"}
    return _record(str(row["question_id"]), row["question"], options, str(row["answer"]), video, out_dir, meta,
                   instruction)  # fmt: skip


def cut_segment(src: Path, dst: Path, start: float, end: float, where: str) -> Path:
    """Write frames ``[start, end)`` seconds of ``src`` to ``dst`` (mp4v, the source's frame rate and size)."""
    cap = cv2.VideoCapture(str(src))
    try:
        fps = float(cap.get(cv2.CAP_PROP_FPS))
        if not cap.isOpened() or not fps > 0:
            raise ConvertError(
                f"{where}: OpenCV cannot read {src} (or its frame rate); re-encode it as H.264 MP4"
            )
        first, last = int(round(start * fps)), int(round(end * fps))
        if last <= first:
            raise ConvertError(f"{where}: empty segment start={start} end={end}; fix the record's bounds")
        dst.parent.mkdir(parents=True, exist_ok=True)
        writer = None
        i = 0
        while i < last and cap.grab():
            if i >= first:
                ok, frame = cap.retrieve()
                if ok:
                    if writer is None:
                        h, w = frame.shape[:2]
                        writer = cv2.VideoWriter(str(dst), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
                    writer.write(frame)
            i += 1
    finally:
        cap.release()
    if writer is None:
        raise ConvertError(f"{where}: no frame of {src} lies in [{start}, {end}) s; fix the record's bounds")
    writer.release()
    return dst


def mvbench_record(
    row: dict[str, Any],
    where: str,
    task: str,
    index: int,
    video_dir: Path,
    out_dir: Path,
    *,
    cut_bounds: bool = True,
    instruction: str = FULL.instruction,
) -> dict[str, Any]:
    """One MVBench row as an mmrl record; ``start``/``end`` segments are cut to ``out_dir/clips/`` when asked."""
    _require(row, MVBENCH_FIELDS, where, "MVBench")
    if (video_dir / str(row["video"])).is_dir():
        raise ConvertError(
            f"{where}: {video_dir / str(row['video'])} is a frame folder (an MVBench 'frame' task); only video "
            "files convert"
        )
    video = _video_file(video_dir, str(row["video"]), where)
    rid = f"mvbench-{task}-{index:05d}"
    meta: dict[str, Any] = {"kind": task, "source": "mvbench", "video": row["video"]}
    if row.get("start") is not None and row.get("end") is not None:
        meta |= {"start": float(row["start"]), "end": float(row["end"])}
        if cut_bounds:  # one file per (video, segment): questions on the same segment share it
            clip = out_dir / "clips" / f"{video.stem}_{meta['start']:g}-{meta['end']:g}s.mp4"
            video = clip if clip.is_file() else cut_segment(video, clip, meta["start"], meta["end"], where)
    options = [str(c).strip() for c in row["candidates"]]
    return _record(rid, row["question"], options, str(row["answer"]), video, out_dir, meta, instruction)


def _write(records: list[dict[str, Any]], out_file: Path) -> Path:
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    tmp.replace(out_file)
    return out_file


def convert_videomme(
    path: str | Path, video_dir: str | Path, out_file: str | Path, *, instruction: str = FULL.instruction
) -> Path:
    """Video-MME rows (parquet, JSON or JSONL) -> ``out_file`` (JSONL); videos are ``video_dir/<videoID>.mp4``."""
    path, out_file = Path(path), Path(out_file)
    rows = _read_rows(path)
    recs = [
        videomme_record(r, f"{path} row {i}", Path(video_dir), out_file.parent, instruction)
        for i, r in enumerate(rows)
    ]
    return _write(recs, out_file)


def convert_mvbench(
    task_json: str | Path,
    video_dir: str | Path,
    out_file: str | Path,
    *,
    cut_bounds: bool = True,
    instruction: str = FULL.instruction,
) -> Path:
    """One MVBench task file (``json/<task>.json``; the task is its name) -> ``out_file`` (JSONL); ``video_dir`` is
    the task's video folder (MVBench's own table pairs e.g. action_sequence with ``star/Charades_v1_480/``)."""
    task_json, out_file = Path(task_json), Path(out_file)
    task = task_json.stem
    recs = [
        mvbench_record(
            r,
            f"{task_json} item {i}",
            task,
            i,
            Path(video_dir),
            out_file.parent,
            cut_bounds=cut_bounds,
            instruction=instruction,
        )  # fmt: skip
        for i, r in enumerate(_read_rows(task_json))
    ]
    return _write(recs, out_file)


__all__ = [
    "ConvertError",
    "convert_mvbench",
    "convert_videomme",
    "cut_segment",
    "mvbench_record",
    "videomme_record",
]
