"""Hostile data (issue 35, section 4): the corpus of tests/hostile_data.py mixed into good records goes through the
loader (``skip`` and ``error``), a real ``mmrl train``, ``mmrl sft`` and ``mmrl eval`` on the tiny shapes model.
Each bad record is skipped with its reason (or named with its fix under ``error``) before step 1; each valid but
unusual one (CMYK, 16-bit, palette, animated, EXIF-rotated, 1x1, 150:1, 64 images, a video) is used; a data set of
bad records only stops with the count of each reason."""

import json
from pathlib import Path

import pytest
from hostile_data import GOOD_ANSWER, build_corpus, mix, outcome

from mmrl.cli import main
from mmrl.config import DataConfig
from mmrl.data import DataError, load_dataset, load_split

ROOT = Path(__file__).resolve().parents[1]
SHAPES = str(ROOT / "assets" / "shapes-sft" / "model")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    return folder, build_corpus(folder)


def _good(path: Path, n: int) -> None:
    from PIL import Image

    Image.new("RGB", (56, 56), (220, 20, 20)).save(path.parent / "red.png")
    rows = [{"id": f"good-{i}", "prompt": "What colour? <image>", "images": ["red.png"], "answer": GOOD_ANSWER}
            for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _skipped(path: Path) -> dict[int, dict]:
    """skipped.jsonl's rows by line number of the record they name."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return {int(r["where"].rsplit(":", 1)[1]): r for r in rows}


def _check_outcomes(cases, at, used_ids, skipped, tokenizer: bool) -> None:
    for c in cases:
        want = outcome(c, tokenizer)
        row = skipped.get(at[c.name])
        if want == "used":
            assert row is None and c.id in used_ids, (c.name, row)
            continue
        assert row is not None and row["kind"] == want, (c.name, row)
        assert row["id"] == (c.id if c.expected != "duplicate_id" else "hostile-cmyk"), (c.name, row)
        assert row["reason"].startswith(f"sample '{c.id}'" if c.id else row["where"]), (c.name, row)


@pytest.mark.parametrize("tokenizer", [False, True])
def test_skip_lists_each_bad_record_with_its_reason_and_uses_the_rest(corpus, tmp_path, tokenizer):
    folder, cases = corpus
    data = folder / f"skip-{tokenizer}.jsonl"
    _good(data, 2)
    at = mix(data, cases)
    out = tmp_path / "skipped.jsonl"
    samples = load_split(DataConfig(on_bad_record="skip"), str(data), out, SHAPES if tokenizer else None)
    used = {s.id for s in samples}
    _check_outcomes(cases, at, used, _skipped(out), tokenizer)
    assert len(samples) == 2 + sum(outcome(c, tokenizer) == "used" for c in cases)
    assert {"good-0", "good-1"} <= used


def _bad(name: str, cases):
    return next(c for c in cases if c.name == name)


@pytest.mark.parametrize(
    "name",
    ["not_utf8", "deep_json", "content_int", "duplicate", "truncated_png", "bomb_400m", "wide_2500",
     "pixels_per_record", "images_300", "zero_frames", "long_chars", "long_tokens", "image_pad", "answer_im_end"],
)  # fmt: skip
def test_error_names_the_record_and_the_fix(corpus, name):
    folder, cases = corpus
    case = _bad(name, cases)
    data = folder / f"error-{name}.jsonl"
    _good(data, 1)
    extra = [_bad("cmyk", cases)] if name == "duplicate" else []
    at = mix(data, cases, only=[*extra, case])
    with pytest.raises(DataError) as e:
        load_split(DataConfig(), str(data), None, SHAPES)
    msg = str(e.value)
    assert e.value.kind == case.expected, msg
    assert f"sample '{case.id}'" in msg or f"{data}:{at[name]}" in msg, msg
    assert msg.endswith("or set data.on_bad_record=skip to skip bad records"), msg


def test_a_split_of_bad_records_only_stops_with_a_count_by_reason(corpus, tmp_path):
    folder, cases = corpus
    data = folder / "all-bad.jsonl"
    mix(data, cases, only=[c for c in cases if c.expected != "used" and c.name != "duplicate"])
    with pytest.raises(DataError) as e:
        load_split(DataConfig(on_bad_record="skip"), str(data), tmp_path / "skipped.jsonl", SHAPES)
    msg = str(e.value)
    counts = {"invalid_record": 5, "missing_media": 5, "special_tokens": 4, "invalid_json": 3,
              "image_unreadable": 3, "image_too_large": 2, "video_unreadable": 2, "prompt_too_long": 2}  # fmt: skip
    assert "no usable records: 31 skipped (" in msg, msg
    for kind, n in counts.items():
        assert f"{n} {kind}" in msg, msg
    skipped = (tmp_path / "skipped.jsonl").read_text().splitlines()
    assert len(skipped) == 31  # the reasons are listed all the same


def test_allowed_special_tokens_pass_as_the_control_tokens_they_are(corpus):
    folder, _ = corpus
    data = folder / "allowed.jsonl"
    row = {"id": "ground", "prompt": "Box <|object_ref_start|>the cat<|object_ref_end|>", "answer": "x"}
    data.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=r"\['<\|object_ref_end\|>', '<\|object_ref_start\|>'\]"):
        load_split(DataConfig(), str(data), None, SHAPES)
    allowed = ["<|object_ref_start|>", "<|object_ref_end|>"]
    assert [
        s.id for s in load_split(DataConfig(allowed_special_tokens=allowed), str(data), None, SHAPES)
    ] == ["ground"]


def test_loader_alone_leaves_the_tokenizer_checks_to_the_policy_side(corpus):
    folder, cases = corpus
    data = folder / "no-tokenizer.jsonl"
    _good(data, 1)
    mix(data, cases, only=[_bad("image_pad", cases)])
    assert [s.id for s in load_dataset(data).samples] == ["good-0", "hostile-image_pad"]


def _recipe(tmp_path: Path, corpus, **data: str) -> Path:
    folder, cases = corpus
    train = folder / f"train-{tmp_path.name}.jsonl"
    _good(train, 6)
    mix(train, cases)
    opts = ", ".join(f"{k}: {v}" for k, v in {"train": str(train), "on_bad_record": "skip", **data}.items())
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {SHAPES}, min_pixels: 3136, max_pixels: 3136, video_max_pixels: 3136, video_min_pixels: 784}}
data: {{{opts}}}
rollout: {{n: 2, max_new_tokens: 2, batch_size: 8}}
optim: {{lr: 0.001, micro_batch_size: 8}}
rewards: [{{name: exact_match}}]
sampler: {{name: uniform}}
sft: {{steps: 2, batch_size: 8, lr: 0.001}}
train: {{prompts_per_step: 8, progress: false, seed: 3}}
"""
    )
    return cfg


