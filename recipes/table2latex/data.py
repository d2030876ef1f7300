"""Synthetic LaTeX tables rendered by the project's sandbox: the table2latex recipe's data (docs/rewards.md#domain-rewards,
Table2LaTeX-RL).

Every table is drawn from a seeded RNG as a grid of cells with spans, and written twice from that one grid: as
a LaTeX ``tabular`` (the reference answer) and as an HTML table (what
:func:`mmrl.rewards.latex_table_html.latex_to_html` must read back from the LaTeX, so the structure reward can
be checked against an independent source). The image the model sees is the reference compiled by
:func:`mmrl.rewards.sandbox.render_latex` in the same fixed preamble and at the same dpi the ``latex_table``
reward renders responses with, so every reference is exact: the reference itself scores compile 1, TEDS-S 1
and CW-SSIM 1.

Difficulty levels (``LEVELS``), the knob of :func:`build`:

- 0: a 2x2 table of words and numbers, no header, no rules or only top/bottom rules;
- 1: 2-3 body rows by 2-3 columns, a header row, booktabs rules (or ``\\hline`` with ``|`` columns now and
  then);
- 2: 3-5 body rows by 3-5 columns, numbers in several formats (decimals, percentages, mean ± std, bold best
  value), a grouped header with ``\\multicolumn`` and ``\\cmidrule``;
- 3: 4-7 body rows by 4-6 columns, also row groups with ``\\multirow`` in the first column and header cells
  spanning both header rows;
- 4: 5-9 body rows by 5-7 columns, also section rows (one ``\\multicolumn`` across the table) and
  ``\\addlinespace``.

The tiny recipe (:func:`build_tiny`, the ``data.builder`` of ``tiny.yaml`` and ``sft.yaml``) draws from a
level of its own, :func:`make_tiny_table`: 2x2 to 3x3 tables of short words and numbers whose LaTeX is short
enough for the bundled tiny model, and adds a skewed ``sft.jsonl`` split for the warm start.

Rendering is batched: all tables of a split go to ONE :func:`render_latex` call, which packs up to 32 bodies
per TeX run on all cores (see :mod:`mmrl.rewards.sandbox`). Measured on the shared 2-core machine at 100 dpi:
``python -m mmrl.recipes.table2latex.data OUT --n-train 300 --n-eval 100`` builds 400 mixed-difficulty tables
at 102-113 tables/s end to end (PNG writing included), 52 tables/s at ``--difficulty 4``; the render call
alone does 170-320 tables/s against 10.7 with one TeX run per table (``batch_size=1``, same 200 tables, same
process).
"""

from __future__ import annotations

import argparse
import html as html_lib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from mmrl.rewards.sandbox import render_latex

# The prompt template of every record (generated or converted): the image, then what to write. It asks for the
# bare ``tabular`` because the reward compiles the answer inside its own fixed preamble (a ``table`` float or a
# ``\\documentclass`` does not compile there); a fenced ```latex block or <answer> tags are read too.
PROMPT = (
    "<image>Convert this table to LaTeX: write one tabular environment with its rows, columns and cell text."
)


@dataclass(frozen=True)
class Level:
    rows: tuple[int, int]  # body rows, inclusive range
    cols: tuple[int, int]
    header: bool  # a header row of column names
    groups: bool  # a grouped header row above it (\multicolumn + \cmidrule)
    row_groups: bool  # \multirow row groups in the first column
    sections: bool  # full-width \multicolumn section rows in the body


LEVELS = {
    0: Level((2, 2), (2, 2), header=False, groups=False, row_groups=False, sections=False),
    1: Level((2, 3), (2, 3), header=True, groups=False, row_groups=False, sections=False),
    2: Level((3, 5), (3, 5), header=True, groups=True, row_groups=False, sections=False),
    3: Level((4, 7), (4, 6), header=True, groups=True, row_groups=True, sections=False),
    4: Level((5, 9), (5, 7), header=True, groups=True, row_groups=True, sections=True),
}

