"""LaTeX tabular <-> HTML table, for the structure part of the table reward (docs/rewards.md#domain-rewards).

``latex_to_html(latex)`` converts the FIRST ``tabular``, ``tabular*``, ``tabularx``, ``tabulary``, ``longtable`` or
``array`` environment to ``<table>`` with one ``<tr>`` per row and one ``<td>`` per cell, which ``teds`` then scores.
Rows above the first full-width rule that has rows on both sides (``\\hline``, ``\\midrule``, ...) go in ``<thead>``,
the rest in ``<tbody>``, mirroring PubTabNet's HTML so that a LaTeX prediction can be scored against its references:

- comments (``%`` to the end of the line, but not ``\\%``) are removed first;
- rows end at top-level ``\\\\`` (with optional ``*`` and ``[2pt]``) or ``\\tabularnewline``; cells end at top-level
  unescaped ``&``; "top level" means outside braces and outside nested environments, so ``\\makecell{a\\\\b}``,
  ``\\shortstack``, ``\\parbox`` and nested tabulars stay inside one cell;
- rules and spacing (``\\hline \\cline \\toprule \\midrule \\bottomrule \\cmidrule(lr){2-3} \\cdashline \\hdashline
  \\specialrule \\addlinespace \\morecmidrules \\noalign``), colours and captions are dropped with their arguments;
- ``\\multicolumn{n}{spec}{x}`` gives ``colspan``; ``\\multirow{n}{w}{x}`` (and ``\\multirowcell``) gives ``rowspan``
  on its cell and removes the placeholder cells it covers in the rows below; a NEGATIVE ``\\multirow{-n}`` (the cell
  written in the bottom row of its span, as colortbl users do) is moved to the top row of the span, with
  ``rowspan=n``, and the placeholders above it are removed; spans that run past the last row are clipped to it;
- cell text is the visible text: formatting commands (``\\textbf`` etc.) are stripped, leaving their argument;
  escaped characters and a small table of symbols (``\\pm``, ``\\times``, Greek letters, ...) become Unicode; ``$`` is
  dropped, ``~`` is a space, ``--``/``---`` become dashes, whitespace is collapsed (spaces after a control word are
  kept, unlike TeX, so ``$1 \\pm 2$`` reads "1 ± 2");
- one empty row after the final ``\\\\`` (usually just ``\\bottomrule``) is dropped, as are longtable's repeated
  headers and per-page footers (rows closed by ``\\endhead`` after an ``\\endfirsthead``, or by ``\\endfoot``).

Anything that cannot be read (no such environment, no ``\\end``, unbalanced braces, a span that is not a plain
number or is past ``MAX_SPAN`` = 1000, such as ``\\multicolumn{inf}`` or ``\\multirow{-1e309}``) raises
``LatexTableParseError`` and nothing else; the reward scores that 0. It is a small tokenizer plus brace matcher
rather than a TeX engine: macros defined by the user are not expanded (unknown commands are dropped and their braced
arguments kept as text), and longtable's ``\\endlastfoot`` rows stay where they are written. Why our own code: no
dependency-free library maps LaTeX tables to HTML with row and column spans (pandoc is an external binary and drops
negative ``\\multirow``; pylatexenc only converts text).

``html_to_latex(html)`` goes the other way for training references (e.g. PubTabNet ground truth): a booktabs
``tabular`` with ``\\multicolumn``/``\\multirow`` and empty placeholders under row spans; ``<b> <i> <sup> <sub>``
become ``\\textbf \\textit \\textsuperscript \\textsubscript``, LaTeX specials are escaped and the symbols of the
same table become commands, so that ``latex_to_html(html_to_latex(h))`` has the structure of ``h`` (and its cell text
up to whitespace and inline markup). Other characters pass through as UTF-8; all 20 PubTabNet sample tables compile
with pdflatex (T1 fontenc), but references from other sources should still be compile-checked.
"""

from __future__ import annotations

import html as html_lib
import re
from dataclasses import dataclass

from lxml import etree
from lxml import html as lxml_html

__all__ = ["LatexTableParseError", "latex_to_html", "html_to_latex"]

ENVIRONMENTS = {
    "tabular": "om",
    "tabular*": "mom",
    "tabularx": "mm",
    "tabulary": "mm",
    "longtable": "om",
    "array": "om",
}
ENV_ARGS = {**ENVIRONMENTS, "minipage": "ooom"}  # arguments dropped with a nested environment inside a cell

