"""Throughput of the ``latex_table`` reward against a naive pipeline, side by side in one process.

Candidates (64): the 20 predictions of a real table-recognition model from ``tests/data/pubtabnet`` (HTML turned
into LaTeX with ``html_to_latex``; reference = the ground truth, also converted) and 44 variants of 11 hand-written
arXiv-style tables (multirow, multicolumn, booktabs, ``\\hline`` grids, ``makecell``, math, ``\\small``): a near miss,
a structural change, a restyled copy, and a broken one (undefined command, missing brace, truncated output, a stray
``&``), some wrapped in markdown fences with prose.

mmrl: ``latex_table(batch)`` with default options (binary scheme, CW-SSIM, 100 dpi; as many TeX runs at once as
usable CPUs, at most 4: 2 here), caches emptied first, so the references are rendered inside the timed call.
Naive, as a competent user would write it: a 2-process pool (``concurrent.futures.ProcessPoolExecutor``, made once
outside the timing, like a reward server's pool) renders each unique reference once, then scores the candidates,
one task per candidate: one ``pdflatex`` run of the full preamble and one ``pdftoppm`` run per table, then the same
metrics and formula (``latex_table._structure``, ``visual_similarity``). Both are timed best of ``--repeats``; the
time spent in TeX + rasterising (summed over the pool's workers on the naive side) is printed too, and how many
scores agree. Last line: ``tables/s: mmrl X naive Y ratio Z``.

Run: ``OMP_NUM_THREADS=1 python benchmarks/latex_reward.py`` (about a minute on the 2-core CI machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import tempfile
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from itertools import repeat
from pathlib import Path

import numpy as np
from PIL import Image

from mmrl.rewards import latex_table as lt
from mmrl.rewards.latex_table_html import html_to_latex
from mmrl.rewards.sandbox import PREAMBLE, format_dir, render_latex
from mmrl.types import RewardInput

PUBTABNET = Path(__file__).resolve().parents[1] / "tests" / "data" / "pubtabnet"

TABLES = [
    r"""\begin{tabular}{lcc}
\toprule
Method & Acc & F1 \\
\midrule
Baseline & 71.2 & 68.4 \\
Ours & \textbf{75.9} & \textbf{73.1} \\
\bottomrule
\end{tabular}""",
    r"""\begin{tabular}{|l|c|c|c|}
\hline
\multirow{2}{*}{Model} & \multicolumn{3}{c|}{Dataset} \\
\cline{2-4}
 & CIFAR-10 & CIFAR-100 & ImageNet \\
\hline
ResNet-18 & 94.2 & 75.6 & 69.8 \\
ResNet-50 & 95.1 & 78.3 & 76.1 \\
ViT-B/16 & 98.1 & 87.1 & 81.8 \\
\hline
\end{tabular}""",
    r"""\begin{tabular}{llrrr}
\toprule
\multirow{3}{*}{Task} & \multirow{3}{*}{Metric} & \multicolumn{3}{c}{Model size} \\
\cmidrule(lr){3-5}
 & & 1B & 7B & 70B \\
 & & (params) & (params) & (params) \\
\midrule
QA & EM & 41.3 & 55.0 & 68.2 \\
 & F1 & 52.7 & 64.9 & 77.5 \\
Summ. & ROUGE-L & 30.1 & 35.8 & 41.0 \\
\bottomrule
\end{tabular}""",
    r"""\small
\begin{tabular}{lcccc}
\hline
Variable & Mean & SD & Min & Max \\
\hline
Age (years) & 54.3 & 12.1 & 18 & 89 \\
BMI (kg/m$^2$) & 27.8 & 4.9 & 16.2 & 45.1 \\
Systolic BP & 131 & 18 & 92 & 201 \\
HbA1c (\%) & 6.1 & 1.2 & 4.3 & 12.8 \\
\hline
\end{tabular}""",
    r"""\begin{tabular}{c|ccc}
