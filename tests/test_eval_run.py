"""``mmrl eval`` / ``mmrl compare`` end to end: the bundled tiny model on each benchmark's fixture
(tests/data/eval, built by its make_fixtures.py), resume after a kill, --limit, --samples, --predictions, and the
one-line errors."""

import hashlib
import json
from pathlib import Path

import pytest

from mmrl.cli import main
from mmrl.eval import load_benchmark
from mmrl.eval.scoring import item_score
from mmrl.rollout.hf import HFEngine

REPO = Path(__file__).resolve().parents[1]
EVAL = REPO / "tests" / "data" / "eval"
MATHVISTA = REPO / "tests" / "data" / "mathvista_scoring"
TINY = str(REPO / "assets" / "tiny-qwen2.5-vl")
FIXTURES = {
    "mathvista": EVAL / "mathvista" / "testmini.json",
    "mathv": EVAL / "mathv" / "testmini.jsonl",
    "screenspot": EVAL / "screenspot",
    "table": EVAL / "table" / "PubTabNet_examples.jsonl",
    "pathvqa": EVAL / "pathvqa" / "test.parquet",
    "videoqa": EVAL / "videoqa",
}
MODEL = ["--model", TINY, "--no-progress", "max_new_tokens=6", "device=cpu", "max_pixels=50176"]


def _eval(name: str, out: Path, *extra: str) -> int:
    return main(
        ["eval", "--benchmark", name, "--data", str(FIXTURES[name]), "--output-dir", str(out), *extra]
    )


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


@pytest.fixture
def generated(monkeypatch):
    """The ids of the items the engine is asked to generate for."""
    seen: list[str] = []
    original = HFEngine.generate

    def spy(self, prompts, params):
        seen.extend(p.sample_id for p in prompts)
        return original(self, prompts, params)

    monkeypatch.setattr(HFEngine, "generate", spy)
    return seen


