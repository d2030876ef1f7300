"""Rendering sandbox for untrusted LaTeX tables: bodies -> grayscale images (pdfLaTeX + PDFium). Model outputs are
hostile input; this module is the security boundary of the rendering rewards (docs/rewards.md#domain-rewards, Table2LaTeX-RL
"visual"). Untrusted HTML goes to :mod:`.html_sandbox` (headless Chromium).

LaTeX, :func:`render_latex`. Every body is compiled inside one fixed preamble (:data:`PREAMBLE`: ``standalone`` with
``border=2pt``, amsmath booktabs multirow tabularx multicol bm xcolor graphicx makecell array), each body on its own
cropped standalone page (``multi=mmrlpage``), and rasterised in-process with PDFium to float32 grayscale in [0, 1].
Needs TeX Live with texlive-latex-extra and the cm-super Type 1 fonts (Debian ``cm-super``): without them ``±``,
``°``, ``×``, ``\\textless`` ... (TS1/T1 glyphs) fail to compile, because font generation is switched off here.

Security, outermost layer first (the OS and kpathsea layers are the boundary; the TeX layers only fail early):

- Landlock (:mod:`.landlock`, Linux >= 5.13): pdflatex may read only the TeX trees, its binary and libraries and the
  format, and write only its run directory; no TCP. This matters: pdfTeX 1.40.24 reads ``\\pdfobj file {...}``
  without asking kpathsea, i.e. it embeds ``/etc/passwd`` in the PDF even in paranoid mode (shown in
  tests/test_sandbox_security.py). **Fail closed**: without Landlock (older kernel, some containers, or
  ``MMRL_SANDBOX_DISABLE_LANDLOCK=1``) :func:`render_latex` raises :class:`SandboxUnavailableError`, whose message
  names the opt-in ``MMRL_ALLOW_UNCONFINED_RENDER=1``; the rendering rewards then score 0 with that error. With the
  opt-in, the layers below are all there is, and the test suite runs its whole hostile corpus in that mode too.
- pdflatex runs in a fresh temporary directory (its cwd, removed afterwards) with a minimal environment built from
  scratch: ``openin_any=p openout_any=p`` (kpathsea "paranoid": no absolute paths, no ``..``, no dotfiles, for
  reading and writing; also given as ``-cnf-line``), ``shell_escape=f`` plus ``-no-shell-escape``, no
  ``TEXMFOUTPUT``, ``HOME`` = the run directory, font generation off (``MKTEX*=0``, ``-no-mktex``: no subprocess
  ever), ``-no-parse-first-line``, stdin closed, its own session (process group), rlimits (CPU, 1 GiB address space,
  20 MB per written file so log bombs die of SIGXFSZ, no core files, ``RLIMIT_NPROC=0`` so a non-root pdflatex cannot
  fork; root is exempt from that one) and a wall-clock timeout that SIGKILLs the process group. Even a finished
  run's group is killed, so nothing outlives a call. ``PR_SET_PDEATHSIG`` kills pdflatex when the process that
  started it dies (a reward worker killed by its pool), and the run directories live under a parent named after
  that process (``mmrl-render-<pid>-<start time>-...``), which :func:`sweep_orphans` removes once the process is
  gone: the next render in any process does it, and so does the reward pool after killing a worker.
- Inputs are screened before any process starts (:func:`.latex_screen.screen_latex`, see that module for the
  design): the text may not change catcodes or build control sequences from text, ``\\begin``/``\\end`` take only
  allow-listed environments, and control words that read or write files, reach the shell or the PDF internals, loop
  or fill the log are refused.
- Inside TeX, the format redefines ``\\input \\include \\openout \\special \\scantokens \\includegraphics \\pdfobj
  \\pdffiledump \\pdfmdfivesum \\pdffilesize \\pdfximage \\pdfmapfile \\pdfprimitive`` ... to errors at
  ``\\begin{document}``, and with them the expl3 aliases of pdfTeX's file readers and of ``\\pdfprimitive``
  (``\\tex_pdfobj:D``, ``\\tex_filesize:D``, ``\\tex_primitive:D``, ...: :data:`_LOCKED_ALIASES`, checked complete
  by tests/test_sandbox_audit.py), which kpathsea does not guard. ``\\openin``/``\\read`` and the internal aliases
  of ``\\input`` (``\\@@input``, ``\\tex_input:D``) stay: LaTeX needs them at run time (loading ``t1enc.def`` for
  ``\\textless``), and kpathsea's paranoid mode guards them.
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
  counters, leaving its group: :data:`.latex_screen.SOLO_WORDS`) is compiled alone. A failing run is resumed: a
  per-run secret marker in the log names the body that failed; it gets that error and the others are run again
  without it. A run past its timeout, without a marker or with the wrong page count falls back to one run per
  body, so a bad body never costs its neighbours anything but time, and batched and single renders are
  pixel-identical;
- (d) ``workers`` TeX runs at once, driven from the calling thread (``pidfd`` + ``poll``; it starts no threads, so
  the rlimit/Landlock ``preexec_fn`` is safe unless the caller runs threads of its own), the next run starting
  before this thread rasterises: 79 renders/s.
"""