def test_train_runs_on_the_good_and_unusual_records_and_lists_the_bad(corpus, tmp_path):
    folder, cases = corpus
    cfg = _recipe(tmp_path, corpus)
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "2"]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # 16 usable records, 8 a step: each one encoded and rolled out
    skipped = [json.loads(x) for x in (out / "skipped.jsonl").read_text().splitlines()]
    assert sorted(r["kind"] for r in skipped) == sorted(c.expected for c in cases if c.expected != "used")
    assert all(r["reason"] for r in skipped)


def test_train_with_error_stops_before_step_1_naming_the_first_bad_record(corpus, tmp_path, capsys):
    cfg = _recipe(tmp_path, corpus, on_bad_record="error")
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "line is not valid UTF-8" in err and "on_bad_record=skip" in err, err
    assert not (out / "metrics.jsonl").exists()


def test_train_on_bad_records_only_stops_before_step_1_with_a_count_by_reason(corpus, tmp_path, capsys):
    folder, cases = corpus
    train = folder / "train-all-bad.jsonl"
    mix(train, cases, only=[c for c in cases if c.expected in ("image_unreadable", "special_tokens")])
    cfg = _recipe(tmp_path, corpus)
    cfg.write_text(cfg.read_text().replace(str(folder / f"train-{tmp_path.name}.jsonl"), str(train)))
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0 and "no usable records: 7 skipped (4 special_tokens, 3 image_unreadable)" in err
    ), err
    assert len((out / "skipped.jsonl").read_text().splitlines()) == 7 and not (out / "metrics.jsonl").exists()


def test_sft_runs_on_the_good_and_unusual_records_and_lists_the_bad(corpus, tmp_path):
    folder, cases = corpus
    cfg = _recipe(tmp_path, corpus)
    out = tmp_path / "sft"
    assert main(["sft", str(cfg), "--output-dir", str(out)]) == 0
    assert len((out / "sft_metrics.jsonl").read_text().splitlines()) == 2
    assert "records: the first 16 of" in (out / "README.md").read_text()  # 6 good + 10 unusual, all encoded
    skipped = [json.loads(x) for x in (out / "skipped.jsonl").read_text().splitlines()]
    assert sorted(r["kind"] for r in skipped) == sorted(c.expected for c in cases if c.expected != "used")


