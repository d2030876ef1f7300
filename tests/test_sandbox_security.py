"""Hostile LaTeX against the rendering sandbox (rewards/sandbox.py, rewards/latex_screen.py) and the latex_table reward.

The whole corpus runs in three modes (the ``mode`` fixture): Landlock on; Landlock made unavailable
(``MMRL_SANDBOX_DISABLE_LANDLOCK=1``, exactly what a kernel without it looks like to the sandbox) with no opt-in,
where every render is refused with an error naming ``MMRL_ALLOW_UNCONFINED_RENDER=1``; and Landlock unavailable with
that opt-in, where the screen must refuse every case that touches files, the shell, catcodes or names built from
text, and nothing may leak. Each case also runs with ``screen=False``, so the OS, kpathsea and format layers must
hold on their own (in the opt-in mode: without Landlock too).

After each run: a canary file next to the run directories is neither read into the output (text layer, error
message: its text, size, MD5 or hex dump) nor modified; no file appears outside the run directories (the root's tree
is unchanged, no target file anywhere); no pdflatex process is left. Positive controls show that the checks would
catch a leak: the same reads succeed from inside a run directory, or with kpathsea's permissive mode, or, for
pdfTeX's ``\\pdfobj file`` (which ignores kpathsea), with the stock LaTeX format and no Landlock.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from mmrl.rewards import landlock, sandbox
from mmrl.rewards.sandbox import SandboxUnavailableError, render_latex
from mmrl.types import RewardInput

TEX = pytest.mark.tex
TIMEOUT_S = 3.0
GOOD_TABLE = (
    r"\begin{tabular}{|l|c|}\hline Name & Value\\ \hline alpha & 1.5\\ beta & 2.0\\ \hline\end{tabular}"
)
BLOAT = "A" * 200
MODES = ("landlock", "no_landlock_refused", "no_landlock_opt_in")
OPT_IN = sandbox.ALLOW_UNCONFINED_ENV + "=1"

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
    "exponential_macro": r"\def\e{\e\e}\e",
    "memory_bomb": r"\def\x{xxxxxxxx}\loop\edef\x{\x\x}\iftrue\repeat",
    "huge_rule": r"\rule{16000pt}{16000pt}",
    "log_bomb_message": r"\loop\message{" + BLOAT + r"}\iftrue\repeat",
    "log_bomb_typeout": r"\loop\typeout{" + BLOAT + r"}\iftrue\repeat",
    "catcode_escape": r"{\catcode`\|=0 |input{{rel}}}",
    "catcode_letters_expl3_input": r"\catcode`\_=11 \catcode`\:=11 \tex_input:D {abs} ",
    "catcode_at_input": r"\catcode`\@=11 \@@input {rel} ",
    "caret_notation_input": r"^^5cinput{rel} ",
    "caret_notation_csname": r"^^5ccsname tex_input:D^^5cendcsname {abs} ",
    "csname_input": r"\csname input\endcsname{{rel}}",
    "csname_expl3_primitive_input": r"\csname tex_input:D\endcsname {rel} ",
    "csname_expl3_primitive_openin": r"\newread\r\csname tex_openin:D\endcsname\r={abs} \ifeof\r no\else\read\r to\x\x\fi",
    "expandafter_let_csname": r"\expandafter\let\expandafter\x\csname tex_input:D\endcsname \x {abs} ",
    "usename_expl3_input": r"\UseName{tex_input:D}{{abs}}",
    "usename_latex_internal_input": r"\UseName{@@input} {rel} ",
    "usename_expl3_pdfobj": r"\immediate\UseName{tex_pdfobj:D} file {{abs}}\UseName{tex_pdfrefobj:D}"
    r"\UseName{tex_pdflastobj:D} x",
    "usename_primitive_pdfobj": r"\immediate\UseName{tex_primitive:D}\pdfobj file {{abs}}"
    r"\UseName{tex_primitive:D}\pdfrefobj\UseName{tex_primitive:D}\pdflastobj x",
    "usename_expl3_filesize": r"\UseName{tex_filesize:D}{{abs}}",
    "usename_expl3_mdfivesum": r"\UseName{tex_mdfivesum:D} file {{abs}}",
    "usename_expl3_filedump": r"\UseName{tex_filedump:D} length 64 {{abs}}",
    "expandargs_c_pdfobj": r"\ExpandArgs{c}\immediate{tex_pdfobj:D} file {{abs}}\UseName{tex_pdfrefobj:D}"
    r"\UseName{tex_pdflastobj:D} x",
    "begin_expl3_input": r"\begin{tex_input:D}{abs} ",
    "begin_expl3_openin": r"\newread\r\begin{tex_openin:D}\r={abs} \ifeof\r no\else\read\r to\x\x\fi",
    "begin_expl3_pdfobj": r"\begin{tex_pdfobj:D} file {{abs}}\end{tex_pdfobj:D}",
    "begin_input": r"\begin{input}{{rel}}",
    "begin_pdfobj": r"\immediate\begin{pdfobj} file {{abs}}",
    "begin_csname": r"\begin{csname}tex_input:D\endcsname {abs} ",
    "begin_explsyntaxon": r"\begin{ExplSyntaxOn}\tex_input:D {abs} ",
    "begin_makeatletter": r"\begin{makeatletter}\@@input {rel} ",
    "begin_name_from_macro": r"\def\x{tex_input:D}\begin{\x}{abs} ",
    "begin_unbraced_macro": r"\def\x{tex_input:D}\begin\x {abs} ",
    "newhelp_expl3_pdfobj": r"\newhelp\h{tex_pdfobj:D}\newhelp\r{tex_pdfrefobj:D}\newhelp\l{tex_pdflastobj:D}"
    r"\immediate\the\h file {{abs}}\the\r\the\l x",
    "pagenumbering_latex_internal": r"\pagenumbering{@input}\thepage",
    "tabbing_accent_builder": r"\a{tex_input:D}{{abs}}",
    "explsyntaxon_input": r"\ExplSyntaxOn \tex_input:D {abs} \ExplSyntaxOff",
    "explsyntaxon_pdfobj": r"\ExplSyntaxOn \tex_immediate:D \tex_pdfobj:D file {{abs}} \tex_pdfrefobj:D"
    r" \tex_pdflastobj:D \ExplSyntaxOff x",
    "expl3_name_without_catcodes": r"\tex_input:D {abs} ",
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
    "endinput_alias": r"\XKeyValLoaded",
    "one_megabyte": "x" * (1 << 20),
    "nul_byte": "a\x00b",
}
HOSTILE_BYTES = {"invalid_utf8": b"\\begin{tabular}{c}\xff\xfe\xc3\\end{tabular}"}
# The only cases the screen lets through: they touch no file and die of a TeX error or a sandbox limit.
PASS_THE_SCREEN = {"exponential_macro", "huge_rule", "font_metric_read"}


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
        self.hex = self.secret.encode().hex().upper()  # what \pdffiledump prints
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
        upper = joined.upper()
        return self.secret in joined or self.md5 in upper or self.hex in upper or self.size in joined

    def check_untouched(self) -> None:
        assert self.canary.read_text().startswith(self.secret), "canary content changed"
        assert self.canary.stat().st_mtime_ns == self.mtime, "canary modified"
        assert self._tree() == self.tree, "files appeared, vanished or changed next to the run directories"
        for where in (self.root.parent, Path.cwd(), Path(tempfile.gettempdir()), Path.home()):
            assert not (where / self.pwned_name).exists(), (
                f"a hostile input created {where / self.pwned_name}"
            )
        assert tex_processes() == [], "a pdflatex process outlived the call"


def tex_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name() in ("pdflatex", "pdftex") and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def set_mode(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Landlock on, or unavailable (``MMRL_SANDBOX_DISABLE_LANDLOCK=1``) without or with the opt-in."""
    monkeypatch.delenv(sandbox.ALLOW_UNCONFINED_ENV, raising=False)
    monkeypatch.delenv(landlock.DISABLE_ENV, raising=False)
    if mode == "landlock":
        if landlock.kernel_abi() == 0:
            pytest.skip("this kernel has no Landlock: the corpus runs in the two no-Landlock modes")
        return
    monkeypatch.setenv(landlock.DISABLE_ENV, "1")
    if mode == "no_landlock_opt_in":
        monkeypatch.setenv(sandbox.ALLOW_UNCONFINED_ENV, "1")


