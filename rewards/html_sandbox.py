"""Rendering sandbox for untrusted HTML: headless Chromium (Playwright sync API) -> grayscale images, for rewards that
judge an HTML answer by how it looks. Model outputs are hostile input (see :mod:`.sandbox` for the LaTeX side).

:class:`HtmlRenderer` keeps one Chromium per renderer and gives each call a fresh context and page, JavaScript off
unless asked for. Every request is aborted by a route handler and counted (``blocked_requests``); behind the routes
the browser's proxy is a local port held bound but never listening (loopback not bypassed), and host names resolve
to nothing, because WebSockets do not pass through routes. Content comes in as a string, never as a path or URL,
and Chromium refuses ``file:`` URLs in a page that is not itself a file, so no local file is read (the security
tests check a ``file://`` iframe).

Resource limits. Chromium's processes get rlimits right after launch, before any untrusted page exists, so every
process started later inherits them: ``RLIMIT_DATA`` (``memory_limit_mb``, default 2048) on all of them, which
bounds what a page can allocate (a renderer that reaches it dies of OOM and the page reports a crash);
``RLIMIT_CPU`` (``renderer_cpu_s``) on the zygotes, so each renderer forked from them has its own CPU budget while
the long-lived browser process has none (utility processes forked from a zygote inherit it; they use little CPU,
and the browser restarts one that dies); no core files; 256 MiB per written file. ``RLIMIT_AS`` is not usable:
measured with Chromium 131-class builds, a renderer reserves about 1.4 TB of address space up front (V8's pointer
cage and sandbox) and the browser about 53 GB, so any useful cap stops them at start-up; ``RLIMIT_DATA`` counts
only writable private memory and works. A page past ``timeout_ms`` (an endless script) is closed with its context;
calls that hang (``evaluate`` has no timeout) are ended by a watchdog that kills the browser's process tree, and a
new browser is launched. Input size and screenshot size are capped; the screenshot is cropped to its content like
the LaTeX pages.
"""

from __future__ import annotations

import io
import threading
import time

import numpy as np

from mmrl.extras import require
from mmrl.rewards.sandbox import RenderResult

_CHROMIUM_ARGS = [
    *"--no-sandbox --disable-gpu --disable-background-networking --disable-component-update --disable-sync".split(),
    *"--no-first-run --disable-quic --disable-dev-shm-usage".split(),
    "--host-resolver-rules=MAP * ~NOTFOUND",
]
_TEXT_JS = "() => document.body ? document.body.innerText : ''"
_PAGE_SIZE_JS = "() => [document.documentElement.scrollWidth, document.documentElement.scrollHeight]"