# Commands dropped together with their arguments: o = [optional], p = (optional), s = optional *, m = mandatory.
DROPPED = {
    "hline": "", "hhline": "m", "cline": "m", "toprule": "op", "midrule": "op", "bottomrule": "op",
    "cmidrule": "opm", "cdashline": "m", "hdashline": "o", "specialrule": "mmm", "addlinespace": "o",
    "morecmidrules": "", "noalign": "m", "rowcolor": "om", "arrayrulecolor": "om", "cellcolor": "om",
    "columncolor": "om", "color": "om", "textcolor": "om", "colorbox": "om", "caption": "som", "label": "m",
    "hspace": "sm", "vspace": "sm", "rule": "omm", "includegraphics": "som", "setlength": "mm",
    "renewcommand": "mm", "fontsize": "mm", "cite": "om", "ref": "m", "footnotemark": "o", "makecell": "o",
    "shortstack": "o", "parbox": "ooom", "raisebox": "moo", "resizebox": "smm", "scalebox": "mo",
    "endhead": "", "endfirsthead": "", "endfoot": "", "endlastfoot": "", "pagebreak": "o", "nopagebreak": "o",
    "newpage": "", "centering": "", "raggedright": "", "raggedleft": "", "arraybackslash": "",
}  # fmt: skip
# HTML caps colspan at 1000 (browsers clamp larger values); a larger span is no real table, and TeX itself stops on
# one wider than the table, so a LaTeX span past it is a parse error and an HTML one is clamped to it.
MAX_SPAN = 1000
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
LONGTABLE_MARKERS = ("endfirsthead", "endhead", "endfoot", "endlastfoot")
FULL_RULES = ("hline", "toprule", "midrule", "bottomrule", "specialrule")  # end the header when between rows
CAPTIONS = (("cs", "caption"), ("cs", "label"))

# One table for both directions: command -> character. Text-mode commands first, then math-mode ones.
TEXT_SYMBOLS = {
    "textdegree": "\u00b0", "textminus": "\u2212", "textmu": "\u00b5", "S": "\u00a7", "P": "\u00b6",
    "ldots": "\u2026", "textbullet": "\u2022", "textperiodcentered": "\u00b7", "textbar": "|", "textless": "<",
    "textgreater": ">", "textasciitilde": "~", "textasciicircum": "^", "textbackslash": "\\", "dag": "\u2020",
    "ddag": "\u2021", "textdagger": "\u2020", "textdaggerdbl": "\u2021", "dots": "\u2026", "copyright": "\u00a9",
    "textregistered": "\u00ae", "texttrademark": "\u2122", "textendash": "\u2013", "textemdash": "\u2014",
}  # fmt: skip
MATH_SYMBOLS = {
    "pm": "\u00b1", "mp": "\u2213", "times": "\u00d7", "div": "\u00f7", "leq": "\u2264", "geq": "\u2265",
    "le": "\u2264", "ge": "\u2265", "neq": "\u2260", "ne": "\u2260", "approx": "\u2248", "sim": "\u223c",
    "simeq": "\u2243", "cdot": "\u22c5", "infty": "\u221e", "circ": "\u2218", "prime": "\u2032",
    "dagger": "\u2020", "ddagger": "\u2021", "bullet": "\u2219", "ast": "\u2217", "star": "\u22c6",
    "rightarrow": "\u2192", "leftarrow": "\u2190", "uparrow": "\u2191", "downarrow": "\u2193", "to": "\u2192",
    "alpha": "\u03b1", "beta": "\u03b2", "gamma": "\u03b3", "delta": "\u03b4", "epsilon": "\u03f5",
    "varepsilon": "\u03b5", "zeta": "\u03b6", "eta": "\u03b7", "theta": "\u03b8", "kappa": "\u03ba",
    "lambda": "\u03bb", "mu": "\u03bc", "nu": "\u03bd", "xi": "\u03be", "pi": "\u03c0", "rho": "\u03c1",
    "sigma": "\u03c3", "tau": "\u03c4", "phi": "\u03d5", "varphi": "\u03c6", "chi": "\u03c7", "psi": "\u03c8",
    "omega": "\u03c9", "Gamma": "\u0393", "Delta": "\u0394", "Theta": "\u0398", "Lambda": "\u039b",
    "Sigma": "\u03a3", "Phi": "\u03a6", "Psi": "\u03a8", "Omega": "\u03a9",
}  # fmt: skip
ESCAPED = {"&": "&", "%": "%", "$": "$", "#": "#", "_": "_", "{": "{", "}": "}", " ": " ", ",": " ", ";": " ",
           ":": " ", "!": "", "-": "", "/": "", "@": "", "\\": " "}  # fmt: skip
