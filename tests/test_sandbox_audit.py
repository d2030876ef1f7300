"""A mechanical audit of the textual screen's word list and the format's locks against the installed TeX.

The screen (rewards/latex_screen.py) can refuse names only if it knows them. This test collects every name that
occurs in the sources the sandbox's format is built from (LaTeX's kernel, expl3, the preamble's packages: the files
a ``-recorder`` build of the format reads), asks TeX for the meaning of each one, before ``\\begin{document}`` (what
the format holds) and after it (what a table body meets), and checks:

- every letter-only name that means a primitive the screen refuses (``\\openin``, ``\\csname``, ``\\endinput``,
  every ``\\pdf...``) is refused too, whatever it is called (``\\XKeyValLoaded`` is ``\\endinput``);
- every name of pdfTeX's kpathsea-blind file readers and of ``\\pdfprimitive``, letters or not
  (``\\tex_pdfobj:D``, ``\\tex_primitive:D``, ...), is locked once the document begins;
- every letter-only macro that builds a control-sequence name from its argument is refused when the prefix in front
  of the argument could complete to a dangerous name (no prefix, a computed prefix, or ``@`` as in
  ``\\pagenumbering``, which reaches ``\\@@input``);
- every letter-only macro that changes catcodes, itself or through the internal macros it calls (``\\ProvidesExplFile``
  switches to expl3 syntax), is refused, but for the reviewed few that only make characters inert;
- no allowed environment ``x`` makes ``\\begin{x}``/``\\end{x}`` run a refused primitive.

A TeX Live update that adds a new alias or name builder makes this test fail until the screen covers it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mmrl.rewards import sandbox
from mmrl.rewards.latex_screen import ENVIRONMENTS, FORBIDDEN_PREFIXES, FORBIDDEN_WORDS, screen_latex

pytestmark = pytest.mark.tex
# pdfTeX primitives that open files without asking kpathsea (or reach any primitive under a locked name)
KPATHSEA_BLIND = {
    "pdfobj", "pdfximage", "pdfrefximage", "pdffiledump", "pdfmdfivesum", "pdffilesize", "pdffilemoddate",
    "pdfmapfile", "pdfmapline", "pdfprimitive",
}  # fmt: skip
KERNEL_FILES = (  # what the base format is built from, for installations that keep no build log
    "latex.ltx expl3.ltx expl3-code.tex latex2e-first-aid-for-external-files.ltx fonttext.ltx fontmath.ltx "
    "preload.ltx t1enc.def ot1enc.def ts1enc.def omsenc.def omlenc.def utf8.def".split()
)
_CATCODES = re.compile(
    r"\\(catcode|tex_catcode:D|char_set_catcode\w*:\w*|ExplSyntaxOn|makeatletter|endlinechar|tex_endlinechar:D"
    r"|scantokens|tex_scantokens:D|cctab_select:N|cctab_begin:N)(?![A-Za-z@_:])"
)
# Reviewed: \verb, \verbatim and \do (the \dospecials step) only make characters inert (catcode "other");
# \nobreakdash reads a catcode and sets none; \root is flagged through \@let@token, a \futurelet scratch token
# that held \makeatletter when the format was dumped, and changes no catcode.
INERT_CATCODE_USERS = {"verb", "verbatim", "do", "nobreakdash", "root"}
_BUILDER = re.compile(
    r"\\(?:csname|ifcsname|cs:w|tex_csname:D|@nameuse \{|use:c \{)\s?(.*?)(#|\\endcsname|\\cs_end:)"
)


@pytest.fixture(scope="module")
def meanings(tmp_path_factory) -> tuple[dict[str, str], dict[str, str]]:
    """(meaning before ``\\begin{document}``, meaning after it) of every name in the format's sources."""
    if shutil.which("pdflatex") is None:
        pytest.fail("pdflatex is not installed: run bash scripts/setup.sh (TeX Live is part of the set-up)")
    work = tmp_path_factory.mktemp("audit")
    fmt_dir = sandbox.format_dir()
    env = {**sandbox._tex_env(fmt_dir, work), "max_print_line": "1000000"}
    (work / "fmt.tex").write_text(sandbox.FORMAT_SOURCE)
    build_env = {k: v for k, v in env.items() if k != "TEXFORMATS"}
    subprocess.run(
        ["pdflatex", "-ini", "-recorder", "-jobname=audit", "-interaction=batchmode", "&pdflatex", "fmt.tex"],
        cwd=work, env=build_env, stdin=subprocess.DEVNULL, capture_output=True, check=True,
    )  # fmt: skip
    recorded = [ln[6:] for ln in (work / "audit.fls").read_text().splitlines() if ln.startswith("INPUT /")]
    kernel = subprocess.run(["kpsewhich", *KERNEL_FILES], capture_output=True, text=True).stdout.split()
    base_fmt = subprocess.run(["kpsewhich", "-engine=pdftex", "pdflatex.fmt"], capture_output=True, text=True)
    base_log = Path(base_fmt.stdout.strip()).with_suffix(".log")  # TeX Live keeps the format's build log
    logged = re.findall(r"\((/[^\s()]+)", base_log.read_text(errors="replace")) if base_log.is_file() else []
    kinds = (".tex", ".ltx", ".sty", ".cls", ".def", ".cfg", ".fd")
    sources = {p for p in [*recorded, *kernel, *logged] if p.endswith(kinds) and Path(p).is_file()}
    assert len(kernel) == len(KERNEL_FILES) and len(sources) > 30
    names = set()
    for path in sources:
        names |= set(re.findall(r"[A-Za-z@_:]+", Path(path).read_text(errors="replace")))
    names = sorted(n for n in names if n.strip(":"))

    def query(tag: str) -> list[str]:
        return [
            f"\\begingroup\\expandafter\\ifx\\csname {n}\\endcsname\\relax\\else"
            f"\\immediate\\write-1{{{tag}:{n}=\\expandafter\\meaning\\csname {n}\\endcsname}}\\fi\\endgroup"
            for n in names
        ]

    job = [*query("P"), "\\begin{document}", *query("D"), "\\end{document}"]
    (work / "job.tex").write_text("\n".join(job) + "\n")
    subprocess.run(
        ["pdflatex", "-fmt=mmrlfmt", *sandbox._TEX_FLAGS, "job.tex"],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=True,
    )  # fmt: skip
    log = (work / "job.log").read_text(errors="replace")
    before = dict(re.findall(r"^P:([^=\n]+)=(.*)$", log, re.M))
    after = dict(re.findall(r"^D:([^=\n]+)=(.*)$", log, re.M))
    assert len(before) > 5000 and len(after) > 5000, "the audit found too few names; is the log complete?"
    return before, after