METHODS = (
    "Baseline",
    "Ours",
    "CNN",
    "LSTM",
    "BERT",
    "ViT",
    "ResNet",
    "Random",
    "Oracle",
    "Linear",
    "Ensemble",
    "Transformer",
    "Median",
    "Kalman",
    "SVM",
    "Boosting",
    "Prior work",
    "Full model",
    "No pretraining",
)
GROUPS = (
    "Train",
    "Test",
    "Validation",
    "Dataset A",
    "Dataset B",
    "Clean",
    "Noisy",
    "Small",
    "Large",
    "Zero-shot",
    "Few-shot",
    "English",
    "German",
    "Day",
    "Night",
    "Indoor",
    "Outdoor",
)
METRICS = (
    "Acc",
    "F1",
    "Recall",
    "Precision",
    "BLEU",
    "Time",
    "Loss",
    "AUC",
    "Error",
    "Params",
    "Score",
    "Mean",
    "Std",
    "Top-1",
    "Top-5",
    "Count",
    "Ratio",
)
FAMILIES = ("Supervised", "Unsupervised", "Classical", "Neural", "Group 1", "Group 2", "Control", "Treatment")
WORDS = ("yes", "no", "high", "low", "none", "male", "female", "stable", "n/a", "fast", "slow", "open")


@dataclass
class Cell:
    """One cell as written: its LaTeX, the visible text :func:`latex_to_html` reads from it, and its spans."""

    latex: str
    text: str
    colspan: int = 1
    rowspan: int = 1


@dataclass
class Table:
    """A grid of rows; ``None`` marks a slot covered by a span from above (written as an empty LaTeX cell, or
    as ``\\multicolumn{k}{c}{}`` under a multi-column span, and left out of the HTML)."""

    spec: str
    rows: list[list[Cell | None]]
    n_cols: int
    header_rows: int
    difficulty: int
    rules_before: dict[int, list[str]] = field(default_factory=dict)  # row index -> rule lines above it
    closing: list[str] = field(default_factory=list)  # rule lines after the last row

    @property
    def spans(self) -> int:
        return sum(1 for row in self.rows for c in row if c is not None and (c.colspan > 1 or c.rowspan > 1))

    def latex(self) -> str:
        lines = [f"\\begin{{tabular}}{{{self.spec}}}"]
        covered_width: dict[tuple[int, int], int] = {}
        for r, row in enumerate(self.rows):
            lines += self.rules_before.get(r, [])
            cells, col = [], 0
            for cell in row:
                if cell is None:
                    width = covered_width.get((r, col), 1)
                    cells.append(f"\\multicolumn{{{width}}}{{c}}{{}}" if width > 1 else "")
                    col += width
                    continue
                body = cell.latex
                if cell.rowspan > 1:
                    body = f"\\multirow{{{cell.rowspan}}}{{*}}{{{body}}}"
                    covered_width.update({(r + k, col): cell.colspan for k in range(1, cell.rowspan)})
                if cell.colspan > 1:
                    align = "l" if col == 0 else "c"
                    body = f"\\multicolumn{{{cell.colspan}}}{{{align}}}{{{body}}}"
                cells.append(body)
                col += cell.colspan
            lines.append(" & ".join(cells) + r" \\")
        lines += self.closing
        lines.append(r"\end{tabular}")
        return "\n".join(lines)

    def html(self) -> str:
        def tr(row: list[Cell | None]) -> str:
            tds = []
            for c in row:
                if c is None:
                    continue
                attrs = f' colspan="{c.colspan}"' if c.colspan > 1 else ""
                attrs += f' rowspan="{c.rowspan}"' if c.rowspan > 1 else ""
                tds.append(f"<td{attrs}>{html_lib.escape(c.text, quote=False)}</td>")
            return "<tr>" + "".join(tds) + "</tr>"

        head = "".join(tr(r) for r in self.rows[: self.header_rows])
        body = "".join(tr(r) for r in self.rows[self.header_rows :])
        return "<table>" + (f"<thead>{head}</thead>" if head else "") + f"<tbody>{body}</tbody></table>"