class HtmlRenderer:
    """Renders untrusted HTML with one reused headless Chromium; use as a context manager (``with HtmlRenderer() as
    r: r.render(html)``). Not thread-safe: Playwright's sync API belongs to the thread that started it.

    ``blocked_requests`` counts the requests the route handler aborted; one that a script fires late may still be
    held at the route when the page closes, and is then dropped with it, uncounted. Behind the routes, the browser's
    proxy is a local port this object holds bound but never listening, so any connection the routes do not see
    (WebSockets) is refused on the spot; host names resolve to nothing."""

    def __init__(
        self,
        *,
        javascript: bool = False,
        max_html_bytes: int = 256 * 1024,
        max_width: int = 4000,
        max_height: int = 4000,
        close_timeout_s: float = 5.0,
        memory_limit_mb: int = 2048,
        renderer_cpu_s: int = 30,
    ):
        self.javascript, self.max_html_bytes = javascript, max_html_bytes
        self.memory_limit_mb, self.renderer_cpu_s = memory_limit_mb, renderer_cpu_s
        self.max_width, self.max_height, self.close_timeout_s = max_width, max_height, close_timeout_s
        self.blocked_requests = 0
        self.restarts = 0
        self._pw = self._browser = self._blackhole = None
        self._browser_procs: list = []
        self._browser_dead = False

    def __enter__(self) -> HtmlRenderer:
        self._launch()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the browser and the Playwright driver; kills the browser's processes if closing does not finish."""
        if self._browser is not None:
            self._guarded(self._browser.close)
        self._kill_browser()
        self._browser = None
        if self._pw is not None:
            self._pw.stop()
            self._pw = None
        if self._blackhole is not None:
            self._blackhole.close()
            self._blackhole = None

    def render(
        self, html: str | bytes, *, width: int = 800, timeout_ms: int = 3000, extract_text: bool = False
    ) -> RenderResult:
        """Screenshot ``html`` in a ``width``-pixel viewport, cropped to its content; not ok (never raises) when the
        input is rejected, the page does not finish within ``timeout_ms`` or the browser fails. ``extract_text``
        also returns the visible text of every frame (tests use it to prove that no local file was loaded)."""
        t0 = time.monotonic()
        text, error = _screen_html(html, self.max_html_bytes)
        if error is not None:
            return RenderResult(ok=False, error=f"rejected: {error}")
        if self._browser is None or self._browser_dead or not self._browser.is_connected():
            self._relaunch()
        # Calls without a timeout of their own (evaluate, close) hang while a script spins; past the deadline the
        # watchdog kills the browser, which makes them raise.
        watchdog = threading.Timer(timeout_ms / 1000.0 + 1.0, self._kill_browser)
        watchdog.start()
        context = None
        try:
            context = self._browser.new_context(
                viewport={"width": width, "height": 600},
                java_script_enabled=self.javascript,
                service_workers="block",
                accept_downloads=False,
                device_scale_factor=1,
            )
            context.route("**/*", self._abort)
            image, text = self._shoot(context.new_page(), text, t0 + timeout_ms / 1000.0, extract_text)
            return RenderResult(ok=True, image=image, seconds=time.monotonic() - t0, text=text)
        except Exception as e:  # Playwright's TimeoutError and Error, a killed browser
            first = (str(e).strip().splitlines() or [""])[0][:200]
            return RenderResult(ok=False, error=f"{type(e).__name__}: {first}", seconds=time.monotonic() - t0)
        finally:
            closed = context is None or self._guarded(context.close)
            watchdog.cancel()
            watchdog.join()
            if not closed or self._browser_dead:
                self._relaunch()

    def _shoot(self, page, html: str, deadline: float, extract_text: bool) -> tuple[np.ndarray, str | None]:
        page.set_content(html, timeout=_left_ms(deadline), wait_until="load")
        w, h = page.evaluate(_PAGE_SIZE_JS)
        clip = {
            "x": 0,
            "y": 0,
            "width": min(max(w, 1), self.max_width),
            "height": min(max(h, 1), self.max_height),
        }
        png = page.screenshot(clip=clip, full_page=True, timeout=_left_ms(deadline), animations="disabled")
        text = "\n".join(_frame_text(f) for f in page.frames) if extract_text else None
        return _crop_content(_png_to_gray(png)), text

    def _abort(self, route) -> None:
        self.blocked_requests += 1
        route.abort()

    def _launch(self) -> None:
        import socket

        require("gui", "the HTML renderer (Chromium driven by playwright)", ("playwright",))
        import psutil
        from playwright.sync_api import sync_playwright

        self._blackhole = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._blackhole.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = self._blackhole.getsockname()[1]
        before = {p.pid for p in psutil.Process().children()}
        self._pw = sync_playwright().start()
        proxy = [f"--proxy-server=http://127.0.0.1:{port}", "--proxy-bypass-list=<-loopback>"]
        self._browser = self._pw.chromium.launch(
            executable_path="/usr/bin/chromium", args=[*_CHROMIUM_ARGS, *proxy]
        )
        # Playwright's driver is our new child; the browser's main process is the driver's child.
        drivers = [p for p in psutil.Process().children() if p.pid not in before]
        self._browser_procs = [c for d in drivers for c in d.children()]
        self._browser_dead = False
        self._limit_processes()

    def _limit_processes(self) -> None:
        """rlimits on the browser's processes (see module docstring); children started later inherit them. A child
        forked while the list was being taken (before its parent had the limits) is caught by the next pass: passes
        repeat until every process has them."""
        import psutil

        data = self.memory_limit_mb << 20
        for _ in range(20):
            missed = 0
            for root in self._browser_procs:
                try:
                    procs = [root, *root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
                for p in procs:
                    try:
                        if p.rlimit(psutil.RLIMIT_DATA) == (data, data):
                            continue
                        missed += 1
                        p.rlimit(psutil.RLIMIT_DATA, (data, data))
                        p.rlimit(psutil.RLIMIT_CORE, (0, 0))
                        p.rlimit(psutil.RLIMIT_FSIZE, (256 << 20, 256 << 20))
                        if "--type=zygote" in p.cmdline():
                            p.rlimit(psutil.RLIMIT_CPU, (self.renderer_cpu_s, self.renderer_cpu_s + 1))
                    except psutil.NoSuchProcess:
                        continue
            if not missed:
                return
            time.sleep(0.05)

    def _relaunch(self) -> None:
        self.close()
        self.restarts += 1
        self._launch()

    def _guarded(self, fn) -> bool:
        """Call ``fn``; if it has not returned after ``close_timeout_s``, kill the browser (which makes it return)."""
        timer = threading.Timer(self.close_timeout_s, self._kill_browser)
        timer.start()
        try:
            fn()
            return True
        except Exception:
            return False
        finally:
            timer.cancel()
            timer.join()

    def _kill_browser(self) -> None:
        import psutil

        self._browser_dead = True
        procs = []
        for root in self._browser_procs:
            try:
                procs += [*root.children(recursive=True), root]
            except psutil.NoSuchProcess:
                pass
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=2)
        self._browser_procs = []


def _frame_text(frame) -> str:
    try:
        return frame.evaluate(_TEXT_JS)
    except Exception:  # a frame showing Chromium's own error page cannot be evaluated; it holds no text
        return ""


def _left_ms(deadline: float) -> float:
    return max(1.0, (deadline - time.monotonic()) * 1000.0)


def _screen_html(html: str | bytes, limit: int) -> tuple[str, str | None]:
    if isinstance(html, bytes):
        try:
            html = html.decode("utf-8")
        except UnicodeDecodeError as e:
            return "", f"input is not valid UTF-8 ({e.reason} at byte {e.start})"
    if not isinstance(html, str):
        return "", f"input must be str or bytes, got {type(html).__name__}"
    try:
        size = len(html.encode("utf-8"))
    except UnicodeEncodeError:
        return "", "input is not valid UTF-8 (lone surrogate)"
    if size > limit:
        return "", f"input is {size} bytes, over the {limit}-byte limit"
    return html, None


def _png_to_gray(png: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("L"), dtype=np.float32) / 255.0


def _crop_content(image: np.ndarray, border: int = 3) -> np.ndarray:
    """Crop to the non-white pixels plus ``border`` (about the 2 pt the LaTeX pages keep at 100 dpi)."""
    rows = np.flatnonzero((image < 0.999).any(axis=1))
    cols = np.flatnonzero((image < 0.999).any(axis=0))
    if rows.size == 0:
        return np.ones((2 * border, 2 * border), dtype=np.float32)
    out = np.ones(
        (rows[-1] - rows[0] + 1 + 2 * border, cols[-1] - cols[0] + 1 + 2 * border), dtype=np.float32
    )
    out[border:-border, border:-border] = image[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    return out


__all__ = ["HtmlRenderer"]
