"""Rebuild the Video-MME and MVBench fixtures of tests/test_recipe_video.py (deterministic, about 40 KB).

    python tests/data/video/make_fixtures.py

Schemas, field for field, as the public releases ship them (see README.md here); the clips are drawn with the video
recipe's own generator, and the questions are written about what those clips show.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mmrl.recipes.video.data import FULL, Shape, write_clip

HERE = Path(__file__).resolve().parent
SMALL = dataclasses.replace(FULL, name="fixture", height=64, width=112, fps=4.0)


def _still(colour: str, kind: str, x: int, y: int, start: int, frames: int, r: int = 9) -> Shape:
    return Shape(colour, kind, r, [None if t < start else (x, y) for t in range(frames)])


def _moving(colour: str, frames: int, dx: int, dy: int, x0: int, y0: int) -> Shape:
    return Shape(colour, "square", 9, [(x0 + dx * t, y0 + dy * t) for t in range(frames)])


def videomme(root: Path) -> None:
    """``videomme/test-00000-of-00001.parquet`` (lmms-lab/Video-MME's columns and types) + ``data/<videoID>.mp4``."""
    (root / "data").mkdir(parents=True)
    style = dataclasses.replace(SMALL, frames=16)
    write_clip(root / "data" / "fixtureClip01.mp4", [_moving("red", 16, 5, 0, 12, 32)], style)
    write_clip(
        root / "data" / "fixtureClip02.mp4",
        [_still("blue", "circle", 20, 20, 0, 16), _still("green", "square", 60, 40, 4, 16),
         _still("red", "circle", 92, 20, 8, 16)],
        style,
    )  # fmt: skip
    rows = [
        {"video_id": "901", "duration": "short", "domain": "Knowledge", "sub_category": "Shapes",
         "url": "https://www.youtube.com/watch?v=fixtureClip01", "videoID": "fixtureClip01",
         "question_id": "901-1", "task_type": "Object Reasoning",
         "question": "In which direction does the red square travel during the video?",
         "options": ["A. Upwards.", "B. To the left.", "C. To the right.", "D. Downwards."], "answer": "C"},
        {"video_id": "902", "duration": "short", "domain": "Knowledge", "sub_category": "Shapes",
         "url": "https://www.youtube.com/watch?v=fixtureClip02", "videoID": "fixtureClip02",
         "question_id": "902-1", "task_type": "Counting Problem",
         "question": "How many shapes are visible at the end of the video?",
         "options": ["A. 1.", "B. 2.", "C. 3.", "D. 4."], "answer": "C"},
        {"video_id": "902", "duration": "short", "domain": "Knowledge", "sub_category": "Shapes",
         "url": "https://www.youtube.com/watch?v=fixtureClip02", "videoID": "fixtureClip02",
         "question_id": "902-2", "task_type": "Temporal Reasoning",
         "question": "Which shape appears last?",
         "options": ["A. The blue circle.", "B. The green square.", "C. The red circle.", "D. None of them."],
         "answer": "C"},
    ]  # fmt: skip
    schema = pa.schema(
        [(k, pa.string()) for k in ("video_id", "duration", "domain", "sub_category", "url", "videoID")]
        + [("question_id", pa.string()), ("task_type", pa.string()), ("question", pa.string())]
        + [("options", pa.list_(pa.string())), ("answer", pa.string())]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), root / "test-00000-of-00001.parquet")


def mvbench(root: Path) -> None:
    """``json/<task>.json`` (OpenGVLab/MVBench's fields) + each task's video folder under ``video/``."""
    (root / "json").mkdir(parents=True)
    star = root / "video" / "star" / "Charades_v1_480"
    clevrer = root / "video" / "clevrer" / "video_validation"
    star.mkdir(parents=True)
    clevrer.mkdir(parents=True)
    long = dataclasses.replace(SMALL, frames=32)  # 8 s at 4 fps; the questions are about seconds 2-7
    write_clip(
        star / "FX001.mp4",
        [_still("green", "square", 20, 30, 0, 32), _still("red", "square", 56, 30, 12, 32),
         _still("blue", "circle", 92, 30, 20, 32)],
        long,
    )  # fmt: skip
    write_clip(
        clevrer / "video_10001.mp4",
        [_moving("blue", 16, 0, 3, 56, 10)],
        dataclasses.replace(SMALL, frames=16),
    )
    action_sequence = [
        {"video": "FX001.mp4", "question": "What happened after the red square appeared?",
         "candidates": ["The blue circle appeared.", "The green square left.", "The red square turned blue.",
                        "Nothing happened."],
         "answer": "The blue circle appeared.", "start": 2.0, "end": 7.0},
        {"video": "FX001.mp4", "question": "Which shape appeared first?",
         "candidates": ["The blue circle.", "The red square."], "answer": "The red square.",
         "start": 2.0, "end": 7.0},
    ]  # fmt: skip
    moving_direction = [
        {"video": "video_10001.mp4", "question": "What direction is the blue square moving?",
         "candidates": ["up", "down", "left", "right", "not moving"], "answer": "down"},
    ]  # fmt: skip
    (root / "json" / "action_sequence.json").write_text(json.dumps(action_sequence, indent=1) + "\n")
    (root / "json" / "moving_direction.json").write_text(json.dumps(moving_direction, indent=1) + "\n")


def main() -> None:
    for name, fn in (("videomme", videomme), ("mvbench", mvbench)):
        shutil.rmtree(HERE / name, ignore_errors=True)
        fn(HERE / name)


if __name__ == "__main__":
    main()