def _number_format(rng: random.Random, difficulty: int) -> str:
    kinds = ["int", "dec1", "dec2"] + (["pct", "pm", "neg"] if difficulty >= 2 else [])
    return rng.choice(kinds)


def _value(rng: random.Random, fmt: str) -> Cell:
    x = rng.uniform(0, 100)
    if fmt == "int":
        s = str(rng.randint(0, 2000))
        return Cell(s, s)
    if fmt == "dec1":
        return Cell(f"{x:.1f}", f"{x:.1f}")
    if fmt == "dec2":
        return Cell(f"{x / 100:.2f}", f"{x / 100:.2f}")
    if fmt == "pct":
        return Cell(f"{x:.1f}\\%", f"{x:.1f}%")
    if fmt == "pm":
        sd = rng.uniform(0.1, 5)
        return Cell(f"${x:.1f} \\pm {sd:.1f}$", f"{x:.1f} \u00b1 {sd:.1f}")
    y = rng.uniform(-5, 5)
    if y < 0:  # a real minus sign in the image, read back as "-"
        return Cell(f"$-${-y:.2f}", f"-{-y:.2f}")
    return Cell(f"{y:.2f}", f"{y:.2f}")


def _body_cell(rng: random.Random, fmt: str, difficulty: int) -> Cell:
    roll = rng.random()
    if difficulty >= 1 and roll < 0.05:
        return Cell("--", "\u2013")
    if fmt == "word" or (difficulty == 0 and roll < 0.3):
        w = rng.choice(WORDS)
        return Cell(w, w)
    return _value(rng, fmt)


def _pick(rng: random.Random, pool: Sequence[str], n: int) -> list[str]:
    return rng.sample(list(pool), n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]


def _partition(rng: random.Random, n: int) -> list[int]:
    """Split ``n`` value columns into consecutive groups of 1-3 (at least one group of 2+ when n >= 2)."""
    while True:
        sizes, left = [], n
        while left:
            sizes.append(rng.randint(1, min(3, left)))
            left -= sizes[-1]
        if n < 2 or max(sizes) > 1:
            return sizes


