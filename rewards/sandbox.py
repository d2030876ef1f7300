"""Rendering sandbox: untrusted LaTeX tables -> grayscale images (pdfLaTeX + PDFium), untrusted HTML -> grayscale
images (headless Chromium). Model outputs are hostile input; this module is the security boundary of the rendering
rewards (ALGORITHMS.md §4, Table2LaTeX-RL "visual").

LaTeX, :func:`render_latex`. Every body is compiled inside one fixed preamble (:data:`PREAMBLE`: ``standalone`` with
``border=2pt``, amsmath booktabs multirow tabularx multicol bm xcolor graphicx makecell array), each body on its own
cropped standalone page (``multi=mmrlpage``), and rasterised in-process with PDFium to float32 grayscale in [0, 1].
Needs TeX Live with texlive-latex-extra and the cm-super Type 1 fonts (Debian ``cm-super``): without them ``±``,
``°``, ``×``, ``\\textless`` ... (TS1/T1 glyphs) fail to compile, because font generation is switched off here.

Security, outermost layer first (the OS and kpathsea layers are the boundary; the TeX layers only fail early):

- Landlock (:mod:`.landlock`, Linux >= 5.13): pdflatex may read only the TeX trees, its binary and libraries and the
  format, and write only its run directory; no TCP. This matters: pdfTeX 1.40.24 reads ``\\pdfobj file {...}``
  without asking kpathsea, i.e. it embeds ``/etc/passwd`` in the PDF even in paranoid mode (shown in
  tests/test_sandbox_security.py). Without Landlock in the kernel the other layers still stop that primitive.
- pdflatex runs in a fresh temporary directory (its cwd, removed afterwards) with a minimal environment built from
  scratch: ``openin_any=p openout_any=p`` (kpathsea "paranoid": no absolute paths, no ``..``, no dotfiles, for
  reading and writing; also given as ``-cnf-line``), ``shell_escape=f`` plus ``-no-shell-escape``, no
  ``TEXMFOUTPUT``, ``HOME`` = the run directory, font generation off (``MKTEX*=0``, ``-no-mktex``: no subprocess
  ever), ``-no-parse-first-line``, stdin closed, its own session (process group), rlimits (CPU, 1 GiB address space,
  20 MB per written file so log bombs die of SIGXFSZ, no core files, ``RLIMIT_NPROC=0`` so a non-root pdflatex cannot
  fork; root is exempt from that one) and a wall-clock timeout that SIGKILLs the process group. Even a finished
  run's group is killed, so nothing outlives a call.
- Inputs are screened before any process starts (:func:`screen_latex`): not str/UTF-8, NUL or other control
  characters, over :data:`MAX_BODY_BYTES` -> rejected. Control words that read or write files, reach the shell or the
  PDF internals, change catcodes, build control sequences from text, loop or fill the log (:data:`FORBIDDEN_WORDS`,
  every ``\\pdf...``, ``^^`` notation, ``document``/``filecontents`` environments) are rejected without running TeX.
- Inside TeX, the format redefines ``\\input \\include \\openout \\special \\scantokens \\includegraphics
  \\pdfobj \\pdffiledump \\pdfmdfivesum \\pdffilesize \\pdfximage \\pdfprimitive`` ... to errors at
  ``\\begin{document}``. ``\\openin``/``\\read`` stay: LaTeX needs them at run time (loading ``t1enc.def`` for
  ``\\textless``). LaTeX's and expl3's internal aliases of all of these keep working, hence "second line".
- The PDF is checked before rasterising: page count, page size (:data:`MAX_PAGE_PT` per side, ``max_pixels``), so a
  ``\\rule{16000pt}{16000pt}`` fails without allocating a bitmap. PDFium (Chrome's PDF engine) parses the PDF.

Speed, rendering only, measured by ``benchmarks/latex_reward.py --ablation`` (90 distinct tables, 11 of them
broken, the 2-core machine shared with other work, so +-20%): naive (full preamble, one ``pdflatex`` + one
``pdftoppm`` per table) 6.3 renders/s;

- (a) the preamble precompiled once into a format (``pdflatex -ini "&pdflatex"`` + ``\\dump``; mylatexformat is
  not needed because the preamble ends before ``\\begin{document}``), cached on disk under ``$MMRL_CACHE_DIR``
  (default ``~/.cache/mmrl``) keyed by the format source, pdfTeX version and base format: 9.2 renders/s;
- (c) PDFium in-process instead of ``pdftoppm`` (0.8 ms against ~9 ms a page): no measurable gain on its own, the
  sandbox's per-run set-up (temporary directory, Landlock) costs about as much;
- (b) up to ``batch_size`` bodies per TeX run, one page each: 53 renders/s, the big step (a run costs ~0.08 s of
  start-up, a table a few ms). A body that could change the state seen by the next one (definitions, ``\\global``,
  counters, leaving its group: :data:`SOLO_WORDS`) is compiled alone. A failing run is resumed: a per-run secret
  marker in the log names the body that failed; it gets that error and the others are run again without it. A run
  past its timeout, without a marker or with the wrong page count falls back to one run per body, so a bad body
  never costs its neighbours anything but time, and batched and single renders are pixel-identical;
- (d) ``workers`` TeX runs at once, driven from the calling thread (``pidfd`` + ``poll``; it starts no threads, so
  the rlimit/Landlock ``preexec_fn`` is safe unless the caller runs threads of its own), the next run starting
  before this thread rasterises: 79 renders/s.

HTML, :class:`HtmlRenderer`: one Chromium (Playwright sync API) per renderer, a fresh context and page per call,
JavaScript off unless asked for, every request aborted by a route handler and counted (``blocked_requests``), and
behind the routes a proxy that refuses every connection (a local port held bound but never listening, loopback not
bypassed) and no host name resolution, because WebSockets do not pass through routes. A page past ``timeout_ms``
(an endless script) is closed with its context; calls that hang (``evaluate`` has no timeout) are ended by a
watchdog that kills the browser's process tree, and a new browser is launched. Input size and screenshot size are
capped; the screenshot is cropped to its content like the LaTeX pages.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
import resource
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmrl.rewards import landlock

PACKAGES = tuple("amsmath booktabs multirow tabularx multicol bm xcolor graphicx makecell array".split())
PAGE_ENV = "mmrlpage"
PREAMBLE = f"\\documentclass[border=2pt,multi={PAGE_ENV}]{{standalone}}\n" + "".join(
    f"\\usepackage{{{p}}}\n" for p in PACKAGES
)
MAX_BODY_BYTES = 64 * 1024
MAX_PAGE_PT = 5000.0
MAX_PIXELS = 16_000_000
ADDRESS_SPACE = 1 << 30
MAX_FILE_BYTES = 20 * 1000 * 1000

# Rejected outright: they read or write files, reach the shell or PDF internals, rebuild any of these from text, or
# only serve to loop or to fill the log (no table needs them).
FORBIDDEN_WORDS = frozenset(
    "input include includeonly InputIfFileExists IfFileExists openin read readline closein endinput verbatiminput "
    "VerbatimInput lstinputlisting includegraphics includepdf usepackage RequirePackage documentclass documentstyle "
    "LoadClass openout write immediate closeout ShellEscape DelayedShellEscape directlua latelua luaexec catcode "
    "makeatletter ExplSyntaxOn csname scantokens special shipout dump primitive batchmode errorstopmode scrollmode "
    "nonstopmode interactionmode loop repeat message typeout wlog show showthe showbox showlists errmessage "
    "errhelp".split()
)
FORBIDDEN_PREFIXES = ("pdf",)
# Allowed, but could leak state into the next body of a shared run (definitions, global assignments, counters,
# leaving the page's group): such a body gets its own TeX run.
SOLO_WORDS = frozenset(
    "def edef gdef xdef let futurelet global globaldefs long outer protected newcommand renewcommand providecommand "
    "DeclareRobustCommand newenvironment renewenvironment newcolumntype newif setcounter addtocounter stepcounter "
    "refstepcounter newcounter newlength newsavebox caption footnote footnotemark footnotetext afterassignment "
    "aftergroup endgroup egroup definecolor colorlet xglobal fontdimen hyphenchar skewchar hyphenation patterns "
    "uccode lccode sfcode mathcode delcode chardef mathchardef countdef dimendef skipdef toksdef muskipdef "
    "font".split()
)
_FORBIDDEN_ENVS = ("document", "filecontents", "filecontents*")
_LOCKED = (
    "input include includeonly openout special scantokens includegraphics pdfobj "
    "pdffiledump pdfmdfivesum pdffilesize pdffilemoddate pdfximage pdfprimitive pdfannot pdfstartlink pdfinfo "
    "pdfcatalog pdfnames pdftrailer pdfoutline pdfdest".split()
)
FORMAT_SOURCE = (
    PREAMBLE
    + "\\makeatletter\n"
    + "\\def\\mmrl@forbidden#1{\\errmessage{mmrl sandbox: \\string#1 is disabled}}\n"
    + "\\def\\mmrl@lock#1{\\def#1{\\mmrl@forbidden#1}}\n"
    + "\\def\\mmrlmark#1{\\immediate\\write-1{#1}}\n"
    + "\\AtBeginDocument{"
    + "".join(f"\\mmrl@lock\\{w}" for w in _LOCKED)
    + "}\n\\makeatother\n\\dump\n"
)
_CONTROL = re.compile(r"\\(?:([A-Za-z]+)|.)", re.S)
_COMMENT = re.compile(r"(\\.)|%[^\n]*(?:\n[ \t]*)?", re.S)
_BAD_CHARS = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
_ENV_NAME = re.compile(r"\\(?:begin|end)\s*\{\s*([^}]*)\}")
_TEX_FLAGS = tuple(
    "-no-shell-escape -interaction=nonstopmode -halt-on-error -no-parse-first-line -no-mktex=tfm -no-mktex=pk "
    "-no-mktex=tex -cnf-line=openin_any=p -cnf-line=openout_any=p -cnf-line=shell_escape=f".split()
)
_PDFIUM_LOCK = threading.Lock()  # PDFium is not thread-safe, even across documents
_FORMAT_LOCK = threading.Lock()
_FORMAT_DIRS: dict[str, Path] = {}
_TEX_READ_PATHS: list[str] = []


@dataclass
class RenderResult:
    """One render: ``image`` is float32 grayscale in [0, 1] (1 = white), cropped to the content plus the border;
    ``seconds`` is this input's share of the wall time of the run that produced it; ``text`` is the text layer
    (only when asked for: tests use it to prove that nothing was read from outside)."""

    ok: bool
    image: np.ndarray | None = None
    error: str | None = None
    seconds: float = 0.0
    text: str | None = None


@dataclass
class _Job:
    items: list[int]
    solo: bool


@dataclass
class _Run:
    job: _Job
    proc: subprocess.Popen
    pidfd: int
    workdir: Path
    nonce: str
    started: float
    deadline: float


def screen_latex(body: str | bytes) -> tuple[str, str | None, bool]:
    """``(text, error, solo)``: the body as text, why it is rejected (None when accepted), and whether it needs its
    own TeX run. Scans the raw text (comments included: a forbidden word in a comment is still rejected)."""
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as e:
            return "", f"input is not valid UTF-8 ({e.reason} at byte {e.start})", False
    if not isinstance(body, str):
        return "", f"input must be str or bytes, got {type(body).__name__}", False
    try:
        size = len(body.encode("utf-8"))
    except UnicodeEncodeError:
        return "", "input is not valid UTF-8 (lone surrogate)", False
    if size > MAX_BODY_BYTES:
        return "", f"input is {size} bytes, over the {MAX_BODY_BYTES}-byte limit", False
    bad = _BAD_CHARS.search(body)
    if bad:
        return "", f"input contains control character {bad.group()!r}", False
    # TeX joins the lines around a comment ("\\inp%<newline>ut"): check what TeX reads as well as the raw text.
    views = [body, _COMMENT.sub(lambda m: m.group(1) or "", body)] if "%" in body else [body]
    solo = False
    for view in views:
        error, needs_solo = _screen_words(view)
        if error is not None:
            return "", error, False
        solo = solo or needs_solo
    return body, None, solo


def _screen_words(text: str) -> tuple[str | None, bool]:
    if "^^" in text:
        return "input contains ^^ character notation", False
    if PAGE_ENV in text:
        return f"input mentions the sandbox's page environment {PAGE_ENV!r}", False
    for m in _ENV_NAME.finditer(text):
        if m.group(1).strip() in _FORBIDDEN_ENVS:
            return f"environment {m.group(1).strip()!r} is not allowed in a table body", False
    solo = False
    for m in _CONTROL.finditer(text):
        word = m.group(1)
        if word is None:
            continue
        if word in FORBIDDEN_WORDS or word.startswith(FORBIDDEN_PREFIXES):
            return f"command \\{word} is not allowed in a table body", False
        solo = solo or word in SOLO_WORDS
    return None, solo


def render_latex(
    bodies: Sequence[str | bytes],
    *,
    dpi: float = 100,
    timeout_s: float = 10.0,
    workers: int | None = None,
    batch_size: int = 32,
    root: str | Path | None = None,
    max_pixels: int = MAX_PIXELS,
    extract_text: bool = False,
    screen: bool = True,
) -> list[RenderResult]:
    """Render each LaTeX body (e.g. a ``tabular``) on its own page; one result per body, in order, never raises for a
    bad body. ``workers`` TeX processes run at once (default: the usable CPUs, at most 4); clean bodies share runs of
    at most ``batch_size``; every run gets ``timeout_s`` of wall time. ``root`` holds the temporary run directories
    (default: the system temp dir). ``screen=False`` skips the textual screening: only the security tests use it,
    to show that the OS and kpathsea layers hold on their own."""
    fmt_dir = format_dir()
    workers = workers or min(4, len(os.sched_getaffinity(0)))
    results: list[RenderResult | None] = [None] * len(bodies)
    texts: list[str] = [""] * len(bodies)
    batchable, solo = [], []
    for i, body in enumerate(bodies):
        text, error, needs_solo = screen_latex(body)
        if error is None or not screen:
            texts[i] = text if error is None else _as_text(body)
            (solo if needs_solo or error is not None else batchable).append(i)
        else:
            results[i] = RenderResult(ok=False, error=f"rejected: {error}")
    jobs = [_Job([i], True) for i in solo]
    n_chunks = max(min(workers, len(batchable)), math.ceil(len(batchable) / batch_size))
    jobs += [
        _Job(chunk.tolist(), False) for chunk in np.array_split(np.array(batchable, dtype=int), n_chunks or 1)
    ]
    _Compiler(texts, results, fmt_dir, dpi, timeout_s, root, max_pixels, extract_text).run(
        [j for j in jobs if j.items], workers
    )
    return [r if r is not None else RenderResult(ok=False, error="internal: no result") for r in results]


def _as_text(body: str | bytes) -> str:
    if isinstance(body, bytes):
        return body.decode("utf-8", errors="replace")
    return body.encode("utf-8", errors="replace").decode("utf-8")


class _Compiler:
    """Runs TeX jobs, at most ``workers`` at once, from the calling thread only."""

    def __init__(self, texts, results, fmt_dir, dpi, timeout_s, root, max_pixels, extract_text):
        self.texts, self.results, self.fmt_dir = texts, results, fmt_dir
        self.dpi, self.timeout_s, self.max_pixels, self.extract_text = (
            dpi,
            timeout_s,
            max_pixels,
            extract_text,
        )
        self.root = Path(root) if root is not None else Path(tempfile.gettempdir())
        self.queue: deque[_Job] = deque()

    def run(self, jobs: list[_Job], workers: int) -> None:
        self.queue.extend(jobs)
        running: dict[int, _Run] = {}
        try:
            while self.queue or running:
                self._fill(running, workers)
                finished = [self._collect(run, timed_out) for run, timed_out in _wait(running)]
                for run, rc, log, pdf, elapsed in finished:
                    if pdf is None:
                        self._settle_failure(run, rc, log, elapsed)
                self._fill(running, workers)  # the next TeX runs start before this thread rasterises
                for run, _, _, pdf, elapsed in finished:
                    if pdf is not None:
                        self._store_pages(run.job, pdf, elapsed)
        finally:
            for run in running.values():
                _reap(run)
                shutil.rmtree(run.workdir, ignore_errors=True)

    def _fill(self, running: dict[int, _Run], workers: int) -> None:
        while self.queue and len(running) < workers:
            run = self._start(self.queue.popleft())
            running[run.pidfd] = run

    def _start(self, job: _Job) -> _Run:
        workdir = Path(tempfile.mkdtemp(prefix="mmrl-tex-", dir=self.root))
        nonce = secrets.token_hex(8)
        lines = ["\\begin{document}"]
        for k, i in enumerate(job.items):
            lines += [
                f"\\mmrlmark{{mmrl-{nonce}-{k}}}%",
                f"\\begin{{{PAGE_ENV}}}%",
                self.texts[i] + "%",
                f"\\end{{{PAGE_ENV}}}%",
            ]
        lines += [f"\\mmrlmark{{mmrl-{nonce}-end}}%", "\\end{document}", ""]
        try:
            (workdir / "job.tex").write_text("\n".join(lines), encoding="utf-8")
            proc = spawn_tex(workdir, self.fmt_dir, self.timeout_s)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        now = time.monotonic()
        return _Run(job, proc, os.pidfd_open(proc.pid), workdir, nonce, now, now + self.timeout_s)

    def _collect(self, run: _Run, timed_out: bool) -> tuple[_Run, int | None, str, bytes | None, float]:
        """Reap a finished (or timed-out) run and read what it left; ``rc`` is None after a timeout."""
        rc = _reap(run)
        elapsed = time.monotonic() - run.started
        log = _read_tail(run.workdir / "job.log", 1 << 20)
        pdf_path = run.workdir / "job.pdf"
        pdf = pdf_path.read_bytes() if rc == 0 and not timed_out and pdf_path.is_file() else None
        shutil.rmtree(run.workdir, ignore_errors=True)
        return run, None if timed_out else rc, log, pdf, elapsed

    def _settle_failure(self, run: _Run, rc: int | None, log: str, elapsed: float) -> None:
        items = run.job.items
        if rc is None:
            self._fail_or_split(run.job, f"timed out after {self.timeout_s:g} s", elapsed)
            return
        error = _tex_error(log, rc)
        k = _last_marker(log, run.nonce)
        if run.job.solo or k is None:
            self._fail_or_split(run.job, error, elapsed)
            return
        self.results[items[k]] = RenderResult(ok=False, error=error, seconds=elapsed / len(items))
        rest = items[:k] + items[k + 1 :]
        if rest:
            self.queue.appendleft(_Job(rest, False))

    def _fail_or_split(self, job: _Job, error: str, elapsed: float) -> None:
        if job.solo:
            self.results[job.items[0]] = RenderResult(ok=False, error=error, seconds=elapsed)
        else:
            self.queue.extend(_Job([i], True) for i in job.items)

    def _store_pages(self, job: _Job, pdf: bytes, elapsed: float) -> None:
        t0 = time.monotonic()
        pages = _rasterise(pdf, len(job.items), self.dpi, self.max_pixels, self.extract_text)
        share = (elapsed + time.monotonic() - t0) / len(job.items)
        if isinstance(pages, str):
            self._fail_or_split(job, pages, elapsed)
            return
        for i, (image, error, text) in zip(job.items, pages):
            self.results[i] = RenderResult(
                ok=error is None, image=image, error=error, seconds=share, text=text
            )


def _wait(running: dict[int, _Run]) -> list[tuple[_Run, bool]]:
    """Block until a run exits or reaches its deadline; remove and return those as ``(run, timed_out)``."""
    poller = select.poll()
    for fd in running:
        poller.register(fd, select.POLLIN)
    wait_s = max(0.0, min(r.deadline for r in running.values()) - time.monotonic())
    ready = {fd for fd, _ in poller.poll(math.ceil(wait_s * 1000))}
    now = time.monotonic()
    return [
        (running.pop(fd), fd not in ready)
        for fd in list(running)
        if fd in ready or now >= running[fd].deadline
    ]


def _reap(run: _Run) -> int:
    """Kill the run's whole process group (also after a normal exit: nothing may outlive a call) and reap it."""
    try:
        os.killpg(run.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    rc = run.proc.wait()
    os.close(run.pidfd)
    return rc


def spawn_tex(workdir: Path, fmt_dir: Path, timeout_s: float, *, confine: bool = True) -> subprocess.Popen:
    """Start pdflatex on ``workdir/job.tex`` with every OS-level protection (see module docstring). Exposed for the
    security tests, which compile hand-made documents the same way; ``confine=False`` leaves Landlock out."""
    return subprocess.Popen(
        ["pdflatex", "-fmt=mmrlfmt", *_TEX_FLAGS, "job.tex"],
        cwd=workdir,
        env=_tex_env(fmt_dir, workdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        preexec_fn=_child_setup(math.ceil(timeout_s) + 1, workdir if confine else None, fmt_dir),
    )


def _child_setup(cpu_s: int, workdir: Path | None, fmt_dir: Path):
    """A ``preexec_fn``: rlimits, then Landlock (when the kernel has it and ``workdir`` is given). Everything is
    computed here, in the parent; the child only makes system calls."""
    limits = []
    for name, value, slack in (
        ("RLIMIT_CPU", cpu_s, 1),  # SIGXCPU at the soft limit, SIGKILL one second later
        ("RLIMIT_AS", ADDRESS_SPACE, 0),
        ("RLIMIT_FSIZE", MAX_FILE_BYTES, 0),
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NPROC", 0, 0),
    ):
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        cap = (lambda v: v) if hard == resource.RLIM_INFINITY else (lambda v, h=hard: min(v, h))
        limits.append((which, (cap(value), cap(value + slack))))
    confine = None
    if workdir is not None and landlock.abi() > 0:
        confine = landlock.confiner([*_TEX_READ_PATHS, fmt_dir], [workdir])

    def apply() -> None:
        for which, pair in limits:
            resource.setrlimit(which, pair)
        if confine is not None:
            confine()

    return apply


def _tex_env(fmt_dir: Path, home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LC_ALL": "C",
        "openin_any": "p",
        "openout_any": "p",
        "shell_escape": "f",
        "TEXFORMATS": f"{fmt_dir}:",
        "MKTEXTFM": "0",
        "MKTEXPK": "0",
        "MKTEXMF": "0",
        "MKTEXTEX": "0",
        "MKTEXFMT": "0",
        "max_print_line": "10000",
        "error_line": "254",
        "half_error_line": "238",
    }


def _read_tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _last_marker(log: str, nonce: str) -> int | None:
    found = re.findall(rf"^mmrl-{nonce}-(\d+|end)$", log, re.M)
    return int(found[-1]) if found and found[-1] != "end" else None


def _tex_error(log: str, rc: int) -> str:
    if rc < 0:
        name = signal.Signals(-rc).name
        return f"pdflatex killed by {name} (a resource limit: CPU time, memory or file size)"
    lines = log.splitlines()
    for n, line in enumerate(lines):
        if line.startswith("!"):
            context = next((ln for ln in lines[n + 1 : n + 12] if re.match(r"l\.\d+ ", ln)), "")
            context = re.sub(r"^l\.\d+ ", "", context).strip()
            return f"LaTeX error: {line[1:].strip()}" + (f" at: {context[-120:]}" if context else "")
    return f"pdflatex failed (exit status {rc}) without an error message"


def _rasterise(pdf: bytes, n_pages: int, dpi: float, max_pixels: int, extract_text: bool):
    """Per page ``(image, error, text)``, or a string when the document as a whole is unusable."""
    import pypdfium2 as pdfium

    scale = dpi / 72.0
    out = []
    with _PDFIUM_LOCK:
        doc = pdfium.PdfDocument(pdf)
        try:
            if len(doc) != n_pages:
                return f"the PDF has {len(doc)} pages, expected {n_pages}"
            for k in range(n_pages):
                page = doc[k]
                w, h = page.get_size()
                if max(w, h) > MAX_PAGE_PT or w * h * scale * scale > max_pixels:
                    out.append((None, f"page is {w:.0f}x{h:.0f} pt, over the size limit", None))
                    continue
                bitmap = page.render(scale=scale, grayscale=True, draw_annots=False)
                image = bitmap.to_numpy().astype(np.float32).reshape(bitmap.height, bitmap.width) / 255.0
                text = page.get_textpage().get_text_range() if extract_text else None
                out.append((image, None, text))
        finally:
            doc.close()
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("MMRL_CACHE_DIR") or Path.home() / ".cache" / "mmrl")


def format_dir() -> Path:
    """The directory holding ``mmrlfmt.fmt`` (the precompiled preamble), built on first use and cached on disk."""
    with _FORMAT_LOCK:
        tex = shutil.which("pdflatex")
        if tex is None:
            raise FileNotFoundError("pdflatex not found: install TeX Live (Debian: texlive-latex-extra)")
        if tex in _FORMAT_DIRS:
            return _FORMAT_DIRS[tex]
        version = subprocess.run([tex, "--version"], capture_output=True, text=True, check=True).stdout
        _TEX_READ_PATHS[:] = _tex_read_paths(tex)
        fonts = subprocess.run(["kpsewhich", "sfrm0900.pfb"], capture_output=True, text=True).stdout.strip()
        if not fonts:
            warnings.warn(
                "the cm-super Type 1 fonts are not installed (Debian: apt-get install cm-super): tables using "
                "±, °, × or \\textless at sizes other than 10pt will fail to compile in the rendering sandbox",
                stacklevel=2,
            )
        base = subprocess.run(["kpsewhich", "-engine=pdftex", "pdflatex.fmt"], capture_output=True, text=True)
        base_path = base.stdout.strip()
        base_id = f"{base_path}:{os.stat(base_path).st_mtime_ns}" if base_path else "none"
        key = hashlib.sha256("\n".join([FORMAT_SOURCE, version, base_id]).encode()).hexdigest()[:20]
        target = cache_dir() / "latex-fmt" / key
        if not (target / "mmrlfmt.fmt").is_file():
            _build_format(target)
        _FORMAT_DIRS[tex] = target
        return target


def _tex_read_paths(tex: str) -> list[str]:
    """What a TeX run may read under Landlock: the TeX trees and configuration, the binary and shared libraries."""
    trees = subprocess.run(
        ["kpsewhich", "-expand-path", "$TEXMF:$TEXMFCNF:$TEXMFSYSVAR:$TEXMFSYSCONFIG:$TEXMFROOT"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    system = ["/usr/lib", "/usr/lib64", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/localtime"]
    binaries = {os.path.dirname(tex), os.path.dirname(os.path.realpath(tex))}
    return [p for p in [*trees.split(os.pathsep), *system, *binaries] if p and os.path.exists(p)]


def _build_format(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=target.parent) as tmp:
        (Path(tmp) / "mmrlfmt.tex").write_text(FORMAT_SOURCE, encoding="utf-8")
        env = {k: v for k, v in _tex_env(target, Path(tmp)).items() if k != "TEXFORMATS"}
        proc = subprocess.run(
            ["pdflatex", "-ini", "-jobname=mmrlfmt", *_TEX_FLAGS, "&pdflatex", "mmrlfmt.tex"],
            cwd=tmp,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
        )
        fmt = Path(tmp) / "mmrlfmt.fmt"
        if proc.returncode != 0 or not fmt.is_file():
            log = _read_tail(Path(tmp) / "mmrlfmt.log", 4000)
            raise RuntimeError(
                f"building the LaTeX format in {target} failed ({_tex_error(log, proc.returncode)}); "
                "check that TeX Live with texlive-latex-extra is installed"
            )
        os.replace(fmt, target / "mmrlfmt.fmt")


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
    ):
        self.javascript, self.max_html_bytes = javascript, max_html_bytes
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
    except (
        Exception
    ):  # a frame showing Chromium's own error page cannot be evaluated; it holds no loaded text
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


__all__ = [
    "PREAMBLE",
    "HtmlRenderer",
    "RenderResult",
    "format_dir",
    "render_latex",
    "screen_latex",
    "spawn_tex",
]
