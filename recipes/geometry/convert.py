"""Geometry3k (Inter-GPS, Lu et al. 2021) to mmrl records scored by the geometry recipe's reward.

Geometry3k's published layout (github.com/lupantech/InterGPS, ``data/geometry3k``; the annotation tool's
``data_examples`` hold the same files): one folder per problem, ``<split>/<id>/``, holding ``data.json`` and the
diagram ``img_diagram.png``. The fields read from ``data.json``:

- ``problem_text``: the question ("Find x.");
- ``choices``: four option texts ("12", "13", ...);
- ``answer``: the correct option's letter ("B");
- ``id``, ``data_type`` (train / val / test), ``problem_type_graph`` and ``problem_type_goal`` (lists such as
  ``["Circle"]`` and ``["Length"]``), kept in the record's metadata.

Each problem becomes one record whose prompt lists the options ("Choices: A. 12 B. 13 ...") in the recipe's
``<think>/<answer>`` template, whose ``answer`` is the letter and whose ``metadata["choices"]`` are the option
texts, so ``mc_letter`` accepts the letter or the option's text. Images are copied beside the written file
(``images/geometry3k-<id>.png``) so the dataset can be moved as a whole. A bad problem folder raises
:class:`ConvertError` naming the folder and what to fix.

    python -m mmrl.recipes.geometry.convert /path/to/geometry3k/train recipes/geometry/data/geometry3k/train.jsonl
"""

from __future__ import annotations

import argparse
import json
import shutil
import string
from pathlib import Path
from typing import Any

from mmrl.recipes.geometry.data import PROMPT


class ConvertError(ValueError):
    pass


def _problem_dirs(root: Path) -> list[Path]:
    """The problem folders under ``root``: the folder itself when it holds a ``data.json``, else its sub-folders
    (a split folder such as ``train/``) or their sub-folders (the dataset root with ``train/``, ``val/``,
    ``test/``), in numeric order of their names."""
    if (root / "data.json").is_file():
        return [root]
    found = sorted(p.parent for p in root.glob("*/data.json")) or sorted(
        p.parent for p in root.glob("*/*/data.json")
    )
    if not found:
        raise ConvertError(
            f"{root}: no Geometry3k problem folders (<id>/data.json with img_diagram.png); point at the "
            "geometry3k folder or one of its train/val/test folders"
        )
    return sorted(found, key=lambda p: (str(p.parent), int(p.name) if p.name.isdigit() else p.name))


def convert_problem(folder: Path, images_dir: Path, rel_images: str = "images") -> dict[str, Any]:
    """One problem folder -> one mmrl record; its diagram is copied into ``images_dir``."""
    data_file = folder / "data.json"
    try:
        data = json.loads(data_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConvertError(
            f"{data_file}: not readable as JSON ({e}); re-extract the problem folder"
        ) from None
    missing = [k for k in ("problem_text", "choices", "answer") if k not in data]
    if missing:
        raise ConvertError(
            f"{data_file}: missing {', '.join(missing)} (Geometry3k's data.json has all three)"
        )
    choices = [str(c) for c in data["choices"]]
    letters = string.ascii_uppercase[: len(choices)]
    answer = str(data["answer"]).strip().upper()
    if not choices or answer not in letters:
        raise ConvertError(
            f"{data_file}: answer {data['answer']!r} is not a letter among the {len(choices)} choices "
            f"({', '.join(letters)}); Geometry3k stores the correct option's letter"
        )
    diagram = folder / "img_diagram.png"
    if not diagram.is_file():
        raise ConvertError(
            f"{folder}: img_diagram.png not found; each Geometry3k problem folder holds its diagram"
        )
    pid = str(data.get("id", folder.name))
    rid = f"geometry3k-{data.get('data_type', folder.parent.name)}-{pid}"
    images_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(diagram, images_dir / f"{rid}.png")
    options = " ".join(f"{letter}. {text}" for letter, text in zip(letters, choices))
    question = f"{str(data['problem_text']).strip()} Choices: {options}."
    return {
        "id": rid,
        "prompt": PROMPT.format(question=question),
        "images": [f"{rel_images}/{rid}.png"],
        "answer": answer,
        "metadata": {
            "kind": "geometry3k",
            "choices": choices,
            "source_id": pid,
            "problem_type_graph": data.get("problem_type_graph", []),
            "problem_type_goal": data.get("problem_type_goal", []),
        },
    }


def convert_geometry3k(src: str | Path, out_file: str | Path) -> Path:
    """Convert every problem folder under ``src`` into the JSONL file ``out_file`` (images in ``images/`` beside
    it); return the file's path."""
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    records = [convert_problem(d, out.parent / "images") for d in _problem_dirs(Path(src))]
    tmp = out.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(out)
    return out


def build_geometry3k(folder: str | Path) -> dict[str, Path]:
    """The GPU configs' ``data.builder``: convert the Geometry3k dataset unzipped into ``<folder>/raw/`` (its
    ``train/`` and ``test/`` problem folders, as InterGPS's ``data/unzip_data.sh`` leaves them) into
    ``train.jsonl`` and ``eval.jsonl`` (the 601 test problems). Nothing is downloaded: without ``raw/`` it says
    where to put the data."""
    root = Path(folder)
    raw = root / "raw"
    if not (raw / "train").is_dir() or not (raw / "test").is_dir():
        raise ConvertError(
            f"{raw}: Geometry3k not found; unzip it there (github.com/lupantech/InterGPS, data/geometry3k: "
            f"{raw}/train/<id>/data.json, {raw}/test/<id>/...) or point data.train/data.eval at converted files"
        )
    return {
        "train": convert_geometry3k(raw / "train", root / "train.jsonl"),
        "eval": convert_geometry3k(raw / "test", root / "eval.jsonl"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="geometry3k folder, a split folder, or one problem folder")
    ap.add_argument("out", type=Path, help="JSONL file to write (images go to images/ beside it)")
    args = ap.parse_args()
    path = convert_geometry3k(args.src, args.out)
    print(f"wrote {sum(1 for _ in path.open())} records to {path}")


if __name__ == "__main__":
    main()