@pytest.fixture
def arena(tmp_path: Path) -> Arena:
    if shutil.which("pdflatex") is None:
        pytest.fail("pdflatex is not installed: run bash scripts/setup.sh (TeX Live is part of the set-up)")
    return Arena(tmp_path)


@pytest.fixture(params=MODES)
def mode(request, monkeypatch) -> str:
    set_mode(monkeypatch, request.param)
    return request.param


@pytest.fixture
def confined(monkeypatch) -> None:
    """Landlock when the kernel has it, else the opt-in: for tests about the layers, not about the policy."""
    set_mode(monkeypatch, "landlock" if landlock.kernel_abi() > 0 else "no_landlock_opt_in")


def hostile(arena: Arena) -> dict[str, str | bytes]:
    return {**{k: arena.body(v) for k, v in HOSTILE_LATEX.items()}, **HOSTILE_BYTES}


def test_the_corpus_covers_every_way_in():
    assert len(HOSTILE_LATEX) + len(HOSTILE_BYTES) >= 75
    joined = "\n".join(HOSTILE_LATEX.values())
    for trick in (
        "\\UseName",
        "\\csname",
        "\\begin{tex_",
        "\\expandafter",
        "\\catcode",
        "^^",
        ":D",
        "\\newhelp",
    ):
        assert trick in joined, trick


