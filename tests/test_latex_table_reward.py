"""The latex_table reward (Table2LaTeX-RL, docs/rewards.md#domain-rewards) on real renders, and the plain HTML teds reward.

Exact values are written out where they do not depend on glyph rasterisation (compile, teds_s, acc, form, the
score, CW-SSIM of identical renders). ``visual`` of two DIFFERENT renders depends on the fonts and the rasteriser
(TeX Live, cm-super, PDFium versions), so those are checked against ranges chosen with a wide margin from the
0.6 threshold the binary scheme uses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mmrl.rewards import landlock
from mmrl.rewards.base import REWARDS, call_reward, validate_options
from mmrl.rewards.latex_table import (
    extract_block,
    latex_table,
    teds_reward,
    visual_similarities,
    visual_similarity,
)
from mmrl.rewards.latex_table_html import latex_to_html
from mmrl.rewards.sandbox import ALLOW_UNCONFINED_ENV, render_latex
from mmrl.rewards.ssim import haar_ssim
from mmrl.types import RewardInput

pytestmark = pytest.mark.tex
PUBTABNET = Path(__file__).resolve().parent / "data" / "pubtabnet"

REF = r"""\begin{tabular}{lcc}
\toprule
Method & Acc & F1 \\
\midrule
Baseline & 71.2 & 68.4 \\
Ours & \textbf{75.9} & \textbf{73.1} \\
\bottomrule
\end{tabular}"""
NEAR_MISS = REF.replace("68.4", "68.9")
EXTRA_COLUMN = r"""\begin{tabular}{lccc}
\toprule
Method & Acc & F1 & Training time (hours) \\
\midrule
Baseline & 71.2 & 68.4 & 12.5 \\
Ours & \textbf{75.9} & \textbf{73.1} & 14.0 \\
\bottomrule
\end{tabular}"""
TRUNCATED = REF[: REF.index("Baseline")]
UNDEFINED_COMMAND = REF.replace(r"\textbf{75.9}", r"\textbff{75.9}")
FENCED = f"Sure! Here is the table:\n\n```latex\n{REF}\n```\n\nLet me know if you need anything else."


@pytest.fixture(scope="module", autouse=True)
def _needs_tex():
    if shutil.which("pdflatex") is None:
        pytest.fail("pdflatex is not installed: run bash scripts/setup.sh (TeX Live is part of the set-up)")


@pytest.fixture(autouse=True)
def _render_without_landlock_where_the_kernel_has_none(monkeypatch):
    # These tests are about scores, not confinement (test_sandbox_security.py covers both modes): on a kernel
    # without Landlock they opt into unconfined rendering instead of being refused.
    if landlock.kernel_abi() == 0:
        monkeypatch.setenv(ALLOW_UNCONFINED_ENV, "1")


def _score(responses: dict[str, str], **options) -> dict:
    batch = [RewardInput(id=k, response=v, reference=REF) for k, v in responses.items()]
    return dict(zip(responses, latex_table(batch, **options)))


def test_binary_scheme_on_real_cases():
    r = _score(
        {
            "exact": REF,
            "near": NEAR_MISS,
            "extra_column": EXTRA_COLUMN,
            "truncated": TRUNCATED,
            "undefined": UNDEFINED_COMMAND,
            "fenced": FENCED,
            "empty": "",
        }
    )
    exact = r["exact"]
    assert exact.score == 2.0 and exact.error is None
    assert exact.parts == {
        "compile": 1.0,
        "teds_s": 1.0,
        "visual": pytest.approx(1.0, abs=1e-12),
        "acc": 1.0,
        "form": 1.0,
    }

    near = r["near"]  # one cell's text differs: the structure is identical, the render nearly so
    assert near.parts["compile"] == 1.0 and near.parts["teds_s"] == 1.0
    assert 0.95 < near.parts["visual"] < 1.0
    assert (near.parts["acc"], near.parts["form"], near.score) == (1.0, 1.0, 2.0)

    # Response tree below <table>: thead, tbody, 3 tr, 12 td = 17 elements; deleting the 3 extra td gives the
    # reference, so TEDS-S = 1 - 3/17. The wider render scores far below the 0.6 visual threshold.
    extra = r["extra_column"]
    assert extra.parts["compile"] == 1.0
    assert extra.parts["teds_s"] == pytest.approx(1 - 3 / 17, abs=1e-12)
    assert 0.25 < extra.parts["visual"] < 0.55
    assert (extra.parts["acc"], extra.parts["form"], extra.score) == (0.0, 0.0, 0.0)

    assert r["truncated"].parts == {"compile": 0.0, "teds_s": 0.0, "visual": 0.0, "acc": 0.0, "form": 0.0}
    assert r["truncated"].score == 0.0
    # The paper's form term ignores compilation: right structure, failed compile -> form 1, acc 0.
    assert r["undefined"].parts == {"compile": 0.0, "teds_s": 1.0, "visual": 0.0, "acc": 0.0, "form": 1.0}
    assert r["undefined"].score == 1.0

    assert r["fenced"].parts == exact.parts and r["fenced"].score == 2.0
    assert r["empty"].parts == {"compile": 0.0, "teds_s": 0.0, "visual": 0.0, "acc": 0.0, "form": 0.0}


def test_continuous_scheme():
    r = _score(
        {"exact": REF, "near": NEAR_MISS, "extra": EXTRA_COLUMN, "undefined": UNDEFINED_COMMAND},
        scheme="continuous",
    )
    assert r["exact"].score == pytest.approx(1.0, abs=1e-12)
    assert set(r["exact"].parts) == {"compile", "teds_s", "visual"}
    near = r["near"]
    assert near.score == pytest.approx(0.5 * 1.0 + 0.5 * near.parts["visual"])
    extra = r["extra"]
    assert extra.score == pytest.approx(0.5 * (1 - 3 / 17) + 0.5 * extra.parts["visual"])
    assert r["undefined"].score == 0.0  # compile gates everything in this scheme


def test_haar_ssim_option_uses_the_authors_metric():
    r = _score({"exact": REF, "near": NEAR_MISS}, visual="haar_ssim")
    image = render_latex([REF])[0].image
    assert r["exact"].parts["visual"] == pytest.approx(haar_ssim(image, image), abs=1e-12)
    assert (
        r["exact"].parts["visual"] > 1.0
    )  # their covariance uses ddof=1: identical images score n / (n - 1)
    assert r["exact"].score == 2.0
    assert 0.9 < r["near"].parts["visual"] < 1.0


def test_batching_does_not_change_any_result():
    responses = {
        "exact": REF,
        "near": NEAR_MISS,
        "extra": EXTRA_COLUMN,
        "bad": UNDEFINED_COMMAND,
        "trunc": TRUNCATED,
    }
    together = _score(responses)
    for name, response in responses.items():
        alone = _score({name: response})[name]
        assert alone.score == together[name].score
        assert alone.parts == pytest.approx(together[name].parts, abs=1e-12)


def test_visual_similarities_of_a_group_equal_the_pairwise_values():
    """One reference's pyramid serves the whole group; resizing, white padding and the identity shortcut apply
    to each response as they do alone."""
    ref = render_latex([REF])[0].image
    near, extra = (r.image for r in render_latex([NEAR_MISS, EXTRA_COLUMN]))
    preds = [near, extra, ref, ref[:, : ref.shape[1] // 2]]  # same size, wider (shrunk), identical, narrower
    for metric in ("cw_ssim", "haar_ssim"):
        group = visual_similarities(preds, ref, metric)
        assert group == [visual_similarity(p, ref, metric) for p in preds]
    assert group[2] > 1.0  # haar_ssim of identical images: n / (n - 1)
    assert visual_similarities(preds, ref, "cw_ssim")[2] == 1.0
    tiny = np.ones((10, 40), np.float32)
    tiny[4:6, 5:35] = 0.0  # a 10-pixel-high render is padded with white to 16 pixels
    assert 0.0 < visual_similarities([np.roll(tiny, 2, axis=1)], tiny, "cw_ssim")[0] < 1.0
    with pytest.raises(ValueError, match="unknown visual metric"):
        visual_similarities(preds, ref, "ssim")


def test_duplicate_responses_in_a_batch_get_the_same_result():
    batch = [
        RewardInput(id=str(i), response=r, reference=REF) for i, r in enumerate([NEAR_MISS, REF, NEAR_MISS])
    ]
    a, b, c = latex_table(batch)
    assert a.parts == c.parts and a.score == c.score == 2.0 and b.score == 2.0


def test_html_reference_scores_structure_against_the_html():
    html_ref = latex_to_html(REF)
    batch = [
        RewardInput(id="h1", response=REF, reference=html_ref, metadata={"reference_format": "html"}),
        RewardInput(
            id="h2", response=EXTRA_COLUMN, reference=html_ref, metadata={"reference_format": "html"}
        ),
    ]
    same, extra = latex_table(batch)
    assert same.parts["compile"] == 1.0 and same.parts["teds_s"] == 1.0
    # the visual reference is html_to_latex(html_ref) rendered: booktabs rules, no bold, so close but not identical
    assert 0.6 < same.parts["visual"] < 1.0
    assert extra.parts["teds_s"] == pytest.approx(1 - 3 / 17, abs=1e-12)


def test_bad_references_are_errors_naming_the_sample():
    batch = [
        RewardInput(id="no-table", response=REF, reference="just text"),
        RewardInput(id="not-compiling", response=REF, reference=UNDEFINED_COMMAND),
        RewardInput(id="fmt", response=REF, reference=REF, metadata={"reference_format": "markdown"}),
        RewardInput(id="fine", response=REF, reference=REF),
    ]
    results = call_reward(latex_table, "latex_table", batch, {})
    for item, res in zip(batch[:3], results[:3]):
        assert res.score == 0.0 and item.id in res.error
    assert "does not render" in results[1].error
    assert results[3].score == 2.0 and results[3].error is None


def test_registration_and_options():
    spec = REWARDS.get("latex_table")
    assert spec.heavy and spec.fn is latex_table
    validate_options(spec, {"scheme": "continuous", "visual": "haar_ssim", "dpi": 150, "timeout_s": 5.0})
    with pytest.raises(ValueError, match="scheme"):
        validate_options(spec, {"scheme": "dense"})
    assert REWARDS.get("teds").fn is teds_reward


def test_extract_block():
    assert extract_block(f"<think>hmm</think><answer>{REF}</answer>", ("latex",)) == REF
    assert extract_block(FENCED, ("latex", "tex")) == REF
    two = f"```python\nprint(1)\n```\nthen\n```tex\n{REF}\n```"
    assert extract_block(two, ("latex", "tex")) == REF
    assert extract_block(f"```latex\n{REF}", ("latex",)) == REF  # truncated generation: no closing fence
    assert extract_block(f"  {REF}\n", ("latex",)) == REF


def test_teds_reward_on_html():
    true = "<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table>"
    wrong_text = true.replace(">d<", ">x<")
    batch = [
        RewardInput(id="same", response=f"```html\n{true}\n```", reference=true),
        RewardInput(id="text", response=wrong_text, reference=true),
        RewardInput(id="none", response="I cannot read this table.", reference=true),
    ]
    full = teds_reward(batch)
    structure = teds_reward(batch, structure_only=True)
    assert [r.score for r in full] == [1.0, pytest.approx(1 - 1 / 6), 0.0]  # one of 6 nodes renamed at cost 1
    assert [r.score for r in structure] == [1.0, 1.0, 0.0]


def test_teds_reward_reproduces_pubtabnet_reference_scores():
    gt = json.loads((PUBTABNET / "sample_gt.json").read_text())
    pred = json.loads((PUBTABNET / "sample_pred.json").read_text())
    expected = json.loads((PUBTABNET / "expected_teds.json").read_text())
    names = sorted(expected)
    batch = [RewardInput(id=n, response=pred[n], reference=gt[n]["html"]) for n in names]
    for structure_only, key in ((False, "teds"), (True, "teds_structure")):
        scores = [r.score for r in teds_reward(batch, structure_only=structure_only)]
        assert scores == pytest.approx([expected[n][key] for n in names], abs=1e-6)


def test_render_dir_keeps_renders_for_a_person(tmp_path):
    from PIL import Image

    table = r"\begin{tabular}{|c|c|}\hline a & b \\ \hline 1 & 2 \\ \hline\end{tabular}"
    meta = {"render_dir": str(tmp_path / "renders")}
    good = RewardInput("tbl/1", table, table, metadata=meta)
    bad = RewardInput("tbl-2", r"\begin{tabular}{cc} a & \undefinedmacro \end{tabular}", table, metadata=meta)
    results = latex_table([good, bad])
    assert results[0].parts["compile"] == 1.0 and results[1].parts["compile"] == 0.0
    out = tmp_path / "renders"
    resp, ref = Image.open(out / "tbl_1-response.png"), Image.open(out / "tbl_1-reference.png")
    assert resp.mode == "L" and resp.size == ref.size and min(resp.getdata()) < 128  # ink on white
    assert (out / "tbl-2-response.error.txt").read_text().strip()
    assert not (out / "tbl-2-response.png").exists()


OVERFLOW_CELLS = {
    "multicolumn_inf": r"\multicolumn{inf}{c}{x}",
    "multicolumn_huge": r"\multicolumn{99999999999}{c}{x}",
    "multicolumn_exponent": r"\multicolumn{1e9}{c}{x}",  # TeX reads 1 and typesets "e9": compiles, unparsable
    "multicolumn_5000_digits": r"\multicolumn{" + "9" * 5000 + "}{c}{x}",
    "multicolumn_nan": r"\multicolumn{nan}{c}{x}",
    "multirow_negative_overflow": r"\multirow{-1e309}{*}{x}",
    "multirow_overflow": r"\multirow{1e309}{*}{x}",
    "multirow_past_int32": r"\multirow{2147483648}{*}{x}",
}
OVERFLOW_ROWS = {
    "newline_1e9pt": r"a \\[1e9pt] b",
    "newline_huge_pt": r"a \\[99999999999pt] b",
    "newline_max_dimen": r"a \\[16383.99999pt] b",
    "rule_past_the_page_limit": r"\rule{1pt}{16000pt}",
}


def test_overflowing_numbers_score_zero_without_an_exception():
    """Spans and lengths past every limit: the reward's own verdict (no error from a caught exception), 0."""
    responses = {
        k: rf"\begin{{tabular}}{{cc}}{v} & y \\ a & b\end{{tabular}}" for k, v in OVERFLOW_CELLS.items()
    }
    responses.update({k: rf"\begin{{tabular}}{{c}}{v}\end{{tabular}}" for k, v in OVERFLOW_ROWS.items()})
    results = _score(responses, timeout_s=5.0)
    for name, res in results.items():
        assert res.error is None, (name, res.error)
        assert res.score == 0.0 and res.parts["acc"] == 0.0 and res.parts["form"] == 0.0, name
        assert res.parts["compile"] == (1.0 if name == "multicolumn_exponent" else 0.0), name
    for name in OVERFLOW_CELLS:  # the structure cannot be read: teds_s is 0, not an exception's 0
        assert results[name].parts["teds_s"] == 0.0, name


def test_without_landlock_and_without_the_opt_in_every_sample_scores_zero_naming_it(monkeypatch):
    monkeypatch.setenv(landlock.DISABLE_ENV, "1")
    monkeypatch.delenv(ALLOW_UNCONFINED_ENV, raising=False)
    batch = [RewardInput(id=str(i), response=r, reference=REF) for i, r in enumerate([REF, NEAR_MISS])]
    results = call_reward(latex_table, "latex_table", batch, {})
    assert [r.score for r in results] == [0.0, 0.0]
    assert all("refusing to render" in r.error and f"{ALLOW_UNCONFINED_ENV}=1" in r.error for r in results)
    monkeypatch.setenv(ALLOW_UNCONFINED_ENV, "1")  # the opt-in: rendered, scored as with Landlock
    assert [r.score for r in call_reward(latex_table, "latex_table", batch, {})] == [2.0, 2.0]