from __future__ import annotations

import ctypes
import hashlib
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

from mmrl.extras import require
from mmrl.rewards import landlock
from mmrl.rewards.latex_screen import PAGE_ENV, screen_latex

PACKAGES = tuple("amsmath booktabs multirow tabularx multicol bm xcolor graphicx makecell array".split())
PREAMBLE = f"\\documentclass[border=2pt,multi={PAGE_ENV}]{{standalone}}\n" + "".join(
    f"\\usepackage{{{p}}}\n" for p in PACKAGES
)
MAX_PAGE_PT = 5000.0
MAX_PIXELS = 16_000_000
ADDRESS_SPACE = 1 << 30
MAX_FILE_BYTES = 20 * 1000 * 1000
ALLOW_UNCONFINED_ENV = "MMRL_ALLOW_UNCONFINED_RENDER"

_LOCKED = (
    "input include includeonly openout special scantokens includegraphics pdfobj pdffiledump pdfmdfivesum "
    "pdffilesize pdffilemoddate pdfximage pdfrefximage pdfxform pdfmapfile pdfmapline pdfprimitive pdfannot "
    "pdfstartlink pdfinfo pdfcatalog pdfnames pdftrailer pdfoutline pdfdest".split()
)
# The other names of the primitives above that TeX does not need at run time (expl3 and LaTeX internals). Names
# with "_" ":" "@" can only be reached by building them from text, which the screen refuses; locking them too keeps
# pdfTeX's kpathsea-blind file readers shut even when the screen is bypassed.
_LOCKED_ALIASES = (
    "tex_pdfobj:D tex_pdfximage:D tex_pdfrefximage:D tex_pdfxform:D tex_filedump:D tex_filemoddate:D "
    "__file_timestamp:n tex_filesize:D __file_size:n tex_mdfivesum:D tex_mapfile:D tex_mapline:D tex_primitive:D "
    "tex_scantokens:D tex_special:D tex_openout:D tex_pdfannot:D tex_pdfstartlink:D tex_pdfinfo:D "
    "tex_pdfcatalog:D tex_pdfnames:D tex_pdftrailer:D tex_pdfoutline:D tex_pdfdest:D".split()
)
FORMAT_SOURCE = (
    PREAMBLE
    + "\\makeatletter\n"
    + "\\def\\mmrl@forbidden#1{\\errmessage{mmrl sandbox: \\string#1 is disabled}}\n"
    + "\\def\\mmrl@lock#1{\\def#1{\\mmrl@forbidden#1}}\n"
    + "\\def\\mmrlmark#1{\\immediate\\write-1{#1}}\n"
    + "\\AtBeginDocument{"
    + "".join(f"\\mmrl@lock\\{w}" for w in _LOCKED)
    + "".join(f"\\expandafter\\mmrl@lock\\csname {w}\\endcsname" for w in _LOCKED_ALIASES)
    + "}\n\\makeatother\n\\dump\n"
)
_TEX_FLAGS = tuple(
    "-no-shell-escape -interaction=nonstopmode -halt-on-error -no-parse-first-line -no-mktex=tfm -no-mktex=pk "
    "-no-mktex=tex -cnf-line=openin_any=p -cnf-line=openout_any=p -cnf-line=shell_escape=f".split()
)
_PDFIUM_LOCK = threading.Lock()  # PDFium is not thread-safe, even across documents
_FORMAT_LOCK = threading.Lock()
_FORMAT_DIRS: dict[str, Path] = {}
_TEX_READ_PATHS: list[str] = []
_RUN_PARENT = re.compile(r"mmrl-render-(\d+)-(\d+)-[a-z0-9_]+")  # mkdtemp adds [a-z0-9_]
_SWEPT: set[str] = set()  # roots already swept by this process
_WARNED: set[str] = set()
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


class SandboxUnavailableError(RuntimeError):
    """Rendering refused: Landlock is unavailable and unconfined rendering was not opted into."""


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


