"""Can a tiny base model learn *where* something is, or only *what* it is? (issue 20: why the tiny GUI and zoom
recipes did not learn from the tiny Qwen2.5-VL.)

Supervised, single-turn, from the base checkpoint: a scene of the zoom recipe's world (``recipes/zoom/data.py``)
and one of two questions with four answers each, written as the model would write them:
- ``where``: the quadrant that holds the red box, as the zoom call on it (``zoom(0, 0, 500, 500)`` ... in the
  model's own coordinate frame, from :mod:`mmrl.model.geometry`), the decision a zoom or a click needs;
- ``colour``: the colour of the dot in the red box (green, blue, yellow, white), on the whole scene (``--view
  scene``) or on the crop of the box's quadrant (``--view quadrant``), what the zoom's crop is for.

The model trains on ``--n`` records (AdamW, batch 32) and is scored every 100 steps on 200 held-out records by
picking the likeliest of the four answers (chance 0.25 up to the answers' balance). Last line:
``<model> <question> <view> @<pixels>px: held-out accuracy X at step N (best Y at step M)``.

    OMP_NUM_THREADS=1 python benchmarks/grounding_probe.py --model assets/tiny-qwen2.5-vl --pixels 3136 --question where
    OMP_NUM_THREADS=1 python benchmarks/grounding_probe.py --model assets/tiny-qwen3_vl --pixels 4096 --question where

``--scene``: ``mark`` (:func:`build_mark`'s: one red box among clutter, the tiny recipe's), ``marks`` (:func:
`build_marks`'s: look-alike boxes of other fills too) or ``plain`` (the red box alone on a plain background).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from PIL import Image
from probe_loop import train_probe, training_options

from mmrl.config import ModelConfig
from mmrl.model.checkpoint_files import ModelView
from mmrl.model.policy import Policy
from mmrl.recipes.zoom.data import MARK, MARK_COLOURS, make_marks_image
from mmrl.types import Sample

COLOURS = sorted(MARK_COLOURS)


def scene(rng: random.Random, kind: str, dot: int, box: int, grid: int) -> tuple[Image.Image, str, list[int]]:
    style = replace(MARK, mark_dot=dot, mark_box=box, mark_cells=grid)
    if kind == "plain":
        style = replace(style, clutter=(0, 0))
    return make_marks_image(rng, style)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="assets/tiny-qwen3_vl")
    ap.add_argument("--pixels", type=int, default=4096, help="min_pixels = max_pixels")
    ap.add_argument("--question", choices=("where", "colour"), default="where")
    ap.add_argument("--view", choices=("scene", "cell"), default="scene")
    ap.add_argument("--grid", type=int, default=3, help="the box lies in one cell of a grid x grid split")
    ap.add_argument("--box", type=int, default=MARK.mark_box)
    ap.add_argument("--scene", choices=("mark", "plain"), default="mark")
    ap.add_argument("--dot", type=int, default=MARK.mark_dot)
    args = training_options(ap)
    policy = Policy.from_pretrained(
        ModelConfig(path=args.model, min_pixels=args.pixels, max_pixels=args.pixels)
    )
    view, tok = ModelView.of_model(policy.cfg), policy.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="grounding-probe-"))
    c = 336 // args.grid
    cells = [(x * c, y * c, x * c + c, y * c + c) for y in range(args.grid) for x in range(args.grid)]

    def zoom_text(q: tuple[int, int, int, int]) -> str:
        corners = (*view.to_frame(q[0], q[1], 336, 336), *view.to_frame(q[2], q[3], 336, 336))
        return "zoom({}, {}, {}, {})".format(*(round(v) for v in corners))

    answers = [zoom_text(q) for q in cells] if args.question == "where" else COLOURS
    question = (
        "Where is the red box?" if args.question == "where" else "What colour is the dot in the red box?"
    )
    records = []
    for i in range(args.n + 200):
        img, colour, box = scene(rng, args.scene, args.dot, args.box, args.grid)
        q = int((box[0] + box[2]) / 2 // c) + args.grid * int((box[1] + box[3]) / 2 // c)
        if args.view == "cell":
            img = img.crop(cells[q])
        path = tmp / f"{i}.png"
        img.save(path)
        content = [{"type": "image"}, {"type": "text", "text": question}]
        sample = Sample(str(i), [{"role": "user", "content": content}], images=[str(path)])
        records.append((policy.encode(sample), q if args.question == "where" else COLOURS.index(colour)))
    targets = [tok(a, add_special_tokens=False)["input_ids"] + [end] for a in answers]
    records = [(enc, targets, label) for enc, label in records]
    acc, best = train_probe(policy, records[: args.n], records[args.n :], args.steps, args.lr, time.time())
    print(
        f"{Path(args.model).name} {args.question} {args.view} @{args.pixels}px ({args.scene} scenes, dot {args.dot}): "
        f"held-out accuracy {acc:.3f} at step {args.steps} (best {best[0]:.3f} at step {best[1]})"
    )


if __name__ == "__main__":
    main()