def make_table(rng: random.Random, difficulty: int) -> Table:
    """One random table at ``difficulty`` (a key of :data:`LEVELS`)."""
    if difficulty not in LEVELS:
        raise ValueError(f"difficulty {difficulty!r} is not one of {sorted(LEVELS)}")
    lv = LEVELS[difficulty]
    n_body, n_cols = rng.randint(*lv.rows), rng.randint(*lv.cols)
    row_groups = lv.row_groups and rng.random() < 0.7 and n_body >= 4 and n_cols >= 3
    label_cols = 2 if row_groups else 1
    n_values = n_cols - label_cols
    formats = [_number_format(rng, difficulty) if rng.random() > 0.15 else "word" for _ in range(n_values)]
    rows: list[list[Cell | None]] = []
    rules: dict[int, list[str]] = {}

    grouped = lv.groups and n_values >= 2 and rng.random() < 0.75
    names = _pick(rng, METRICS, n_values)
    if grouped:
        sizes = _partition(rng, n_values)
        tall = difficulty >= 3 and rng.random() < 0.5  # label headers span both header rows
        top: list[Cell | None] = [Cell("Method", "Method", rowspan=2 if tall else 1)]
        if row_groups:
            top.insert(0, Cell("Family", "Family", rowspan=2 if tall else 1))
        second: list[Cell | None] = [None] * label_cols if tall else [Cell("", "") for _ in range(label_cols)]
        col, cmids = label_cols, []
        for size, name in zip(sizes, _pick(rng, GROUPS, len(sizes))):
            top.append(Cell(name, name, colspan=size))
            if size > 1:
                cmids.append(f"\\cmidrule(lr){{{col + 1}-{col + size}}}")
            col += size
        second += [Cell(n, n) for n in names]
        rows += [top, second]
        rules[1] = [" ".join(cmids)] if cmids else []
    elif lv.header:
        head = [Cell(n, n) for n in (["Family", "Method"] if row_groups else ["Method"]) + names]
        if rng.random() < 0.3:
            head = [Cell(f"\\textbf{{{c.latex}}}", c.text) for c in head]
        rows.append(head)
    header_rows = len(rows)

    body: list[list[Cell | None]] = []
    methods = iter(_pick(rng, METHODS, n_body))
    families = iter(_pick(rng, FAMILIES, n_body))
    section_rows: list[int] = []
    group_starts: list[int] = []
    while len(body) < n_body:
        if lv.sections and body and rng.random() < 0.2 and len(body) + 2 <= n_body:
            name = rng.choice(GROUPS)
            section_rows.append(len(body))
            body.append([Cell(f"\\textit{{{name}}}", name, colspan=n_cols)])
            continue
        size = min(rng.randint(2, 3), n_body - len(body)) if row_groups else 1
        group_starts.append(len(body))
        for k in range(size):
            label = next(methods, None) or rng.choice(METHODS)
            row: list[Cell | None] = [Cell(label, label)]
            if row_groups:
                fam = next(families, None) or rng.choice(FAMILIES)
                row.insert(
                    0, Cell(fam, fam, rowspan=size) if k == 0 and size > 1 else None if k else Cell(fam, fam)
                )
            row += [_body_cell(rng, f, difficulty) for f in formats]
            body.append(row)
    if difficulty >= 2 and formats and rng.random() < 0.5:  # bold the best value of a numeric column
        j = label_cols + rng.randrange(n_values)
        numeric = [r for r in body if len(r) > j and r[j] is not None and r[j].text[:1].isdigit()]
        if numeric:
            best = max(numeric, key=lambda r: float(r[j].text.split()[0].rstrip("%")))
            cell = best[j]
            best[j] = Cell(f"\\textbf{{{cell.latex}}}", cell.text)
    rows += body

    boxed = difficulty >= 1 and not row_groups and not grouped and rng.random() < 0.25
    if boxed:
        spec = "|" + "|".join("l" if c == 0 else rng.choice("cr") for c in range(n_cols)) + "|"
        rules[0] = [r"\hline"]
        if header_rows:
            rules.setdefault(header_rows, []).append(r"\hline")
        return Table(spec, rows, n_cols, header_rows, difficulty, rules, [r"\hline"])
    spec = "l" * label_cols + "".join(rng.choice("cr") for _ in range(n_values))
    if difficulty == 0 and rng.random() < 0.5:
        return Table(spec, rows, n_cols, header_rows, difficulty)
    rules[0] = [r"\toprule"]
    if header_rows:
        rules.setdefault(header_rows, []).append(r"\midrule")
    for s in section_rows:  # never the first body row: a section needs rows above it
        rules.setdefault(header_rows + s, []).append(r"\midrule")
    if row_groups:
        separator = r"\addlinespace" if difficulty >= 4 else f"\\cmidrule(lr){{1-{n_cols}}}"
        for s in group_starts[1:]:
            if s - 1 not in section_rows and s not in section_rows:
                rules.setdefault(header_rows + s, []).append(separator)
    return Table(spec, rows, n_cols, header_rows, difficulty, rules, [r"\bottomrule"])


TINY_SHAPES = ((2, 2), (2, 3), (3, 2), (3, 3))  # (rows, columns); the first is the sft split's majority
TINY_LABELS = tuple(m for m in METHODS if len(m) <= 6)
TINY_WORDS = tuple(w for w in WORDS if len(w) <= 4 and w.isalpha())


