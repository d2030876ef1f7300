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

Crashes. A renderer can crash and a browser can die under any Chromium user (another Chromium on a loaded machine;
the OOM killer): Playwright then raises ``Target crashed``, ``Page crashed`` or a ``TargetClosedError`` (``Target
page, context or browser has been closed``) from the call under way or the next one on that page (the page's
``crash`` event fires too, later; the errors are what is read). :meth:`HtmlRenderer.retry_crashes` is the one
place every user (this renderer, the gui data builders, the ``browser_app`` env) survives them: it relaunches a
dead browser, lets the caller open its page again, and runs the item again, at most ``crash_retries`` times; then
the item fails with :class:`ChromiumCrash`, whose message names the item and every crash. Only crashes are retried
(:func:`crash_reason`): a timeout, the watchdog's own kill of a hung page, a script or content error fail the item
at once, so hostile HTML fails closed. A page that crashes its renderer (an allocation past ``memory_limit_mb``)
looks like any other crash, so it is rendered at most ``1 + crash_retries`` times.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np

from mmrl.extras import require
from mmrl.rewards.sandbox import RenderResult

_CHROMIUM_ARGS = [
    *"--no-sandbox --disable-gpu --disable-background-networking --disable-component-update --disable-sync".split(),
    *"--no-first-run --disable-quic --disable-dev-shm-usage".split(),
    "--host-resolver-rules=MAP * ~NOTFOUND",
    # Same page, same pixels (docs/agents.md, "The browser env's pixels"): with partial raster on, a screenshot
    # after an action sometimes differs from a fresh build's by a few anti-aliased edge pixels (a button's rounded
    # corners); the gui data builder built twice under CI-like load differed in 5 of 32 tries, 0 of 31 with these.
    "--disable-partial-raster",
    "--disable-checker-imaging",
]
_TEXT_JS = "() => document.body ? document.body.innerText : ''"
_PAGE_SIZE_JS = "() => [document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
# Playwright's words for a dead renderer ("Target crashed", "Page crashed") or browser ("Target page, context or
# browser has been closed", "Browser has been closed", "Browser closed", "Playwright connection closed")
_CRASH = re.compile(r"Target crashed|Page crashed|has been closed|Browser closed|[Cc]onnection closed")

logger = logging.getLogger("mmrl.rewards.html_sandbox")
T = TypeVar("T")


class ChromiumCrash(RuntimeError):
    """An item that Chromium crashed under ``1 + crash_retries`` times in a row; the message names the item and
    every crash."""


def crash_reason(error: BaseException) -> str | None:
    """``error``'s first line when it is Playwright reporting a crashed renderer or a dead browser (retried on a
    new page); None for anything else (a timeout, a script or content error: the item's own fault)."""
    if not type(error).__module__.startswith("playwright") or type(error).__name__ == "TimeoutError":
        return None
    first = (str(error).strip().splitlines() or [""])[0].strip()[:200]
    if type(error).__name__ == "TargetClosedError" or _CRASH.search(first):
        return f"{type(error).__name__}: {first}"
    return None


def describe_error(error: BaseException) -> str:
    """``Type: first line`` of ``error`` (Playwright's messages go on with a call log)."""
    first = (str(error).strip().splitlines() or [""])[0][:400]
    return f"{type(error).__name__}: {first}"


