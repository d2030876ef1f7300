"""Can a tiny base model learn which tile a colour word names on a gui_agent panel? (issue 20: why the tiny GUI
agent recipe did not learn.) The panel counterpart of ``grounding_probe.py``.

Supervised, single-turn, from ``--model``: a screen of a ``panel`` app (:mod:`mmrl.recipes.gui_agent.apps`) drawn
by the ``browser_app`` env in the sandboxed Chromium, the task's prompt (``PROMPT`` of
:mod:`mmrl.recipes.gui_agent.data`), and as the answer the oracle's next click written as the model writes it (its
own coordinate frame, :mod:`mmrl.model.geometry`). ``--at first``: the first screen; ``--at any``: the screen after a
random number of the oracle's presses (the header's trail then says how far the task is). The model trains on
``--n`` records (AdamW, batch 32) and is scored every 100 steps on 200 held-out apps by picking the likeliest of the
screen's candidate clicks (the centre of every tile and of Done, measured in the page): chance is 1 / (tiles + 1),
about 0.18. ``--kind panel_cue``: the page marks the next control (the tiny recipe's world). Last line: ``<model> <kind> <at> @<pixels>px: held-out accuracy X at step N (best Y at step M)``.

    OMP_NUM_THREADS=1 python benchmarks/panel_probe.py --model assets/tiny-qwen2.5-vl --pixels 9408
    OMP_NUM_THREADS=1 python benchmarks/panel_probe.py --model assets/tiny-qwen3_vl --pixels 12288
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from probe_loop import train_probe, training_options

from mmrl.config import ModelConfig
from mmrl.envs.browser import _MEASURE_JS, BrowserAppEnv, action_response, close_shared_browser
from mmrl.model.checkpoint_files import ModelView
from mmrl.model.policy import Policy
from mmrl.recipes.gui_agent.apps import COLOURS
from mmrl.recipes.gui_agent.data import PROMPT, VIEWPORT
from mmrl.types import Sample


def panel_records(
    n: int, seed: int, at: str, work: Path, kind: str = "panel"
) -> list[tuple[str, str, list[list[int]], int]]:
    """``n`` records ``(image, instruction, candidate points in page pixels, index of the oracle's)``."""
    rng, out = random.Random(seed), []
    for i in range(n):
        env = BrowserAppEnv(workdir=work / f"e{i}", max_steps=20, check_first_image=False)
        try:
            sample = Sample(f"p{i}", [], metadata={"app": kind, "seed": seed * 1_000_000 + i})
            obs = env.reset(sample)
            shot = obs.images[0]
            k = 0 if at == "first" else rng.randint(0, len(env.app.goal["pressed"]))
            for _ in range(k):
                action = env.oracle_action()
                if action is None:
                    break
                res = env.step(action_response(action, "original_pixels", VIEWPORT, VIEWPORT))
                if res.done:
                    break
                shot = res.observation.images[0]
            action = env.oracle_action()
            if action is None or action["action"] != "click":
                continue
            points = []
            for ui in [f"tile-{c}" for c in sorted(COLOURS)] + ["done"]:
                where = env.page.evaluate(_MEASURE_JS, ui)
                if where is not None:
                    points.append([round(where["x"]), round(where["y"])])
            label = points.index(list(action["coordinate"]))
            keep = work / f"r{i}.png"
            keep.write_bytes(Path(shot).read_bytes())
            out.append((str(keep), env.app.instruction, points, label))
        finally:
            env.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="assets/tiny-qwen2.5-vl")
    ap.add_argument("--pixels", type=int, default=9408, help="max_pixels (min_pixels 3136)")
    ap.add_argument("--at", choices=("first", "any"), default="first")
    ap.add_argument(
        "--kind", choices=("panel", "panel_cue"), default="panel", help="panel_cue: the next control marked"
    )
    args = training_options(ap)
    policy = Policy.from_pretrained(ModelConfig(path=args.model, min_pixels=3136, max_pixels=args.pixels))
    view, tok = ModelView.of_model(policy.cfg), policy.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    work = Path(tempfile.mkdtemp(prefix="panel-probe-"))
    t0 = time.time()
    raw = panel_records(args.n + 200, args.seed, args.at, work, args.kind)
    close_shared_browser()
    print(f"{len(raw)} records in {time.time() - t0:.0f} s", flush=True)
    model_size = view.model_size(*VIEWPORT)

    def answer(point: list[int]) -> list[int]:
        text = action_response({"action": "click", "coordinate": point}, view.frame, VIEWPORT, model_size)
        return tok(text, add_special_tokens=False)["input_ids"] + [end]

    records = []
    for i, (image, instruction, points, label) in enumerate(raw):
        content = [{"type": "image"}, {"type": "text", "text": PROMPT.format(instruction=instruction)[7:]}]
        enc = policy.encode(Sample(str(i), [{"role": "user", "content": content}], images=[image]))
        records.append((enc, [answer(p) for p in points], label))
    train, held = records[: len(records) - 200], records[len(records) - 200 :]
    chance = sum(1 / len(c) for _, c, _ in held) / len(held)
    print(f"chance {chance:.3f}", flush=True)
    acc, best = train_probe(policy, train, held, args.steps, args.lr, t0)
    print(
        f"{Path(args.model).name} {args.kind} {args.at} @{args.pixels}px: held-out accuracy {acc:.3f} at step "
        f"{args.steps} (best {best[0]:.3f} at step {best[1]}; chance {chance:.3f})"
    )


if __name__ == "__main__":
    main()