LATEX_SPECIALS = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "&": r"\&", "%": r"\%", "$": r"\$",
                  "#": r"\#", "_": r"\_", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}  # fmt: skip


class LatexTableParseError(ValueError):
    """The input has no readable tabular environment."""


Token = tuple[str, str]  # (kind, value); kinds: cs (control sequence name), {, }, &, space, char


def _tokenize(src: str) -> list[Token]:
    """Control sequences, braces, ``&``, whitespace and other characters; comments are removed here."""
    toks: list[Token] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c == "\\":
            j = i + 1
            while j < n and src[j].isalpha():
                j += 1
            if j == i + 1:  # control symbol such as \\ \& \%
                toks.append(("cs", src[i + 1 : i + 2]))
                i += 2
                continue
            toks.append(("cs", src[i + 1 : j]))  # spaces after it are kept (TeX drops them) for readable text
            i = j
        elif c == "%":
            end = src.find("\n", i)
            i = n if end < 0 else end + 1
            while i < n and src[i] in " \t":
                i += 1
        elif c in "{}&":
            toks.append((c, c))
            i += 1
        else:
            toks.append(("space" if c.isspace() else "char", c))
            i += 1
    return toks


def _skip_space(toks: list[Token], i: int) -> int:
    while i < len(toks) and toks[i][0] == "space":
        i += 1
    return i


def _group_end(toks: list[Token], i: int) -> int:
    """Index just after the ``}`` matching the ``{`` at ``i``."""
    depth = 0
    for k in range(i, len(toks)):
        if toks[k][0] == "{":
            depth += 1
        elif toks[k][0] == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    raise LatexTableParseError("unbalanced braces: a '{' is never closed")


def _delimited_end(toks: list[Token], i: int, close: str) -> int:
    """Index just after the ``close`` char ending a ``[...]``/``(...)`` argument that starts at ``i``."""
    k = i + 1
    while k < len(toks):
        if toks[k][0] == "{":
            k = _group_end(toks, k)
            continue
        if toks[k] == ("char", close):
            return k + 1
        k += 1
    raise LatexTableParseError(f"optional argument opened with {toks[i][1]!r} is never closed")


def _read_args(toks: list[Token], i: int, signature: str) -> tuple[list[list[Token] | None], int]:
    """Read arguments after a command (see ``DROPPED`` for the letters); returns them and the next index."""
    args: list[list[Token] | None] = []
    for kind in signature:
        k = _skip_space(toks, i)
        opener = {"o": "[", "p": "(", "s": "*"}.get(kind)
        if opener is not None:
            if k < len(toks) and toks[k] == ("char", opener):
                end = k + 1 if kind == "s" else _delimited_end(toks, k, "]" if kind == "o" else ")")
                args.append(toks[k + 1 : end - 1])
                i = end
            else:
                args.append(None)
            continue
        if k >= len(toks) or toks[k][0] == "}":
            raise LatexTableParseError("a command is missing a mandatory argument")
        if toks[k][0] == "{":
            end = _group_end(toks, k)
            args.append(toks[k + 1 : end - 1])
        else:
            end = k + 1
            args.append(toks[k:end])
        i = end
    return args, i


def _env_name(toks: list[Token], i: int) -> tuple[str, int]:
    """Name of the environment after a ``\\begin``/``\\end`` token at ``i - 1``."""
    (arg,), k = _read_args(toks, i, "m")
    return "".join(v for _, v in arg).strip(), k


