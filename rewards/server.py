"""``mmrl reward serve``: registered rewards behind HTTP, for rewards that need a model or a farm of machines.

    mmrl reward serve --rewards latex_table,exact_match --port 8790 --token-file ~/.mmrl/reward.token
        [--host 127.0.0.1] [--option latex_table.scheme=continuous ...] [--workers 2] [--timeout-s 30]
        [--max-body-mb 64] [--max-image-mb 16] [--max-items 4096]

The client is the ``remote`` reward (:mod:`mmrl.rewards.remote`). FastAPI on uvicorn, one process: the parallelism is
the rewards' own. Each served reward is a :class:`~mmrl.rewards.compose.CompositeReward` of that one reward, the
trainer's path: a heavy (rendering) reward runs in a pool of ``--workers`` processes with a per-item timeout of
``--timeout-s``, inside the rendering sandbox (a heavy reward without the sandbox's confinement refuses to start, as
``mmrl train`` does), and results are cached. A reward's options are fixed when the server starts (``--option
NAME.KEY=VALUE``); a request naming other options for it is refused (400), so a run never gets scores made under
options it did not ask for.

``GET /health`` -> ``{"status": "ok"}``, without a token: anything may probe liveness, and the answer says nothing
about the configuration (no reward names, versions or paths; the OpenAPI pages are off).

``POST /score`` with ``Authorization: Bearer <token>``::

    {"options": {"latex_table": {"scheme": "continuous"}},          # optional: per reward, checked as above
     "images": {"<sha256 hex>": "<base64 of PNG or JPEG bytes>"},   # each distinct image once
     "items": [{"id": "0", "reward": "latex_table", "response": "...", "reference": ..., "prompt": "",
                "images": ["<sha256 hex>"], "metadata": {...}, "sample_id": "tbl-0042"}]}
    -> {"results": [{"id": "0", "score": 1.0, "parts": {"compile": 1.0, ...}, "error": null}]}

Results are in the items' order, one per id (ids must be unique in a request); ``score`` is null when the reward does
not apply; ``parts`` are the reward's own; ``error`` is set when it raised or timed out (the score is then 0). An item
with a bad image (not valid base64, not PNG or JPEG by its signature, larger than ``--max-image-mb``, or not matching
its SHA-256 key) scores 0 with an error and the others are scored. Items run under their ``sample_id``.

Batching: a request is a batch, and requests that arrive while one is being scored are merged. One scoring thread
takes everything queued, scores each reward's items of all those requests in one composite call (a pool's workers
all busy, latex_table's TeX runs batched), and hands every request its own results; different rewards run one after
the other. A request waits at most for the batch in progress.

Limits: a body over ``--max-body-mb`` gets 413 before it is parsed (a declared ``Content-Length`` over the limit is
refused unread; a body without one is read until it passes the limit); more than ``--max-items`` items get 413 too
(the ``remote`` reward splits the chunk and sends the halves).

Auth: the token file must be private (no group or other permission bits, ``chmod 600``) and hold at least 16
characters, or the server refuses to start; tokens are compared with :func:`hmac.compare_digest`. A missing (or
non-Bearer) ``Authorization`` header gets 401, a wrong token 403. The token is never logged: uvicorn's access log is
off, and one line per scored batch is logged instead.

Untrusted input: images are written to a private temporary folder under their SHA-256 and removed as soon as no
request in flight uses them; ``render_dir`` is dropped from the metadata (a client must not choose where the server
writes). The server binds to 127.0.0.1 unless ``--host`` says otherwise, and speaks plain HTTP: across machines, use a
private network, a TLS-terminating proxy or an SSH tunnel, since the token travels with every request.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from mmrl.rewards.base import RewardSpec
from mmrl.rewards.compose import ComposedResult, CompositeReward, RewardConfig
from mmrl.rewards.remote import JPEG_MAGIC, PNG_MAGIC, read_token
from mmrl.types import RewardInput

logger = logging.getLogger("mmrl.rewards.server")
MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 64 * MiB
    max_image_bytes: int = 16 * MiB
    max_items: int = 4096


@dataclass
class Served:
    spec: RewardSpec
    composite: CompositeReward
    defaults: dict[str, Any]
    options: dict[str, Any]  # with the defaults filled in

    @property
    def name(self) -> str:
        return self.spec.name


class ImageStore:
    """The images of the requests in flight: one file per distinct content, named by its SHA-256, removed when the
    last request using it is done (the composite's cache keys on the path, so equal images share cache entries)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="mmrl-reward-images-"))  # mode 0700
        self._users: Counter[str] = Counter()
        self._lock = threading.Lock()

    def put(self, digest: str, data: bytes) -> str:
        path = self.root / f"{digest}.{'png' if data.startswith(PNG_MAGIC) else 'jpg'}"
        with self._lock:
            if not self._users[digest]:
                tmp = path.with_suffix(".part")
                tmp.write_bytes(data)
                tmp.replace(path)
            self._users[digest] += 1
        return str(path)

    def release(self, digests: Sequence[str]) -> None:
        with self._lock:
            for d in digests:
                self._users[d] -= 1
                if self._users[d] <= 0:
                    del self._users[d]
                    for f in self.root.glob(f"{d}.*"):
                        f.unlink(missing_ok=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class _Job:
    items: list[tuple[str, RewardInput]]  # (served reward, input)
    future: Future


class Scorer:
    """One thread scoring every queued request's items together, one composite call per reward."""

    def __init__(self, served: dict[str, Served]):
        self.served = served
        self._queue: list[_Job] = []
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="mmrl-reward-scorer", daemon=True)
        self._thread.start()

    def submit(self, items: list[tuple[str, RewardInput]]) -> Future:
        job = _Job(items, Future())
        with self._cv:
            if self._closed:
                raise RuntimeError("the reward server is shutting down")
            self._queue.append(job)
            self._cv.notify()
        return job.future

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                jobs, self._queue = self._queue, []
            self._run(jobs)

    def _run(self, jobs: list[_Job]) -> None:
        start = time.monotonic()
        where: dict[str, list[tuple[int, int]]] = {}
        for j, job in enumerate(jobs):
            for k, (name, _) in enumerate(job.items):
                where.setdefault(name, []).append((j, k))
        out: list[list[ComposedResult | None]] = [[None] * len(job.items) for job in jobs]
        try:
            for name, slots in where.items():
                results = self.served[name].composite([jobs[j].items[k][1] for j, k in slots])
                for (j, k), r in zip(slots, results):
                    out[j][k] = r
        except Exception as exc:  # the composite never raises for a reward's fault; this is a bug: answer 500
            logger.exception("scoring failed")
            for job in jobs:
                job.future.set_exception(exc)
            return
        for job, rs in zip(jobs, out):
            job.future.set_result(rs)
        counts = ", ".join(f"{n}: {len(s)}" for n, s in where.items())
        logger.info(
            "scored %s from %d requests in %.2f s", counts or "0 items", len(jobs), time.monotonic() - start
        )

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()
        for s in {id(s): s for s in self.served.values()}.values():
            s.composite.close()


def build_served(
    rewards: Sequence[str], options: dict[str, dict[str, Any]], *, workers: int, timeout_s: float
) -> dict[str, Served]:
    """One composite per reward, under its registered name and the name it was given as (``file.py:fn``); raises
    ValueError naming a bad reward, option or a sandbox that cannot confine a heavy reward."""
    from mmrl.rewards.base import load_reward, reward_options, validate_options
    from mmrl.rewards.sandbox import SandboxUnavailableError, confinement

    unknown = sorted(set(options) - set(rewards))
    if unknown:
        raise ValueError(f"--option {unknown[0]}.KEY=VALUE: {unknown[0]!r} is not in --rewards")
    served: dict[str, Served] = {}
    for given in rewards:
        try:
            spec = load_reward(given)
            opts = validate_options(spec, options.get(given, {}))
            defaults = {k: p.default for k, p in reward_options(spec).items()}
            if spec.heavy:
                confinement()
        except (KeyError, TypeError, ValueError, OSError, ImportError, SandboxUnavailableError) as e:
            raise ValueError(f"--rewards {given}: {e.args[0] if e.args else e}") from None
        composite = CompositeReward(
            [RewardConfig(given, 1.0, opts)], num_workers=workers, timeout_s=timeout_s
        )
        entry = Served(spec, composite, defaults, {**defaults, **opts})
        for alias in dict.fromkeys([spec.name, given]):
            if alias in served:
                raise ValueError(f"--rewards: {alias!r} is listed twice")
            served[alias] = entry
    return served


def wire_result(item_id: str, name: str, r: ComposedResult) -> dict[str, Any]:
    """A one-reward composite's verdict as the reward's own result: its parts without the ``name/`` prefix."""
    prefix = f"{name}/"
    parts = {k[len(prefix) :]: v for k, v in r.parts.items() if k.startswith(prefix)}
    error = "; ".join(e["error"] for e in r.errors) or None
    return {"id": item_id, "score": r.score if r.applied else None, "parts": parts, "error": error}


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    reward: str
    response: str
    reference: Any = None
    prompt: str = ""
    sample_id: str | None = None
    images: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item]
    images: dict[str, str] = Field(default_factory=dict)
    options: dict[str, dict[str, Any]] = Field(default_factory=dict)


