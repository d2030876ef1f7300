import json

import pytest
from PIL import Image

from mmrl.data import DataError, load_dataset


def _write(tmp_path, rows):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return p


@pytest.fixture
def img(tmp_path):
    Image.new("RGB", (10, 10)).save(tmp_path / "a.png")
    return "a.png"


def test_prompt_becomes_messages_with_placeholders(tmp_path, img):
    p = _write(tmp_path, [{"id": "x", "prompt": "Look <image> then answer", "images": [img], "answer": "a"}])
    s = load_dataset(p).samples[0]
    parts = s.messages[0]["content"]
    assert [q["type"] for q in parts] == ["text", "image", "text"]
    assert s.images == [str(tmp_path / img)] and s.prompt_text == "Look  then answer"


def test_media_first_when_no_placeholder(tmp_path, img):
    s = load_dataset(_write(tmp_path, [{"id": "x", "prompt": "Q?", "images": [img]}])).samples[0]
    assert [q["type"] for q in s.messages[0]["content"]] == ["image", "text"]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"prompt": "q"}, "has no 'id'"),
        ({"id": "r1", "prompt": "q", "images": ["missing.png"]}, "sample 'r1': image file not found"),
        ({"id": "r2", "prompt": "q <image> <image>", "images": ["a.png"]}, "2 image placeholder"),
        ({"id": "r3", "prompt": "q", "extra": 1}, "unknown field"),
        ({"id": "r4"}, "exactly one of 'prompt'"),
        ({"id": "r5", "messages": [{"role": "bot", "content": "x"}]}, "'role' in"),
        ({"id": "r6", "prompt": "q", "metadata": [1]}, "'metadata' must be a mapping"),
        ("{not json", "invalid JSON"),
    ],
)
def test_bad_records_name_record_and_fix(tmp_path, img, row, message):
    p = _write(tmp_path, [row])
    with pytest.raises(DataError, match=message) as e:
        load_dataset(p)
    assert "on_bad_record=skip" in str(e.value)


def test_corrupt_image_is_caught_on_load(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match="sample 'b': cannot read image"):
        load_dataset(_write(tmp_path, [{"id": "b", "prompt": "q", "images": ["bad.png"]}]))


def test_skip_mode_lists_skipped(tmp_path, img):
    rows = [
        {"id": "ok", "prompt": "q"},
        {"id": "bad", "prompt": "q", "images": ["nope.png"]},
        {"id": "ok", "prompt": "q"},
    ]
    d = load_dataset(_write(tmp_path, rows), on_bad_record="skip")
    assert [s.id for s in d.samples] == ["ok"]
    assert [s["id"] for s in d.skipped] == ["bad", "ok"]
    assert "duplicate id" in d.skipped[1]["reason"]
    d.write_skipped(tmp_path / "out" / "skipped.jsonl")
    d.write_skipped(tmp_path / "out" / "skipped.jsonl")  # appended, never truncated
    assert len((tmp_path / "out" / "skipped.jsonl").read_text().splitlines()) == 4


def test_parquet_records(tmp_path, img):
    pa = pytest.importorskip("pyarrow", reason="pyarrow (installed with the dev extra) reads parquet")
    import pyarrow.parquet as pq

    rows = [{"id": "p1", "prompt": "Q?", "images": [img], "answer": "red", "metadata": {"kind": "colour"}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    s = load_dataset(tmp_path / "d.parquet").samples[0]
    assert (s.id, s.answer, s.metadata, s.images) == ("p1", "red", {"kind": "colour"}, [str(tmp_path / img)])
