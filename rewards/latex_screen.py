"""The textual screen of the LaTeX rendering sandbox (:mod:`.sandbox`): which table bodies reach TeX at all.

With Landlock (the boundary, see :mod:`.landlock`) the screen only makes hostile bodies fail early and cheaply.
Without it (kernels before 5.13, some containers), and only when the user opts in with
``MMRL_ALLOW_UNCONFINED_RENDER=1``, the screen, the format's locks and kpathsea's paranoid mode are all that stands
between a model's output and the machine, and pdfTeX 1.40's ``\\pdfobj file {...}`` reads any file without asking
kpathsea. So the screen is built around what a body may do rather than around a list of bad names:

1. The body is tokenized as written. Whatever changes how later text becomes tokens is refused: ``^^`` notation and
   the catcode changers (``\\catcode``, ``\\makeatletter``, ``\\ExplSyntaxOn``, ``\\obeycr``, ``\\scantokens``,
   ``\\endlinechar`` ...). So every control sequence a body writes is a letter-only control word, and the internal
   names holding ``@``, ``_`` or ``:`` (among them the aliases ``\\@@input``, ``\\tex_input:D``, ``\\tex_pdfobj:D``,
   ``\\tex_primitive:D`` of locked primitives) can only be reached by building them from text.
2. Nothing builds a control sequence from text. ``\\csname``, ``\\ifcsname``, ``\\UseName``, ``\\ExpandArgs``,
   ``\\expandafter`` (the glue of such tricks) and the public commands that feed an argument to ``\\csname`` without
   a fixed prefix (:data:`NAME_BUILDERS`, e.g. ``\\newhelp\\h{tex_input:D}\\the\\h``) are refused. ``\\begin{x}``
   and ``\\end{x}`` run ``\\x`` and ``\\endx``, so they must be followed by a braced name from :data:`ENVIRONMENTS`,
   an allow-list. As a second line, text shaped like an internal name (``@`` before a letter or ``@``; a word
   holding both ``_`` and ``:``) is refused wherever it appears, even as plain text.
3. What remains is control words written out; those are checked against :data:`FORBIDDEN_WORDS` and every
   ``\\pdf...`` word. ``tests/test_sandbox_audit.py`` checks this list against the installed TeX: it asks TeX for the
   meaning of every name in the sources the format was built from, and fails when a letter-only alias of a
   dangerous primitive, a macro feeding an argument into ``\\csname`` with a prefix that reaches a dangerous name,
   or a macro that changes catcodes (itself or through the internals it calls) is not refused.

Not even a full bypass of the screen reaches pdfTeX's kpathsea-blind file readers: the format locks them under every
name they have (see :mod:`.sandbox`), and kpathsea's paranoid mode guards ``\\input``/``\\openin`` under any name.

Bodies that could change the state seen by the next body of a shared TeX run (definitions, global assignments,
counters, leaving the page's group: :data:`SOLO_WORDS`) are allowed but get a run of their own.
"""

from __future__ import annotations

import re

MAX_BODY_BYTES = 64 * 1024
PAGE_ENV = "mmrlpage"

