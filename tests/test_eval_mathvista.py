"""MathVista scoring against the reference scorer's own output (tests/data/mathvista_scoring, CC BY-SA 4.0).

The output file holds, for each of the 1,000 testmini records, a model's ``response``, the GPT-4 ``extraction`` and
what lupantech/MathVista's ``calculate_score.py`` made of it: the normalised ``prediction`` and ``true_false``.
"""

import json
from pathlib import Path

import pytest

from mmrl.eval.base import get_benchmark
from mmrl.eval.mathvista import build_query, normalize
from mmrl.eval.scoring import read_predictions, score_rows

DATA = Path(__file__).parent / "data" / "mathvista_scoring"
TESTMINI = DATA / "testmini.json"
OUTPUT = DATA / "output_llava_llama_2_13b.json"

# Every record where our normalised answer differs from the file's ``prediction``, with the reason. The file was
# written by an earlier calculate_score.py that parsed integer answers with ``int(x)``, so a decimal extraction
# became None there; the current scorer (and this one) uses ``int(float(x))``. true_false is False either way,
# because neither value equals the answer.
PREDICTION_DISAGREEMENTS = {
    "246": (
        "0.0034",
        "0",
        None,
        "int('0.0034') fails in the older scorer; int(float(.)) gives '0' (answer 13)",
    ),
    "835": (
        "66.67",
        "66",
        None,
        "int('66.67') fails in the older scorer; int(float(.)) gives '66' (answer 0)",
    ),
    "983": (
        "99.99",
        "99",
        None,
        "int('99.99') fails in the older scorer; int(float(.)) gives '99' (answer 8)",
    ),
    "987": ("3553.25", "3553", None, "int('3553.25') fails in the older scorer; gives '3553' (answer 4232)"),
}
# Records whose true_false we do not reproduce, with the reason: none.
TRUE_FALSE_DISAGREEMENTS: dict[str, str] = {}


@pytest.fixture(scope="module")
def scored():
    bench = get_benchmark("mathvista")
    bench.check_media = False  # the fixture has no images; scoring a prediction file does not need them
    items = bench.load(TESTMINI).items
    responses, given = read_predictions(OUTPUT, bench, items)
    return score_rows(bench, items, responses, given), json.loads(OUTPUT.read_text())


def test_conformance_true_false_and_prediction(scored):
    rows, reference = scored
    assert len(rows) == 1000
    tf = {r["id"] for r in rows if r["correct"] != reference[r["id"]]["true_false"]}
    assert set(tf) == set(TRUE_FALSE_DISAGREEMENTS)
    agreement = 1 - len(tf) / len(rows)
    assert agreement >= 0.995
    diffs = {
        r["id"]: (r["extracted"], r["normalized"], reference[r["id"]]["prediction"])
        for r in rows
        if r["normalized"] != reference[r["id"]]["prediction"]
    }
    assert diffs == {pid: v[:3] for pid, v in PREDICTION_DISAGREEMENTS.items()}
    assert sum(r["correct"] for r in rows) == 261  # the file's true_false count


def test_cli_scores_the_reference_output_format(tmp_path, capsys):
    from mmrl.cli import main

    out = tmp_path / "mv"
    rc = main(["eval", "--benchmark", "mathvista", "--data", str(TESTMINI), "--predictions", str(OUTPUT),
               "--output-dir", str(out), "--no-progress"])  # fmt: skip
    assert rc == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["accuracy"] == pytest.approx(0.261)
    assert metrics["items"] == 1000 and metrics["model"] is None
    by_type = metrics["breakdowns"]["question_type"]
    assert by_type["multi_choice"]["n"] == 540 and by_type["free_form"]["n"] == 460
    skills = metrics["breakdowns"]["skills"]  # a list field: an item counts under each of its skills
    assert sum(g["n"] for g in skills.values()) > 1000
    assert "mathvista: accuracy 0.2610 on 1000 items" in capsys.readouterr().out
    assert (out / "metrics.md").read_text().count("## by ") == len(metrics["breakdowns"])
    assert {p.name for p in out.glob("*.png")} >= {"summary.png", "accuracy_by_question_type.png"}


def test_normalisation_follows_the_reference_scorer():
    choices = ["Yes", "No"]
    assert normalize("B", choices, "multi_choice", "text", None) == "No"
    assert normalize("(a) Yes it is", choices, "multi_choice", "text", None) == "Yes"
    assert normalize("Nope", choices, "multi_choice", "text", None) == "No"  # nearest by edit distance
    assert normalize("", ["abc", "de", "fg"], "multi_choice", "text", None) == "de"  # shortest, first on ties
    assert normalize("F", choices, "multi_choice", "text", None) == "No"  # out-of-range letter: nearest text
    assert normalize("3.7", None, "free_form", "integer", None) == "3"
    assert normalize("1,000", None, "free_form", "integer", None) is None
    assert normalize("51.038", None, "free_form", "float", 2) == "51.04"
    assert normalize("1.25", None, "free_form", "float", 1) == "1.2"  # Python rounds half to even
    assert normalize([1, 2], None, "free_form", "list", None) == "[1, 2]"


def test_rule_extraction():
    bench = get_benchmark("mathvista")
    bench.check_media = False
    items = {it.id: it for it in bench.load(TESTMINI).items}
    mc, integer, flt, lst = (
        items["3"],
        items["2"],
        items["1"],
        items["225"],
    )  # choices 135°..150°; 1000; 1.2; list
    assert bench.extract(mc, "145°") == "145°"
    assert bench.extract(mc, "The angle is 145°, so the answer is (C).") == "C"
    assert bench.judge(mc, bench.extract(mc, "<answer>C</answer>")).correct
    assert bench.extract(integer, "1000") == "1000"
    assert bench.extract(integer, "It holds 1,000 ml in total. The answer is 1000.") == "1000"
    assert bench.judge(flt, bench.extract(flt, "d = 1.22 m, so \\boxed{1.2}")).correct
    assert bench.extract(flt, "") == ""
    assert bench.extract(lst, "The chain code is [0, 2, 0, 2, 1, 7, 1, 2, 0, 3, 0, 6].") == str(
        [0, 2, 0, 2, 1, 7, 1, 2, 0, 3, 0, 6]
    )
    assert bench.judge(lst, bench.extract(lst, "[0, 2, 0, 2, 1, 7, 1, 2, 0, 3, 0, 6]")).correct


def test_query_is_the_released_one():
    """Built queries equal the output file's (the released prompts) except in the options block of 10 records,
    where the file shows the options in another order or as they were before a dataset revision."""
    records = json.loads(TESTMINI.read_text())
    released = json.loads(OUTPUT.read_text())
    differ = [pid for pid, rec in records.items() if build_query(rec) != released[pid]["query"]]
    assert len(differ) == 10
    for pid in differ:
        ours, theirs = build_query(records[pid]), released[pid]["query"]
        assert records[pid]["question_type"] == "multi_choice"
        assert ours.split("\nChoices:\n")[0] == theirs.split("\nChoices:\n")[0]