$n$ & $\alpha=0.1$ & $\alpha=0.5$ & $\alpha=0.9$ \\
\hline
10 & $1.2\times10^{-3}$ & $4.5\times10^{-2}$ & $0.31$ \\
100 & $3.4\times10^{-4}$ & $1.1\times10^{-2}$ & $0.12$ \\
1000 & $8.9\times10^{-5}$ & $2.0\times10^{-3}$ & $0.05$ \\
\end{tabular}""",
    r"""\begin{tabular}{lll}
\toprule
Symbol & Meaning & Unit \\
\midrule
$\rho$ & density & kg\,m$^{-3}$ \\
$\mu$ & dynamic viscosity & Pa\,s \\
$\nu$ & kinematic viscosity & m$^2$\,s$^{-1}$ \\
$\kappa$ & thermal conductivity & W\,m$^{-1}$\,K$^{-1}$ \\
\bottomrule
\end{tabular}""",
    r"""\begin{tabular}{|c|c|c|c|c|c|}
\hline
\multicolumn{2}{|c|}{Setting} & \multicolumn{2}{c|}{Train} & \multicolumn{2}{c|}{Test} \\
\hline
Split & Seed & Loss & Acc & Loss & Acc \\
\hline
A & 1 & 0.21 & 93.1 & 0.34 & 89.7 \\
A & 2 & 0.19 & 93.8 & 0.33 & 90.2 \\
B & 1 & 0.25 & 91.4 & 0.41 & 87.9 \\
\hline
\end{tabular}""",
    r"""\begin{tabular}{lcc}
\toprule
 & \makecell{Zero-shot\\accuracy} & \makecell{Few-shot\\accuracy} \\
\midrule
GPT-2 & 12.4 & 18.9 \\
GPT-3 & 38.2 & 51.7 \\
\textit{Ours} & \textbf{44.6} & \textbf{58.3} \\
\bottomrule
\end{tabular}""",
    r"""\begin{tabular}{rl}
\hline
Year & Event \\
\hline
1998 & Founded in Berlin \\
2004 & Opened office in Paris \\
2011 & Acquired by Example Corp. \\
2019 & 1,000 employees \\
\hline
\end{tabular}""",
    r"""\footnotesize
\begin{tabular}{lcccccc}
\toprule
\multirow{2}{*}{Method} & \multicolumn{3}{c}{Easy} & \multicolumn{3}{c}{Hard} \\
\cmidrule(lr){2-4}\cmidrule(lr){5-7}
 & P & R & F & P & R & F \\
\midrule
CRF & 81.2 & 79.5 & 80.3 & 60.1 & 55.4 & 57.7 \\
BiLSTM & 85.7 & 84.1 & 84.9 & 66.3 & 61.2 & 63.6 \\
BERT & 91.0 & 90.4 & 90.7 & 74.8 & 70.9 & 72.8 \\
\bottomrule
\end{tabular}""",
    r"""\begin{tabular}{l|r@{.}l}
