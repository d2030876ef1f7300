import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mmrl.data import DataError, load_dataset
from mmrl.types import Sample


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


# Parquet files and saved HF datasets store records by column; image paths are resolved against the parquet file's
# folder or against the saved dataset's own folder.
COLUMNAR_ROWS = [
    {
        "id": "c1",
        "prompt": "What colour is it? <image>",
        "images": ["a.png"],
        "answer": "red",
        "metadata": {"n": 1},
    },
    {
        "id": "c2",
        "prompt": "<image> How many shapes?",
        "images": ["a.png"],
        "answer": "3",
        "metadata": {"n": 3},
    },
]


def _columnar_samples(image: Path) -> list[Sample]:
    user = lambda *parts: [{"role": "user", "content": list(parts)}]  # noqa: E731
    return [
        Sample("c1", user({"type": "text", "text": "What colour is it? "}, {"type": "image"}), [str(image)],
               answer="red", metadata={"n": 1}),
        Sample("c2", user({"type": "image"}, {"type": "text", "text": " How many shapes?"}), [str(image)],
               answer="3", metadata={"n": 3}),
    ]  # fmt: skip


def test_parquet_records(tmp_path, img):
    pq.write_table(pa.Table.from_pylist(COLUMNAR_ROWS), tmp_path / "d.parquet")
    data = load_dataset(tmp_path / "d.parquet")
    assert data.samples == _columnar_samples(tmp_path / img) and data.skipped == []


def test_saved_hf_dataset_records(tmp_path):
    folder = tmp_path / "saved"
    datasets.Dataset.from_list(COLUMNAR_ROWS).save_to_disk(str(folder))
    Image.new("RGB", (10, 10)).save(folder / "a.png")
    data = load_dataset(folder)
    assert data.samples == _columnar_samples(folder / "a.png") and data.skipped == []


def _columnar_table(rows: list[dict]) -> pa.Table:
    """One column per field any record has, as pandas or ``datasets`` build it: Arrow has no 'absent', so a field
    a record lacks is null there, and a struct (metadata, message parts) gets every key any record gives it."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return pa.table({k: [r.get(k) for r in rows] for k in keys})


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_columnar_records_with_different_fields_load_as_from_jsonl(tmp_path, img, fmt):
    rows = [
        {"id": "m1", "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]}],
         "images": [img], "metadata": {"region": [1, 2, 3, 4]}},
        {"id": "p1", "prompt": "Count them.", "answer": "3", "metadata": {"kind": "count"}},
    ]  # fmt: skip
    folder = tmp_path / "saved" if fmt == "hf" else tmp_path
    if fmt == "hf":
        datasets.Dataset(_columnar_table(rows)).save_to_disk(str(folder))
        (folder / img).write_bytes((tmp_path / img).read_bytes())
        path = folder
    else:
        path = tmp_path / "d.parquet"
        pq.write_table(_columnar_table(rows), path)
    as_jsonl = load_dataset(_write(folder, rows)).samples
    assert as_jsonl[0].metadata == {"region": [1, 2, 3, 4]} and as_jsonl[1].images == []
    assert load_dataset(path).samples == as_jsonl


def test_builder_data_is_stamped_and_a_changed_builder_is_reported(tmp_path, monkeypatch):
    """ensure_built runs the builder once and stamps the folder with its module's source digest; when that module
    changes later, the records are kept but a warning names the folder to delete."""
    import warnings

    from mmrl.data import BUILD_STAMP, ensure_built

    src = tmp_path / "mybuilder.py"
    src.write_text(
        "from pathlib import Path\n\n\ndef build(folder):\n"
        "    Path(folder).mkdir(parents=True, exist_ok=True)\n"
        '    (Path(folder) / \'train.jsonl\').write_text(\'{"id": "a", "prompt": "hi"}\\n\')\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    train = tmp_path / "data" / "train.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ensure_built(str(train), "mybuilder:build")
        ensure_built(str(train), "mybuilder:build")  # built and unchanged: silent
    stamp = json.loads((train.parent / BUILD_STAMP).read_text())
    assert stamp["builder"] == "mybuilder:build" and len(stamp["source_sha256"]) == 64
    records = train.read_text()
    src.write_text(src.read_text() + "# the builder changed\n")
    with pytest.warns(UserWarning, match=r"built by an earlier version of mybuilder:build.*delete .*data"):
        ensure_built(str(train), "mybuilder:build")
    assert train.read_text() == records  # kept: the user decides
    with pytest.raises(DataError, match="must look like 'package.module:function'"):
        ensure_built(str(tmp_path / "other" / "train.jsonl"), "mybuilder")
