"""The ``mmrl`` command line.

mmrl train CONFIG --output-dir DIR [--max-steps N] [--resume | --overwrite] [--force] [key=value ...]
mmrl plan CONFIG [--gpus N] [--nodes M] [--gpu-memory GiB] [--model-config DIR] [key=value ...]
mmrl sft CONFIG --output-dir DIR [key=value ...]
mmrl eval --model PATH --benchmark NAME --data PATH --output-dir DIR [...]   (see ``mmrl eval --help``)
mmrl compare DIR_A DIR_B
mmrl report RUN_DIR
mmrl list
mmrl reward NAME ...            (see ``mmrl reward --help``)
mmrl reward serve --rewards NAMES --port P --token-file F [--host H] [...]   (a reward server)
mmrl build-tiny [--family NAME] [--out DIR] [--seed N]
mmrl info
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _exit_cleanly_on_sigterm() -> None:
    """SIGTERM (a batch scheduler's stop, ``kill PID``) raises SystemExit in the main thread instead of ending the
    process at once, so the trainer's ``finally`` closes the reward worker pool (else its forkserver and workers
    outlive the run) and the logs; the last checkpoint is what ``--resume`` continues from."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _cmd_train(args: argparse.Namespace) -> int:
    from mmrl.config import load_config
    from mmrl.train.checks import check_rewards

    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    cfg = load_config(args.config, overrides)
    check_rewards(cfg)  # the most common mistake, answered before torch is imported
    from mmrl.plan.preflight import preflight

    preflight(cfg, force=args.force)  # a GPU run that cannot fit is refused before any model loads

    from mmrl.run.report import write_report
    from mmrl.run.rundir import RunFinished
    from mmrl.train.trainer import Trainer

    dist = None
    if cfg.rollout.placement == "separate":  # the last processes generate (docs/async.md#separate-placement)
        from mmrl.distributed import Dist
        from mmrl.train.checks import check_config

        check_config(cfg)
        dist = Dist(cfg.train.dist_timeout_s, rollout_processes=cfg.rollout.rollout_processes)
        if dist.generates:
            return _generate(cfg, args, dist)
    try:
        trainer = Trainer(cfg, args.output_dir, resume=args.resume, overwrite=args.overwrite, dist=dist)
    except RunFinished as e:
        print(f"{e}: nothing to do")
        return 0
    _exit_cleanly_on_sigterm()  # a scheduler's kill stops the run through fit's cleanup (reward workers, logs)
    try:
        trainer.fit()
    except (
        BaseException
    ) as e:  # a launched rank ends here: its error first, the lost peers named, no hang at exit
        trainer.dist.fail(e, brief=isinstance(e, _user_errors()))
        raise
    trainer.close()  # every rank done: engine down, then leave the process group together (not at exit)
    if trainer.dist.is_main:
        summary = write_report(args.output_dir)
        if "start_accuracy" in summary:
            print(
                f"held-out accuracy: start {summary['start_accuracy']:.3f} -> final {summary['final_accuracy']:.3f}"
            )
        print(f"report: {summary['html']}  {summary['markdown']}  plot: {summary['plot']}")
    trainer.dist.exit(0)  # a launched rank ends here, without the interpreter's teardown (Dist.exit says why)
    return 0


def _generate(cfg: Any, args: argparse.Namespace, dist: Any) -> int:
    """A generating process of a separate placement: it serves the trainers' batches until they stop it."""
    from mmrl.train.placement import serve

    _exit_cleanly_on_sigterm()
    try:
        serve(cfg, Path(args.output_dir), dist)
    except BaseException as e:
        dist.fail(e, brief=isinstance(e, _user_errors()))
        raise
    dist.exit(0)
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from mmrl.config import load_config
    from mmrl.plan.planner import PlanOptions, plan_run
    from mmrl.plan.report import format_plan

    cfg = load_config(args.config, list(args.overrides))
    opts = PlanOptions(
        gpus=args.gpus,
        nodes=args.nodes,
        gpu_memory_gib=args.gpu_memory,
        model_config=args.model_config,
        text_tokens=args.text_tokens,
        images=args.images,
        videos=args.videos,
    )
    p = plan_run(cfg, opts)
    print(format_plan(p, args.config))
    return 0 if p.fits else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from mmrl.run.report import write_report

    summary = write_report(args.run_dir, gallery_steps=args.steps)
    print(f"report: {summary['html']}  {summary['markdown']}")
    print(f"plots: {summary['plot']} {' '.join(summary['plots'])}")
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    from mmrl.config import load_config
    from mmrl.train.sft import run_sft

    cfg = load_config(args.config, list(args.overrides))
    path = run_sft(cfg, args.output_dir)
    print(f"saved warm-started model: {path}")
    return 0


