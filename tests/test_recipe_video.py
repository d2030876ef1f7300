"""The video recipe: its generated clips are real videos that the video processor reads back with decord and with
the OpenCV fallback and that show what their answers say; the Video-MME and MVBench converters on public-layout
fixtures (tests/data/video/); and a 2-step CI smoke run of the tiny recipe through the real CLI."""

import json
import string
from pathlib import Path

import cv2
import numpy as np
import pytest

from mmrl.cli import main
from mmrl.data import load_dataset
from mmrl.processors.video import load_video
from mmrl.recipes.video import data as vdata
from mmrl.recipes.video.convert import ConvertError, convert_mvbench, convert_videomme, videomme_record
from mmrl.rewards.general import mc_letter
from mmrl.run.metrics import read_metrics
from mmrl.types import RewardInput

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "video"
TINY_PIXELS = 112 * 224


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("video-tiny")
    vdata.build(folder, n_train=24, n_eval=12, n_sft=24, seed=3)
    return folder


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _colour_mask(frame_rgb: np.ndarray, colour: str) -> np.ndarray:
    """Pixels within 60 of a recipe colour (frames are RGB; the recipe's table is BGR)."""
    target = np.array(vdata.COLOURS_BGR[colour][::-1], dtype=np.int16)
    return np.abs(frame_rgb.astype(np.int16) - target).max(axis=-1) < 60


def _ink(frame_rgb: np.ndarray) -> np.ndarray:
    """Non-background pixels (the background is white)."""
    return frame_rgb.astype(np.int16).min(axis=-1) < 200


def _blobs(frame_rgb: np.ndarray) -> int:
    ink = _ink(frame_rgb).astype(np.uint8)
    n, _, stats, _ = cv2.connectedComponentsWithStats(ink)
    return int((stats[1:, cv2.CC_STAT_AREA] > 40).sum())


def test_build_is_deterministic_with_disjoint_splits(tiny_data, tmp_path):
    again = tmp_path / "again"
    vdata.build(again, n_train=24, n_eval=12, n_sft=24, seed=3)
    ids = {}
    for split in ("train", "eval", "sft"):
        recs = _records(tiny_data / f"{split}.jsonl")
        assert recs == _records(again / f"{split}.jsonl")
        ids[split] = {r["id"] for r in recs}
        for r in recs:
            assert (tiny_data / r["videos"][0]).read_bytes() == (again / r["videos"][0]).read_bytes()
            choices = r["metadata"]["choices"]
            assert choices[string.ascii_uppercase.index(r["answer"])] == r["metadata"]["answer_text"]
            lines = [f"{string.ascii_uppercase[i]}. {c}" for i, c in enumerate(choices)]
            assert r["prompt"].startswith("<video>") and all(f"\n{x}\n" in r["prompt"] for x in lines)
    assert (
        not (ids["train"] & ids["eval"])
        and not (ids["train"] & ids["sft"])
        and not (ids["eval"] & ids["sft"])
    )
    assert {r["metadata"]["kind"] for r in _records(tiny_data / "train.jsonl")} == set(vdata.KINDS)
    assert len(load_dataset(tiny_data / "train.jsonl").samples) == 24  # the loader's validation accepts them


def test_sft_split_skews_each_kind_by_its_own_rate(tmp_path):
    """The warm-start split keeps non-majority answers at SFT_KEEP_OTHER's per-kind rate (counting skewed hardest);
    the RL and held-out splits do not depend on it."""
    vdata.build(tmp_path / "a", n_train=30, n_eval=6, n_sft=300, seed=5)
    vdata.build(tmp_path / "b", n_train=30, n_eval=6, n_sft=30, seed=5, sft_keep_other=1.0)
    share = {}
    for kind in vdata.KINDS:
        recs = [r for r in _records(tmp_path / "a" / "sft.jsonl") if r["metadata"]["kind"] == kind]
        share[kind] = sum(r["metadata"]["answer_text"] == vdata.MAJORITY[kind] for r in recs) / len(recs)
    # expected majority shares: 1/(1 + 2 x 0.05) = 0.91 for count, 1/(1 + 0.25) = 0.80 and 1/(1 + 2 x 0.25) = 0.67
    assert share["count"] > 0.85 and 0.65 < share["direction"] < 0.92 and 0.5 < share["order"] < 0.8, share
    for split in ("train", "eval"):
        assert _records(tmp_path / "a" / f"{split}.jsonl") == _records(tmp_path / "b" / f"{split}.jsonl")
    with pytest.raises(ValueError, match="one probability per kind"):
        vdata.build(tmp_path / "c", n_train=2, n_eval=2, n_sft=2, sft_keep_other={"count": 0.1})


