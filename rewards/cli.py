"""``mmrl reward``: score responses with one reward from the command line, to debug a reward or a recipe's data;
``mmrl reward serve`` runs a reward server.

    mmrl reward NAME --response FILE --reference FILE [--image FILE ...] [--option K=V ...] [--metadata FILE.json]
                [--render-dir DIR] [--json]
    mmrl reward NAME --batch FILE.jsonl [--option K=V ...] [--render-dir DIR] [--json]
    mmrl reward serve --rewards NAME[,NAME...] --port P --token-file F [--host 127.0.0.1] [--option NAME.K=V ...]
                [--workers 2] [--timeout-s 30] [--max-body-mb 64] [--max-image-mb 16] [--max-items 4096]
    mmrl reward remote --option urls=http://HOST:P[,...] --option reward=NAME --option token_file=F
                (--response FILE --reference FILE | --batch FILE.jsonl) [...]

NAME is a registered reward or ``path/to/file.py:function``. The reference file is read as JSON when it parses, else
as raw text (trailing newlines dropped); the response file is used verbatim. ``--option`` values are JSON when they
parse (``k=0.5`` -> 0.5, ``k=true`` -> True) else strings, and are checked against the reward's signature.
``--render-dir`` puts ``render_dir`` into the metadata so rendering rewards save their renders there.

Batch mode reads one ``{"id", "response", "reference", "images", "metadata"}`` object per line (images relative to
the file's folder, or absolute), scores all good lines in one call, and prints one result per line in order; a bad
line prints ``{"line": N, "error": ...}`` and the others are still scored.

Output: ``{"score": ..., "parts": {...}}`` (plus ``"error"`` when the reward raised; batch lines also carry ``"id"``).
Exit code: 0 on success, 2 on bad input (a clear message on stderr; in batch mode: any bad line), 1 when the reward
itself raised on some input.

``serve`` is a mode, not a reward: it serves the ``--rewards`` over HTTP (protocol, limits and auth in
:mod:`mmrl.rewards.server`) until SIGINT/SIGTERM, each reward's options given as ``--option NAME.KEY=VALUE``; a bad
token file, reward or option exits 2 before it binds. ``remote`` is the registered reward that sends the inputs to
such servers (:mod:`mmrl.rewards.remote`): the images given here travel inline, and ``--render-dir`` does not apply.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mmrl.extras import MissingExtra, require
from mmrl.types import RewardInput, RewardResult


class InputError(ValueError):
    pass


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "reward",
        help="score responses with one reward (debugging); `mmrl reward serve`: serve rewards over HTTP",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", help="registered reward name, path/to/file.py:function, or serve (run a server)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--response", type=Path, help="file holding one response")
    mode.add_argument("--batch", type=Path, help="JSONL file, one input object per line")
    p.add_argument("--reference", type=Path, help="file holding the reference (JSON or raw text)")
    p.add_argument(
        "--image", action="append", default=[], type=Path, help="an image of the sample (repeatable)"
    )
    p.add_argument(
        "--option", action="append", default=[], metavar="K=V", help="a reward option (repeatable)"
    )
    p.add_argument("--metadata", type=Path, help="JSON file with the sample's metadata")
    p.add_argument("--render-dir", type=Path, help="rendering rewards save their renders here")
    p.add_argument("--id", default="cli", help="sample id used in messages (single mode)")
    p.add_argument("--json", action="store_true", help="print JSON")
    s = p.add_argument_group("mmrl reward serve")
    s.add_argument("--rewards", help="comma-separated rewards to serve")
    s.add_argument("--port", type=int, help="port to listen on")
    s.add_argument("--token-file", help="file holding the shared token (chmod 600)")
    s.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    s.add_argument("--workers", type=int, default=2, help="worker processes per heavy reward (default 2)")
    s.add_argument("--timeout-s", type=float, default=30.0, help="per-item timeout of a heavy reward (30)")
    s.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body, MiB (64)")
    s.add_argument("--max-image-mb", type=float, default=16.0, help="largest image, MiB (16)")
    s.add_argument("--max-items", type=int, default=4096, help="most items in one request (4096)")
    p.set_defaults(fn=run)
    return p


def run(args: argparse.Namespace) -> int:
    from mmrl.rewards.base import call_reward

    if args.name == "serve":
        return _serve(args)
    try:
        if args.response is None and args.batch is None:
            raise InputError("give --response FILE (with --reference FILE) or --batch FILE.jsonl")
        spec, options = _load(args)
        if args.batch is not None:
            return _run_batch(args, spec, options)
        item = _single_input(args)
    except InputError as e:
        print(f"mmrl reward: {e}", file=sys.stderr)
        return 2
    result = call_reward(spec.fn, spec.name, [item], options)[0]
    _emit(result.to_json(), args.json)
    return 1 if result.error is not None else 0


def _serve(args: argparse.Namespace) -> int:
    missing = [f for f in ("rewards", "port", "token_file") if getattr(args, f) is None]
    try:
        if missing:
            raise InputError(f"serve needs --{missing[0].replace('_', '-')}")
        if args.response is not None or args.batch is not None:
            raise InputError("serve takes no --response or --batch (clients send the inputs)")
        options: dict[str, dict[str, Any]] = {}
        for text in args.option:
            key, value = _parse_option(text)
            name, dot, opt = key.rpartition(".")
            if not dot or not name:
                raise InputError(f"--option {text!r}: write it as REWARD.key=value when serving")
            options.setdefault(name, {})[opt] = value
        require("server", "", ("fastapi", "uvicorn"))  # an error naming the extra, not a traceback
        from mmrl.rewards.server import Limits, serve

        mib = 1 << 20
        limits = Limits(int(args.max_body_mb * mib), int(args.max_image_mb * mib), args.max_items)
        rewards = [r.strip() for r in args.rewards.split(",") if r.strip()]
        return serve(
            rewards,
            token_file=args.token_file,
            port=args.port,
            host=args.host,
            options=options,
            workers=args.workers,
            timeout_s=args.timeout_s,
            limits=limits,
        )
    except (InputError, ValueError, MissingExtra) as e:
        print(f"mmrl reward serve: {e}", file=sys.stderr)
        return 2


def _load(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    from mmrl.rewards.base import describe_exception, load_reward, validate_options

    try:
        spec = load_reward(args.name)
    except KeyError as e:
        raise InputError(e.args[0]) from None
    except MissingExtra as e:  # a built-in reward's optional package
        raise InputError(str(e)) from None
    except Exception as e:  # the user's reward file failed to import: report it as bad input
        raise InputError(f"cannot load reward {args.name!r}: {describe_exception(e)}") from None
    options = dict(_parse_option(o) for o in args.option)
    try:
        validate_options(spec, options)
    except (TypeError, ValueError) as e:
        raise InputError(str(e)) from None
    return spec, options


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise InputError(f"--option {text!r}: write it as key=value")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read {what} file {path}: {e.strerror or e}") from None


def _metadata(path: Path | None, render_dir: Path | None) -> dict[str, Any]:
    meta: Any = {}
    if path is not None:
        try:
            meta = json.loads(_read(path, "metadata"))
        except json.JSONDecodeError as e:
            raise InputError(f"metadata file {path} is not valid JSON: {e}") from None
        if not isinstance(meta, dict):
            raise InputError(f"metadata file {path} must hold a JSON object, got {type(meta).__name__}")
    return _with_render_dir(meta, render_dir)


def _with_render_dir(meta: dict[str, Any], render_dir: Path | None) -> dict[str, Any]:
    if render_dir is not None:
        render_dir.mkdir(parents=True, exist_ok=True)
        meta = {**meta, "render_dir": str(render_dir)}
    return meta


def _single_input(args: argparse.Namespace) -> RewardInput:
    if args.reference is None:
        raise InputError("--reference FILE is required with --response")
    text = _read(args.reference, "reference")
    try:
        reference = json.loads(text)
    except json.JSONDecodeError:
        reference = text.rstrip("\n")
    missing = [str(p) for p in args.image if not p.is_file()]
    if missing:
        raise InputError(f"image file not found: {', '.join(missing)}")
    return RewardInput(
        id=args.id,
        response=_read(args.response, "response"),
        reference=reference,
        images=[str(p) for p in args.image],
        metadata=_metadata(args.metadata, args.render_dir),
    )


def _batch_line(raw: str, lineno: int, base: Path, render_dir: Path | None) -> RewardInput:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InputError(f"line {lineno}: invalid JSON: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("response"), str):
        raise InputError(f"line {lineno}: need an object with a string 'response'")
    images, meta = obj.get("images") or [], obj.get("metadata") or {}
    if not isinstance(images, list) or not isinstance(meta, dict):
        raise InputError(f"line {lineno}: 'images' must be a list of paths and 'metadata' an object")
    paths = [p if Path(p).is_absolute() else str(base / p) for p in map(str, images)]
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise InputError(
            f"line {lineno}: image file not found: {', '.join(missing)} (paths resolve against the file's folder)"
        )
    return RewardInput(
        id=str(obj.get("id", f"line{lineno}")),
        response=obj["response"],
        reference=obj.get("reference"),
        images=paths,
        metadata=_with_render_dir(meta, render_dir),
    )


def _run_batch(args: argparse.Namespace, spec: Any, options: dict[str, Any]) -> int:
    from mmrl.rewards.base import call_reward

    lines = _read(args.batch, "batch").splitlines()
    rows: list[tuple[int, RewardInput | str]] = []
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rows.append((lineno, _batch_line(raw, lineno, args.batch.parent, args.render_dir)))
        except InputError as e:
            rows.append((lineno, str(e)))
    good = [x for _, x in rows if isinstance(x, RewardInput)]
    results: list[RewardResult] = call_reward(spec.fn, spec.name, good, options) if good else []
    it = iter(results)
    bad = raised = False
    for lineno, x in rows:
        if isinstance(x, str):
            bad = True
            _emit({"line": lineno, "error": x}, args.json)
            continue
        r = next(it)
        raised |= r.error is not None
        _emit({"id": x.id, **r.to_json()}, args.json)
    return 2 if bad else (1 if raised else 0)


def _emit(obj: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj, ensure_ascii=False), flush=True)
        return
    head = " ".join(f"{k}={obj[k]}" for k in ("line", "id", "score", "error") if k in obj)
    parts = " ".join(f"{k}={v:g}" for k, v in obj.get("parts", {}).items())
    print(f"{head}  {parts}".rstrip(), flush=True)
