import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "reward_plugin_example.py"


def _cli(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mmrl.cli", "reward", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    return proc.returncode, proc.stdout, proc.stderr


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_single_math_verify(tmp_path):
    resp = _write(tmp_path / "resp.txt", "<think>half</think><answer>\\frac{1}{2}</answer>\n")
    ref = _write(tmp_path / "ref.txt", "0.5\n")
    rc, out, err = _cli("math_verify", "--response", resp, "--reference", ref, "--json")
    assert rc == 0, err
    assert json.loads(out) == {"score": 1.0, "parts": {"format": 1.0, "correct": 1.0}}


def test_single_gui_with_metadata_options_and_raw_text_reference(tmp_path):
    resp = _write(
        tmp_path / "r.txt", "<think>t</think><answer>[{'action': 'click', 'point': [641, 500]}]</answer>"
    )
    ref = _write(tmp_path / "ref.json", json.dumps({"action": "click", "point": [500, 500]}))
    meta = _write(
        tmp_path / "m.json", json.dumps({"image_sizes": [[1000, 1000]], "model_image_sizes": [[1000, 1000]]})
    )
    base = [
        "gui_action",
        "--response",
        resp,
        "--reference",
        ref,
        "--metadata",
        meta,
        "--option",
        "scheme=gui_r1",
    ]
    rc, out, _ = _cli(*base, "--json")
    assert rc == 0 and json.loads(out)["parts"]["coord"] == 0.0  # 141 px from the point, radius 140
    rc, out, _ = _cli(*base, "--option", "point_radius=150", "--json")
    assert rc == 0 and json.loads(out)["parts"] == {
        "type": 1.0,
        "coord": 1.0,
        "text": 1.0,
        "format": 1.0,
        "accuracy": 1.0,
    }

    letter = _write(tmp_path / "letter.txt", "B\n")
    answer = _write(tmp_path / "a.txt", "the answer is (B)")
    rc, out, _ = _cli("mc_letter", "--response", answer, "--reference", letter)
    assert rc == 0 and out.strip() == "score=1.0  format=1 correct=1"


def test_render_dir_and_reward_from_file(tmp_path):
    resp = _write(tmp_path / "resp.txt", "\\begin{tabular}{c}x\\end{tabular}")
    ref = _write(tmp_path / "ref.txt", "unused")
    renders = tmp_path / "renders"
    rc, out, err = _cli(
        f"{PLUGIN}:render_marker", "--response", resp, "--reference", ref, "--render-dir", renders, "--json"
    )
    assert rc == 0, err
    assert json.loads(out)["score"] == 1.0
    assert (renders / "cli.txt").read_text() == "\\begin{tabular}{c}x\\end{tabular}"


def test_bad_input_exits_2_with_message(tmp_path):
    resp = _write(tmp_path / "resp.txt", "<answer>1</answer>")
    ref = _write(tmp_path / "ref.txt", "1")
    rc, out, err = _cli(
        "exact_match", "--response", resp, "--reference", ref, "--option", "extract_answer=false"
    )
    assert rc == 2 and out == ""
    assert "unknown option 'extract_answer'; did you mean 'extract_answer_tag'?" in err
    rc, _, err = _cli("exact_mach", "--response", resp, "--reference", ref)
    assert rc == 2 and "did you mean 'exact_match'" in err
    rc, _, err = _cli("exact_match", "--response", resp, "--reference", tmp_path / "missing.txt")
    assert rc == 2 and "cannot read reference file" in err
    rc, _, err = _cli("exact_match", "--response", resp)
    assert rc == 2 and "--reference FILE is required" in err


def test_batch_mode_keeps_order_and_reports_bad_lines(tmp_path):
    lines = [
        json.dumps({"id": "a", "response": "<answer>Paris</answer>", "reference": "paris"}),
        "{not json",
        json.dumps({"id": "b", "response": "<answer>Rome</answer>", "reference": "paris"}),
        "",
        json.dumps({"id": "c", "reference": "x"}),
        json.dumps({"id": "d", "response": "<answer>the Paris</answer>", "reference": ["Lyon", "Paris"]}),
    ]
    batch = _write(tmp_path / "in.jsonl", "\n".join(lines) + "\n")
    rc, out, _ = _cli("exact_match", "--batch", batch, "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 2
    assert [r.get("id") or r["line"] for r in rows] == ["a", 2, "b", 5, "d"]
    assert [r.get("score") for r in rows] == [1.0, None, 0.0, None, 1.0]
    assert rows[1]["error"].startswith("line 2: invalid JSON")
    assert rows[3]["error"] == "line 5: need an object with a string 'response'"

    good = _write(tmp_path / "good.jsonl", lines[0] + "\n" + lines[2] + "\n")
    rc, out, _ = _cli("exact_match", "--batch", good, "--json")
    assert rc == 0 and [json.loads(line)["score"] for line in out.splitlines()] == [1.0, 0.0]


def test_batch_mode_reward_error_is_reported_per_line(tmp_path):
    lines = [
        json.dumps({"id": "ok", "response": "B", "reference": "B", "metadata": {"choices": ["x", "y"]}}),
        json.dumps(
            {"id": "bad-ref", "response": "B", "reference": "zebra", "metadata": {"choices": ["x", "y"]}}
        ),
    ]
    batch = _write(tmp_path / "mc.jsonl", "\n".join(lines))
    rc, out, _ = _cli("mc_letter", "--batch", batch, "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 1
    assert rows[0] == {"id": "ok", "score": 1.0, "parts": {"format": 1.0, "correct": 1.0}}
    assert rows[1]["id"] == "bad-ref" and rows[1]["score"] == 0.0
    assert "sample 'bad-ref': reference 'zebra' is neither an option letter" in rows[1]["error"]
