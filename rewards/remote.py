"""The ``remote`` reward: score a batch on reward servers (``mmrl reward serve``, :mod:`mmrl.rewards.server`).

    rewards:
      - name: remote
        options: {urls: [http://10.0.0.5:8790, http://10.0.0.6:8790], reward: latex_table,
                  token_file: ~/.mmrl/reward.token, reward_options: {scheme: continuous}}

``reward`` names a reward the servers serve; ``reward_options`` are its options, which must equal the server's
(both with the reward's defaults filled in: a server started with other options refuses the request rather than
score differently). ``urls`` is a list, or one comma-separated string (``--option urls=http://a:8790,http://b:8790``
from ``mmrl reward remote``). The token file holds the servers' shared secret and must be private (``chmod 600``).

How a batch travels. It is cut into chunks of ``chunk_size`` items; each chunk is one ``POST /score`` carrying every
distinct image of its items once (a GRPO group's responses share their prompt's images), inline as PNG or JPEG bytes
(other formats and in-memory images are re-encoded as PNG). At most two chunks per server are in flight; each goes to
the server with the fewest requests in flight from this process, healthy servers first, ties taken in turn.

Exactly once. Every item carries an id (its index in the batch). A chunk's scores come from one complete ``200``
response that answers each of the chunk's ids exactly once and no other id, or from none: whatever else happens to
an attempt (connection refused or reset, a timeout of ``timeout_s``, a 5xx, a malformed or short answer), nothing of
it is used, the server is marked unhealthy for ``unhealthy_s`` seconds (it is then tried after the healthy ones, not
dropped), and the chunk goes to the next server it has not tried. A 4xx (an unknown reward, options the server does
not serve, a wrong token) is that server's refusal: the next server is tried and the first is not marked. A 413
(too large) splits the chunk in halves. When every server has failed a chunk, its items score 0 with an error naming
each server's failure: fail closed, counted and logged by the composite like any reward error, and the run goes on.
A chunk re-sent after a lost answer may be scored twice by the servers; only one answer is ever used.

Scores equal the local reward's on the same inputs after a JSON round trip (a tuple arrives as a list); their parts
are logged as ``reward/remote/<part>``. Renders stay on the servers: ``render_dir`` is not sent. Option names, and
the types of those with a typed default, are checked against this signature at pre-flight like any reward's; the
required ``urls``, ``reward`` and ``token_file`` are checked at the first call (a bad one makes every item score 0
with the error).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import stat
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl.extras import require
from mmrl.rewards.base import register_reward
from mmrl.types import RewardInput, RewardResult

logger = logging.getLogger("mmrl.rewards.remote")

PNG_MAGIC, JPEG_MAGIC = b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff"
MIN_TOKEN_CHARS = 16
INFLIGHT_PER_SERVER = 2


class TokenFileError(ValueError):
    pass


def read_token(path: str | os.PathLike[str]) -> str:
    """The shared secret in ``path``; refuses a file that group or others may read or write (like ssh's keys)."""
    p = Path(path).expanduser()
    try:
        mode = p.stat().st_mode
        text = p.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise TokenFileError(f"token file {p}: cannot read it ({e.strerror or e})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokenFileError(
            f"token file {p} is accessible to group or others (mode {stat.filemode(mode)}): the token is a secret; "
            f"run `chmod 600 {p}`"
        )
    if len(text) < MIN_TOKEN_CHARS:
        raise TokenFileError(
            f"token file {p} holds {len(text)} characters, fewer than {MIN_TOKEN_CHARS}; write a random one: "
            f"python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > {p}"
        )
    return text


# -- the request's payload ---------------------------------------------------------------------------------------


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, torch tensors
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON")


def image_bytes(image: Any) -> bytes:
    """PNG or JPEG bytes of an image path or PIL image (anything else is re-encoded as PNG)."""
    if isinstance(image, (str, os.PathLike)):
        data = Path(image).read_bytes()
        if data.startswith((PNG_MAGIC, JPEG_MAGIC)):
            return data
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            image = im.copy()
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class Payload:
    """A batch encoded once: each item's JSON, and each distinct image as (sha256, base64) for the chunks to share."""

    items: dict[int, str] = field(default_factory=dict)
    item_images: dict[int, list[str]] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    head: str = ""

    def body(self, idx: list[int]) -> bytes:
        digests = dict.fromkeys(d for i in idx for d in self.item_images[i])
        images = json.dumps({d: self.images[d] for d in digests})
        items = ",".join(self.items[i] for i in idx)
        return f'{{{self.head},"images":{images},"items":[{items}]}}'.encode()


def encode_batch(
    batch: list[RewardInput], reward: str, options: dict[str, Any], send_images: bool
) -> Payload:
    out = Payload(head=f'"options":{json.dumps({reward: options})}')
    seen: dict[Any, str] = {}
    for i, x in enumerate(batch):
        try:
            digests = []
            for n, image in enumerate(x.images if send_images else []):
                key = str(image) if isinstance(image, (str, os.PathLike)) else id(image)
                if key not in seen:
                    try:
                        data = image_bytes(image)
                    except (OSError, ValueError, AttributeError) as e:
                        raise ValueError(f"image {n} ({str(image)[:200]}) cannot be sent: {e}") from None
                    seen[key] = hashlib.sha256(data).hexdigest()
                    out.images.setdefault(seen[key], base64.b64encode(data).decode("ascii"))
                digests.append(seen[key])
            meta = {k: v for k, v in x.metadata.items() if k != "render_dir"}
            wire = {"id": str(i), "sample_id": x.id, "reward": reward, "response": x.response}
            wire |= {"reference": x.reference, "prompt": x.prompt, "images": digests, "metadata": meta}
            out.items[i] = json.dumps(wire, default=_jsonable, ensure_ascii=False)
            out.item_images[i] = digests
        except (TypeError, ValueError) as e:
            out.errors[i] = f"remote: sample {x.id!r} cannot be sent: {e}"
    return out


def accept(ids: list[str], payload: Any) -> list[RewardResult]:
    """The results of a chunk in the order of ``ids``; raises ValueError unless the answer holds every id exactly
    once, no other id, and well-formed results."""
    rows = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(rows, list):
        raise ValueError("no 'results' list")
    wanted, got = set(ids), {}
    for row in rows:
        rid = row.get("id") if isinstance(row, dict) else None
        if rid not in wanted:
            raise ValueError(f"unknown id {rid!r}")
        if rid in got:
            raise ValueError(f"id {rid!r} answered twice")
        score, parts, error = row.get("score"), row.get("parts", {}), row.get("error")
        numbers = isinstance(parts, dict) and all(isinstance(v, (int, float)) for v in parts.values())
        if not (score is None or isinstance(score, (int, float))) or not numbers:
            raise ValueError(f"id {rid!r}: malformed result")
        if error is not None and not isinstance(error, str):
            raise ValueError(f"id {rid!r}: malformed error")
        got[rid] = RewardResult(score=score, parts={k: float(v) for k, v in parts.items()}, error=error)
    if len(got) != len(wanted):
        missing = sorted(wanted - set(got), key=int)[:5]
        raise ValueError(f"{len(wanted) - len(got)} ids unanswered (e.g. {', '.join(missing)})")
    return [got[i] for i in ids]


# -- the servers -------------------------------------------------------------------------------------------------


class _Fault(Exception):
    """An attempt whose answer is unusable because of the server (marks it unhealthy)."""


class _Refused(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


@dataclass
class _Server:
    url: str
    inflight: int = 0
    down_until: float = 0.0


class RemoteClient:
    """The servers of one ``urls`` list, shared by every call in this process: health, load and an HTTP pool."""

    def __init__(self, urls: list[str], token: str, timeout_s: float):
        require("server", "reward 'remote'", ("httpx",))
        import httpx

        self.servers = [_Server(u) for u in urls]
        self.http = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            limits=httpx.Limits(max_connections=INFLIGHT_PER_SERVER * len(urls) + 4),
        )
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._turn = 0

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def _pick(self, tried: set[str]) -> _Server | None:
        with self._lock:
            now, n = time.monotonic(), len(self.servers)
            order = [(k, s) for k, s in enumerate(self.servers) if s.url not in tried]
            if not order:
                return None
            # healthy ones (0 s left unhealthy) first, then the one that failed longest ago; fewest in flight; in turn
            k, s = min(
                order,
                key=lambda ks: (max(ks[1].down_until - now, 0.0), ks[1].inflight, (ks[0] - self._turn) % n),
            )
            s.inflight += 1
            self._turn = (k + 1) % n
            return s

    def _post(self, server: _Server, body: bytes, ids: list[str]) -> list[RewardResult]:
        import httpx

        try:
            r = self.http.post(f"{server.url}/score", content=body)
        except httpx.HTTPError as e:  # refused, reset, timed out, cut short
            raise _Fault(f"{type(e).__name__}: {e}") from None
        finally:
            with self._lock:
                server.inflight -= 1
        detail = r.text[:300].strip()
        if r.status_code >= 500:
            raise _Fault(f"HTTP {r.status_code}: {detail}")
        if r.status_code != 200:
            raise _Refused(r.status_code, detail)
        try:
            return accept(ids, json.loads(r.content))
        except ValueError as e:
            raise _Fault(f"unusable answer: {e}") from None

    def score(self, idx: list[int], payload: Payload, unhealthy_s: float) -> list[RewardResult]:
        """One chunk: every server at most once until one answers it completely, else fail closed."""
        ids, body, failures, tried = [str(i) for i in idx], payload.body(idx), [], set()
        while (server := self._pick(tried)) is not None:
            tried.add(server.url)
            self._count("requests")
            try:
                return self._post(server, body, ids)
            except _Refused as e:
                if e.status == 413 and len(idx) > 1:
                    half = len(idx) // 2
                    return self.score(idx[:half], payload, unhealthy_s) + self.score(
                        idx[half:], payload, unhealthy_s
                    )
                failures.append(f"{server.url}: {e}")
            except _Fault as e:
                failures.append(f"{server.url}: {e}")
                with self._lock:
                    server.down_until = time.monotonic() + unhealthy_s
                self._count("server_failures")
                logger.warning(
                    "reward server %s failed (%s); its %d items go to the next server, and it is tried last "
                    "for %.0f s",
                    server.url,
                    e,
                    len(idx),
                    unhealthy_s,
                )
        self._count("failed_items", len(idx))
        error = "remote: every server failed: " + "; ".join(failures)
        return [RewardResult(score=0.0, error=error) for _ in idx]


_CLIENTS: dict[tuple[Any, ...], RemoteClient] = {}
_CLIENTS_LOCK = threading.Lock()


def _urls(urls: Any) -> list[str]:
    items = urls.split(",") if isinstance(urls, str) else urls
    if not isinstance(items, list) or not items or not all(isinstance(u, str) and u.strip() for u in items):
        raise ValueError(
            f"remote: option 'urls' must be a non-empty list of server URLs (or one comma-separated string), "
            f"got {urls!r}"
        )
    out = [u.strip().rstrip("/") for u in items]
    bad = [u for u in out if not u.startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"remote: server URL {bad[0]!r} must start with http:// or https://")
    return out


def client_for(urls: Any, token_file: str, timeout_s: float) -> RemoteClient:
    servers = _urls(urls)
    if not token_file:
        raise ValueError(
            "remote: option 'token_file' is required (a file holding the servers' token, chmod 600)"
        )
    key = (tuple(servers), str(Path(token_file).expanduser().resolve()), float(timeout_s))
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            _CLIENTS[key] = RemoteClient(servers, read_token(token_file), timeout_s)
        return _CLIENTS[key]


def remote_stats() -> dict[str, int]:
    """Requests sent, server failures and failed (zero-scored) items, summed over this process's clients."""
    total: Counter[str] = Counter()
    for c in list(_CLIENTS.values()):
        with c._lock:
            total.update(c.counts)
    return dict(total)


@register_reward("remote")
def remote(
    batch: list[RewardInput],
    *,
    urls: list[str] | str | None = None,
    reward: str = "",
    token_file: str = "",
    reward_options: dict[str, Any] | None = None,
    chunk_size: int = 16,
    timeout_s: float = 120.0,
    unhealthy_s: float = 30.0,
    send_images: bool = True,
) -> list[RewardResult]:
    if not reward:
        raise ValueError("remote: option 'reward' is required (the name of a reward the servers serve)")
    if chunk_size < 1 or not timeout_s > 0 or unhealthy_s < 0:
        raise ValueError("remote: chunk_size must be >= 1, timeout_s > 0 and unhealthy_s >= 0")
    client = client_for(urls, token_file, timeout_s)
    if not batch:
        return []
    payload = encode_batch(batch, reward, dict(reward_options or {}), send_images)
    results: list[RewardResult | None] = [None] * len(batch)
    for i, error in payload.errors.items():
        results[i] = RewardResult(score=0.0, error=error)
    todo = [i for i in range(len(batch)) if i not in payload.errors]
    chunks = [todo[k : k + chunk_size] for k in range(0, len(todo), chunk_size)]
    if chunks:
        with ThreadPoolExecutor(min(len(chunks), INFLIGHT_PER_SERVER * len(client.servers))) as pool:
            for idx, rs in zip(chunks, pool.map(lambda c: client.score(c, payload, unhealthy_s), chunks)):
                for i, r in zip(idx, rs):
                    results[i] = r
    return results  # type: ignore[return-value]
