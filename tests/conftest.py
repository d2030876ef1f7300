import http.server
import os
import socketserver
import threading

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    """``tiny_family(NAME)``: a tiny random checkpoint of a VLM family (``mmrl build-tiny --family NAME``), built once
    per test session; the shipped tiny Qwen2.5-VL for ``qwen2_5_vl``. Under pytest-xdist the workers share one build
    folder (the session's root temp folder, new each session) and a file lock per family, so that each family is
    built once rather than once per worker; the build is deterministic (seed 0) and lands by an atomic rename."""
    from pathlib import Path

    from filelock import FileLock

    from mmrl.tiny.build import build_tiny

    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "families"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("families")
    built = {}

    def get(family: str) -> Path:
        if family == "qwen2_5_vl":
            return Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl"
        if family not in built:
            out = root / family
            with FileLock(str(root / f"{family}.lock")):
                built[family] = (
                    out if (out / "config.json").is_file() else build_tiny(out, seed=0, family=family)
                )
        return built[family]

    return get


class _Hits(http.server.BaseHTTPRequestHandler):
    """A canary web server for the sandbox tests: every request a page manages to make is recorded."""

    hits: list[str] = []

    def do_GET(self):
        self.hits.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"leaked")

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    """A canary HTTP server on loopback: (host:port, the paths requested so far)."""
    srv = socketserver.TCPServer(("127.0.0.1", 0), _Hits)
    _Hits.hits = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{srv.server_address[1]}", _Hits.hits
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True, scope="module")
def _no_shared_browser_left_open():
    """Close the browser env's shared Chromium after each module that opened one in this process: Playwright's sync
    API allows one live instance per thread, and a browser left open breaks every later module that renders."""
    yield
    import sys

    browser = sys.modules.get("mmrl.envs.browser")
    if browser is not None:
        browser.close_shared_browser()