@pytest.mark.parametrize("backend", ["decord", "opencv"])
def test_clips_decode_and_show_their_answer(tiny_data, backend):
    seen = set()
    for r in _records(tiny_data / "train.jsonl") + _records(tiny_data / "eval.jsonl"):
        clip = load_video(
            tiny_data / r["videos"][0], fps=2.0, max_frames=4, max_pixels=TINY_PIXELS, backend=backend
        )
        assert clip.backend == backend and clip.frames.shape == (4, 112, 224, 3)
        assert clip.frame_indices == [0, 1, 2, 3] and clip.source_fps == pytest.approx(2.0)
        first, last = clip.frames[0], clip.frames[-1]
        kind, answer = r["metadata"]["kind"], r["metadata"]["answer_text"]
        if kind == "count":
            assert _blobs(last) == int(answer)
        elif kind == "direction":
            xs = [np.nonzero(_ink(f))[1].mean() for f in (first, last)]
            assert (xs[1] > xs[0] + 40) if answer == "to the right" else (xs[1] < xs[0] - 40)
        else:  # order: only the answer's colour is on screen in the first 2-frame patch
            present = [c for c in vdata.TINY.colours if _colour_mask(first, c).sum() > 100]
            assert present == [answer]
            assert _blobs(last) == 2
        seen.add(kind)
    assert seen == set(vdata.KINDS)


def test_decord_and_opencv_read_the_same_frames(tiny_data):
    path = tiny_data / _records(tiny_data / "eval.jsonl")[0]["videos"][0]
    a = load_video(path, fps=2.0, max_frames=4, max_pixels=TINY_PIXELS, backend="decord").frames
    b = load_video(path, fps=2.0, max_frames=4, max_pixels=TINY_PIXELS, backend="opencv").frames
    assert np.abs(a.astype(np.int16) - b.astype(np.int16)).mean() < 2.0


def test_full_style_shuffles_options_and_asks_for_think_answer(tmp_path):
    vdata.build_full(tmp_path, n_train=12, n_eval=4, seed=1)
    recs = _records(tmp_path / "train.jsonl")
    assert {r["answer"] for r in recs} - {"A"}, "shuffled options put the answer under several letters"
    for r in recs:
        assert "<answer>" in r["prompt"] and len(r["metadata"]["choices"]) >= 2
    clip = load_video(tmp_path / recs[0]["videos"][0], fps=4.0, max_frames=16, max_pixels=224 * 448)
    assert clip.frames.shape == (16, 224, 448, 3)


def test_mc_letter_scores_the_recipe_records(tiny_data):
    r = _records(tiny_data / "eval.jsonl")[0]
    wrong = next(L for L in "ABC"[: len(r["metadata"]["choices"])] if L != r["answer"])
    batch = [
        RewardInput(r["id"], resp, r["answer"], metadata=r["metadata"])
        for resp in (r["answer"], wrong, r["metadata"]["answer_text"])
    ]
    assert [x.score for x in mc_letter(batch)] == [1.0, 0.0, 1.0]


def test_convert_videomme_parquet(tmp_path):
    out = convert_videomme(
        FIXTURES / "videomme" / "test-00000-of-00001.parquet",
        FIXTURES / "videomme" / "data",
        tmp_path / "mme.jsonl",
    )
    recs = _records(out)
    assert [r["id"] for r in recs] == ["901-1", "902-1", "902-2"]
    assert [r["answer"] for r in recs] == ["C", "C", "C"]
    assert recs[0]["metadata"]["choices"] == ["Upwards.", "To the left.", "To the right.", "Downwards."]
    assert recs[1]["metadata"]["kind"] == "Counting Problem" and recs[1]["metadata"]["duration"] == "short"
    samples = load_dataset(out).samples
    clip = load_video(samples[0].videos[0], fps=4.0, max_frames=16, max_pixels=64 * 112 * 4)
    red_x = [np.nonzero(_colour_mask(f, "red"))[1].mean() for f in (clip.frames[0], clip.frames[-1])]
    assert red_x[1] > red_x[0] + 40  # the clip does show the answer: the red square travels to the right