class LeftOut:
    """A data builder's items that failed after Chromium crashed under them: ``with left_out.item(name): ...``
    swallows a :class:`ChromiumCrash` from the block (the rest of the block is skipped, the item left out with a
    warning naming it and the crashes) so that the build goes on; ``in_a_row`` failed items in a row raise, since
    Chromium is then broken, not one item."""

    def __init__(self, builder: str, in_a_row: int = 3) -> None:
        self.builder, self.in_a_row = builder, in_a_row
        self.items: list[str] = []
        self._streak = 0

    @contextlib.contextmanager
    def item(self, name: str) -> Iterator[None]:
        try:
            yield
        except ChromiumCrash as e:
            self.items.append(name)
            self._streak += 1
            logger.warning("%s: %s left out: %s", self.builder, name, e)
            if self._streak >= self.in_a_row:
                raise RuntimeError(
                    f"{self.builder}: Chromium crashed on {self._streak} items in a row (the last, {name}: {e}); "
                    "check this machine's Chromium (bash scripts/setup.sh) and its free memory"
                ) from e
        else:
            self._streak = 0


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
        crash_retries: int = 2,
    ):
        self.javascript, self.max_html_bytes = javascript, max_html_bytes
        self.crash_retries = crash_retries
        self.memory_limit_mb, self.renderer_cpu_s = memory_limit_mb, renderer_cpu_s
        self.max_width, self.max_height, self.close_timeout_s = max_width, max_height, close_timeout_s
        self.blocked_requests = 0
        self.restarts = 0
        self.crashes = 0  # crashes seen by retry_crashes, survived or not
        self._pw = self._browser = self._blackhole = None
        self._browser_procs: list = []
        self._browser_dead = False
        self._expired = False  # the watchdog killed the browser: the page's timeout follows, not a crash

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
        input is rejected, the page does not finish within ``timeout_ms``, or Chromium crashes under it
        ``1 + crash_retries`` times in a row (:meth:`retry_crashes`). ``extract_text`` also returns the visible
        text of every frame (tests use it to prove that no local file was loaded)."""
        t0 = time.monotonic()
        text, error = _screen_html(html, self.max_html_bytes)
        if error is not None:
            return RenderResult(ok=False, error=f"rejected: {error}")
        self.ensure_browser()  # a browser that cannot start at all is the machine's problem: it raises
        try:
            image, text = self.retry_crashes(
                lambda: self._render_once(text, width, timeout_ms, extract_text), "page"
            )
        except Exception as e:  # Playwright's TimeoutError and Error, the watchdog's kill, ChromiumCrash
            if not self._browser_alive():
                self._relaunch()
            return RenderResult(ok=False, error=describe_error(e), seconds=time.monotonic() - t0)
        return RenderResult(ok=True, image=image, seconds=time.monotonic() - t0, text=text)

    def retry_crashes(
        self, attempt: Callable[[], T], what: str, recover: Callable[[], None] | None = None
    ) -> T:
        """``attempt()``, again after each crash of Chromium under it (:func:`crash_reason`), at most
        ``crash_retries`` times: a dead browser is relaunched and ``recover()`` (the caller opens its page again)
        runs before the next attempt. Then :class:`ChromiumCrash` names ``what`` and every crash. Any other error,
        and the watchdog's kill of a hung page, propagates at once."""
        crashes: list[str] = []
        while True:
            try:
                self._expired = False
                self.ensure_browser()
                if crashes and recover is not None:
                    recover()
                return attempt()
            except Exception as e:
                reason = None if self._expired else crash_reason(e)
                if reason is None:
                    raise
                dead = not self._browser_alive()
                self._browser_dead = self._browser_dead or dead
                crashes.append(f"{'browser died' if dead else 'renderer crashed'} ({reason})")
                self.crashes += 1
                if len(crashes) > self.crash_retries:
                    raise ChromiumCrash(
                        f"{what}: Chromium crashed {len(crashes)} times in a row: {'; '.join(crashes)}"
                    ) from e
                logger.warning("%s: Chromium crashed (%s); trying again on a new page", what, crashes[-1])

    def ensure_browser(self) -> None:
        """Launch Chromium, or launch it again when it died or was killed."""
        if self._pw is None:
            self._launch()
        elif self._browser is None or self._browser_dead or not self._browser.is_connected():
            self._relaunch()

    def _render_once(
        self, html: str, width: int, timeout_ms: int, extract_text: bool
    ) -> tuple[np.ndarray, str | None]:
        deadline = time.monotonic() + timeout_ms / 1000.0
        # Calls without a timeout of their own (evaluate, close) hang while a script spins; past the deadline the
        # watchdog kills the browser, which makes them raise.
        watchdog = threading.Timer(timeout_ms / 1000.0 + 1.0, self._expire)
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
            return self._shoot(context.new_page(), html, deadline, extract_text)
        finally:
            closed = context is None or self._guarded(context.close)
            watchdog.cancel()
            watchdog.join()
            self._browser_dead = self._browser_dead or not closed

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

    def _expire(self) -> None:
        self._expired = True
        self._kill_browser()

    def _browser_alive(self) -> bool:
        """The browser is connected and its main process runs (a killed one can look connected for a moment)."""
        if self._browser_dead or self._browser is None or not self._browser.is_connected():
            return False
        try:
            return all(p.is_running() and p.status() != "zombie" for p in self._browser_procs)
        except Exception:  # psutil.NoSuchProcess
            return False

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


__all__ = ["ChromiumCrash", "HtmlRenderer", "LeftOut", "crash_reason", "describe_error"]
