import json
import string
import threading
from pathlib import Path

import pytest

from mmrl.rewards.general import (
    exact_match,
    format_think_answer,
    math_verify,
    mc_letter,
    overlong_penalty,
)
from mmrl.types import RewardInput

DATA = Path(__file__).resolve().parent / "data"


def _x(response, reference="", i=0, **metadata):
    return RewardInput(id=f"g{i}", response=response, reference=reference, metadata=metadata)


@pytest.mark.parametrize(
    "response, require_think, expected",
    [
        ("<think>a</think><answer>b</answer>", True, 1.0),
        ("  <think>\nstep 1\nstep 2\n</think>\n\n<answer> 42 </answer>\n", True, 1.0),
        ("<answer>42</answer>", True, 0.0),
        ("<answer>42</answer>", False, 1.0),
        ("<think>a</think><answer>b</answer> trailing words", True, 0.0),
        ("Sure! <think>a</think><answer>b</answer>", True, 0.0),
        ("<think>a</think><answer>b</answer><answer>c</answer>", True, 0.0),
        ("<think>a<think>b</think><answer>c</answer>", True, 0.0),
        ("<answer>b</answer><think>a</think>", True, 0.0),
    ],
)
def test_format_think_answer(response, require_think, expected):
    assert format_think_answer([_x(response)], require_think=require_think)[0].score == expected


def test_math_verify_cases():
    batch = [
        _x("<think>1/2 of it</think><answer>\\frac{1}{2}</answer>", "0.5", 0),
        _x("so it is \\boxed{1+x^2}", "x^2+1", 1),
        _x("<think>t</think><answer>3</answer>", "0.5", 2),
        _x("I get 0.50 in the end", "\\frac12", 3),
        _x("<think>t</think><answer>no idea</answer>", "2", 4),
    ]
    got = [(r.score, r.parts) for r in math_verify(batch)]
    assert got == [
        (1.0, {"format": 1.0, "correct": 1.0}),
        (1.0, {"format": 1.0, "correct": 1.0}),
        (0.0, {"format": 1.0, "correct": 0.0}),
        (1.0, {"format": 0.0, "correct": 1.0}),
        (0.0, {"format": 1.0, "correct": 0.0}),
    ]


def test_math_verify_outside_main_thread_and_bad_reference():
    out = []
    worker = threading.Thread(target=lambda: out.extend(math_verify([_x("<answer>\\sqrt{4}</answer>", "2")])))
    worker.start()
    worker.join()
    assert (
        out[0].score == 1.0
    )  # math-verify's signal timeouts would raise here; they are disabled off the main thread
    with pytest.raises(ValueError, match="sample 'g7': math-verify cannot parse the reference"):
        math_verify([_x("<answer>1</answer>", "", 7)])


@pytest.mark.parametrize(
    "response, expected_letter",
    [
        ("B", "B"),
        ("(C)", "C"),
        ("D.", "D"),
        ("Answer: B", "B"),
        ("The answer is (C) because it is larger.", "C"),
        ("the answer is b", "B"),
        ("<think>A or B?</think><answer>(A)</answer>", "A"),
        ("C. 45 degrees", "C"),
        ("I would pick (D) here", "D"),
    ],
)
def test_mc_letter_forms(response, expected_letter):
    choices = ["10 degrees", "30 degrees", "45 degrees", "90 degrees"]
    for letter in "ABCD":
        r = mc_letter([_x(response, letter, choices=choices)])[0]
        assert r.score == float(letter == expected_letter) and r.parts["format"] == 1.0


def test_mc_letter_option_text_and_lowercase_article():
    cats = ["dog", "cat"]
    assert mc_letter([_x("the answer is a cat", "B", choices=cats)])[0].score == 1.0  # "a" is an article here
    assert mc_letter([_x("<answer>cat</answer>", "cat", choices=cats)])[0].score == 1.0
    r = mc_letter([_x("no idea", "A", choices=cats)])[0]
    assert (r.score, r.parts) == (0.0, {"format": 0.0, "correct": 0.0})
    with pytest.raises(ValueError, match="sample 'g0': reference 'bird' is neither an option letter"):
        mc_letter([_x("A", "bird", choices=cats)])


def test_mc_letter_agrees_with_mathvista_scorer():
    """MathVista's scorer maps an extracted letter (or option text) to the option and compares it with the answer;
    on every multiple-choice record whose extraction is a letter or an option's text, mc_letter must agree."""
    path = DATA / "mathvista_scoring" / "output_llava_llama_2_13b.json"
    records = json.loads(path.read_text())
    rows = [
        (pid, r)
        for pid, r in records.items()
        if r["question_type"] == "multi_choice"
        and (
            r["extraction"].strip() in string.ascii_uppercase[: len(r["choices"])]
            or r["extraction"] in r["choices"]
        )
    ]
    assert len(rows) == 523
    batch = [_x(r["extraction"], r["answer"], pid, choices=r["choices"]) for pid, r in rows]
    ours = [bool(res.score) for res in mc_letter(batch)]
    assert ours == [r["true_false"] for _, r in rows]


def test_exact_match():
    batch = [
        _x("<think>x</think><answer>The Eiffel Tower!</answer>", "eiffel tower"),
        _x("<answer>Paris</answer>", ["Lyon", "paris"]),
        _x("<answer>Paris</answer>", "Paris, France"),
        _x("Paris", "paris"),
    ]
    assert [r.score for r in exact_match(batch)] == [1.0, 1.0, 0.0, 1.0]
    assert exact_match([_x("<answer>Paris</answer>", "paris")], extract_answer_tag=False)[0].score == 0.0


def test_no_reference_means_does_not_apply():
    no_ref = [_x("<answer>B</answer>", None)]
    assert [f(no_ref)[0].score for f in (exact_match, math_verify, mc_letter)] == [None, None, None]


def test_overlong_penalty():
    words = [_x(" ".join(["w"] * n), i=n) for n in (80, 90, 100, 130)]
    assert [r.score for r in overlong_penalty(words, max_length=100, buffer=20)] == [0.0, -0.5, -1.0, -1.0]
    tokens = [_x("short", response_tokens=95), _x("short", response_tokens=list(range(85)))]
    out = overlong_penalty(tokens, max_length=100, buffer=20)
    assert [(r.score, r.parts["length"]) for r in out] == [(-0.75, 95.0), (-0.25, 85.0)]
    with pytest.raises(ValueError, match="need 0 < buffer <= max_length"):
        overlong_penalty(words, max_length=10, buffer=20)
