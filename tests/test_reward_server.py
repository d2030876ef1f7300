"""Reward servers on loopback: real ``mmrl reward serve`` processes (uvicorn) on free ports, and the ``remote`` reward.

One pair of servers serves the whole module (auth, limits, health, equality with local scores, latex_table); the
kill test starts its own pair and kills one of them while it scores.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from PIL import Image

from mmrl.rewards.base import call_reward, load_reward, validate_options
from mmrl.rewards.remote import TokenFileError, accept, read_token, remote_stats
from mmrl.types import RewardInput

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "reward_plugin_example.py"
SLOW, PIXELS = f"{PLUGIN}:slow_heavy", f"{PLUGIN}:image_pixels"
TOKEN = "test-token-0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _token_file(folder: Path, mode: int = 0o600) -> Path:
    path = folder / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def _serve_cmd(port: int, token_file: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mmrl.cli",
        "reward",
        "serve",
        "--port",
        str(port),
        "--token-file",
        str(token_file),
    ]


@contextmanager
def _servers(folder: Path, n: int, *args: str):
    """``n`` servers, each in its own process group (its reward workers die with it); yields (urls, procs, logs)."""
    token_file = _token_file(folder)
    # TMPDIR: the image folder of a killed server is left in the test's folder, not in /tmp
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(folder)}
    procs, urls, logs = [], [], []
    try:
        for k in range(n):
            port = _free_port()
            logs.append(folder / f"server{k}.log")
            cmd = [*_serve_cmd(port, token_file), *args]
            with open(logs[-1], "wb") as log:
                procs.append(
                    subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log, start_new_session=True)
                )
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        for url, proc, log in zip(urls, procs, logs):
            while True:
                assert proc.poll() is None, f"server exited: {log.read_text()}"
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"server did not start: {log.read_text()}"
                time.sleep(0.1)
        yield urls, procs, logs
    finally:
        for proc in procs:
            _kill(proc)


def _kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("servers")
    args = ["--rewards", ",".join(["exact_match", SLOW, PIXELS, "latex_table"]), "--max-body-mb", "1"]
    with _servers(folder, 2, *args, "--max-items", "32") as (urls, procs, logs):
        yield urls, folder / "token"
        for proc in procs:  # SIGTERM stops a server cleanly: exit 0, its reward pools and forkserver gone too
            proc.terminate()
        for proc in procs:
            assert proc.wait(timeout=30) == 0
            deadline = time.monotonic() + 10
            while _group_alive(proc.pid):
                assert time.monotonic() < deadline, "the server's reward workers outlived it"
                time.sleep(0.1)
        for log in logs:
            assert TOKEN not in log.read_text(), "the token was logged"


def _opts(urls, token_file, reward, **kw):
    return {"urls": urls, "reward": reward, "token_file": str(token_file), **kw}


def _remote(batch, **options):
    spec = load_reward("remote")
    return call_reward(spec.fn, spec.name, batch, validate_options(spec, options))


def _local(name, batch, **options):
    spec = load_reward(name)
    return call_reward(spec.fn, spec.name, batch, options)


def test_health_needs_no_token_and_says_nothing(pair):
    urls, _ = pair
    r = httpx.get(f"{urls[0]}/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert httpx.get(f"{urls[0]}/openapi.json").status_code == 404


def test_token_missing_401_wrong_403(pair):
    urls, _ = pair
    body = {"items": [{"id": "0", "reward": "exact_match", "response": "a", "reference": "a"}]}
    assert httpx.post(f"{urls[0]}/score", json=body).status_code == 401
    assert (
        httpx.post(f"{urls[0]}/score", json=body, headers={"Authorization": "Basic eDp5"}).status_code == 401
    )
    wrong = httpx.post(f"{urls[0]}/score", json=body, headers={"Authorization": f"Bearer {TOKEN}x"})
    assert wrong.status_code == 403 and TOKEN not in wrong.text
    ok = httpx.post(f"{urls[0]}/score", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.json() == {"results": [{"id": "0", "score": 1.0, "parts": {}, "error": None}]}


def test_oversized_request_is_refused_before_parsing(pair):
    urls, _ = pair
    auth = {"Authorization": f"Bearer {TOKEN}"}
    junk = b"{" * ((1 << 20) + 1)  # not JSON: a parsed body would get 422
    assert httpx.post(f"{urls[0]}/score", content=junk, headers=auth).status_code == 413
    chunked = httpx.post(f"{urls[0]}/score", content=iter([junk[:600_000], junk[600_000:]]), headers=auth)
    assert chunked.status_code == 413  # no Content-Length: counted while read
    items = [{"id": str(i), "reward": "exact_match", "response": "a", "reference": "a"} for i in range(33)]
    assert httpx.post(f"{urls[0]}/score", json={"items": items}, headers=auth).status_code == 413


def test_remote_equals_local_with_images_split_and_dedup(pair, tmp_path):
    urls, token_file = pair
    batch = [RewardInput(f"s{i % 7}", f"answer {i % 3}", f"answer {i % 2}") for i in range(40)]
    before = remote_stats().get("requests", 0)
    got = _remote(batch, **_opts(urls, token_file, "exact_match", chunk_size=40))  # 40 > --max-items: split
    assert [r.to_json() for r in got] == [r.to_json() for r in _local("exact_match", batch)]
    assert remote_stats()["requests"] - before == 3  # 40 refused (413, over --max-items), then 2 x 20

    png, webp = tmp_path / "a.png", tmp_path / "b.webp"
    Image.new("RGB", (30, 20), (10, 200, 30)).save(png)
    Image.new("RGB", (7, 9), (90, 0, 250)).save(webp, lossless=True)
    in_memory = Image.new("RGB", (5, 4), (1, 2, 3))
    images = [[str(png)], [str(webp), str(png)], [in_memory], [], [str(png)]]
    batch = [
        RewardInput(f"i{k}", "r", None, images=imgs, metadata={"render_dir": "/x"})
        for k, imgs in enumerate(images)
    ]
    got = _remote(batch, **_opts(urls, token_file, "image_pixels", chunk_size=2))
    assert [r.to_json() for r in got] == [r.to_json() for r in _local(PIXELS, batch)]
    assert got[3].score is None and got[0].parts["crc"] == got[4].parts["crc"]


def test_options_other_than_the_servers_fail_closed(pair):
    urls, token_file = pair
    batch = [RewardInput("s", "a b", None)]
    [r] = _remote(batch, **_opts(urls, token_file, "plugin_slow_heavy", reward_options={"seconds": 1.0}))
    assert r.score == 0.0 and "served with options" in r.error and "every server failed" in r.error
    [r] = _remote(batch, **_opts(urls, token_file, "not_served"))
    assert r.score == 0.0 and "not served here" in r.error


def test_remote_options_are_checked_and_dead_servers_fail_closed(tmp_path):
    spec = load_reward("remote")
    with pytest.raises(ValueError, match="unknown option 'chunk_sise'; did you mean 'chunk_size'"):
        validate_options(spec, {"urls": ["http://127.0.0.1:1"], "chunk_sise": 4})
    with pytest.raises(ValueError, match="option 'timeout_s' expects a number"):
        validate_options(spec, {"timeout_s": "soon"})
    token_file = _token_file(tmp_path)
    dead = [f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}"]
    results = _remote([RewardInput("s", "a", "a")] * 3, **_opts(dead, token_file, "exact_match"))
    assert all(r.score == 0.0 and r.error.startswith("remote: every server failed") for r in results)
    assert dead[0] in results[0].error and dead[1] in results[0].error
    [bad] = _remote([RewardInput("s", "a", "a")], **_opts("ftp://x", token_file, "exact_match"))
    assert "must start with http://" in bad.error


def test_an_answer_is_used_only_when_it_holds_every_id_exactly_once():
    ok = {"results": [{"id": "1", "score": None, "parts": {}}, {"id": "0", "score": 2, "parts": {"a": 1}}]}
    assert [r.to_json() for r in accept(["0", "1"], ok)] == [
        {"score": 2, "parts": {"a": 1.0}},
        {"score": None, "parts": {}},
    ]
    row = {"id": "0", "score": 1.0, "parts": {}}
    for bad, why in [
        ({"results": [row, row]}, "answered twice"),
        ({"results": [row, {**row, "id": "7"}]}, "unknown id '7'"),
        ({"results": [row]}, "1 ids unanswered"),
        ({"results": [row, {**row, "id": "1", "score": "high"}]}, "malformed"),
        ({"detail": "oops"}, "no 'results'"),
    ]:
        with pytest.raises(ValueError, match=why):
            accept(["0", "1"], bad)


def test_token_file_must_be_private(tmp_path):
    token_file = _token_file(tmp_path, 0o644)
    with pytest.raises(TokenFileError, match="chmod 600"):
        read_token(token_file)
    proc = subprocess.run(
        [*_serve_cmd(_free_port(), token_file), "--rewards", "exact_match"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "chmod 600" in proc.stderr and TOKEN not in proc.stderr + proc.stdout
    token_file.chmod(0o600)
    token_file.write_text("short\n")
    with pytest.raises(TokenFileError, match="fewer than 16"):
        read_token(token_file)


def test_cli_remote_mode(pair, tmp_path):
    urls, token_file = pair
    (tmp_path / "resp.txt").write_text("<answer>42</answer>")
    (tmp_path / "ref.txt").write_text("42\n")
    args = ["--response", tmp_path / "resp.txt", "--reference", tmp_path / "ref.txt", "--json"]
    opts = [f"urls={','.join(urls)}", "reward=exact_match", f"token_file={token_file}"]
    cmd = [sys.executable, "-m", "mmrl.cli", "reward", "remote", *args]
    for o in opts:
        cmd += ["--option", o]
    proc = subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"score": 1.0, "parts": {}}


@pytest.mark.tex
def test_latex_table_remote_equals_local(pair):
    if shutil.which("pdflatex") is None:
        pytest.fail("pdflatex is not installed: run bash scripts/setup.sh (TeX Live is part of the set-up)")
    import random

    from mmrl.recipes.table2latex.data import make_table

    urls, token_file = pair
    batch = []
    for k in range(4):
        ref = make_table(random.Random(k), 1 + k % 3).latex()
        for j, resp in enumerate([ref, ref.replace("\\\\", "& x \\\\", 1), ref[: len(ref) // 2]]):
            batch.append(RewardInput(f"t{k}-{j}", resp, ref))
    got = _remote(batch, **_opts(urls, token_file, "latex_table", chunk_size=4))
    want = _local("latex_table", batch)
    assert [r.to_json() for r in got] == [r.to_json() for r in want]
    assert {r.score for r in got} != {0.0} and all(r.error is None for r in got[::3])


def test_a_server_killed_mid_run_loses_and_doubles_nothing(tmp_path):
    batch = [RewardInput(f"s{i}", " ".join(["w"] * (i % 9)) + f" {i}", None) for i in range(64)]
    with _servers(tmp_path, 2, "--rewards", SLOW, "--option", f"{SLOW}.seconds=0.1") as (urls, procs, _):
        killer = threading.Timer(1.0, _kill, args=(procs[0],))
        killer.start()
        try:
            opts = _opts(
                urls, tmp_path / "token", "plugin_slow_heavy", chunk_size=4, reward_options={"seconds": 0.1}
            )
            before = remote_stats().get("server_failures", 0)
            got = _remote(batch, **opts)
        finally:
            killer.join()
        # killed while the run was going on: the client saw the server fail and re-sent its chunks elsewhere
        assert procs[0].poll() is not None
        assert remote_stats()["server_failures"] - before >= 1
    want = _local(SLOW, batch, seconds=0.0)
    assert [r.to_json() for r in got] == [r.to_json() for r in want]