class RewardService:
    """What ``POST /score`` does, in steps: authorize, read the body within its limit, parse and check it, store its
    images, score through the :class:`Scorer`, answer."""

    def __init__(self, served: dict[str, Served], token: str, limits: Limits):
        self.served, self.limits = served, limits
        self._token = token.encode()
        self.store = ImageStore()
        self.scorer = Scorer(served)

    def authorize(self, authorization: str | None) -> None:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise HTTPException(401, "send Authorization: Bearer <token>", {"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(given.strip().encode(), self._token):
            raise HTTPException(403, "wrong token")

    async def read_body(self, request: Request) -> bytes:
        limit = self.limits.max_body_bytes
        too_large = HTTPException(413, f"request body over {limit} bytes (--max-body-mb)")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large  # refused unread
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    def parse(self, body: bytes) -> ScoreRequest:
        try:
            req = ScoreRequest.model_validate_json(body)
        except ValidationError as e:
            raise HTTPException(422, e.errors(include_input=False, include_url=False)) from None
        if len(req.items) > self.limits.max_items:
            raise HTTPException(413, f"{len(req.items)} items, over {self.limits.max_items} (--max-items)")
        dup = [i for i, n in Counter(x.id for x in req.items).items() if n > 1]
        unknown = sorted({x.reward for x in req.items} - set(self.served))
        if dup or unknown:
            what = f"id {dup[0]!r} appears twice" if dup else f"reward {unknown[0]!r} is not served here"
            raise HTTPException(400, f"{what}; this server scores: {', '.join(sorted(self.served))}")
        for name, opts in req.options.items():
            if name in self.served:  # an unknown reward is named by its items
                self._check_options(self.served[name], name, opts)
        return req

    @staticmethod
    def _check_options(s: Served, name: str, opts: dict[str, Any]) -> None:
        from mmrl.rewards.base import validate_options

        try:
            validate_options(s.spec, opts)
        except (TypeError, ValueError) as e:
            raise HTTPException(400, str(e)) from None
        wanted = {**s.defaults, **opts}
        if wanted != s.options:
            raise HTTPException(
                400,
                f"reward {name!r} is served with options {s.options}, the request asks {wanted}; start a server "
                "with those options or change the run's reward_options",
            )

    def store_images(self, images: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """Paths of the stored images and errors of the others, by key. Only a key equal to its content's SHA-256
        (hex) is stored, which also keeps it a plain file name."""
        paths, errors = {}, {}
        for key, text in images.items():
            try:
                data = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                errors[key] = "not valid base64"
                continue
            if len(data) > self.limits.max_image_bytes:
                errors[key] = f"{len(data)} bytes, over {self.limits.max_image_bytes} (--max-image-mb)"
            elif not data.startswith((PNG_MAGIC, JPEG_MAGIC)):
                errors[key] = "not a PNG or JPEG"
            elif hashlib.sha256(data).hexdigest() != key:
                errors[key] = "its SHA-256 does not match its key"
            else:
                try:
                    paths[key] = self.store.put(key, data)
                except OSError as e:
                    errors[key] = f"cannot be stored on the server ({e.strerror or e})"
        return paths, errors

    async def score(self, body: bytes) -> list[dict[str, Any]]:
        req = await run_in_threadpool(self.parse, body)
        paths, errors = await run_in_threadpool(self.store_images, req.images)
        try:
            answered: dict[str, dict[str, Any]] = {}
            todo: list[tuple[str, str, RewardInput]] = []  # (id, served reward, input)
            for x in req.items:
                bad = [
                    f"image {n}: {errors.get(d, 'missing')}" for n, d in enumerate(x.images) if d not in paths
                ]
                if bad:
                    answered[x.id] = {"id": x.id, "score": 0.0, "parts": {}, "error": "; ".join(bad)}
                    continue
                meta = {k: v for k, v in x.metadata.items() if k != "render_dir"}
                images = [paths[d] for d in x.images]
                sample = RewardInput(x.sample_id or x.id, x.response, x.reference, x.prompt, images, meta)
                todo.append((x.id, self.served[x.reward].name, sample))
            if todo:
                results = await asyncio.wrap_future(self.scorer.submit([(n, x) for _, n, x in todo]))
                for (item_id, name, _), r in zip(todo, results):
                    answered[item_id] = wire_result(item_id, name, r)
        finally:
            self.store.release(list(paths))
        return [answered[x.id] for x in req.items]

    def close(self) -> None:
        self.scorer.close()
        self.store.close()


def create_app(service: RewardService) -> FastAPI:
    app = FastAPI(title="mmrl reward server", docs_url=None, redoc_url=None, openapi_url=None)

    def authorize(authorization: str | None = Header(default=None)) -> None:
        service.authorize(authorization)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/score", dependencies=[Depends(authorize)])
    async def score(request: Request) -> Response:
        results = await service.score(await service.read_body(request))
        return Response(json.dumps({"results": results}), media_type="application/json")

    return app


def serve(
    rewards: Sequence[str],
    *,
    token_file: str,
    port: int,
    host: str = "127.0.0.1",
    options: dict[str, dict[str, Any]] | None = None,
    workers: int = 2,
    timeout_s: float = 30.0,
    limits: Limits | None = None,
) -> int:
    """Run the server until SIGINT/SIGTERM (then exit 0 with the pools closed); raises ValueError (a bad token file,
    reward or option) before binding."""
    import uvicorn

    token = read_token(token_file)
    served = build_served(rewards, options or {}, workers=workers, timeout_s=timeout_s)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = RewardService(served, token, limits or Limits())
    app = create_app(service)
    names = ", ".join(dict.fromkeys(s.name for s in served.values()))
    print(f"mmrl reward server: {names} on http://{host}:{port} (token from {token_file})", file=sys.stderr)
    if host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "listening on %s over plain HTTP: the token travels in the clear; use a private network, a TLS proxy "
            "or an SSH tunnel",
            host,
        )
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, access_log=False, log_level="info"))
    for sig in (
        signal.SIGINT,
        signal.SIGTERM,
    ):  # uvicorn re-raises the signal after its graceful shutdown: end
        signal.signal(sig, lambda signum, frame: sys.exit(0))  # through `finally`, the reward pools closed
    try:
        server.run()
    finally:
        service.close()
    return 0 if server.started else 1