Item & \multicolumn{2}{c}{Price (\$)} \\
\hline
Coffee & 3&50 \\
Tea & 2&75 \\
Cake & 4&25 \\
\end{tabular}""",
]


def _variants(table: str, k: int) -> list[str]:
    """A near miss, a structural change, a restyled copy and a broken copy of ``table``."""
    rng = random.Random(k)
    digits = [i for i, ch in enumerate(table) if ch.isdigit()]
    i = rng.choice(digits)
    near = table[:i] + str((int(table[i]) + 1) % 10) + table[i + 1 :]
    lines = table.split("\n")
    rows = [n for n, line in enumerate(lines) if line.rstrip().endswith("\\\\") and "&" in line]
    structure = "\n".join(lines[: rows[-1]] + lines[rows[-1] + 1 :])  # one row fewer
    restyled = (
        table.replace(r"\toprule", r"\hline")
        .replace(r"\midrule", r"\hline")
        .replace(r"\bottomrule", r"\hline")
        if r"\toprule" in table
        else table.replace(r"\hline", r"\midrule", 1)
    )
    broken = [
        table.replace("\\\\\n", "\\\\ \\undefinedmacro\n", 1),
        table.replace("}", "", 1),
        table[: len(table) // 2],
        table.replace(" & ", " & & ", 1),
    ][k % 4]
    fenced = f"Here is the LaTeX code for the table:\n```latex\n{near}\n```\nIt reproduces the image."
    return [fenced if k % 3 == 0 else near, structure, restyled, broken]


def build_batch() -> list[RewardInput]:
    batch = []
    gt = json.loads((PUBTABNET / "sample_gt.json").read_text())
    pred = json.loads((PUBTABNET / "sample_pred.json").read_text())
    for name in sorted(gt):
        ref = html_to_latex(gt[name]["html"])
        batch.append(RewardInput(id=name, response=html_to_latex(pred[name]), reference=ref))
    for k, table in enumerate(TABLES):
        for j, cand in enumerate(_variants(table, k)):
            batch.append(RewardInput(id=f"t{k}-{j}", response=cand, reference=table))
    return batch


def _naive_render(body: str, dpi: int, timeout_s: float, *, with_format: bool = False) -> np.ndarray | None:
    """pdflatex + pdftoppm for one table; ``with_format`` loads the sandbox's precompiled preamble instead."""
    with tempfile.TemporaryDirectory() as tmp:
        flags = ["-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape"]
        env = None
        if with_format:
            doc = f"\\begin{{document}}\\begin{{mmrlpage}}{body}%\n\\end{{mmrlpage}}\\end{{document}}\n"
            flags.append("-fmt=mmrlfmt")
            env = {**os.environ, "TEXFORMATS": f"{format_dir()}:"}
        else:
            doc = (
                PREAMBLE.replace(",multi=mmrlpage", "") + "\\begin{document}\n" + body + "\n\\end{document}\n"
            )
        Path(tmp, "t.tex").write_text(doc, encoding="utf-8")
        try:
            subprocess.run(
                ["pdflatex", *flags, "t.tex"], cwd=tmp, env=env, timeout=timeout_s, capture_output=True
            )
        except subprocess.TimeoutExpired:
            return None
        if not Path(tmp, "t.pdf").exists():
            return None
        args = ["pdftoppm", "-r", str(dpi), "-gray", "-singlefile", "t.pdf", "page"]
        subprocess.run(args, cwd=tmp, capture_output=True, timeout=timeout_s)
        with Image.open(Path(tmp, "page.pgm")) as im:
            return np.asarray(im, dtype=np.float32) / 255.0


def _timed_render(body: str, dpi: int, timeout_s: float) -> tuple[np.ndarray | None, float]:
    """A reference's render and the seconds its pdflatex + pdftoppm took (one pool task)."""
    t0 = time.perf_counter()
    image = _naive_render(body, dpi, timeout_s)
    return image, time.perf_counter() - t0


def _naive_score(
    item: RewardInput, ref_image: np.ndarray | None, visual: str, dpi: int, timeout_s: float
) -> tuple[float, float]:
    """One candidate's score and the seconds its pdflatex + pdftoppm took (one pool task)."""
    pred = lt.extract_block(item.response, ("latex", "tex"))
    t0 = time.perf_counter()
    image = _naive_render(pred, dpi, timeout_s) if pred.strip() else None
    t_tex = time.perf_counter() - t0
    compiled = image is not None
    teds_s = lt._structure(pred, lt._reference(item)[1])
    vis = lt.visual_similarity(image, ref_image, visual) if compiled else 0.0
    acc = 0.0 if teds_s < 0.3 or not compiled else float(vis > 0.6)
    return acc + float(teds_s > 0.9), t_tex


def naive_reward(
    batch: list[RewardInput], visual: str, pool: Executor, dpi: int = 100, timeout_s: float = 10.0
) -> tuple[list[float], float]:
    """Scores and the pdflatex + pdftoppm seconds summed over the pool's workers."""
    refs = list(dict.fromkeys(x.reference for x in batch))
    rendered = dict(zip(refs, pool.map(_timed_render, refs, repeat(dpi), repeat(timeout_s))))
    ref_images = [rendered[x.reference][0] for x in batch]
    scored = list(pool.map(_naive_score, batch, ref_images, repeat(visual), repeat(dpi), repeat(timeout_s)))
    t_tex = sum(s for _, s in rendered.values()) + sum(s for _, s in scored)
    return [score for score, _ in scored], t_tex