def _find_environment(toks: list[Token]) -> tuple[str, list[Token]]:
    """The first table environment: its name and body (after its own arguments, before its ``\\end``)."""
    for i, tok in enumerate(toks):
        if tok != ("cs", "begin"):
            continue
        name, k = _env_name(toks, i + 1)
        if name not in ENVIRONMENTS:
            continue
        _, body_start = _read_args(toks, k, ENVIRONMENTS[name])
        depth, j = 1, body_start
        while j < len(toks):
            if toks[j][0] == "cs" and toks[j][1] in ("begin", "end"):
                inner, after = _env_name(toks, j + 1)
                if inner == name:
                    depth += 1 if toks[j][1] == "begin" else -1
                    if depth == 0:
                        return name, toks[body_start:j]
                j = after
                continue
            j += 1
        raise LatexTableParseError(f"\\begin{{{name}}} has no matching \\end{{{name}}}")
    raise LatexTableParseError(
        "no tabular, tabular*, tabularx, tabulary, longtable or array environment found"
    )


def _split_top(toks: list[Token], is_separator) -> list[list[Token]]:
    """Split at separators that sit outside braces and nested environments; ``is_separator(toks, k)`` returns
    the index after the separator (and anything it swallows) or None."""
    chunks: list[list[Token]] = []
    start = depth = env = k = 0
    while k < len(toks):
        kind, value = toks[k]
        if kind == "{":
            depth += 1
        elif kind == "}":
            depth -= 1
        elif kind == "cs" and value in ("begin", "end"):
            env += 1 if value == "begin" else -1
        elif depth == 0 and env == 0:
            after = is_separator(toks, k)
            if after is not None:
                chunks.append(toks[start:k])
                start = k = after
                continue
        k += 1
    if depth != 0:
        raise LatexTableParseError("unbalanced braces inside the table body")
    chunks.append(toks[start:])
    return chunks


def _row_separator(toks: list[Token], k: int) -> int | None:
    if toks[k] not in (("cs", "\\"), ("cs", "tabularnewline")):
        return None
    _, after = _read_args(toks, k + 1, "so")  # \\* and \\[2pt]
    return after


def _cell_separator(toks: list[Token], k: int) -> int | None:
    return k + 1 if toks[k][0] == "&" else None


def _drop_commands(toks: list[Token]) -> list[Token]:
    """Remove the ``DROPPED`` commands and their arguments, at any depth."""
    out: list[Token] = []
    k = 0
    while k < len(toks):
        kind, value = toks[k]
        if kind == "cs" and value in DROPPED:
            _, k = _read_args(toks, k + 1, DROPPED[value])
            continue
        if kind == "cs" and value in ("begin", "end"):  # nested environment: drop its name and arguments
            name, k = _env_name(toks, k + 1)
            if value == "begin":
                _, k = _read_args(toks, k, ENV_ARGS.get(name, ""))
            continue
        out.append(toks[k])
        k += 1
    return out


def _strip(toks: list[Token]) -> list[Token]:
    lo, hi = 0, len(toks)
    while lo < hi and toks[lo][0] == "space":
        lo += 1
    while hi > lo and toks[hi - 1][0] == "space":
        hi -= 1
    return toks[lo:hi]


def _text(toks: list[Token]) -> str:
    """Visible text of (already rule-stripped) tokens."""
    parts: list[str] = []
    for kind, value in toks:
        if kind in ("char", "space"):
            parts.append({"$": "", "~": " ", "^": "", "_": ""}.get(value, value))
        elif kind == "&":
            parts.append(" ")
        elif kind == "cs":
            parts.append(ESCAPED.get(value) or TEXT_SYMBOLS.get(value) or MATH_SYMBOLS.get(value) or "")
    text = "".join(parts).replace("---", "\u2014").replace("--", "\u2013")
    text = text.replace("``", "\u201c").replace("''", "\u201d")
    return re.sub(r"\s+", " ", text).strip()


@dataclass
class _Cell:
    col: int
    colspan: int
    rowspan: int  # negative: written in the bottom row of its span
    text: str


def _span_count(arg: list[Token] | None, what: str) -> int:
    """The span as written: a plain decimal number (a fraction is truncated, as before), at most ``MAX_SPAN`` in
    size; ``inf``, ``1e309``, ``nan``, exponents, and spans past ``MAX_SPAN`` raise ``LatexTableParseError``."""
    raw = "".join(v for _, v in arg or []).strip()
    if not _NUMBER.fullmatch(raw):
        raise LatexTableParseError(f"{what} has a non-numeric span {raw[:40]!r}")
    digits = raw.lstrip("+-").split(".")[0].lstrip("0")
    if len(digits) > len(str(MAX_SPAN)) or abs(int(float(raw))) > MAX_SPAN:  # no float overflow on 10**400
        raise LatexTableParseError(f"{what} spans {raw[:40]}, more than the {MAX_SPAN} a table can have")
    return int(float(raw))


