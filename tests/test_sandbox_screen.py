"""The textual screen (rewards/latex_screen.py): legitimate tables pass it and render; each way of reaching a
primitive by a name built from text, or by changing how text is read, is refused with a reason that says which.

The hostile corpus itself, run through the whole sandbox in every mode, is in test_sandbox_security.py; the check
of the word list against the installed TeX is in test_sandbox_audit.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrl.rewards import landlock, sandbox
from mmrl.rewards.latex_screen import ENVIRONMENTS, MAX_BODY_BYTES, screen_latex
from mmrl.rewards.latex_table_html import html_to_latex
from mmrl.rewards.sandbox import render_latex

PUBTABNET = Path(__file__).resolve().parent / "data" / "pubtabnet"

# What table models write: rules, spans, cells with math, escapes, colours, boxes, sizes, column specs with @{}.
LEGIT = {
    "booktabs": r"\begin{tabular}{@{}lcc@{}}\toprule Method & Acc & F1 \\ \midrule Ours & \textbf{75.9} & 73.1 \\"
    r"\bottomrule\end{tabular}",
    "spans": r"\begin{tabular}{|l|c|c|}\hline \multirow{2}{*}{Model} & \multicolumn{2}{c|}{Data} \\ \cline{2-3}"
    r" & A & B \\ \hline\end{tabular}",
    "negative_multirow": r"\begin{tabular}{cc} & a \\ \multirow{-2}{*}{X} & b\end{tabular}",
    "math_subscripts": r"\begin{tabular}{cc}$\alpha_1$ & $x_{max}: 3$ \\ $\sigma_x^2$ & $W_{in}\times 4$\end{tabular}",
    "escapes": r"\begin{tabular}{ll}max\_len: & 50\% \\ A \& B & \#1 \$2\end{tabular}",
    "makecell_and_colours": r"\begin{tabular}{cc}\makecell{a\\b} & \textcolor{red}{r} \\ \colorbox{blue!10}{c} & d"
    r"\end{tabular}",
    "size_command": r"\small\begin{tabular}{c}x\end{tabular}",
    "size_environment": r"\begin{footnotesize}\begin{tabular}{c}x\end{tabular}\end{footnotesize}",
    "tabularx": r"\begin{tabularx}{8cm}{lX}a & a long cell \\\end{tabularx}",
    "tabular_star": r"\begin{tabular*}{8cm}{@{\extracolsep{\fill}}lr}a & b\end{tabular*}",
    "matrix_in_cell": r"\begin{tabular}{c}$\begin{pmatrix}1 & 2\\3 & 4\end{pmatrix}$\end{tabular}",
    "definitions_run_alone": r"\newcommand{\R}{\mathbb{R}}\begin{tabular}{c}$x$\end{tabular}",
    "nasa_spacing": r"\begin{tabular}{c}NASA\@. Done\end{tabular}",
    "comment": "\\begin{tabular}{c}% a comment\nx\\end{tabular}",
}


def test_legitimate_tables_pass_the_screen():
    for name, body in LEGIT.items():
        text, error, _ = screen_latex(body)
        assert error is None and text == body, (name, error)
    assert screen_latex(LEGIT["definitions_run_alone"])[2] is True  # \newcommand: its own TeX run
    assert screen_latex(LEGIT["booktabs"])[2] is False


def test_pubtabnet_references_pass_the_screen():
    records = json.loads((PUBTABNET / "sample_gt.json").read_text(encoding="utf-8"))
    for name, record in records.items():
        assert screen_latex(html_to_latex(record["html"]))[1] is None, name


@pytest.mark.tex
def test_legitimate_tables_render(monkeypatch):
    if landlock.kernel_abi() == 0:  # the layers below the screen are what this test is not about
        monkeypatch.setenv(sandbox.ALLOW_UNCONFINED_ENV, "1")
    records = json.loads((PUBTABNET / "sample_gt.json").read_text(encoding="utf-8"))
    bodies = [
        *(b for n, b in LEGIT.items() if n != "definitions_run_alone"),
        *map(html_to_latex, (r["html"] for r in records.values())),
    ]
    results = render_latex(bodies, timeout_s=20)
    assert [r.error for r in results if not r.ok] == []
    assert len(results) == len(LEGIT) - 1 + 20


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (r"\UseName{tex_input:D}{x}", "internal name"),
        (r"\UseName{input}{x}", r"\UseName is not allowed"),
        (r"\csname input\endcsname", r"\csname is not allowed"),
        (r"\expandafter\x\y", r"\expandafter is not allowed"),
        (r"\ExpandArgs{c}\x{input}", r"\ExpandArgs is not allowed"),
        (r"\newhelp\h{input}\the\h", r"\newhelp is not allowed"),
        (r"\pagenumbering{input}", r"\pagenumbering is not allowed"),
        (r"\begin{tex_input:D}", "internal name"),
        (r"\begin{input}{x}", "allowed environment ('input'"),
        (r"\begin{ExplSyntaxOn}", "allowed environment"),
        (r"\begin{table}\end{table}", "allowed environment ('table'"),
        (r"\def\x{input}\begin{\x}", "allowed environment"),
        (r"\let\b\begin \b{input}", "allowed environment"),
        (r"\end{input}", "allowed environment"),
        (r"\begin{mmrlpage}", "page environment"),
        (r"\catcode`\|=0", r"\catcode is not allowed"),
        (r"\makeatletter", r"\makeatletter is not allowed"),
        (r"\ExplSyntaxOn", r"\ExplSyntaxOn is not allowed"),
        (r"\endlinechar=-1", r"\endlinechar is not allowed"),
        (r"^^5cinput", "^^ character notation"),
        (r"\@@input x", "internal name"),
        (r"a cell saying pdf@filesize", "internal name"),
        (r"\tex_openin:D", "internal name"),
        (r"\pdfstrcmp{a}{b}", r"\pdfstrcmp is not allowed"),
        (r"\XKeyValLoaded", r"\XKeyValLoaded is not allowed"),
        ("\\inp%\nut{x}", r"\input is not allowed"),  # TeX joins the lines around a comment
        ("\\UseName%\n{x}", r"\UseName is not allowed"),
        ("a\x00b", "control character"),
        ("x" * (MAX_BODY_BYTES + 1), "byte limit"),
        (b"\xff", "not valid UTF-8"),
    ],
)
def test_refusals_say_why(body, reason: str):
    text, error, solo = screen_latex(body)
    assert error is not None and reason in error and text == "" and solo is False


def test_allowed_environments_are_plain_names():
    # \begin{x} runs \x: an allowed name is letters (and a trailing *) and no refused word
    for env in ENVIRONMENTS:
        assert env.rstrip("*").isalpha()
        assert screen_latex(f"\\begin{{{env}}}x\\end{{{env}}}")[1] is None
    assert {"tabular", "tabular*", "tabularx", "array"} <= ENVIRONMENTS
    assert not {"document", "filecontents", "verbatim", "mmrlpage"} & ENVIRONMENTS
