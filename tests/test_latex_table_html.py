"""LaTeX tabular -> HTML: hand cases with the expected HTML written out, errors, and the HTML -> LaTeX round trip."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from lxml import html as lxml_html

from mmrl.rewards.latex_table_html import LatexTableParseError, html_to_latex, latex_to_html
from mmrl.rewards.teds import teds

DATA = Path(__file__).resolve().parent / "data" / "pubtabnet"


def _body(*rows: str) -> str:
    return "<table><tbody>" + "".join(f"<tr>{r}</tr>" for r in rows) + "</tbody></table>"


CASES = {
    "plain rows, trailing empty row dropped": (
        "\\begin{tabular}{cc}\na & b \\\\\nc & d \\\\\n\\end{tabular}",
        _body("<td>a</td><td>b</td>", "<td>c</td><td>d</td>"),
    ),
    "hline header rule, last row without \\\\": (
        "\\begin{tabular}{|l|l|}\\hline a & b \\\\ \\hline c & d \\\\ \\hline e & f\\end{tabular}",
        "<table><thead><tr><td>a</td><td>b</td></tr></thead>"
        "<tbody><tr><td>c</td><td>d</td></tr><tr><td>e</td><td>f</td></tr></tbody></table>",
    ),
    "booktabs with cmidrule(lr) inside a two-row header": (
        "\\begin{tabular}{lcc}\\toprule\n & \\multicolumn{2}{c}{Group} \\\\ \\cmidrule(lr){2-3}\n"
        "Name & x & y \\\\\n\\midrule\nA & 1 & 2 \\\\\n\\bottomrule\n\\end{tabular}",
        '<table><thead><tr><td></td><td colspan="2">Group</td></tr><tr><td>Name</td><td>x</td><td>y</td></tr>'
        "</thead><tbody><tr><td>A</td><td>1</td><td>2</td></tr></tbody></table>",
    ),
    "multirow with its placeholder below": (
        "\\begin{tabular}{cc}\\multirow{2}{*}{m} & 1 \\\\ & 2 \\\\ z & 3 \\\\\\end{tabular}",
        _body('<td rowspan="2">m</td><td>1</td>', "<td>2</td>", "<td>z</td><td>3</td>"),
    ),
    "negative multirow moves to the top of its span": (
        "\\begin{tabular}{ccc}\\cellcolor{gray} & a & b \\\\ & c & d \\\\\n"
        "\\multirow{-3}{*}{\\cellcolor{gray}X} & e & f \\\\\\end{tabular}",
        _body('<td rowspan="3">X</td><td>a</td><td>b</td>', "<td>c</td><td>d</td>", "<td>e</td><td>f</td>"),
    ),
    "negative multirow in a middle column": (
        "\\begin{tabular}{ccc}a & & b \\\\ c & \\multirow{-2}{*}{M} & d \\\\\\end{tabular}",
        _body('<td>a</td><td rowspan="2">M</td><td>b</td>', "<td>c</td><td>d</td>"),
    ),
    "multicolumn wrapping multirow, multicolumn placeholder": (
        "\\begin{tabular}{ccc}\\multicolumn{2}{c}{\\multirow{2}{*}{big}} & 1 \\\\\n"
        "\\multicolumn{2}{c}{} & 2 \\\\\\end{tabular}",
        _body('<td colspan="2" rowspan="2">big</td><td>1</td>', "<td>2</td>"),
    ),
    "multirow optional arguments and multirowcell": (
        "\\begin{tabular}{cc}\\multirow[t]{2}[3]{2cm}[1ex]{p} & \\multirowcell{2}{q} \\\\ & \\\\\\end{tabular}",
        _body('<td rowspan="2">p</td><td rowspan="2">q</td>', ""),
    ),
    "row ends with \\\\[2pt], \\\\* and \\tabularnewline": (
        "\\begin{tabular}{c}a \\\\[2pt] b \\\\*[1ex] c \\tabularnewline d\\end{tabular}",
        _body("<td>a</td>", "<td>b</td>", "<td>c</td>", "<td>d</td>"),
    ),
    "escaped ampersand and percent, comments removed": (
        "\\begin{tabular}{cc}% header comment & x \\\\\nA \\& B & 50\\% % trailing & note\n\\\\\n"
        "% c & d \\\\\ne & f\\end{tabular}",
        _body("<td>A &amp; B</td><td>50%</td>", "<td>e</td><td>f</td>"),
    ),
    "makecell keeps its inner line breaks in one cell": (
        "\\begin{tabular}{cc}\\makecell[l]{first\\\\second} & x \\\\\\end{tabular}",
        _body("<td>first second</td><td>x</td>"),
    ),
    "formatting stripped, nested braces kept as text": (
        "\\begin{tabular}{cc}\\textbf{\\emph{bold}} & {\\bf a{b}c} \\\\ \\textcolor{red}{r} & \\underline{u}"
        "\\end{tabular}",
        _body("<td>bold</td><td>abc</td>", "<td>r</td><td>u</td>"),
    ),
    "all rule kinds dropped": (
        "\\begin{tabular}{cc}\\toprule[1pt]a & b \\\\ \\cline{1-2} \\cdashline{1-2} \\specialrule{1pt}{2pt}{3pt}"
        "\\addlinespace[4pt] \\morecmidrules \\cmidrule[0.5pt](lr){1-2} c & d \\\\ \\hdashline e & f \\\\"
        "\\bottomrule\\end{tabular}",
        "<table><thead><tr><td>a</td><td>b</td></tr></thead>"
        "<tbody><tr><td>c</td><td>d</td></tr><tr><td>e</td><td>f</td></tr></tbody></table>",
    ),
    "symbols, math and dashes": (
        "\\begin{tabular}{ccc}$1.2 \\pm 0.3$ & $\\alpha$--$\\beta$ & 3~$\\times$~4\\end{tabular}",
        _body("<td>1.2 \u00b1 0.3</td><td>\u03b1\u2013\u03b2</td><td>3 \u00d7 4</td>"),
    ),
    "nested tabular stays in its cell": (
        "\\begin{tabular}{cc}\\begin{tabular}{@{}c@{}}x\\\\y\\end{tabular} & z & w\\\\\\end{tabular}",
        _body("<td>x y</td><td>z</td><td>w</td>"),
    ),
    "tabular* arguments": (
        "\\begin{tabular*}{\\textwidth}[t]{@{\\extracolsep{\\fill}}lr}a & b\\end{tabular*}",
        _body("<td>a</td><td>b</td>"),
    ),
    "tabularx after text, first environment only": (
        "Table: \\begin{tabularx}{\\linewidth}{Xp{2cm}}a & b\\end{tabularx}"
        "\\begin{tabular}{c}other\\end{tabular}",
        _body("<td>a</td><td>b</td>"),
    ),
    "array in math": (
        "$\\begin{array}[c]{cc}1 & 2 \\\\ 3 & 4\\end{array}$",
        _body("<td>1</td><td>2</td>", "<td>3</td><td>4</td>"),
    ),
    "longtable: caption line, repeated head and page foot dropped": (
        "\\begin{longtable}{cc}\\caption{T}\\label{t}\\\\ \\toprule H & I \\\\ \\midrule \\endfirsthead\n"
        "H & I \\\\ \\endhead\n\\multicolumn{2}{r}{continued} \\\\ \\endfoot\n\\bottomrule\\endlastfoot\n"
        "1 & 2 \\\\\n\\end{longtable}",
        "<table><thead><tr><td>H</td><td>I</td></tr></thead><tbody><tr><td>1</td><td>2</td></tr></tbody></table>",
    ),
    "html special characters escaped": (
        "\\begin{tabular}{cc}a<b & \\textless{}x\\textgreater{}\\end{tabular}",
        _body("<td>a&lt;b</td><td>&lt;x&gt;</td>"),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_latex_to_html(name: str) -> None:
    latex, expected = CASES[name]
    assert latex_to_html(latex) == expected


@pytest.mark.parametrize(
    ("latex", "message"),
    [
        ("no table here", "no tabular"),
        ("\\begin{tabular}{cc}a & b \\\\", "no matching"),
        ("\\begin{tabular}{cc}\\textbf{a & b\\end{tabular}", "unbalanced"),
        ("\\begin{tabular}{cc}\\multicolumn{two}{c}{a}\\end{tabular}", "non-numeric"),
        ("\\begin{tabular}{cc}a \\\\[2pt b\\end{tabular}", "never closed"),
    ],
)
def test_unparsable_raises(latex: str, message: str) -> None:
    with pytest.raises(LatexTableParseError, match=message):
        latex_to_html(latex)
    assert issubclass(LatexTableParseError, ValueError)


def test_html_to_latex_spans_and_escapes() -> None:
    source = (
        "<table><thead><tr><td rowspan='2'>k</td><td colspan='2'><b>A&amp;B</b></td></tr>"
        "<tr><td>x_1</td><td>50%</td></tr></thead><tbody><tr><td>\u00b1 \u03bc</td><td>1</td><td>2</td></tr>"
        "</tbody></table>"
    )
    latex = html_to_latex(source)
    assert latex == (
        "\\begin{tabular}{lcc}\n\\toprule\n"
        "\\multirow{2}{*}{k} & \\multicolumn{2}{c}{\\textbf{A\\&B}} \\\\\n"
        " & x\\_1 & 50\\% \\\\\n\\midrule\n"
        "$\\pm$ $\\mu$ & 1 & 2 \\\\\n\\bottomrule\n\\end{tabular}"
    )
    assert latex_to_html(latex) == (
        '<table><thead><tr><td rowspan="2">k</td><td colspan="2">A&amp;B</td></tr>'
        "<tr><td>x_1</td><td>50%</td></tr></thead><tbody><tr><td>\u00b1 \u03bc</td><td>1</td><td>2</td></tr>"
        "</tbody></table>"
    )


def test_pubtabnet_round_trip() -> None:
    records = json.loads((DATA / "sample_gt.json").read_text(encoding="utf-8"))
    assert len(records) == 20
    for name, record in records.items():
        back = latex_to_html(html_to_latex(record["html"]))
        assert teds(back, record["html"], structure_only=True) == 1.0, name
        texts = [
            re.sub(r"\s+", " ", td.text_content()).strip() for td in lxml_html.fromstring(back).iter("td")
        ]
        original = lxml_html.fromstring(record["html"]).iter("td")
        assert texts == [re.sub(r"\s+", " ", td.text_content()).strip() for td in original], name


OVERFLOW_SPANS = {
    "multicolumn_inf": r"\multicolumn{inf}{c}{x}",
    "multicolumn_huge": r"\multicolumn{99999999999}{c}{x}",
    "multicolumn_exponent": r"\multicolumn{1e9}{c}{x}",
    "multicolumn_nan": r"\multicolumn{nan}{c}{x}",
    "multicolumn_negative_huge": r"\multicolumn{-99999999999}{c}{x}",
    "multicolumn_5000_digits": r"\multicolumn{" + "9" * 5000 + "}{c}{x}",
    "multicolumn_hex": r"\multicolumn{0x10}{c}{x}",
    "multicolumn_unicode_digits": "\\multicolumn{\u0661\u0662}{c}{x}",
    "multicolumn_past_html_limit": r"\multicolumn{1001}{c}{x}",
    "multirow_negative_overflow": r"\multirow{-1e309}{*}{x}",
    "multirow_overflow": r"\multirow{1e309}{*}{x}",
    "multirow_past_int32": r"\multirow{2147483648}{*}{x}",
    "multirowcell_inf": r"\multirowcell{inf}{x}",
}


@pytest.mark.parametrize("case", list(OVERFLOW_SPANS))
def test_overflowing_spans_are_parse_errors(case: str) -> None:
    latex = "\\begin{tabular}{cc}" + OVERFLOW_SPANS[case] + r" & y \\ a & b\end{tabular}"
    with pytest.raises(LatexTableParseError, match="span"):
        latex_to_html(latex)


def test_spans_up_to_the_html_limit_are_read() -> None:
    assert 'colspan="1000"' in latex_to_html(r"\begin{tabular}{c}\multicolumn{1000}{c}{x}\end{tabular}")
    assert 'colspan="2"' in latex_to_html(r"\begin{tabular}{c}\multicolumn{ 2.5 }{c}{x}\end{tabular}")
    far_up = latex_to_html(r"\begin{tabular}{c}a \\ \multirow{-1000}{*}{x}\end{tabular}")
    assert far_up == _body('<td rowspan="2">x</td>', "")  # clipped to the rows that exist


def test_html_spans_are_clamped_as_browsers_do() -> None:
    html = "<table><tr><td colspan='99999999999'>a</td></tr><tr><td rowspan='1e309'>b</td></tr></table>"
    latex = html_to_latex(html)
    assert "\\multicolumn{1000}{c}{a}" in latex and "{l" + "c" * 999 + "}" in latex
    assert latex_to_html(latex) == _body('<td colspan="1000">a</td>', "<td>b</td>")
    with pytest.raises(LatexTableParseError, match="no <table>"):
        html_to_latex("<p>no table</p>")


def test_mutated_tables_raise_nothing_but_parse_errors() -> None:
    """Random edits of the hand cases (inserted braces, separators, spans, environment ends, cut points): the
    converter returns HTML or raises LatexTableParseError, never anything else (seeded, 4000 inputs)."""
    rng = random.Random(0)
    pieces = ["{", "}", "&", "\\\\", "\\\\[", "[", "]", "(", "%", "\\multicolumn{", "\\multirow{-", "\\multirow{",
              "\\begin{tabular}{", "\\end{tabular}", "\\end{", "\\cmidrule(", "\\makecell[", "1e999}", "-0}", "inf}",
              "\\", "$", "\\endhead", "\\caption{"]  # fmt: skip
    sources = [latex for latex, _ in CASES.values()]
    outcomes = {"html": 0, "parse error": 0}
    for _ in range(4000):
        text = rng.choice(sources)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(text) + 1)
            text = text[:at] + rng.choice(pieces) + text[at + rng.randint(0, 3) :]
        try:
            latex_to_html(text)
            outcomes["html"] += 1
        except LatexTableParseError:
            outcomes["parse error"] += 1
    assert outcomes["html"] > 500 and outcomes["parse error"] > 500  # both paths were exercised
