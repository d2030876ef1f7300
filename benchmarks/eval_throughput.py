"""Items per second of ``mmrl eval`` on the bundled tiny Qwen2.5-VL: the HF engine batched, the HF engine one item
at a time (what a plain per-item ``model.generate`` loop does: the peer), and the vLLM engine when it can be
imported (its own environment, ``.venv-vllm``).

The items are the MathVista fixture's six records (tests/data/eval/mathvista, images 160x120) repeated under new
ids to ``--items``; every run generates ``--max-new-tokens`` greedy tokens per item (the random tiny model rarely
stops early) and scores them with MathVista's scorer, exactly what ``mmrl eval`` does. Items/s is the evaluation
loop's own rate (encode, generate, score, write), read from ``metrics.json``; loading the model is not counted.
After one untimed warm-up run per configuration, each runs ``--rounds`` times in a fresh output folder,
alternating the order, and the median is reported.

    OMP_NUM_THREADS=1 python benchmarks/eval_throughput.py [--items 48 --batch-size 16 --max-new-tokens 32]

The last line is ``items/s: hf X vllm Y`` (``vllm n/a`` where vLLM is not importable).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
from pathlib import Path

from mmrl.eval.runner import EvalRequest, run_eval

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "data" / "eval" / "mathvista"


def build_items(folder: Path, n: int) -> Path:
    """A MathVista-layout testmini.json with ``n`` records (the fixture's, cycled under new pids)."""
    records = list(json.loads((FIXTURE / "testmini.json").read_text()).values())
    out = {}
    for i in range(n):
        rec = dict(records[i % len(records)])
        rec["pid"] = str(i)
        rec["image"] = str(FIXTURE / rec["image"])
        out[str(i)] = rec
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "testmini.json"
    path.write_text(json.dumps(out))
    return path


def items_per_second(data: Path, out: Path, engine: str, batch_size: int, args: argparse.Namespace) -> float:
    req = EvalRequest(
        benchmark="mathvista",
        data=str(data),
        output_dir=str(out),
        model=str(REPO / "assets" / "tiny-qwen2.5-vl"),
        engine=engine,
        batch_size=batch_size,
        overrides=[f"max_new_tokens={args.max_new_tokens}", f"device={args.device}", "max_pixels=50176"],
        progress=False,
    )
    return run_eval(req)["throughput"]["items_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    has_vllm = importlib.util.find_spec("vllm") is not None
    configs = {"hf": ("hf", args.batch_size), "hf-unbatched": ("hf", 1)}
    if has_vllm:
        configs["vllm"] = ("vllm", args.batch_size)
    rates: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        data = build_items(Path(tmp), args.items)
        for name, (engine, bs) in configs.items():  # warm-up: first-call imports and kernel set-up, not timed
            items_per_second(
                build_items(Path(tmp) / "warm", bs), Path(tmp) / f"warm-{name}", engine, bs, args
            )
        for r in range(args.rounds):
            order = list(configs) if r % 2 == 0 else list(reversed(configs))
            for name in order:
                engine, bs = configs[name]
                rate = items_per_second(data, Path(tmp) / f"{name}-{r}", engine, bs, args)
                rates[name].append(rate)
                print(f"round {r} {name:13s} batch {bs:3d}: {rate:7.2f} items/s", flush=True)
    med = {name: statistics.median(v) for name, v in rates.items()}
    print(
        f"{args.items} items, {args.max_new_tokens} new tokens each, tiny Qwen2.5-VL on {args.device}: "
        f"batched HF / unbatched HF = {med['hf'] / med['hf-unbatched']:.2f}x"
    )
    vllm = f"{med['vllm']:.2f}" if has_vllm else "n/a"
    print(f"items/s: hf {med['hf']:.2f} vllm {vllm}")


if __name__ == "__main__":
    main()