def _cmd_build_tiny(args: argparse.Namespace) -> int:
    from mmrl.tiny.build import FAMILIES, build_tiny

    if args.family not in FAMILIES:
        print(f"error: unknown family {args.family!r}; choose one of {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    print(f"built {build_tiny(args.out, seed=args.seed, family=args.family)}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    import importlib.metadata as md
    import platform
    import shutil

    print(f"mmrl {md.version('mmrl')}  python {platform.python_version()}")
    for pkg in (
        "torch",
        "transformers",
        "accelerate",
        "qwen-vl-utils",
        "vllm",
        "decord",
        "playwright",
        "math-verify",
    ):
        try:
            print(f"  {pkg:14s} {md.version(pkg)}")
        except md.PackageNotFoundError:
            print(f"  {pkg:14s} not installed")
    import torch

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    print(f"  GPU            {', '.join(gpus) if gpus else 'none (CPU only)'}")
    for tool in ("pdflatex", "pdftoppm", "chromium"):
        print(f"  {tool:14s} {shutil.which(tool) or 'missing'}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from mmrl.algos import (
        ADVANTAGES,
        AGGREGATIONS,
        KL_ESTIMATORS,
        LOSSES,
        REWARD_CORRECTIONS,
        ROLLOUT_CORRECTIONS,
    )
    from mmrl.presets import PRESETS
    from mmrl.rewards.base import REWARDS
    from mmrl.rollout import ENGINES
    from mmrl.run.trackers import TRACKERS
    from mmrl.samplers import SAMPLERS
    from mmrl.train.augment import AUGMENTERS
    from mmrl.train.hints import HINTS

    rows = {
        "presets (algo.preset)": sorted(PRESETS),
        "advantage estimators (algo.advantage)": ADVANTAGES.names(),
        "policy losses (algo.loss)": LOSSES.names(),
        "loss aggregations (algo.loss_agg)": AGGREGATIONS.names(),
        "KL estimators (algo.kl_estimator)": KL_ESTIMATORS.names(),
        "reward corrections (algo.reward_correction)": REWARD_CORRECTIONS.names(),
        "rollout corrections (algo.rollout_correction)": ROLLOUT_CORRECTIONS.names(),
        "batch augmenters (algo.augment)": AUGMENTERS.names(),
        "hint builders (algo.augment_options.hints)": HINTS.names(),
        "rewards (rewards[].name)": REWARDS.names(),
        "samplers (sampler.name)": SAMPLERS.names(),
        "rollout engines (rollout.engine)": ENGINES.names(),
        "experiment trackers (train.trackers)": TRACKERS.names(),
    }
    for title, names in rows.items():
        print(f"{title}: {', '.join(names)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from mmrl.rewards import cli as reward_cli

    p = argparse.ArgumentParser(prog="mmrl", description="RL post-training for vision-language models")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a policy with a recipe config")
    t.add_argument("config")
    t.add_argument("--output-dir", required=True)
    t.add_argument("--max-steps", type=int)
    t.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint in DIR")
    t.add_argument("--overwrite", action="store_true", help="replace the run already in DIR (its files only)")
    t.add_argument("--force", action="store_true", help="start a GPU run the memory plan says cannot fit")
    t.add_argument("overrides", nargs="*", help="config overrides: key.sub=value")
    t.set_defaults(fn=_cmd_train)
    _add_plan_parser(sub)
    s = sub.add_parser("sft", help="supervised warm start on a recipe's records")
    s.add_argument("config")
    s.add_argument("--output-dir", required=True)
    s.add_argument("overrides", nargs="*")
    s.set_defaults(fn=_cmd_sft)
    b = sub.add_parser("build-tiny", help="build the bundled tiny Qwen2.5-VL, or a tiny model of --family")
    b.add_argument(
        "--family",
        default="qwen2_5_vl",
        help="qwen2_5_vl (bundled), qwen3_vl, qwen3_vl_moe, qwen3_5, qwen3_5_moe or gemma3 (mmrl.tiny.build.FAMILIES)",
    )
    b.add_argument("--out", default=None, help="default: assets/tiny-qwen2.5-vl, or assets/tiny-<family>")
    b.add_argument("--seed", type=int, default=0)
    b.set_defaults(fn=_cmd_build_tiny)
    ls = sub.add_parser("list", help="registered presets, algorithms, losses, rewards, samplers and engines")
    ls.set_defaults(fn=_cmd_list)
    r = sub.add_parser("report", help="plots, report.md and report.html (rollout gallery) of a run directory")
    r.add_argument("run_dir")
    r.add_argument("--steps", type=int, default=4, help="latest logged steps shown in the gallery")
    r.set_defaults(fn=_cmd_report)
    i = sub.add_parser("info", help="versions, GPU, TeX and Chromium")
    i.set_defaults(fn=_cmd_info)
    reward_cli.add_parser(sub)
    from mmrl.eval.cli import add_parsers as add_eval_parsers  # mmrl eval, mmrl compare

    add_eval_parsers(sub)
    return p


def _add_plan_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="memory per GPU of a run, stage by stage, its peak, and the cheapest change that fits (exit 1 if not)",
    )
    p.add_argument("config")
    p.add_argument("--gpus", type=int, help="GPUs per node (default: the config's hardware section, else 1)")
    p.add_argument("--nodes", type=int, help="nodes (default: the config's hardware section, else 1)")
    p.add_argument("--gpu-memory", type=float, help="GiB per GPU (default: the config's hardware, else 80)")
    p.add_argument("--model-config", help="folder with the checkpoint's config.json (a hub id not here)")
    p.add_argument("--text-tokens", type=int, help="text tokens of the longest prompt (default 256)")
    p.add_argument("--images", type=int, help="images per prompt (default: as in data.train, else 1)")
    p.add_argument("--videos", type=int, help="videos per prompt (default: as in data.train, else 0)")
    p.add_argument("overrides", nargs="*", help="config overrides: key.sub=value")
    p.set_defaults(fn=_cmd_plan)


def _user_errors() -> tuple[type[Exception], ...]:
    """The errors that name a record, a setting or a file and their fix: printed as one line, exit code 2."""
    from mmrl.config import ConfigError
    from mmrl.data import DataError
    from mmrl.eval.base import EvalError
    from mmrl.processors.errors import MediaError

    return (ConfigError, DataError, MediaError, EvalError, FileNotFoundError)


def main(argv: list[str] | None = None) -> int:

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    bad = [x for x in extra if "=" not in x or x.startswith("-")]
    if bad or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(bad or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]  # key=value overrides may follow --options
    try:
        return int(args.fn(args) or 0)
    except _user_errors() as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