def confinement() -> str:
    """``"landlock"`` when TeX runs will be confined by Landlock; ``"unconfined"`` when Landlock is unavailable and
    the user opted in with ``MMRL_ALLOW_UNCONFINED_RENDER=1`` (warns once per process). Raises
    :class:`SandboxUnavailableError` otherwise: the sandbox fails closed."""
    if landlock.abi() > 0:
        return "landlock"
    if os.environ.get(ALLOW_UNCONFINED_ENV) == "1":
        if not _WARNED:
            _WARNED.add(ALLOW_UNCONFINED_ENV)
            warnings.warn(
                f"rendering LaTeX without Landlock ({ALLOW_UNCONFINED_ENV}=1): only the textual screen, the TeX-level "
                "locks, kpathsea's paranoid mode and rlimits stand between model outputs and this machine's files",
                stacklevel=3,
            )
        return "unconfined"
    if os.environ.get(landlock.DISABLE_ENV) == "1" and landlock.kernel_abi() > 0:
        why = f"{landlock.DISABLE_ENV}=1 is set"
    else:
        why = "this kernel offers no Landlock (Linux >= 5.13 with landlock in the lsm= boot parameter)"
    raise SandboxUnavailableError(
        f"refusing to render LaTeX: {why}. Without Landlock, pdfTeX's \\pdfobj and similar primitives can read any "
        "file this process can, and only a textual screen stands in the way. Run on a kernel with Landlock, or set "
        f"{ALLOW_UNCONFINED_ENV}=1 to render anyway (the screen, TeX-level locks, kpathsea's paranoid mode and "
        "rlimits still apply)"
    )


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
    bad body, but raises :class:`SandboxUnavailableError` when it cannot confine TeX (see :func:`confinement`).
    ``workers`` TeX processes run at once (default: the usable CPUs, at most 4); clean bodies share runs of at most
    ``batch_size``; every run gets ``timeout_s`` of wall time. ``root`` holds the temporary run directories (default:
    the system temp dir), inside one parent per call named after this process. ``screen=False`` skips the textual
    screening: only the security tests use it, to show that the OS, kpathsea and format layers hold on their own."""
    confinement()
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
    jobs = [j for j in jobs if j.items]
    if jobs:
        root = Path(root) if root is not None else Path(tempfile.gettempdir())
        if str(root) not in _SWEPT:
            _SWEPT.add(str(root))
            sweep_orphans(root)
        owner = f"mmrl-render-{os.getpid()}-{_start_ticks(os.getpid())}-"
        parent = Path(tempfile.mkdtemp(prefix=owner, dir=root))
        try:
            compiler = _Compiler(texts, results, fmt_dir, dpi, timeout_s, parent, max_pixels, extract_text)
            compiler.run(jobs, workers)
        finally:
            shutil.rmtree(parent, ignore_errors=True)
    return [r if r is not None else RenderResult(ok=False, error="internal: no result") for r in results]


def sweep_orphans(root: str | Path | None = None) -> int:
    """Remove the run directories under ``root`` (default: the system temp dir) whose owning process is gone (a
    reward worker killed mid-render), first killing any process still working in them; returns how many were
    removed. :func:`render_latex` calls it once per process and root; the reward pool calls it after killing its
    workers. A directory of a live process is never touched (the name holds its pid and start time)."""
    root = Path(root) if root is not None else Path(tempfile.gettempdir())
    try:
        entries = [e for e in os.scandir(root) if _RUN_PARENT.fullmatch(e.name)]
    except OSError:
        return 0
    removed = 0
    for entry in entries:
        pid, ticks = map(int, _RUN_PARENT.fullmatch(entry.name).groups())
        if _start_ticks(pid) == ticks or not entry.is_dir(follow_symlinks=False):
            continue
        _kill_processes_in(Path(entry.path))
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += not os.path.exists(entry.path)
    return removed


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), None when it is gone:
    with the pid it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _kill_processes_in(folder: Path) -> None:
    """SIGKILL every TeX process whose working directory is inside ``folder`` (one that outlived its parent's
    death signal); nothing else, not even a shell someone opened there."""
    prefix = str(folder.resolve())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            inside = cwd == prefix or cwd.startswith(prefix + os.sep)
            if inside and (proc / "comm").read_text().strip() in ("pdflatex", "pdftex"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


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
        self.root = root
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
    """Start pdflatex on ``workdir/job.tex`` with every OS-level protection (see module docstring); raises
    :class:`SandboxUnavailableError` when Landlock is unavailable and not opted out of. Exposed for the security
    tests, which compile hand-made documents the same way; ``confine=False`` leaves Landlock out."""
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
    """A ``preexec_fn``: die with the parent, rlimits, then Landlock (unless ``workdir`` is None or the user opted
    into unconfined rendering). Everything is computed here, in the parent; the child only makes system calls."""
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
    if workdir is not None and confinement() == "landlock":
        confine = landlock.confiner([*_TEX_READ_PATHS, fmt_dir], [workdir])
    parent = os.getpid()

    def apply() -> None:
        # SIGKILL when the thread that started us dies: a reward worker killed mid-render takes its TeX runs along.
        if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the prctl: no signal will come
            os._exit(1)
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
    require("render", "rasterising the rendered PDF", ("pypdfium2",))
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


__all__ = [
    "ALLOW_UNCONFINED_ENV",
    "PREAMBLE",
    "RenderResult",
    "SandboxUnavailableError",
    "confinement",
    "format_dir",
    "render_latex",
    "spawn_tex",
    "sweep_orphans",
]
