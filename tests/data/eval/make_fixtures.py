"""Rebuild the small benchmark fixtures in this folder (each in its benchmark's published layout).

    python tests/data/eval/make_fixtures.py [--shared ../shared/data]

Sources: MathVista records from ``tests/data/mathvista_scoring/testmini.json`` (CC BY-SA 4.0) with stand-in images
drawn here; PubTabNet example tables and annotation lines from ``<shared>/pubtabnet/examples`` (CDLA-Permissive-1.0,
images under the PMC Open Access terms); a 192x192 crop of scikit-image's ``ihc.png`` (BSD-3-Clause); screenshots,
MATH-Vision-style puzzles and videos drawn here. Everything is deterministic.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent
TESTS_DATA = HERE.parent
MATHVISTA_PIDS = ("1", "2", "3", "8", "108", "225")
TABLES = ("PMC3907710_006_00.png", "PMC2753619_002_00.png", "PMC4517499_004_00.png", "PMC5198506_004_00.png")


def _canvas(w: int, h: int, colour=(255, 255, 255)) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    im = Image.new("RGB", (w, h), colour)
    return im, ImageDraw.Draw(im)


def mathvista(out: Path) -> None:
    records = json.loads((TESTS_DATA / "mathvista_scoring" / "testmini.json").read_text())
    chosen = {pid: records[pid] for pid in MATHVISTA_PIDS}
    for pid, rec in chosen.items():
        im, d = _canvas(160, 120, (245, 245, 235))
        d.rectangle([10, 10, 150, 110], outline=(40, 40, 40), width=2)
        d.text((20, 20), f"MathVista {pid}", fill=(0, 0, 0))
        d.line([20, 100, 140, 40], fill=(200, 30, 30), width=3)
        path = out / rec["image"]
        path.parent.mkdir(parents=True, exist_ok=True)
        im.save(path, quality=70)
    (out / "testmini.json").write_text(json.dumps(chosen, indent=1, ensure_ascii=False) + "\n")


def mathv(out: Path) -> None:
    puzzles = [
        ("1", "How many circles are in the picture?\n<image1>", [], "3", 1, "counting", 3),
        ("2", "Which shape is drawn in the picture?\n<image1>", ["circle", "square", "triangle"], "A", 1, "logic", 1),
        ("3", "Each circle is worth 1/2. What is the total value of the circles in <image1>?", [], "2", 2,
         "arithmetic", 4),
        ("4", "How many circles would there be if one more were drawn?\n<image1>", [], "3", 2, "counting", 2),
    ]  # fmt: skip
    lines = []
    for pid, question, options, answer, level, subject, n in puzzles:
        im, d = _canvas(140, 60)
        for i in range(n):
            d.ellipse([8 + 32 * i, 16, 36 + 32 * i, 44], outline=(0, 0, 200), width=3)
        path = out / "images" / f"{pid}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        im.save(path)
        lines.append({"id": pid, "question": question, "options": options, "answer": answer, "solution": None,
                      "level": level, "subject": subject, "image": f"images/{pid}.png"})  # fmt: skip
    (out / "testmini.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _screen(
    name: str, size: tuple[int, int], widgets: list[tuple[str, str, tuple[int, int, int, int]]]
) -> Image.Image:
    im, d = _canvas(*size, (236, 239, 244))
    d.rectangle([0, 0, size[0], 24], fill=(52, 73, 94))
    d.text((8, 6), name, fill=(255, 255, 255))
    for kind, label, (x, y, w, h) in widgets:
        if kind == "text":
            d.rectangle([x, y, x + w, y + h], fill=(255, 255, 255), outline=(120, 120, 120))
            d.text((x + 6, y + h // 2 - 5), label, fill=(0, 0, 0))
        else:
            d.ellipse([x, y, x + w, y + h], fill=(41, 128, 185))
            d.line([x + 4, y + h // 2, x + w - 4, y + h // 2], fill=(255, 255, 255), width=2)
    return im


def screenspot(out: Path) -> None:
    screens = {
        "mobile": ((270, 480), "ios", [("text", "Settings", (20, 60, 110, 32)), ("icon", "add", (210, 400, 40, 40))]),
        "desktop": ((480, 300), "windows", [("text", "File", (10, 30, 50, 22)), ("icon", "close", (440, 2, 20, 20))]),
        "web": ((400, 300), "shop", [("text", "Sign in", (300, 40, 80, 26)), ("icon", "search", (20, 40, 28, 28))]),
    }  # fmt: skip
    imgs = out / "screenspot_imgs"
    imgs.mkdir(parents=True, exist_ok=True)
    for platform, (size, source, widgets) in screens.items():
        name = f"{platform}_0.png"
        _screen(f"{platform} app", size, widgets).save(imgs / name)
        records = [
            {"img_filename": name, "bbox": list(box), "data_type": kind, "data_source": source,
             "instruction": f"open {label}" if kind == "text" else f"tap the {label} button"}
            for kind, label, box in widgets
        ]  # fmt: skip
        (out / f"screenspot_{platform}.json").write_text(json.dumps(records, indent=1) + "\n")


def table(out: Path, shared: Path) -> None:
    src = shared / "pubtabnet" / "examples"
    lines = {
        json.loads(x)["filename"]: x for x in (src / "PubTabNet_Examples.jsonl").read_text().splitlines()
    }
    out.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        shutil.copyfile(src / name, out / name)
    (out / "PubTabNet_examples.jsonl").write_text("".join(lines[name] + "\n" for name in TABLES))


def pathvqa(out: Path, shared: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    crop = Image.open(shared / "pathology_smoke" / "ihc.png").convert("RGB").crop((96, 96, 288, 288))
    buf = io.BytesIO()
    crop.save(buf, format="JPEG", quality=80)
    qa = [
        ("Is this tissue stained by immunohistochemistry?", "yes"),
        ("Is this image a chest radiograph?", "no"),
        ("What counterstain gives the nuclei their blue colour?", "hematoxylin"),
        ("What staining technique was used on this tissue?", "immunohistochemistry"),
    ]
    image = {"bytes": buf.getvalue(), "path": "ihc_crop.jpg"}
    rows = {"image": [image] * len(qa), "question": [q for q, _ in qa], "answer": [a for _, a in qa]}
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), out / "test.parquet")


def _video(path: Path, frames: int, motion: str) -> None:
    w, h = 64, 48
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 8.0, (w, h))
    for i in range(frames):
        frame = np.full((h, w, 3), 255, np.uint8)
        t = i / (frames - 1)
        x, y = (int(4 + t * 44), 16) if motion == "right" else (24, int(2 + t * 30))
        frame[y : y + 14, x : x + 14] = (0, 0, 220)  # red in BGR
        writer.write(frame)
    writer.release()


def videoqa(out: Path) -> None:
    videos = out / "videos"
    videos.mkdir(parents=True, exist_ok=True)
    _video(videos / "clip1.mp4", 16, "right")
    _video(videos / "clip2.mp4", 16, "down")
    options = [
        "A. From left to right.",
        "B. From right to left.",
        "C. From top to bottom.",
        "D. It does not move.",
    ]
    mme = [
        {"videoID": "clip1", "question_id": "clip1-1", "duration": "short", "domain": "synthetic",
         "sub_category": "shapes", "task_type": "Object Motion", "question": "How does the red square move?",
         "options": options, "answer": "A"},
        {"videoID": "clip2", "question_id": "clip2-1", "duration": "short", "domain": "synthetic",
         "sub_category": "shapes", "task_type": "Object Motion", "question": "How does the red square move?",
         "options": options, "answer": "C"},
        {"videoID": "clip1", "question_id": "clip1-2", "duration": "short", "domain": "synthetic",
         "sub_category": "shapes", "task_type": "Counting Problem", "question": "How many squares are there?",
         "options": ["A. 1.", "B. 2.", "C. 3.", "D. 4."], "answer": "A"},
    ]  # fmt: skip
    (out / "videomme.json").write_text(json.dumps(mme, indent=1) + "\n")
    mvbench = [{"video": "videos/clip2.mp4", "question": "What colour is the moving square?",
                "candidates": ["blue", "red", "green"], "answer": "red"}]  # fmt: skip
    (out / "object_colour.json").write_text(json.dumps(mvbench, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(HERE.parents[3] / "shared" / "data"))
    shared = Path(ap.parse_args().shared)
    for name in ("mathvista", "mathv", "screenspot", "table", "pathvqa", "videoqa"):
        shutil.rmtree(HERE / name, ignore_errors=True)
        (HERE / name).mkdir(parents=True)
    mathvista(HERE / "mathvista")
    mathv(HERE / "mathv")
    screenspot(HERE / "screenspot")
    table(HERE / "table", shared)
    pathvqa(HERE / "pathvqa", shared)
    videoqa(HERE / "videoqa")
    total = sum(p.stat().st_size for p in HERE.rglob("*") if p.is_file())
    print(f"fixtures written under {HERE}: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