# Primitives and LaTeX commands that read or write files, reach the shell or the PDF internals, end the input,
# stop for the terminal, or only serve to loop or to fill the log. "pdf..." words are refused as a prefix.
_FILES_AND_SHELL = (
    "input include includeonly InputIfFileExists IfFileExists openin read readline closein endinput verbatiminput "
    "VerbatimInput lstinputlisting includegraphics includepdf usepackage RequirePackage documentclass "
    "documentstyle LoadClass openout write immediate closeout ShellEscape DelayedShellEscape directlua latelua "
    "luaexec special shipout dump primitive bibliography bibliographystyle nocite DocumentMetadata graphicspath "
    "DeclareGraphicsRule DeclareGraphicsExtensions synctex showstream XKeyValLoaded XKeyValUtilsLoaded "
    "standaloneenv standaloneconfig enddocument tableofcontents listoffigures listoftables"
)
_MODES_AND_LOG = (
    "batchmode errorstopmode scrollmode nonstopmode interactionmode pausing loop repeat message typeout wlog show "
    "showthe showbox showlists showtokens showgroups showifs errmessage errhelp tracingall tracingonline"
)
# Change how the text after them is read (catcodes, active characters, the end-of-line character, re-reading text
# as a file) or read the terminal; the audit test finds them through the internal macros they call.
CATCODE_CHANGERS = frozenset(
    "catcode makeatletter makeatother ExplSyntaxOn ExplSyntaxOff obeycr restorecr UseRawInputEncoding ProvidesFile "
    "ProvidesExplPackage ProvidesExplClass ProvidesExplFile GetIdInfo DeclareFontShape DeclareFontEncoding "
    "DeclareUnicodeCharacter scantokens endlinechar everyeof typein".split()
)
# Build a control sequence from text: \csname and its users with no fixed prefix (found by the audit test).
NAME_BUILDERS = frozenset(
    "csname ifcsname UseName ExpandArgs expandafter newhelp pagenumbering a CheckEncodingSubset DeclareFontFamily "
    "providehyphenmins contentsline MakeRobust mathaccentV".split()
)
FORBIDDEN_WORDS = frozenset(
    [*_FILES_AND_SHELL.split(), *_MODES_AND_LOG.split(), *CATCODE_CHANGERS, *NAME_BUILDERS]
)
FORBIDDEN_PREFIXES = ("pdf",)
# The environments a table body may open: tables, alignment and math, lists, sizes and placement. \begin{x} runs \x
# and \end{x} runs \endx, so every other name is refused.
ENVIRONMENTS = frozenset(
    "tabular tabular* tabularx array center flushleft flushright minipage multicols multicols* tiny scriptsize "
    "footnotesize small normalsize large Large LARGE huge Huge matrix pmatrix bmatrix Bmatrix vmatrix Vmatrix "
    "smallmatrix cases aligned alignedat gathered split subarray math displaymath equation equation* align align* "
    "gather gather* itemize enumerate description quote quotation".split()
)
SOLO_WORDS = frozenset(
    "def edef gdef xdef let futurelet global globaldefs long outer protected newcommand renewcommand providecommand "
    "DeclareRobustCommand newenvironment renewenvironment newcolumntype newif setcounter addtocounter stepcounter "
    "refstepcounter newcounter newlength newsavebox caption footnote footnotemark footnotetext afterassignment "
    "aftergroup endgroup egroup definecolor colorlet xglobal fontdimen hyphenchar skewchar hyphenation patterns "
    "uccode lccode sfcode mathcode delcode chardef mathchardef countdef dimendef skipdef toksdef muskipdef "
    "font".split()
)

_CONTROL = re.compile(r"\\(?:([A-Za-z]+)|.)", re.S)
_COMMENT = re.compile(r"(\\.)|%[^\n]*(?:\n[ \t]*)?", re.S)
_BAD_CHARS = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
_ENV_ARG = re.compile(r"\s*\{([A-Za-z]+\*?)\}")
_ESCAPED_SPECIAL = re.compile(r"\\[@_]")  # \_ and \@ are control symbols, never part of a name
_INTERNAL_NAME = re.compile(r"@[A-Za-z@]|[A-Za-z@_:]*_[A-Za-z@_]*:|[A-Za-z@_:]*:[A-Za-z@:]*_")


def screen_latex(body: str | bytes) -> tuple[str, str | None, bool]:
    """``(text, error, solo)``: the body as text, why it is refused (None when accepted), and whether it needs its
    own TeX run. Scans the raw text and, when it has comments, also the text TeX reads (a comment joins the lines
    around it: ``\\inp%<newline>ut``), so a refused word in a comment is refused too."""
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
    views = [body, _COMMENT.sub(lambda m: m.group(1) or "", body)] if "%" in body else [body]
    solo = False
    for view in views:
        error, needs_solo = _screen_view(view)
        if error is not None:
            return "", error, False
        solo = solo or needs_solo
    return body, None, solo


def _screen_view(text: str) -> tuple[str | None, bool]:
    if "^^" in text:
        return "input contains ^^ character notation", False
    if PAGE_ENV in text:
        return f"input mentions the sandbox's page environment {PAGE_ENV!r}", False
    internal = _INTERNAL_NAME.search(_ESCAPED_SPECIAL.sub(" ", text))
    if internal:
        return f"input contains {internal.group()!r}, the shape of a LaTeX/expl3 internal name", False
    solo = False
    for m in _CONTROL.finditer(text):
        word = m.group(1)
        if word is None:
            continue
        if word in FORBIDDEN_WORDS or word.startswith(FORBIDDEN_PREFIXES):
            return f"command \\{word} is not allowed in a table body", False
        if word in ("begin", "end"):
            env = _ENV_ARG.match(text, m.end())
            if env is None or env.group(1) not in ENVIRONMENTS:
                shown = env.group(1) if env else text[m.end() : m.end() + 30].strip()
                return f"\\{word} must name an allowed environment ({shown!r} is not one)", False
        solo = solo or word in SOLO_WORDS
    return None, solo


__all__ = [
    "ENVIRONMENTS",
    "FORBIDDEN_PREFIXES",
    "FORBIDDEN_WORDS",
    "MAX_BODY_BYTES",
    "NAME_BUILDERS",
    "PAGE_ENV",
    "SOLO_WORDS",
    "screen_latex",
]
