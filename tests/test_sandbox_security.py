"""Hostile inputs against the rendering sandbox (rewards/sandbox.py) and the latex_table reward.

Every LaTeX case runs three ways: through the reward (score 0), through ``render_latex`` (not ok), and through
``render_latex(screen=False)``, which skips the textual screening so that the OS, kpathsea and TeX-format layers must
hold on their own. After each run: a canary file next to the run directories is neither read into the output (text
layer, error message) nor modified (content, mtime); no file appears outside the run directories (the root's tree is
unchanged, no target file anywhere); no pdflatex process is left. Positive controls show that the checks would catch
a leak: the same reads succeed from inside a run directory, or with kpathsea's permissive mode, or (for pdfTeX's
``\\pdfobj file``, which ignores kpathsea) without Landlock.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import secrets
import shutil
import signal
import socketserver
import subprocess
import tempfile
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from mmrl.rewards import landlock, sandbox
from mmrl.rewards.sandbox import HtmlRenderer, render_latex
from mmrl.types import RewardInput

TEX = pytest.mark.tex
CHROMIUM = pytest.mark.chromium
TIMEOUT_S = 3.0
GOOD_TABLE = (
    r"\begin{tabular}{|l|c|}\hline Name & Value\\ \hline alpha & 1.5\\ beta & 2.0\\ \hline\end{tabular}"
)
BLOAT = "A" * 200

# {rel}: ../canary.tex (outside the run directory), {abs}: its absolute path, {pwned}: an absolute path outside the
# run directory that must never be created, {pwned_name}: its name (written as ../{pwned_name}).
HOSTILE_LATEX = {
    "input_etc_passwd": r"\input{/etc/passwd}",
    "input_parent_canary": r"\input{../canary}",
    "input_abs_canary": r"\input{{abs}}",
    "include_canary": r"\include{../canary}",
    "openin_read_canary": r"\newread\r\openin\r={rel} \read\r to\x \x",
    "openin_abs_canary": r"\newread\r\openin\r={abs} \ifeof\r closed\else\read\r to\x \x\fi",
    "readline_proc_environ": r"\newread\r\openin\r=/proc/self/environ \readline\r to\x \x",
    "verbatiminput": r"\verbatiminput{{rel}}",
    "lstinputlisting": r"\lstinputlisting{{rel}}",
    "includegraphics_parent_png": r"\includegraphics{../canary.png}",
    "includegraphics_etc": r"\includegraphics{/etc/hostname}",
    "write18_touch": r"\write18{touch {pwned}}x",
    "immediate_write18_touch": r"\immediate\write18{touch {pwned}}x",
    "input_pipe": r"\input|" + '"touch {pwned}" ',
    "openout_parent": r"\newwrite\w\immediate\openout\w=../{pwned_name} \immediate\write\w{x}\immediate\closeout\w x",
    "openout_abs": r"\newwrite\w\immediate\openout\w={pwned} \immediate\write\w{x}\immediate\closeout\w x",
    "filecontents_parent": r"\begin{filecontents}{../{pwned_name}}x\end{filecontents}x",
    "infinite_loop": r"\loop\iftrue\repeat",
    "exponential_macro": r"\def\a{\a\a}\a",
    "memory_bomb": r"\def\x{xxxxxxxx}\loop\edef\x{\x\x}\iftrue\repeat",
    "huge_rule": r"\rule{16000pt}{16000pt}",
    "log_bomb_message": r"\loop\message{" + BLOAT + r"}\iftrue\repeat",
    "log_bomb_typeout": r"\loop\typeout{" + BLOAT + r"}\iftrue\repeat",
    "catcode_escape": r"{\catcode`\|=0 |input{{rel}}}",
    "caret_notation_input": r"^^5cinput{rel} ",
    "csname_input": r"\csname input\endcsname{{rel}}",
    "csname_expl3_primitive_input": r"\csname tex_input:D\endcsname {rel} ",
    "csname_expl3_primitive_openin": r"\newread\r\csname tex_openin:D\endcsname\r={abs} \ifeof\r no\else\read\r to\x\x\fi",
    "makeatletter_internal_input": r"\makeatletter\@@input {rel} \makeatother",
    "scantokens_input": r"\scantokens{\input {rel} }",
    "pdfprimitive_input": r"\pdfprimitive\input {rel} ",
    "special": r"\special{header={rel}}x",
    "pdfobj_file": r"\immediate\pdfobj file {{abs}}\pdfrefobj\pdflastobj x",
    "pdfobj_file_expl3": r"\immediate\csname tex_pdfobj:D\endcsname file {{abs}}"
    r"\csname tex_pdfrefobj:D\endcsname\csname tex_pdflastobj:D\endcsname x",
    "pdffiledump": r"\pdffiledump length 64 {{rel}}",
    "pdfmdfivesum_file": r"\pdfmdfivesum file {{rel}}",
    "pdffilesize": r"\pdffilesize{{rel}}",
    "pdffilesize_expl3": r"\csname tex_filesize:D\endcsname{{abs}}",
    "pdfmapfile": r"\pdfmapfile{../canary.map}x",
    "shellesc_package": r"\usepackage{shellesc}\ShellEscape{touch {pwned}}x",
    "directlua": r"\directlua{os.execute('touch {pwned}')}x",
    "end_document_injection": r"\begin{tabular}{c}a\end{tabular}\end{document}\documentclass{article}"
    r"\begin{document}\input{../canary}",
    "font_metric_read": r"\font\x=../canary \x a",
    "errorstopmode_waits_on_stdin": r"\errorstopmode\undefinedcommand",
    "one_megabyte": "x" * (1 << 20),
    "nul_byte": "a\x00b",
}
HOSTILE_BYTES = {"invalid_utf8": b"\\begin{tabular}{c}\xff\xfe\xc3\\end{tabular}"}


class Arena:
    """A root for the run directories with a canary next to them, and the checks run after every render."""

    def __init__(self, root: Path):
        self.root = root
        self.secret = "CANARY" + secrets.token_hex(12)
        self.canary = root / "canary.tex"
        text = self.secret + "\n" + "% padding, a comment when typeset\n" * 300
        self.canary.write_text(text[:7330] + "\n")  # 7331 bytes: a size no error message contains
        Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(root / "canary.png")
        (root / "canary.map").write_text(f"{self.secret} {self.secret} <{self.canary}\n")
        self.pwned_name = f"pwned-{secrets.token_hex(6)}.tex"
        self.pwned = root / self.pwned_name
        self.md5 = hashlib.md5(self.canary.read_bytes()).hexdigest().upper()
        self.size = str(self.canary.stat().st_size)
        self.mtime = self.canary.stat().st_mtime_ns
        self.tree = self._tree()

    def _tree(self) -> dict[str, tuple[int, int]]:
        return {
            str(p.relative_to(self.root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.root.rglob("*")
        }

    def body(self, template: str) -> str:
        return (
            template.replace("{rel}", "../canary.tex")
            .replace("{abs}", str(self.canary))
            .replace("{pwned_name}", self.pwned_name)
            .replace("{pwned}", str(self.pwned))
        )

    def leaked(self, *texts: str | None) -> bool:
        joined = "\n".join(t for t in texts if t)
        return self.secret in joined or self.md5 in joined.upper() or self.size in joined

    def check_untouched(self) -> None:
        assert self.canary.read_text().startswith(self.secret), "canary content changed"
        assert self.canary.stat().st_mtime_ns == self.mtime, "canary modified"
        assert self._tree() == self.tree, "files appeared, vanished or changed next to the run directories"
        for where in (self.root.parent, Path.cwd(), Path(tempfile.gettempdir()), Path.home()):
            assert not (where / self.pwned_name).exists(), (
                f"a hostile input created {where / self.pwned_name}"
            )
        assert _tex_processes() == [], "a pdflatex process outlived the call"


def _tex_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name() in ("pdflatex", "pdftex") and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def arena(tmp_path: Path) -> Arena:
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (TeX Live is installed by .ci/run)")
    return Arena(tmp_path)


def _hostile(arena: Arena) -> dict[str, str | bytes]:
    return {**{k: arena.body(v) for k, v in HOSTILE_LATEX.items()}, **HOSTILE_BYTES}


def test_there_are_enough_hostile_cases():
    assert len(HOSTILE_LATEX) + len(HOSTILE_BYTES) >= 25


@TEX
@pytest.mark.parametrize("case", [*HOSTILE_LATEX, *HOSTILE_BYTES])
def test_hostile_latex_is_not_rendered(arena: Arena, case: str):
    result = render_latex([_hostile(arena)[case]], root=arena.root, timeout_s=TIMEOUT_S, extract_text=True)[0]
    assert not result.ok and result.image is None and result.error
    assert not arena.leaked(result.text, result.error)
    arena.check_untouched()


@TEX
@pytest.mark.parametrize("case", [*HOSTILE_LATEX, *HOSTILE_BYTES])
def test_hostile_latex_is_contained_without_screening(arena: Arena, case: str):
    body = _hostile(arena)[case]
    t0 = time.monotonic()
    result = render_latex([body], root=arena.root, timeout_s=TIMEOUT_S, extract_text=True, screen=False)[0]
    assert time.monotonic() - t0 < TIMEOUT_S + 10, "not stopped at its timeout"  # one run; 10 s for a busy CI
    assert not arena.leaked(result.text, result.error), f"{case}: canary content reached the output"
    if case in ("infinite_loop", "huge_rule", "one_megabyte", "invalid_utf8", "nul_byte"):
        assert not result.ok  # a timeout, the page-size limit, or TeX itself (nothing was screened out here)
    if case == "infinite_loop":
        assert "timed out" in result.error
    if case.startswith("log_bomb"):
        assert not result.ok and ("SIGXFSZ" in result.error or "timed out" in result.error)
    arena.check_untouched()


@TEX
def test_hostile_latex_scores_zero_in_a_batch_with_good_tables(arena: Arena):
    from mmrl.rewards.latex_table import latex_table

    hostile = _hostile(arena)
    responses = [GOOD_TABLE, *hostile.values(), GOOD_TABLE]
    batch = [
        RewardInput(
            id=f"s{i}",
            response=r if isinstance(r, str) else r.decode("utf-8", "replace"),
            reference=GOOD_TABLE,
        )
        for i, r in enumerate(responses)
    ]
    results = latex_table(batch, timeout_s=TIMEOUT_S)
    assert results[0].score == 2.0 and results[-1].score == 2.0
    for name, res in zip(hostile, results[1:-1]):
        assert res.parts["compile"] == 0.0, name
        assert res.parts["visual"] == 0.0 and res.parts["acc"] == 0.0, name
        assert res.score == res.parts["form"], name  # form alone: teds_s > 0.9, which no hostile case reaches
        assert res.score == 0.0, name
    arena.check_untouched()


@TEX
def test_a_hostile_body_does_not_change_its_neighbours(arena: Arena):
    tables = [GOOD_TABLE.replace("alpha", f"row{i}") for i in range(6)]
    alone = [render_latex([t], root=arena.root)[0] for t in tables]
    mixed = [
        tables[0],
        r"\undefinedcommand",
        tables[1],
        r"\def\a{\a\a}\a",
        *tables[2:],
        r"\rule{16000pt}{1pt}",
    ]
    together = render_latex(mixed, root=arena.root, timeout_s=TIMEOUT_S)
    good = [r for b, r in zip(mixed, together) if b in tables]
    assert [r.ok for r in together] == [True, False, True, False, True, True, True, True, False]
    for a, b in zip(alone, good):
        assert np.array_equal(a.image, b.image)
    arena.check_untouched()


def _compile_by_hand(
    workdir: Path, body: str, *, confine: bool = True, env: dict | None = None, files: list[Path] = ()
) -> tuple[int, bytes]:
    """Compile one page exactly as the sandbox does (or with the given environment instead), with ``files`` copied
    into the run directory; return (exit status, PDF bytes). The directory is removed afterwards."""
    workdir.mkdir()
    for f in files:
        shutil.copy(f, workdir / f.name)
    (workdir / "job.tex").write_text(
        f"\\begin{{document}}\\begin{{{sandbox.PAGE_ENV}}}{body}\\end{{{sandbox.PAGE_ENV}}}\\end{{document}}\n"
    )
    fmt = sandbox.format_dir()
    if env is None:
        proc = sandbox.spawn_tex(workdir, fmt, 10.0, confine=confine)
    else:
        flags = [f for f in sandbox._TEX_FLAGS if not f.startswith("-cnf-line")]
        argv = ["pdflatex", "-fmt=mmrlfmt", *flags, "job.tex"]
        proc = subprocess.Popen(
            argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
    rc = proc.wait(timeout=30)
    pdf = (workdir / "job.pdf").read_bytes() if (workdir / "job.pdf").exists() else b""
    shutil.rmtree(workdir)
    return rc, pdf


def _pdf_text_and_streams(pdf: bytes) -> str:
    import pypdfium2 as pdfium

    parts = []
    if pdf:
        doc = pdfium.PdfDocument(pdf)
        parts += [doc[i].get_textpage().get_text_range() for i in range(len(doc))]
        doc.close()
    for m in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", pdf, re.S):
        try:
            parts.append(zlib.decompress(m.group(1)).decode("latin-1"))
        except zlib.error:
            parts.append(m.group(1).decode("latin-1"))
    return "\n".join(parts)


@TEX
def test_positive_control_a_read_inside_the_run_directory_is_seen(arena: Arena):
    body = (
        r"\makeatletter\@@input canary.tex "  # LaTeX's internal alias: \input itself is locked in the format
    )
    rc, pdf = _compile_by_hand(arena.root / "control", body, files=[arena.canary])
    assert rc == 0 and arena.secret in _pdf_text_and_streams(pdf)
    arena.check_untouched()


@TEX
def test_positive_control_kpathsea_paranoid_mode_is_what_blocks_parent_reads(arena: Arena):
    body = r"\makeatletter\@@input ../canary.tex "
    env = {**sandbox._tex_env(sandbox.format_dir(), arena.root / "permissive"), "openin_any": "a"}
    rc, pdf = _compile_by_hand(arena.root / "permissive", body, env=env)
    assert rc == 0 and arena.secret in _pdf_text_and_streams(pdf)
    rc, pdf = _compile_by_hand(arena.root / "paranoid", body, confine=False)
    assert rc != 0 and arena.secret not in _pdf_text_and_streams(pdf)
    arena.check_untouched()


@TEX
def test_landlock_stops_pdftex_pdfobj_file_which_ignores_kpathsea(arena: Arena):
    if landlock.abi() == 0:
        pytest.skip("this kernel has no Landlock; screening and the TeX-level lock still reject \\pdfobj")
    body = arena.body(HOSTILE_LATEX["pdfobj_file_expl3"])
    rc, pdf = _compile_by_hand(arena.root / "unconfined", body, confine=False)
    assert rc == 0 and arena.secret in _pdf_text_and_streams(pdf)  # pdfTeX reads it despite openin_any=p
    rc, pdf = _compile_by_hand(arena.root / "confined", body, confine=True)
    assert rc != 0 and arena.secret not in _pdf_text_and_streams(pdf)
    arena.check_untouched()


@TEX
def test_tex_process_runs_confined(arena: Arena):
    """The limits and environment of a live pdflatex, read from /proc while it loops."""
    workdir = arena.root / "live"
    workdir.mkdir()
    loop = r"\begin{document}\begin{mmrlpage}\loop\iftrue\repeat\end{mmrlpage}\end{document}"
    (workdir / "job.tex").write_text(loop + "\n")
    proc = sandbox.spawn_tex(workdir, sandbox.format_dir(), 5.0)
    try:
        deadline = time.monotonic() + 5
        while psutil.Process(proc.pid).name() not in ("pdflatex", "pdftex") and time.monotonic() < deadline:
            time.sleep(0.01)  # until the exec has happened
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        environ = dict(
            kv.split("=", 1) for kv in Path(f"/proc/{proc.pid}/environ").read_text().split("\0") if "=" in kv
        )
        assert re.search(r"Max address space\s+1073741824\s+1073741824", limits)
        assert re.search(r"Max file size\s+20000000\s+20000000", limits)
        assert re.search(r"Max cpu time\s+6\s+7", limits)
        assert re.search(r"Max processes\s+0\s+0", limits)
        assert re.search(r"Max core file size\s+0\s+0", limits)
        assert os.getpgid(proc.pid) == proc.pid and os.getsid(proc.pid) == proc.pid
        assert Path(f"/proc/{proc.pid}/cwd").resolve() == workdir.resolve()
        assert environ["openin_any"] == environ["openout_any"] == "p" and environ["shell_escape"] == "f"
        assert "TEXMFOUTPUT" not in environ and environ["HOME"] == str(workdir)
        assert set(environ) <= set(sandbox._tex_env(sandbox.format_dir(), workdir))
        if landlock.abi() > 0:
            assert re.search(r"NoNewPrivs:\s+1", status)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    shutil.rmtree(workdir)
    arena.check_untouched()


# ---------------------------------------------------------------------------------------------------- HTML


class _Hits(http.server.BaseHTTPRequestHandler):
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
    srv = socketserver.TCPServer(("127.0.0.1", 0), _Hits)
    _Hits.hits = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{srv.server_address[1]}", _Hits.hits
    srv.shutdown()
    srv.server_close()


def _browser_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "chrom" in p.name().lower() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def renderer():
    if shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists():
        pytest.skip("/usr/bin/chromium is not installed (installed by .ci/run)")
    with HtmlRenderer(javascript=True) as r:
        yield r
    assert _browser_processes() == [], "Chromium processes outlived the renderer"


HOSTILE_HTML = {
    "infinite_loop_inline": "<p>x</p><script>while (true) {}</script>",
    "infinite_loop_after_load": "<p>x</p><script>setTimeout(() => { while (true) {} }, 0)</script>",
    "fetch": "<p>x</p><script>fetch('http://{srv}/fetch')</script>",
    "img": "<img src='http://{srv}/img'>",
    "img_external": "<img src='http://example.com/pixel.png'>",
    "stylesheet": "<link rel=stylesheet href='http://{srv}/css'><p>x</p>",
    "iframe_http": "<iframe src='http://{srv}/frame'></iframe>",
    "websocket": "<p>x</p><script>new WebSocket('ws://{srv}/ws')</script>",
    "xhr_and_beacon": "<p>x</p><script>navigator.sendBeacon('http://{srv}/b');"
    "var q = new XMLHttpRequest(); q.open('GET', 'http://{srv}/xhr'); q.send()</script>",
    "meta_refresh": "<meta http-equiv=refresh content='0;url=http://{srv}/refresh'><p>x</p>",
    "iframe_file_canary": "<p>x</p><iframe src='file://{canary}'></iframe>",
    "huge_dom_by_script": "<body><p>x</p><script>for (;;) document.body.appendChild(document.createElement('div'))"
    "</script></body>",
}


@CHROMIUM
@pytest.mark.parametrize("case", list(HOSTILE_HTML))
def test_hostile_html_is_contained(renderer: HtmlRenderer, server, tmp_path: Path, case: str):
    address, hits = server
    secret = "CANARY" + secrets.token_hex(12)
    canary = tmp_path / "canary.html"
    canary.write_text(f"<p>{secret}</p>")
    mtime = canary.stat().st_mtime_ns
    blocked = renderer.blocked_requests
    html = HOSTILE_HTML[case].replace("{srv}", address).replace("{canary}", str(canary))
    t0 = time.monotonic()
    result = renderer.render(html, timeout_ms=2000, extract_text=True)
    assert time.monotonic() - t0 < 2 + 15, "not stopped at its timeout"  # + watchdog, kill and relaunch
    assert hits == [], f"{case}: requests reached the server: {hits}"
    assert secret not in (result.text or "") and secret not in (result.error or "")
    assert canary.stat().st_mtime_ns == mtime
    if case.startswith(("infinite_loop", "huge_dom")):
        assert not result.ok and result.error
    if case in (
        "img",
        "img_external",
        "stylesheet",
        "iframe_http",
    ):  # the load event waits for these requests
        assert renderer.blocked_requests > blocked, f"{case}: the route handler saw no request"
    after = renderer.render("<p>still works</p>", extract_text=True)
    assert after.ok and "still works" in after.text


@CHROMIUM
def test_positive_control_inline_canary_text_is_seen(renderer: HtmlRenderer):
    secret = "CANARY" + secrets.token_hex(12)
    result = renderer.render(f"<p>{secret}</p>", extract_text=True)
    assert result.ok and secret in result.text


@CHROMIUM
def test_html_size_limits(renderer: HtmlRenderer):
    too_big = "<table>" + "<tr><td>x</td></tr>" * 20000 + "</table>"
    result = renderer.render(too_big)
    assert not result.ok and "limit" in result.error
    assert not renderer.render(b"<p>\xff\xfe</p>").ok
    tall = renderer.render(
        "<div style='height: 100000px; width: 100000px; background: black'></div>", timeout_ms=5000
    )
    assert (
        tall.ok
        and tall.image.shape[0] <= renderer.max_height + 6
        and tall.image.shape[1] <= renderer.max_width + 6
    )


@CHROMIUM
def test_html_renderer_leaves_no_process():
    with HtmlRenderer() as r:
        assert r.render("<table><tr><td>a</td></tr></table>").ok
        assert _browser_processes() != []
    assert _browser_processes() == []