def mmrl_reward(batch: list[RewardInput], visual: str) -> list[float]:
    lt._REF_RENDERS.clear()
    lt._REF_HTML.clear()
    return [r.score for r in lt.latex_table(batch, visual=visual)]


def sandbox_only(batch: list[RewardInput]) -> None:
    """What the mmrl reward renders (distinct responses and references), without the metrics."""
    preds = [lt.extract_block(x.response, ("latex", "tex")) for x in batch]
    render_latex(list(dict.fromkeys([*preds, *(x.reference for x in batch)])))


def ablation(batch: list[RewardInput], repeats: int) -> None:
    """Rendering alone (no metrics), adding the sandbox's speed tricks one at a time."""
    preds = [lt.extract_block(x.response, ("latex", "tex")) for x in batch]
    texts = list(dict.fromkeys([*preds, *(x.reference for x in batch)]))
    steps = [
        ("naive: full preamble, pdftoppm, 1 table/run", lambda: [_naive_render(t, 100, 10.0) for t in texts]),
        ("(a) precompiled format", lambda: [_naive_render(t, 100, 10.0, with_format=True) for t in texts]),
        ("(a)+(c) sandbox, PDFium in-process", lambda: render_latex(texts, batch_size=1, workers=1)),
        ("(a)+(b)+(c) 32 tables per run", lambda: render_latex(texts, batch_size=32, workers=1)),
        ("(a)+(b)+(c)+(d) 2 runs at once", lambda: render_latex(texts, batch_size=32, workers=2)),
    ]
    for name, fn in steps:
        seconds, _ = best_of(fn, repeats)
        print(f"  {name:45s} {seconds:6.2f} s  {len(texts) / seconds:7.1f} renders/s")


def best_of(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - t0
        if elapsed < best:
            best, out = elapsed, result
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--visual", choices=["cw_ssim", "haar_ssim"], default="cw_ssim")
    parser.add_argument("--ablation", action="store_true", help="also time each rendering trick on its own")
    args = parser.parse_args()
    batch = build_batch()
    lt.latex_table(batch[:2])  # builds the format file once per machine; not part of the measurement
    _naive_render(TABLES[0], 100, 10.0)

    if args.ablation:
        ablation(batch, args.repeats)
    t_mmrl, s_mmrl = best_of(lambda: mmrl_reward(batch, args.visual), args.repeats)
    tex_mmrl, _ = best_of(lambda: sandbox_only(batch), args.repeats)
    with ProcessPoolExecutor(max_workers=2) as pool:
        list(pool.map(_naive_render, [TABLES[0]] * 2, repeat(100), repeat(10.0)))  # start both workers
        t_naive, (s_naive, tex_naive) = best_of(
            lambda: naive_reward(batch, visual=args.visual, pool=pool), args.repeats
        )

    agree = sum(a == b for a, b in zip(s_mmrl, s_naive))
    compiled = sum(r.parts.get("compile", 0) for r in lt.latex_table(batch))
    print(f"candidates: {len(batch)} ({int(compiled)} compile), scores agree on {agree}/{len(batch)}")
    print(f"mmrl : {t_mmrl:.2f} s total, sandbox alone {tex_mmrl:.2f} s")
    print(f"naive: {t_naive:.2f} s total (2 processes), pdflatex+pdftoppm {tex_naive:.2f} s summed over both")
    print(f"mean score: mmrl {np.mean(s_mmrl):.3f} naive {np.mean(s_naive):.3f}")
    n = len(batch)
    print(f"tables/s: mmrl {n / t_mmrl:.2f} naive {n / t_naive:.2f} ratio {t_naive / t_mmrl:.2f}")


if __name__ == "__main__":
    main()