@pytest.mark.parametrize(
    "name",
    ["mathvista", "mathv", "screenspot", pytest.param("table", marks=pytest.mark.tex), "pathvqa", "videoqa"],
)
def test_end_to_end_on_fixture(name, tmp_path, capsys, generated):
    out = tmp_path / name
    assert _eval(name, out, *MODEL) == 0
    items = load_benchmark(name, FIXTURES[name])
    rows = _rows(out)
    assert [r["id"] for r in rows] == [it.id for it in items] == generated
    for row, item in zip(rows, items):
        assert isinstance(row["prediction"], str) and row["finish_reason"] in ("stop", "length")
        assert "extracted" in row and isinstance(row["correct"], (bool, float))
        assert all(row[k] == v for k, v in item.fields.items() if v is not None)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["benchmark"] == name and metrics["model"] == TINY and metrics["items"] == len(items)
    assert metrics["accuracy"] == pytest.approx(sum(item_score(r) for r in rows) / len(rows))
    files = sorted(FIXTURES[name].glob("*.json")) if FIXTURES[name].is_dir() else [FIXTURES[name]]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + f.read_bytes())
    assert metrics["data"]["sha256"] == digest.hexdigest()
    assert metrics["settings"]["generation"]["temperature"] == 0.0  # greedy by default
    assert metrics["throughput"]["items"] == len(items) and metrics["throughput"]["items_per_s"] > 0
    assert (out / "metrics.md").read_text().startswith(f"# {name}: {TINY}")
    assert (out / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert f"{name}: accuracy {metrics['accuracy']:.4f} on {len(items)} items" in capsys.readouterr().out


def test_resume_after_kill_regenerates_only_the_missing_items(tmp_path, generated):
    out = tmp_path / "mv"
    assert _eval("mathvista", out, *MODEL, "--batch-size", "2") == 0
    full = (out / "predictions.jsonl").read_text().splitlines(keepends=True)
    ids = [json.loads(line)["id"] for line in full]
    # killed while writing the 4th line: three whole lines and half of the fourth are on disk
    (out / "predictions.jsonl").write_text("".join(full[:3]) + full[3][: len(full[3]) // 2])
    (out / "metrics.json").unlink()
    generated.clear()
    assert _eval("mathvista", out, *MODEL, "--batch-size", "2") == 0
    assert generated == ids[3:]  # the three complete rows were not generated again
    assert (out / "predictions.jsonl").read_text().splitlines(keepends=True) == full  # greedy: same rows
    assert json.loads((out / "metrics.json").read_text())["throughput"]["items"] == 3
    generated.clear()
    assert _eval("mathvista", out, *MODEL, "--batch-size", "2") == 0
    assert generated == []


def test_limit_then_extend(tmp_path, generated):
    out = tmp_path / "lim"
    assert _eval("mathvista", out, *MODEL, "--limit", "2") == 0
    assert len(_rows(out)) == 2 and json.loads((out / "metrics.json").read_text())["items"] == 2
    first = list(generated)
    assert _eval("mathvista", out, *MODEL, "--limit", "4") == 0
    items = [it.id for it in load_benchmark("mathvista", FIXTURES["mathvista"])]
    assert first == items[:2] and generated == items[:4]
    assert json.loads((out / "metrics.json").read_text())["items"] == 4


def test_samples_give_pass_at_k(tmp_path):
    out = tmp_path / "k"
    assert _eval("mathvista", out, *MODEL, "--samples", "3") == 0
    rows = _rows(out)
    assert all(len(r["prediction"]) == len(r["correct"]) == len(r["normalized"]) == 3 for r in rows)
    assert any(len(set(r["prediction"])) > 1 for r in rows)  # sampled, not greedy copies
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["settings"]["generation"]["temperature"] == 1.0  # the default for K > 1
    pk = metrics["pass@k"]
    assert list(pk) == ["pass@1", "pass@2", "pass@3"]
    assert pk["pass@1"] == pytest.approx(metrics["accuracy"]) and metrics["mean@3"] == metrics["accuracy"]
    assert pk["pass@1"] <= pk["pass@2"] <= pk["pass@3"]
    assert pk["pass@3"] == pytest.approx(sum(any(r["correct"]) for r in rows) / len(rows))


def test_own_predictions_rescore_identically(tmp_path):
    first, again = tmp_path / "a", tmp_path / "b"
    assert _eval("pathvqa", first, *MODEL) == 0
    assert _eval("pathvqa", again, "--predictions", str(first / "predictions.jsonl"), "--no-progress") == 0
    strip = [{k: v for k, v in r.items() if k != "finish_reason"} for r in _rows(first)]
    assert _rows(again) == strip


def test_changed_settings_refuse_to_mix_runs(tmp_path, capsys):
    out = tmp_path / "mix"
    assert _eval("pathvqa", out, *MODEL, "--limit", "1") == 0
    capsys.readouterr()
    assert _eval("pathvqa", out, *MODEL[:-3], "max_new_tokens=7", "device=cpu", "max_pixels=50176") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds an evaluation with different generation" in err[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--benchmark", "mathvistaa", "--data", "x", "--model", TINY], "did you mean 'mathvista'"),
        (["--benchmark", "mathvista", "--data", "nowhere.json", "--model", TINY], "data not found: nowhere.json"),
        (["--benchmark", "mathvista", "--data", str(FIXTURES["mathvista"]), "--model", TINY, "temprature=0.5"],
         "unknown setting 'temprature'; did you mean 'temperature'"),
        (["--benchmark", "screenspot", "--data", str(FIXTURES["screenspot"]), "--model", TINY, "coords=pixels"],
         "screenspot.coords: 'pixels' is not one of"),
        (["--benchmark", "mathvista", "--data", str(FIXTURES["mathvista"])], "give --model PATH"),
        (["--benchmark", "mathvista", "--data", str(FIXTURES["mathvista"]), "--model", TINY, "--predictions", "p"],
         "give --model PATH"),
        (["--benchmark", "mathvista", "--data", str(FIXTURES["mathvista"]), "--model", TINY, "--samples", "0"],
         "--samples must be at least 1"),
        (["--benchmark", "mathvista", "--data", str(EVAL / "mathv" / "testmini.jsonl"), "--model", TINY],
         "missing field(s) ['pid', 'question_type', 'answer_type']"),
    ],
)  # fmt: skip
def test_cli_errors_are_one_line_and_exit_2(args, message, tmp_path, capsys):
    assert main(["eval", *args, "--output-dir", str(tmp_path / "o")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], captured.err
    assert captured.out == ""


def test_compare_reports_paired_deltas(tmp_path, capsys):
    """B is the reference output with the first 100 records' extraction replaced by the answer."""
    output = json.loads((MATHVISTA / "output_llava_llama_2_13b.json").read_text())
    fixed = sum(not r["true_false"] for r in list(output.values())[:100])
    for rec in list(output.values())[:100]:
        rec["extraction"] = rec["answer"]
    (tmp_path / "better.json").write_text(json.dumps(output))
    data = str(MATHVISTA / "testmini.json")
    for name, preds in (("a", MATHVISTA / "output_llava_llama_2_13b.json"), ("b", tmp_path / "better.json")):
        assert main(["eval", "--benchmark", "mathvista", "--data", data, "--predictions", str(preds),
                     "--output-dir", str(tmp_path / name / "mathvista"), "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--resamples", "2000"]) == 0
    table = capsys.readouterr().out
    overall = next(line for line in table.splitlines() if line.startswith("| mathvista | all |"))
    cells = [c.strip() for c in overall.strip("|").split("|")]
    assert cells[2] == "1000" and cells[3] == "0.2610"
    assert cells[5] == f"{fixed / 1000:+.4f}*"
    lo, hi = (float(x) for x in cells[6].strip("[]").split(","))
    assert 0 < lo < fixed / 1000 < hi
    assert "| mathvista | question_type=multi_choice |" in table
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("error: not a folder")