def make_tiny_table(rng: random.Random) -> Table:
    """A table the bundled tiny model can learn to write (the tiny recipe): 2-3 rows by 2-3 columns
    (:data:`TINY_SHAPES`), no header, a short name in the first column, then short words, integers below 100 or
    one-decimal numbers below 10; top and bottom rules half the time. Its LaTeX is 25-55 tokens of the tiny
    model's tokenizer."""
    n_rows, n_cols = rng.choice(TINY_SHAPES)
    rows: list[list[Cell | None]] = []
    for label in _pick(rng, TINY_LABELS, n_rows):
        row: list[Cell | None] = [Cell(label, label)]
        for _ in range(n_cols - 1):
            roll = rng.random()
            if roll < 0.3:
                text = rng.choice(TINY_WORDS)
            elif roll < 0.65:
                text = str(rng.randint(0, 99))
            else:
                text = f"{rng.uniform(0, 10):.1f}"
            row.append(Cell(text, text))
        rows.append(row)
    spec = "l" + "".join(rng.choice("cr") for _ in range(n_cols - 1))
    if rng.random() < 0.5:
        return Table(spec, rows, n_cols, 0, 0)
    return Table(spec, rows, n_cols, 0, 0, {0: [r"\toprule"]}, [r"\bottomrule"])


def _levels(difficulty: int | tuple[int, int]) -> list[int]:
    lo, hi = (difficulty, difficulty) if isinstance(difficulty, int) else difficulty
    if lo not in LEVELS or hi not in LEVELS or lo > hi:
        raise ValueError(f"difficulty must be a level or a (low, high) range of levels in {sorted(LEVELS)}")
    return list(range(lo, hi + 1))


def render_tables(latex: list[str], *, dpi: float, timeout_s: float, names: list[str]) -> list[np.ndarray]:
    """Grayscale renders of ``latex`` in one batched sandbox call; a table that does not render is a generator
    bug and raises naming it."""
    out = []
    for name, body, res in zip(names, latex, render_latex(latex, dpi=dpi, timeout_s=timeout_s)):
        if not res.ok or res.image is None:
            raise RuntimeError(f"table {name!r} did not render ({res.error}):\n{body}")
        out.append(res.image)
    return out


def to_png(image: np.ndarray) -> Image.Image:
    """A float grayscale render in [0, 1] as an 8-bit grayscale PIL image."""
    return Image.fromarray((np.clip(image, 0.0, 1.0) * 255).round().astype(np.uint8), mode="L")


def _draw(
    rng: random.Random, n: int, make: Callable[[random.Random], Table], seen: set[str], what: str
) -> list[Table]:
    """``n`` tables from ``make`` whose LaTeX is not in ``seen`` (which grows), so splits never share a table."""
    tables: list[Table] = []
    attempts = 0
    while len(tables) < n:
        attempts += 1
        if attempts > 50 * n + 100:
            raise ValueError(f"{what}: cannot draw {n} distinct tables; ask for fewer")
        table = make(rng)
        text = table.latex()
        if text not in seen:
            seen.add(text)
            tables.append(table)
    return tables


def _write_split(root: Path, split: str, tables: list[Table], *, dpi: float, timeout_s: float) -> Path:
    """Render ``tables`` in one sandbox call and write ``<split>.jsonl`` and its images (atomically)."""
    ids = [f"t2l-{split}-{i:05d}" for i in range(len(tables))]
    latex = [t.latex() for t in tables]
    images = render_tables(latex, dpi=dpi, timeout_s=timeout_s, names=ids) if tables else []
    lines = []
    for rid, table, text, image in zip(ids, tables, latex, images):
        rel = f"images/{rid}.png"
        to_png(image).save(root / rel, optimize=True)
        meta = {
            "rows": len(table.rows),
            "cols": table.n_cols,
            "shape": f"{len(table.rows)}x{table.n_cols}",
            "difficulty": table.difficulty,
            "spans": table.spans,
        }
        lines.append(
            json.dumps({"id": rid, "prompt": PROMPT, "images": [rel], "answer": text, "metadata": meta})
        )
    path = root / f"{split}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.replace(path)
    return path