@TEX
@pytest.mark.parametrize("case", [*HOSTILE_LATEX, *HOSTILE_BYTES])
def test_hostile_latex_is_not_rendered(arena: Arena, mode: str, case: str):
    body = hostile(arena)[case]
    if mode == "no_landlock_refused":
        with pytest.raises(SandboxUnavailableError, match=re.escape(OPT_IN)):
            render_latex([body], root=arena.root, timeout_s=TIMEOUT_S)
        arena.check_untouched()
        return
    result = render_latex([body], root=arena.root, timeout_s=TIMEOUT_S, extract_text=True)[0]
    assert not result.ok and result.image is None and result.error
    assert not arena.leaked(result.text, result.error)
    assert result.error.startswith("rejected:") == (case not in PASS_THE_SCREEN), result.error
    arena.check_untouched()


@TEX
@pytest.mark.parametrize("case", [*HOSTILE_LATEX, *HOSTILE_BYTES])
def test_hostile_latex_is_contained_without_screening(arena: Arena, mode: str, case: str):
    body = hostile(arena)[case]
    if mode == "no_landlock_refused":
        with pytest.raises(SandboxUnavailableError, match=re.escape(OPT_IN)):
            render_latex([body], root=arena.root, timeout_s=TIMEOUT_S, screen=False)
        arena.check_untouched()
        return
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
def test_hostile_latex_scores_zero_in_a_batch_with_good_tables(arena: Arena, mode: str):
    from mmrl.rewards.latex_table import latex_table

    responses = [GOOD_TABLE, *hostile(arena).values(), GOOD_TABLE]
    batch = [
        RewardInput(
            id=f"s{i}",
            response=r if isinstance(r, str) else r.decode("utf-8", "replace"),
            reference=GOOD_TABLE,
        )
        for i, r in enumerate(responses)
    ]
    results = latex_table(batch, timeout_s=TIMEOUT_S)
    if (
        mode == "no_landlock_refused"
    ):  # refused as a whole, good tables too: score 0 with the reason, no crash
        assert all(r.score == 0.0 and OPT_IN in r.error for r in results)
        arena.check_untouched()
        return
    assert results[0].score == 2.0 and results[-1].score == 2.0
    for name, res in zip(hostile(arena), results[1:-1]):
        assert res.parts["compile"] == 0.0, name
        assert res.parts["visual"] == 0.0 and res.parts["acc"] == 0.0, name
        assert res.score == res.parts["form"] == 0.0, (
            name
        )  # form needs teds_s > 0.9: no hostile case reaches it
    arena.check_untouched()