# mmrl eval reads a benchmark's published layout (here MATH-Vision's JSONL): its loader refuses what it cannot read
# (a line that is not UTF-8 or JSON, a missing file); what it lets through and the model cannot use is skipped.
EVAL_ITEMS = {  # id: (image, question, expected)
    "cmyk": ("cmyk.jpg", "How many?", "used"),
    "deep16": ("deep16.png", "How many?", "used"),
    "palette": ("palette.png", "How many?", "used"),
    "animated_gif": ("animated.gif", "How many?", "used"),
    "exif_rotated": ("exif_rotated.jpg", "How many?", "used"),
    "one_pixel": ("one.png", "How many?", "used"),
    "truncated_png": ("truncated.png", "How many?", "image_unreadable"),
    "corrupt_image": ("corrupt.png", "How many?", "image_unreadable"),
    "bomb_81m": ("bomb_81m.png", "How many?", "image_too_large"),
    "wide_2500": ("wide_2500.png", "How many?", "aspect_ratio"),
    "long_chars": ("ok.png", "lorem ipsum " * 20_000, "prompt_too_long"),
    "image_pad": ("ok.png", "What is <|image_pad|>?", "special_tokens"),
}


def _eval(data: Path, out: Path) -> int:
    model = ["--model", SHAPES, "--no-progress", "max_new_tokens=2", "device=cpu", "max_pixels=3136"]
    return main(["eval", "--benchmark", "mathv", "--data", str(data), "--output-dir", str(out), *model])


def test_eval_scores_the_usable_items_and_lists_the_rest(corpus, tmp_path, capsys):
    folder, _ = corpus
    data = folder / "mathv.jsonl"
    rows = [{"id": k, "question": q, "options": [], "answer": "3", "image": f"hostile/{img}"}
            for k, (img, q, _) in EVAL_ITEMS.items()]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval"
    assert _eval(data, out) == 0
    scored = [json.loads(x)["id"] for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert scored == [k for k, v in EVAL_ITEMS.items() if v[2] == "used"]
    skipped = {r["id"]: r for r in map(json.loads, (out / "skipped.jsonl").read_text().splitlines())}
    assert {k: r["kind"] for k, r in skipped.items()} == {
        k: v[2] for k, v in EVAL_ITEMS.items() if v[2] != "used"
    }
    assert "eval: 6 item(s) skipped" in capsys.readouterr().err
    assert json.loads((out / "metrics.json").read_text())["items"] == 6


def test_eval_names_a_line_its_benchmark_cannot_read(corpus, tmp_path, capsys):
    folder, _ = corpus
    data = folder / "mathv-bad.jsonl"
    good = {"id": "a", "question": "How many?", "options": [], "answer": "3", "image": "hostile/ok.png"}
    data.write_bytes(json.dumps(good).encode() + b'\n{"id": "b", "question": "caf\xe9"}\n')
    assert _eval(data, tmp_path / "eval") == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {data}:2: not valid UTF-8 (byte 0xe9 at offset 28); re-save the file as UTF-8"


def test_a_record_that_fails_to_encode_at_its_step_is_skipped_there(corpus, tmp_path, monkeypatch):
    """What only fails when a step encodes it (a video decoder, media the load-time checks passed) is skipped at that
    step with its reason in skipped.jsonl (once, however often it is drawn), replaced by a fresh draw and never used
    in a batch; the run goes on."""
    from mmrl.model.policy import Policy
    from mmrl.processors.errors import MediaError

    real = Policy.encode
    failing = {f"good-{i}" for i in range(1, 6)}
    calls: list[str] = []

    def encode(self, sample, *args, **kwargs):
        calls.append(sample.id)
        if sample.id in failing:
            raise MediaError(sample.id, "the decoder gave up (simulated)")
        return real(self, sample, *args, **kwargs)

    monkeypatch.setattr(Policy, "encode", encode)
    cfg = _recipe(tmp_path, corpus)
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--output-dir", str(out), "--max-steps", "3"]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    skipped = [json.loads(x) for x in (out / "skipped.jsonl").read_text().splitlines()]
    at_steps = [r["id"] for r in skipped if r["kind"] == "encode_failed"]
    drawn = failing & set(calls)
    assert drawn and sorted(at_steps) == sorted(drawn)  # each failing record drawn is listed once
    assert all(
        "decoder gave up" in r["reason"] and r["where"].startswith("step ")
        for r in skipped
        if r["kind"] == "encode_failed"
    )
    logged = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert not failing & {r["id"] for r in logged}