def build(
    folder: str | Path,
    *,
    n_train: int = 400,
    n_eval: int = 100,
    seed: int = 0,
    difficulty: int | tuple[int, int] = (0, 4),
    dpi: float = 100,
    timeout_s: float = 30.0,
) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``eval.jsonl`` (records in the README's data format) and ``images/``.

    ``difficulty`` is one level of :data:`LEVELS` or an inclusive ``(low, high)`` range; levels are drawn
    uniformly per table. The same ``seed`` writes the same files. Eval tables whose LaTeX also occurs in train
    are redrawn, so the held-out split is really held out (2x2 tables repeat otherwise).
    """
    root = Path(folder)
    (root / "images").mkdir(parents=True, exist_ok=True)
    levels = _levels(difficulty)
    seen: set[str] = set()
    paths = {}
    for split, n, s in (("train", n_train, seed), ("eval", n_eval, seed + 1_000_003)):
        tables = _draw(
            random.Random(s), n, lambda r: make_table(r, r.choice(levels)), seen, f"{split} at {difficulty}"
        )
        paths[split] = _write_split(root, split, tables, dpi=dpi, timeout_s=timeout_s)
    return paths


def build_tiny(
    folder: str | Path,
    *,
    n_train: int = 512,
    n_eval: int = 64,
    n_sft: int = 1024,
    sft_keep_other: float = 0.25,
    seed: int = 0,
    dpi: float = 150,
    timeout_s: float = 30.0,
) -> dict[str, Path]:
    """The tiny recipe's data: ``train.jsonl`` (RL prompts), ``eval.jsonl`` (held out), ``sft.jsonl`` (the warm
    start's records) and ``images/``, all drawn by :func:`make_tiny_table` and pairwise disjoint.

    ``train`` and ``eval`` draw the four shapes of :data:`TINY_SHAPES` uniformly. ``sft`` keeps a table that
    is not 2x2 with probability ``sft_keep_other``, so about 57% of its tables are 2x2 (25% in the RL and
    held-out splits) at 0.25: a warm start trained on it leans towards two rows and two columns, and RL on
    the balanced prompts has to teach it to count rows and columns in the image.

    Images are rendered at 150 dpi (the ``latex_table`` reward still compares renders at its own dpi): a 2x2
    table is then about 160x60 pixels, a 3x3 one 240x90, which the tiny recipe's ``model.max_pixels`` keeps at
    their size (12-30 image tokens), so the image's size itself tells the rows and columns apart.
    """
    root = Path(folder)
    (root / "images").mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    paths = {}

    def skewed(rng: random.Random) -> Table:
        while True:
            table = make_tiny_table(rng)
            if (len(table.rows), table.n_cols) == TINY_SHAPES[0] or rng.random() < sft_keep_other:
                return table

    splits = (
        ("train", n_train, seed, make_tiny_table),
        ("eval", n_eval, seed + 1_000_003, make_tiny_table),
        ("sft", n_sft, seed + 2_000_029, skewed),
    )
    for split, n, s, make in splits:
        tables = _draw(random.Random(s), n, make, seen, f"tiny {split}")
        paths[split] = _write_split(root, split, tables, dpi=dpi, timeout_s=timeout_s)
    return paths


def main(argv: list[str] | None = None) -> None:
    """``python -m mmrl.recipes.table2latex.data OUT``: build a dataset and print how fast it went."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--n-train", type=int, default=400)
    p.add_argument("--n-eval", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--difficulty", type=int, nargs="+", default=[0, 4], help="a level, or LOW HIGH")
    p.add_argument("--dpi", type=float, default=100)
    a = p.parse_args(argv)
    difficulty = a.difficulty[0] if len(a.difficulty) == 1 else (a.difficulty[0], a.difficulty[1])
    t0 = time.perf_counter()
    paths = build(a.out, n_train=a.n_train, n_eval=a.n_eval, seed=a.seed, difficulty=difficulty, dpi=a.dpi)
    dt = time.perf_counter() - t0
    n = a.n_train + a.n_eval
    print(f"{n} tables in {dt:.1f} s: {n / dt:.1f} tables/s -> {', '.join(str(p) for p in paths.values())}")


if __name__ == "__main__":
    main()
