"""LaTeX-table rewards/s: the trainer's local reward pool against reward servers (``mmrl reward serve``) on this
machine, on the same responses.

Data: the table2latex recipe's own builder (``mmrl.recipes.table2latex.data.build``, difficulty 1-4, 100 dpi renders
as the prompts' images) writes ``N / G`` records; each gets ``G`` responses like a GRPO group's (G = 4): the
reference itself, a near miss (one digit changed), one body row fewer and a broken copy (cut in half), so about a
quarter do not compile, as early in training. A second, disjoint set of records warms every side up first (worker
pools started, TeX's format loaded), so the timed call renders every reference and response itself on every side.

Sides, each scoring the same ``N`` inputs in one call, with ``latex_table``'s default options:

- ``local pool``: ``CompositeReward([latex_table], num_workers=W)``, what ``mmrl train`` does with
  ``train.reward_workers=W`` (default 2);
- ``1 server``: the ``remote`` reward against one ``mmrl reward serve --rewards latex_table --workers W``;
- ``K servers``: the ``remote`` reward against K such servers (default 2), each in its own process with its own pool.

Each server side uses fresh server processes (their result caches are empty). Images travel inline (each distinct
image once per request, ``send_images`` on, as a recipe sends them); the payload per item is printed with and
without them, and the time it would take on a 1 and a 10 Gbit/s link. Scores must equal the local pool's (counted).
The last line is ``rewards/s: local X servers Y ratio Z`` (ratio = servers / local).

Run: ``OMP_NUM_THREADS=1 python benchmarks/reward_servers.py [--n 256 --servers 2 --workers 2 --chunk-size 16]``.
On a machine with C cores the servers share those C cores, so K servers here measure the protocol's overhead and
the scheduling, not K machines; the README's "Reward servers" section turns the per-server number into N machines.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from mmrl.recipes.table2latex.data import build
from mmrl.rewards.base import load_reward, validate_options
from mmrl.rewards.compose import CompositeReward, RewardConfig
from mmrl.rewards.remote import encode_batch
from mmrl.types import RewardInput

REPO = Path(__file__).resolve().parents[1]


def variants(ref: str, rng: random.Random) -> list[str]:
    """A GRPO group's responses to one table: exact, a near miss, one row fewer, broken."""
    digits = [i for i, ch in enumerate(ref) if ch.isdigit()] or [0]
    i = rng.choice(digits)
    near = ref[:i] + str((int(ref[i]) + 1) % 10 if ref[i].isdigit() else "x") + ref[i + 1 :]
    lines = ref.split("\n")
    rows = [k for k, line in enumerate(lines) if line.rstrip().endswith("\\\\")] or [1]
    fewer = "\n".join(lines[: rows[-1]] + lines[rows[-1] + 1 :])
    return [ref, near, fewer, ref[: len(ref) // 2]]


def batches(folder: Path, n: int, group: int, warm: int) -> tuple[list[RewardInput], list[RewardInput]]:
    records_needed = -(-n // group) + warm
    build(folder, n_train=records_needed, n_eval=0, seed=0, difficulty=(1, 4))
    records = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    rng = random.Random(0)
    items = []
    for rec in records:
        for j, resp in enumerate(variants(rec["answer"], rng)[:group]):
            image = str(folder / rec["images"][0])
            items.append(
                RewardInput(f"{rec['id']}-{j}", resp, rec["answer"], rec["prompt"], [image], rec["metadata"])
            )
    return items[:n], items[len(items) - warm * group :]


@contextmanager
def servers(folder: Path, k: int, workers: int):
    token_file = folder / "token"
    token_file.write_text(os.urandom(24).hex())
    token_file.chmod(0o600)
    procs, urls = [], []
    try:
        for i in range(k):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            cmd = [sys.executable, "-m", "mmrl.cli", "reward", "serve", "--rewards", "latex_table"]
            cmd += ["--port", str(port), "--token-file", str(token_file), "--workers", str(workers)]
            log = open(folder / f"server{i}-{port}.log", "wb")  # closed with the process, below
            env = {**os.environ, "TMPDIR": str(folder)}
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log, start_new_session=True)
            procs.append((proc, log))
            urls.append(f"http://127.0.0.1:{port}")
        import httpx

        for url, (proc, log) in zip(urls, procs):
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server {url} did not start: {Path(log.name).read_text()}")
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
        yield urls, token_file
    finally:
        for proc, log in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()


def time_local(batch, warm, workers: int) -> tuple[float, list[float]]:
    with CompositeReward([RewardConfig("latex_table")], num_workers=workers) as composite:
        composite(warm)
        start = time.perf_counter()
        results = composite(batch)
        return time.perf_counter() - start, [r.score for r in results]


def time_remote(urls, token_file, batch, warm, chunk_size: int) -> tuple[float, list[float]]:
    spec = load_reward("remote")
    opts = {"urls": urls, "reward": "latex_table", "token_file": str(token_file), "chunk_size": chunk_size}
    validate_options(spec, opts)
    for url in urls:  # every server's pool started
        spec.fn(warm, **{**opts, "urls": [url]})
    start = time.perf_counter()
    results = spec.fn(batch, **opts)
    errors = [r.error for r in results if r.error and r.error.startswith("remote:")]
    if errors:
        raise RuntimeError(f"{len(errors)} items failed on the servers, e.g. {errors[0]}")
    return time.perf_counter() - start, [r.score for r in results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=256, help="responses scored per side")
    ap.add_argument("--group", type=int, default=4, choices=[1, 2, 3, 4], help="responses per table")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2, help="pool workers, locally and per server")
    ap.add_argument("--chunk-size", type=int, default=16, help="items per request")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="mmrl-bench-servers-") as tmp:
        folder = Path(tmp)
        batch, warm = batches(folder / "data", args.n, args.group, warm=4)
        with_images = len(encode_batch(batch, "latex_table", {}, True).body(list(range(len(batch))))) / len(
            batch
        )
        without = len(encode_batch(batch, "latex_table", {}, False).body(list(range(len(batch))))) / len(
            batch
        )

        rows = []
        t_local, local = time_local(batch, warm, args.workers)
        rows.append((f"local pool ({args.workers} workers)", args.workers, t_local, local))
        for k in sorted({1, args.servers}):
            with servers(folder, k, args.workers) as (urls, token_file):
                t, scores = time_remote(urls, token_file, batch, warm, args.chunk_size)
            name = f"{k} server{'s' if k > 1 else ''} ({args.workers} workers each)"
            rows.append((name, k * args.workers, t, scores))

    n = len(batch)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"{n} latex_table responses ({n // args.group} tables x {args.group}), {cpus} usable CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print("| side | pool workers | seconds | rewards/s | scores equal to local |")
    print("|---|---|---|---|---|")
    for name, w, t, scores in rows:
        same = sum(a == b for a, b in zip(scores, local))
        print(f"| {name} | {w} | {t:.2f} | {n / t:.1f} | {same}/{n} |")
    per_item_s = t_local / n * args.workers  # one worker's seconds per item
    for label, size in (("with images", with_images), ("without images", without)):
        print(
            f"payload {label}: {size / 1024:.1f} KiB/item; on 1 Gbit/s {size * 8 / 1e9 * 1e3:.3f} ms/item, "
            f"on 10 Gbit/s {size * 8 / 1e10 * 1e3:.4f} ms/item (one worker scores an item in {per_item_s * 1e3:.0f} ms)"
        )
    local_rate, servers_rate = n / rows[0][2], n / rows[-1][2]
    print(
        f"rewards/s: local {local_rate:.1f} servers {servers_rate:.1f} ratio {servers_rate / local_rate:.2f}"
    )


if __name__ == "__main__":
    main()