@TEX
def test_refusal_without_landlock_names_the_opt_in_and_starts_nothing(arena: Arena, monkeypatch):
    set_mode(monkeypatch, "no_landlock_refused")
    for call in (
        sandbox.confinement,
        lambda: render_latex([GOOD_TABLE], root=arena.root),
        lambda: sandbox.spawn_tex(arena.root, sandbox.format_dir(), 5.0),
    ):
        with pytest.raises(SandboxUnavailableError) as info:
            call()
        assert OPT_IN in str(info.value) and landlock.DISABLE_ENV in str(info.value)
    arena.check_untouched()  # no run directory was made, no TeX started
    monkeypatch.setenv(sandbox.ALLOW_UNCONFINED_ENV, "1")
    monkeypatch.setattr(sandbox, "_WARNED", set())  # the warning comes once per process
    with pytest.warns(UserWarning, match="without Landlock"):
        assert sandbox.confinement() == "unconfined"
    assert render_latex([GOOD_TABLE], root=arena.root)[0].ok


@TEX
def test_a_hostile_body_does_not_change_its_neighbours(arena: Arena, confined):
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
    workdir: Path,
    body: str,
    *,
    confine: bool = True,
    env: dict | None = None,
    files: list[Path] = (),
    stock_format: bool = False,
) -> tuple[int, bytes, str]:
    """Compile one page exactly as the sandbox does (or with the given environment, or with TeX Live's own
    ``pdflatex`` format and a full document instead of the sandbox's format), with ``files`` copied into the run
    directory; return (exit status, PDF bytes, log). The directory is removed afterwards."""
    workdir.mkdir()
    for f in files:
        shutil.copy(f, workdir / f.name)
    page = f"\\begin{{{sandbox.PAGE_ENV}}}{body}\\end{{{sandbox.PAGE_ENV}}}"
    preamble = "\\documentclass{article}" if stock_format else ""
    (workdir / "job.tex").write_text(
        f"{preamble}\\begin{{document}}{page if not stock_format else body}\\end{{document}}\n"
    )
    fmt = sandbox.format_dir()
    flags = [f for f in sandbox._TEX_FLAGS if not f.startswith("-cnf-line")]
    if stock_format:
        tex_env = {k: v for k, v in sandbox._tex_env(fmt, workdir).items() if k != "TEXFORMATS"}
        setup = sandbox._child_setup(11, workdir if confine else None, fmt)
        proc = subprocess.Popen(
            ["pdflatex", *sandbox._TEX_FLAGS, "job.tex"], cwd=workdir, env=tex_env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=setup,
        )  # fmt: skip
    elif env is None:
        proc = sandbox.spawn_tex(workdir, fmt, 10.0, confine=confine)
    else:
        argv = ["pdflatex", "-fmt=mmrlfmt", *flags, "job.tex"]
        proc = subprocess.Popen(
            argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
    rc = proc.wait(timeout=30)
    pdf = (workdir / "job.pdf").read_bytes() if (workdir / "job.pdf").exists() else b""
    log = (workdir / "job.log").read_text(errors="replace") if (workdir / "job.log").exists() else ""
    shutil.rmtree(workdir)
    return rc, pdf, log


def _pdf_text_and_streams(pdf: bytes) -> str:
    import pypdfium2 as pdfium

    parts = []
    if pdf:
        doc = pdfium.PdfDocument(pdf)
        parts += [doc[i].get_textpage().get_text_range() for i in range(len(doc))]
        doc.close()
    # the stream's bytes up to `endstream`, its end-of-line included: a compressed stream may END with a \r byte,
    # which a pattern stripping "\r?\n" before `endstream` took off, truncating the data (zlib.error: the canary
    # then went unseen, about one run in 256 since the canary is random); a decompressor object stops at the
    # compressed data's own end and leaves the end-of-line as unused data
    for m in re.finditer(rb"stream\r?\n(.*?)endstream", pdf, re.S):
        try:
            parts.append(zlib.decompressobj().decompress(m.group(1)).decode("latin-1"))
        except zlib.error:
            parts.append(m.group(1).decode("latin-1"))
    return "\n".join(parts)


@TEX
def test_positive_control_a_read_inside_the_run_directory_is_seen(arena: Arena, confined):
    body = (
        r"\makeatletter\@@input canary.tex "  # LaTeX's internal alias: \input itself is locked in the format
    )
    rc, pdf, _ = _compile_by_hand(arena.root / "control", body, files=[arena.canary])
    assert rc == 0 and arena.secret in _pdf_text_and_streams(pdf)
    arena.check_untouched()


@TEX
def test_positive_control_kpathsea_paranoid_mode_is_what_blocks_parent_reads(arena: Arena, monkeypatch):
    set_mode(monkeypatch, "no_landlock_opt_in")  # kpathsea alone, no Landlock behind it
    body = r"\makeatletter\@@input ../canary.tex "
    env = {**sandbox._tex_env(sandbox.format_dir(), arena.root / "permissive"), "openin_any": "a"}
    rc, pdf, _ = _compile_by_hand(arena.root / "permissive", body, env=env)
    assert rc == 0 and arena.secret in _pdf_text_and_streams(pdf)
    rc, pdf, _ = _compile_by_hand(arena.root / "paranoid", body, confine=False)
    assert rc != 0 and arena.secret not in _pdf_text_and_streams(pdf)
    arena.check_untouched()


@TEX
def test_landlock_stops_pdftex_pdfobj_file_which_ignores_kpathsea(arena: Arena, monkeypatch):
    """TeX Live's own format (no locks), kpathsea paranoid: pdfTeX embeds the canary; Landlock alone stops it."""
    set_mode(monkeypatch, "landlock")
    body = arena.body(r"\immediate\pdfobj file {{abs}}\pdfrefobj\pdflastobj x")
    rc, pdf, _ = _compile_by_hand(arena.root / "unconfined", body, confine=False, stock_format=True)
    assert rc == 0 and arena.secret in _pdf_text_and_streams(pdf)  # pdfTeX reads it despite openin_any=p
    rc, pdf, _ = _compile_by_hand(arena.root / "confined", body, confine=True, stock_format=True)
    assert rc != 0 and arena.secret not in _pdf_text_and_streams(pdf)
    arena.check_untouched()


@TEX
@pytest.mark.parametrize("alias", ["tex_pdfobj:D", "tex_primitive:D"])
def test_format_locks_the_expl3_aliases_that_kpathsea_does_not_guard(arena: Arena, monkeypatch, alias: str):
    """No Landlock, no screen: the expl3 alias reaches pdfTeX's \\pdfobj in the stock format and leaks the canary
    (positive control); the sandbox's format has locked it, and TeX stops with the lock's error."""
    set_mode(monkeypatch, "no_landlock_opt_in")
    pdfobj = r"\UseName{tex_pdfobj:D}" if alias == "tex_pdfobj:D" else r"\UseName{tex_primitive:D}\pdfobj"
    body = arena.body(rf"\immediate{pdfobj} file {{{{abs}}}}\pdfrefobj\pdflastobj x")
    rc, pdf, _ = _compile_by_hand(arena.root / "stock", body, confine=False, stock_format=True)
    assert rc == 0 and arena.secret in _pdf_text_and_streams(pdf)
    rc, pdf, log = _compile_by_hand(arena.root / "sandbox", body, confine=False)
    assert rc != 0 and arena.secret not in _pdf_text_and_streams(pdf)
    assert f"mmrl sandbox: \\{alias} is disabled" in log
    arena.check_untouched()


@TEX
@pytest.mark.parametrize("tex_mode", ["landlock", "no_landlock_opt_in"])
def test_tex_process_runs_confined(arena: Arena, monkeypatch, tex_mode: str):
    """The limits and environment of a live pdflatex, read from /proc while it loops."""
    set_mode(monkeypatch, tex_mode)
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
        # Landlock sets no_new_privs before restricting; unconfined runs do not
        assert re.search(r"NoNewPrivs:\s+(\d)", status).group(1) == ("1" if tex_mode == "landlock" else "0")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    shutil.rmtree(workdir)
    arena.check_untouched()