def test_convert_mvbench_cuts_the_bounded_segment(tmp_path):
    mv = FIXTURES / "mvbench"
    out = convert_mvbench(
        mv / "json" / "action_sequence.json",
        mv / "video" / "star" / "Charades_v1_480",
        tmp_path / "seq.jsonl",
    )
    recs = _records(out)
    assert [r["answer"] for r in recs] == ["A", "B"]
    assert (recs[0]["metadata"]["start"], recs[0]["metadata"]["end"]) == (2.0, 7.0)
    assert recs[0]["videos"] == recs[1]["videos"], "two questions on one segment share its cut"
    clip = load_video(tmp_path / recs[0]["videos"][0], fps=4.0, max_frames=32, max_pixels=64 * 112 * 4)
    assert clip.total_frames == 20  # the 2 s to 7 s segment at 4 fps
    first, last = clip.frames[0], clip.frames[-1]
    assert _colour_mask(first, "red").sum() == 0 and _colour_mask(last, "red").sum() > 100
    assert _colour_mask(last, "blue").sum() > 100
    plain = convert_mvbench(
        mv / "json" / "moving_direction.json",
        mv / "video" / "clevrer" / "video_validation",
        tmp_path / "dir.jsonl",
    )
    (rec,) = _records(plain)
    assert (
        rec["answer"] == "B"
        and rec["metadata"]["kind"] == "moving_direction"
        and "start" not in rec["metadata"]
    )
    assert (tmp_path / rec["videos"][0]).resolve() == (mv / "video/clevrer/video_validation/video_10001.mp4")


def test_converters_name_the_record_and_the_fix(tmp_path):
    row = {
        "videoID": "nope",
        "question_id": "1-1",
        "question": "q",
        "options": ["A. x", "B. y"],
        "answer": "A",
    }
    with pytest.raises(ConvertError, match=r"row 7: video not found: .*video_dir"):
        videomme_record(row, "mme row 7", FIXTURES / "videomme" / "data", tmp_path)
    with pytest.raises(ConvertError, match=r"row 2: missing \['answer'\]"):
        videomme_record({**row, "answer": ""}, "mme row 2", tmp_path, tmp_path)
    bad = tmp_path / "json" / "object_shuffle.json"
    bad.parent.mkdir()
    bad.write_text(
        json.dumps([{"video": "video_10001.mp4", "question": "q", "candidates": ["a", "b"], "answer": "c"}])
    )
    with pytest.raises(ConvertError, match="neither an option letter nor the text"):
        convert_mvbench(
            bad, FIXTURES / "mvbench" / "video" / "clevrer" / "video_validation", tmp_path / "o.jsonl"
        )


def test_tiny_recipe_two_step_smoke(tmp_path, monkeypatch, capsys):
    """The CI smoke run: the shipped warm start, 2 GRPO steps on freshly built clips, step-0 and final evals."""
    monkeypatch.chdir(ROOT)
    data = tmp_path / "data"
    vdata.build(data, n_train=16, n_eval=8, n_sft=4)
    args = [
        "train", "recipes/video/tiny.yaml", "--output-dir", str(tmp_path / "run"), "--max-steps", "2",
        f"data.train={data / 'train.jsonl'}", f"data.eval={data / 'eval.jsonl'}", "eval.max_samples=8",
        "eval.every=1", "train.progress=false", "train.save_every=0", "train.prompts_per_step=4",
    ]  # fmt: skip
    assert main(args) == 0
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("eval/accuracy" in r for r in rows) and "reward/mc_letter/correct" in rows[-1]
    logged = _records(run / "rollouts.jsonl")
    assert logged and all(len(x["responses"]) == 8 for x in logged)
    video = Path(logged[-1]["videos"][0])  # the gallery finds each clip here and shows its key frames
    assert video.is_file() and video.suffix == ".mp4"
    assert f"{video} frame 0" in (run / "report.html").read_text()
    assert "held-out accuracy: start" in capsys.readouterr().out


def test_headroom_prior_correction_on_hand_computed_logprobs():
    """benchmarks/video_headroom.py: one constant per letter recovers what a biased prior hides, and no more."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("video_headroom", ROOT / "benchmarks" / "video_headroom.py")
    headroom = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headroom)
    # every row prefers A by 2 nats over what the evidence says: B/C rows are right once B and C get +2..+3
    logp = np.log(np.array([[0.90, 0.06, 0.04], [0.60, 0.30, 0.10], [0.55, 0.05, 0.40], [0.50, 0.45, 0.05]]))
    y = np.array([0, 1, 2, 1])
    assert np.mean(logp.argmax(1) == y) == 0.25
    best, (off_b, off_c) = headroom.prior_corrected(logp, y)
    assert best == 1.0
    assert all(np.argmax(logp[i] + [0, off_b, off_c]) == y[i] for i in range(4))
    # two identical rows with different answers: no prior makes both right
    same = np.log(np.array([[0.6, 0.4], [0.6, 0.4]]))
    assert headroom.prior_corrected(same, np.array([0, 1]))[0] == 0.5
