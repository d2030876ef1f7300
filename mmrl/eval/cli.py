"""The ``mmrl eval`` and ``mmrl compare`` subcommands (registered by ``mmrl.cli`` through :func:`add_parsers`).

mmrl eval --model PATH --benchmark NAME --data PATH --output-dir DIR [--limit N] [--samples K]
          [--engine hf|vllm] [--batch-size B] [--predictions FILE] [key=value ...]
mmrl compare DIR_A DIR_B [--resamples N] [--seed S] [--output FILE]

Errors in the inputs print one line, ``error: ...``, and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _fail(e: Exception) -> int:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2


def _cmd_eval(args: argparse.Namespace) -> int:
    from mmrl.config import ConfigError
    from mmrl.eval.base import EvalError
    from mmrl.eval.runner import EvalRequest, run_eval
    from mmrl.processors.errors import MediaError

    req = EvalRequest(
        benchmark=args.benchmark,
        data=args.data,
        output_dir=args.output_dir,
        model=args.model,
        predictions=args.predictions,
        limit=args.limit,
        samples=args.samples,
        engine=args.engine,
        batch_size=args.batch_size,
        overrides=list(args.overrides),
        progress=not args.no_progress,
    )
    try:
        m = run_eval(req)
    except (EvalError, ConfigError, MediaError) as e:
        return _fail(e)
    extra = "".join(f"  {k} {v:.4f}" for k, v in (m.get("pass@k", {}) | m.get("summary", {})).items())
    print(f"{m['benchmark']}: accuracy {m['accuracy']:.4f} on {m['items']} items{extra}")
    print(f"wrote {Path(args.output_dir) / 'metrics.md'}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from mmrl.eval.base import EvalError
    from mmrl.eval.compare import compare, markdown_table

    if args.resamples < 100:
        return _fail(ValueError(f"--resamples must be at least 100, got {args.resamples}"))
    try:
        results = compare(Path(args.dir_a), Path(args.dir_b), args.resamples, args.seed)
    except (EvalError, OSError, ValueError) as e:
        return _fail(e)
    table = markdown_table(results, Path(args.dir_a), Path(args.dir_b))
    print(table, end="")
    if args.output:
        Path(args.output).write_text(table)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from mmrl.eval.base import FAMILIES

    e = sub.add_parser("eval", help="score a model (or a prediction file) on a benchmark")
    e.add_argument("--model", help="HF model folder or hub id to generate with")
    e.add_argument("--benchmark", required=True, help=f"one of: {', '.join(FAMILIES)}")
    e.add_argument(
        "--data", required=True, help="the benchmark's data file or folder, in its published layout"
    )
    e.add_argument(
        "--output-dir", required=True, help="predictions.jsonl, metrics.json/.md and plots go here"
    )
    e.add_argument("--limit", type=int, help="score only the first N items")
    e.add_argument(
        "--samples", type=int, default=1, help="responses per item (K > 1 gives pass@k and mean@k)"
    )
    e.add_argument("--engine", default="hf", help="rollout engine: hf or vllm")
    e.add_argument("--batch-size", type=int, default=8, help="items generated together")
    e.add_argument(
        "--predictions", help="score this prediction file (the benchmark's format) instead of a model"
    )
    e.add_argument("--no-progress", action="store_true", help="no progress bar")
    e.add_argument(
        "overrides",
        nargs="*",
        help="settings: temperature=, top_p=, top_k=, max_new_tokens=, seed=, system_prompt=, model fields "
        "(dtype=, device=, max_pixels=, ...) and the benchmark's options (e.g. coords=normalized_1000; an env "
        "benchmark's max_turns=, env_options=, env_workers=, ...)",
    )
    e.set_defaults(fn=_cmd_eval)
    c = sub.add_parser(
        "compare", help="per-benchmark deltas between two evaluations, with bootstrap intervals"
    )
    c.add_argument("dir_a")
    c.add_argument("dir_b")
    c.add_argument("--resamples", type=int, default=10_000, help="paired bootstrap resamples")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--output", help="also write the markdown table to this file")
    c.set_defaults(fn=_cmd_compare)
