"""TEDS: conformance with IBM's PubTabNet numbers, hand-computed cases, and agreement with apted on random tables."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from apted import APTED
from lxml import html
from table_recognition_metric import TEDS
from table_recognition_metric.utils import CustomConfig

from mmrl.rewards.teds import teds

DATA = Path(__file__).resolve().parent / "data" / "pubtabnet"


def _pubtabnet() -> tuple[dict, dict, dict]:
    load = lambda name: json.loads((DATA / name).read_text(encoding="utf-8"))  # noqa: E731
    return load("sample_pred.json"), load("sample_gt.json"), load("expected_teds.json")


@pytest.mark.parametrize("structure_only", [False, True], ids=["full", "structure"])
def test_pubtabnet_conformance(structure_only: bool) -> None:
    pred, true, expected = _pubtabnet()
    key = "teds_structure" if structure_only else "teds"
    assert len(true) == 20
    errors = {}
    for name, record in true.items():
        errors[name] = abs(
            teds(pred[name], record["html"], structure_only=structure_only) - expected[name][key]
        )
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-6, f"{worst}: off by {errors[worst]:.3g}"
    mean = sum(expected[n][key] for n in true) / len(true)
    assert mean == pytest.approx(0.93610 if structure_only else 0.89968, abs=1e-5)


def _table(rows: list[str], wrap: bool = True) -> str:
    body = "<table>" + "".join(f"<tr>{r}</tr>" for r in rows) + "</table>"
    return f"<html><body>{body}</body></html>" if wrap else body


REF = _table(["<td>a</td><td>b</td>", "<td>c</td><td>d</td>"])  # 2 tr + 4 td = 6 elements below <table>


@pytest.mark.parametrize("structure_only", [False, True])
def test_identical_is_one(structure_only: bool) -> None:
    assert teds(REF, REF, structure_only=structure_only) == 1.0


@pytest.mark.parametrize("structure_only", [False, True])
def test_extra_column_costs_two_insertions(structure_only: bool) -> None:
    pred = _table(["<td>a</td><td>b</td><td>e</td>", "<td>c</td><td>d</td><td>f</td>"])
    assert teds(pred, REF, structure_only=structure_only) == pytest.approx(1 - 2 / 8)


def test_colspan_change_costs_rename_and_delete() -> None:
    pred = _table(['<td colspan="2">a</td>', "<td>c</td><td>d</td>"])
    assert teds(pred, REF, structure_only=True) == pytest.approx(1 - 2 / 6)


def test_cell_text_is_normalised_levenshtein() -> None:
    ref = _table(["<td>abc</td><td>b</td>"])
    pred = _table(["<td>abd</td><td>b</td>"])
    assert teds(pred, ref) == pytest.approx(1 - (1 / 3) / 3)
    assert teds(pred, ref, structure_only=True) == 1.0
    bold = _table(["<td><b>abc</b></td><td>b</td>"])  # tokens <b> a b c </b> vs a b c: 2 edits of 5
    assert teds(bold, ref) == pytest.approx(1 - (2 / 5) / 4)  # IBM counts the <b> element in the normaliser


def test_empty_or_tableless_prediction_scores_zero() -> None:
    assert teds("", REF) == 0.0
    assert teds("   ", REF) == 0.0
    assert teds("<html><body><p>no table</p></body></html>", REF) == 0.0
    assert teds("I cannot read this table.", REF) == 0.0


def test_bare_table_fragment_is_accepted() -> None:
    pred = _table(["<td>a</td><td>x</td>", "<td>c</td><td>d</td>"], wrap=False)
    wrapped = _table(["<td>a</td><td>x</td>", "<td>c</td><td>d</td>"])
    assert teds(pred, REF) == teds(wrapped, REF) == pytest.approx(1 - 1 / 6)


def test_reference_without_table_raises() -> None:
    with pytest.raises(ValueError, match="reference HTML has no <table>"):
        teds(REF, "<p>oops</p>")


Cell = tuple[str, str, str]  # (tag, attributes, inner HTML)
WORDS = ["", "1", "a", "ab", "1.5", "x y", "<b>7</b>", "<i>z</i>q", "\u00b1"]


def _random_cell(rng: random.Random) -> Cell:
    attrs = ""
    if rng.random() < 0.2:
        attrs += f' colspan="{rng.randint(2, 3)}"'
    if rng.random() < 0.15:
        attrs += f' rowspan="{rng.randint(2, 3)}"'
    return ("th" if rng.random() < 0.15 else "td", attrs, rng.choice(WORDS))


def _random_table(rng: random.Random) -> dict[str, list[list[Cell]]]:
    """A small random table: optional thead, tbody or bare rows; th cells keep inline markup as tree nodes."""
    rows = lambda n: [[_random_cell(rng) for _ in range(rng.randint(1, 4))] for _ in range(n)]  # noqa: E731
    table = {"thead": rows(rng.randint(1, 2))} if rng.random() < 0.5 else {}
    table["tbody" if rng.random() < 0.7 else "rows"] = rows(rng.randint(0, 4))
    return table


def _mutate(table: dict[str, list[list[Cell]]], rng: random.Random) -> dict[str, list[list[Cell]]]:
    """Drop, insert, respan or retype a few cells, or drop a row."""
    out = {k: [list(r) for r in rows] for k, rows in table.items()}
    for _ in range(rng.randint(1, 3)):
        rows = [r for part in out.values() for r in part]
        if not rows:
            break
        row = rng.choice(rows)
        op = rng.randrange(5)
        if op == 0 and row:
            row.pop(rng.randrange(len(row)))
        elif op == 1:
            row.insert(rng.randint(0, len(row)), _random_cell(rng))
        elif op == 2 and row:
            k = rng.randrange(len(row))
            row[k] = (row[k][0], ' colspan="2"', row[k][2])
        elif op == 3 and row:
            k = rng.randrange(len(row))
            row[k] = (row[k][0], row[k][1], rng.choice(WORDS))
        else:
            part = rng.choice([p for p in out.values()])
            if part:
                part.pop(rng.randrange(len(part)))
    return out


def _render(table: dict[str, list[list[Cell]]]) -> str:
    def rows(part: list[list[Cell]]) -> str:
        return "".join("<tr>" + "".join(f"<{t}{a}>{x}</{t}>" for t, a, x in r) + "</tr>" for r in part)

    inner = "".join(
        rows(part) if key == "rows" else f"<{key}>{rows(part)}</{key}>" for key, part in table.items()
    )
    return f"<html><body><table>{inner}</table></body></html>"


def _apted_teds(pred: str, true: str, structure_only: bool) -> float:
    """IBM's metric: peer's tree building and rename config, apted distance, IBM's ``.//*`` normaliser."""
    metric = TEDS(structure_only=structure_only)
    parser = html.HTMLParser(remove_comments=True, encoding="utf-8")
    tables = [html.fromstring(s, parser=parser).xpath("body/table")[0] for s in (pred, true)]
    trees = [metric.load_html_tree(t) for t in tables]
    distance = APTED(trees[0], trees[1], CustomConfig()).compute_edit_distance()
    n_nodes = max(len(t.xpath(".//*")) for t in tables)
    return 1.0 - distance / n_nodes if n_nodes else 1.0


@pytest.mark.parametrize("structure_only", [False, True], ids=["full", "structure"])
def test_agrees_with_apted_on_random_tables(structure_only: bool) -> None:
    rng = random.Random(1234)
    for case in range(30):
        table = _random_table(rng)
        true, pred = _render(table), _render(_random_table(rng) if case % 3 == 0 else _mutate(table, rng))
        ours = teds(pred, true, structure_only=structure_only)
        ref = _apted_teds(pred, true, structure_only)
        assert ours == pytest.approx(ref, abs=1e-9), f"case {case}:\n{pred}\n{true}"