def _refused(word: str) -> bool:
    return screen_latex(f"\\{word}")[1] is not None


def _primitives(before: dict[str, str]) -> set[str]:
    """Names that are primitives in the format (their meaning is their own name)."""
    return {n for n, m in before.items() if m == f"\\{n}"}


def test_every_letter_only_alias_of_a_refused_primitive_is_refused(meanings):
    before, _ = meanings
    refused = {p for p in _primitives(before) if p in FORBIDDEN_WORDS or p.startswith(FORBIDDEN_PREFIXES)}
    assert {"openin", "read", "write", "csname", "catcode", "expandafter", "endinput", "pdfobj"} <= refused
    aliases = {n for n, m in before.items() if re.fullmatch(r"[A-Za-z]+", n) and m[1:] in refused}
    assert "XKeyValLoaded" in aliases  # \let to \endinput by xkeyval: a real alias the audit must see
    assert [n for n in sorted(aliases) if not _refused(n)] == []


def test_every_name_of_the_kpathsea_blind_readers_is_locked_in_the_document(meanings):
    before, after = meanings
    names = {n for n, m in before.items() if m[1:] in KPATHSEA_BLIND}
    assert {"tex_pdfobj:D", "tex_primitive:D", "tex_filesize:D", "pdfobj"} <= names
    unlocked = [n for n in sorted(names) if not after.get(n, "").startswith("macro:->\\mmrl@forbidden")]
    assert unlocked == []


def test_every_name_builder_that_reaches_a_dangerous_name_is_refused(meanings):
    before, after = meanings
    refused = {p for p in _primitives(before) if p in FORBIDDEN_WORDS or p.startswith(FORBIDDEN_PREFIXES)}
    dangerous = {n for n, m in before.items() if m[1:] in refused} | set(sandbox._LOCKED)
    builders: dict[str, set[str]] = {}
    for name, meaning in after.items():
        if re.fullmatch(r"[A-Za-z]+", name) and "macro:" in meaning:
            for m in _BUILDER.finditer(meaning.split("->", 1)[-1]):
                if m.group(2) == "#":
                    builders.setdefault(name, set()).add(m.group(1))
    assert {"UseName", "newhelp", "pagenumbering", "setcounter"} <= set(builders)

    def reaches(
        prefix: str,
    ) -> bool:  # only the literal text before a computed part (\string, \number) is fixed
        literal = prefix.split("\\")[0]
        return any(d.startswith(literal) for d in dangerous)

    must = {b for b, prefixes in builders.items() if any(reaches(p) for p in prefixes)}
    assert [b for b in sorted(must) if not _refused(b)] == []
    assert "setcounter" not in must  # c@<name> reaches no dangerous name: counters stay usable


def test_every_catcode_changer_is_refused(meanings):
    before, _ = meanings

    def body(name: str) -> str:
        meaning = before.get(name, "")
        return meaning.split("->", 1)[1] if "macro:" in meaning and "->" in meaning else ""

    changers = set()
    for name in before:
        if re.fullmatch(r"[A-Za-z]+", name) and body(name):
            called = [n for n in re.findall(r"\\([A-Za-z@_:]+)", body(name)) if re.search(r"[@_:]", n)]
            if any(_CATCODES.search(text) for text in [body(name), *map(body, called)]):
                changers.add(name)
    assert {"ExplSyntaxOn", "ProvidesExplFile", "makeatletter", "obeycr"} <= changers
    assert [n for n in sorted(changers - INERT_CATCODE_USERS) if not _refused(n)] == []


def test_allowed_environments_run_no_refused_primitive(meanings):
    before, _ = meanings
    refused = {p for p in _primitives(before) if p in FORBIDDEN_WORDS or p.startswith(FORBIDDEN_PREFIXES)}
    for env in ENVIRONMENTS:
        for name in (env, f"end{env}"):
            assert before.get(name, "undefined")[1:] not in refused, name
            assert name not in FORBIDDEN_WORDS, name