def _parse_cell(toks: list[Token]) -> tuple[int, int, str]:
    """(colspan, rowspan, text) of one cell; \\multicolumn and \\multirow may wrap each other."""
    toks = _strip(toks)
    colspan = rowspan = 1
    while toks and toks[0][0] == "cs" and toks[0][1] in ("multicolumn", "multirow", "multirowcell"):
        name = toks[0][1]
        signature = {"multicolumn": "mmm", "multirow": "omomom", "multirowcell": "moom"}[name]
        args, after = _read_args(toks, 1, signature)
        if name == "multicolumn":
            colspan = _span_count(args[0], "\\multicolumn")
            if colspan < 1:
                raise LatexTableParseError(f"\\multicolumn spans {colspan} columns")
        else:
            rowspan = _span_count(args[1] if name == "multirow" else args[0], f"\\{name}") or 1
        toks = _strip(args[-1] + toks[after:])
    return colspan, rowspan, _text(toks)


def _longtable_sections(chunks: list[list[Token]]) -> list[list[Token]]:
    """Drop longtable's repeated head (closed by ``\\endhead`` after ``\\endfirsthead``) and per-page feet."""
    kept: list[list[Token]] = []
    section: list[list[Token]] = []
    seen_first_head = False
    for chunk in chunks:
        marker = next((v for kind, v in chunk if kind == "cs" and v in LONGTABLE_MARKERS), None)
        if marker is not None:  # the rows since the previous marker form a head or a foot
            keep = marker in ("endfirsthead", "endlastfoot") or (marker == "endhead" and not seen_first_head)
            kept.extend(section if keep else [])
            seen_first_head |= marker == "endfirsthead"
            section = []
        section.append(chunk)
    return kept + section


def _rows(body: list[Token]) -> tuple[list[list[_Cell]], int]:
    """Rows of cells (LaTeX column positions, spans as written) and the number of header rows.

    The header is the rows above the first full-width rule that has rows on both sides (0 when there is none).
    """
    chunks = _longtable_sections(_split_top(body, _row_separator))
    rows: list[list[_Cell]] = []
    header = 0
    for k, chunk in enumerate(chunks):
        parsed = [_parse_cell(_drop_commands(c)) for c in _split_top(chunk, _cell_separator)]
        if rows and not header and any(kind == "cs" and v in FULL_RULES for kind, v in chunk):
            header = len(rows)
        if parsed == [(1, 1, "")] and (k == len(chunks) - 1 or any(t in CAPTIONS for t in chunk)):
            continue  # the empty "row" after the final \\ (rules only), or a longtable caption line
        col, cells = 0, []
        for colspan, rowspan, text in parsed:
            cells.append(_Cell(col, colspan, rowspan, text))
            col += colspan
        rows.append(cells)
    return rows, header if header < len(rows) else 0


def _overlaps(cell: _Cell, col: int, colspan: int) -> bool:
    return cell.col < col + colspan and col < cell.col + cell.colspan


def _resolve_spans(rows: list[list[_Cell]]) -> list[list[_Cell]]:
    """Move negative row spans to the top of their span; remove the placeholders every span covers."""
    for r, row in enumerate(rows):
        for cell in [c for c in row if c.rowspan < 0]:
            top = max(0, r + cell.rowspan + 1)
            row.remove(cell)
            for above in range(top, r):
                rows[above] = [c for c in rows[above] if not _overlaps(c, cell.col, cell.colspan)]
            cell.rowspan = r - top + 1
            rows[top].append(cell)
            rows[top].sort(key=lambda c: c.col)
    for r, row in enumerate(rows):
        for cell in row:
            cell.rowspan = min(cell.rowspan, len(rows) - r)
            for below in range(r + 1, r + cell.rowspan):
                rows[below] = [c for c in rows[below] if not _overlaps(c, cell.col, cell.colspan)]
    return rows


def _tr(row: list[_Cell]) -> str:
    cells = []
    for cell in row:
        attrs = f' colspan="{cell.colspan}"' if cell.colspan > 1 else ""
        attrs += f' rowspan="{cell.rowspan}"' if cell.rowspan > 1 else ""
        cells.append(f"<td{attrs}>{html_lib.escape(cell.text, quote=False)}</td>")
    return "<tr>" + "".join(cells) + "</tr>"


def latex_to_html(latex: str) -> str:
    """HTML ``<table>`` of the first table environment in ``latex`` (see module docstring)."""
    _, body = _find_environment(_tokenize(latex))
    rows, header = _rows(body)
    rows = _resolve_spans(rows)
    if not rows:
        return "<table></table>"
    head = "<thead>" + "".join(_tr(r) for r in rows[:header]) + "</thead>" if header else ""
    return "<table>" + head + "<tbody>" + "".join(_tr(r) for r in rows[header:]) + "</tbody></table>"


_TO_LATEX = {ch: f"\\{name}{{}}" for name, ch in reversed(TEXT_SYMBOLS.items())}
_TO_LATEX.update({ch: f"$\\{name}$" for name, ch in reversed(MATH_SYMBOLS.items())})
_TO_LATEX.update(LATEX_SPECIALS)
_INLINE = {"b": "textbf", "strong": "textbf", "i": "textit", "em": "textit", "sup": "textsuperscript",
           "sub": "textsubscript", "u": "underline"}  # fmt: skip


def _escape_latex(text: str) -> str:
    return "".join(_TO_LATEX.get(ch, ch) for ch in re.sub(r"\s+", " ", text))


def _cell_latex(el: etree._Element) -> str:
    """LaTeX for a cell's content: escaped text, inline tags as text commands."""
    parts = [_escape_latex(el.text or "")]
    for child in el:
        if child.tag == "br":
            parts.append(" ")
        elif isinstance(child.tag, str):
            inner = _cell_latex(child)
            command = _INLINE.get(child.tag)
            parts.append(f"\\{command}{{{inner}}}" if command and inner.strip() else inner)
        parts.append(_escape_latex(child.tail or ""))
    return "".join(parts).strip()


def _span_attr(el: etree._Element, name: str) -> int:
    """The attribute as browsers read it: 1 when it is not a number, clamped to [1, ``MAX_SPAN``]."""
    try:
        return min(max(1, int(el.get(name, "1"))), MAX_SPAN)
    except ValueError:
        return 1


def html_to_latex(html: str) -> str:
    """A booktabs ``tabular`` for an HTML table (first ``<table>``); raises ``LatexTableParseError`` (a
    ``ValueError``) when there is none. Spans are read as browsers do: clamped to [1, ``MAX_SPAN``]."""
    root = lxml_html.document_fromstring(html) if html.strip() else None
    tables = root.xpath("//table") if root is not None else []
    if not tables:
        raise LatexTableParseError(f"no <table> in the HTML: {html[:80]!r}")
    trs = tables[0].xpath(".//tr")
    covered: dict[tuple[int, int], int] = {}  # (row, col) of a span's top-left-below cell -> its colspan
    lines, width, head_rows = [], 0, len(tables[0].xpath(".//thead//tr"))
    for r, tr in enumerate(trs):
        cells, col = [], 0
        queue = [c for c in tr if c.tag in ("td", "th")]
        while queue:  # placeholders under row spans only where a later cell of this row needs the alignment
            if (r, col) in covered:
                span = covered.pop((r, col))
                cells.append(f"\\multicolumn{{{span}}}{{c}}{{}}" if span > 1 else "")
                col += span
                continue
            cell = queue.pop(0)
            colspan, rowspan = _span_attr(cell, "colspan"), min(_span_attr(cell, "rowspan"), len(trs) - r)
            text = _cell_latex(cell)
            if rowspan > 1:
                text = f"\\multirow{{{rowspan}}}{{*}}{{{text}}}"
                covered.update({(r + k, col): colspan for k in range(1, rowspan)})
            cells.append(f"\\multicolumn{{{colspan}}}{{c}}{{{text}}}" if colspan > 1 else text)
            col += colspan
        covered = {pos: span for pos, span in covered.items() if pos[0] != r}
        width = max(width, col)
        lines.append(" & ".join(cells) + r" \\")
        if r + 1 == head_rows and r + 1 < len(trs):
            lines.append(r"\midrule")
    spec = "l" + "c" * max(0, width - 1)
    return "\n".join([f"\\begin{{tabular}}{{{spec}}}", r"\toprule", *lines, r"\bottomrule", r"\end{tabular}"])
