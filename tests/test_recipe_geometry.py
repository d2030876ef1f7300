"""The geometry recipe: its data builder, its reward routing, the Geometry3k converter on real Geometry3k problem
folders, and 2-step smoke runs of both tiny variants (MSSR and GRPO + VADE) through the real CLI."""

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
from PIL import Image

from mmrl.cli import main
from mmrl.data import load_dataset
from mmrl.recipes.geometry.convert import ConvertError, convert_geometry3k
from mmrl.recipes.geometry.data import KINDS, build, completion, make_figure
from mmrl.rewards.base import load_reward
from mmrl.rewards.general import format_think_answer
from mmrl.types import RewardInput

ROOT = Path(__file__).resolve().parents[1]
GEO3K = ROOT / "tests" / "data" / "geometry3k"
REWARD = load_reward("mmrl.recipes.geometry.reward:geometry_answer").fn  # as the configs name it


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _score(response, reference, **metadata):
    return REWARD([RewardInput(id="geo-t", response=response, reference=reference, metadata=metadata)])[0]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("geometry")
    build(folder, n_train=64, n_eval=12, n_sft=24, seed=5)
    return folder


def test_build_is_deterministic_and_splits_are_disjoint(small_data, tmp_path):
    build(tmp_path, n_train=64, n_eval=12, n_sft=24, seed=5)
    for split in ("train", "eval", "sft"):
        assert (tmp_path / f"{split}.jsonl").read_text() == (small_data / f"{split}.jsonl").read_text()
    rows = {s: _rows(small_data / f"{s}.jsonl") for s in ("train", "eval", "sft")}
    assert [len(rows[s]) for s in ("train", "eval", "sft")] == [64, 12, 24]
    first = rows["train"][0]["images"][0]
    assert (tmp_path / first).read_bytes() == (small_data / first).read_bytes()
    keys = {}
    for recs in rows.values():
        for r in recs:
            img = Image.open(small_data / r["images"][0])
            assert img.size == (112, 112)
            key = hashlib.sha1(img.convert("RGB").tobytes() + r["prompt"].encode()).hexdigest()
            assert key not in keys, f"{r['id']} repeats {keys.get(key)}"
            keys[key] = r["id"]
    # RL/held-out answers are the bare value; the warm-start split's answer is the whole target completion
    assert all("<answer>" not in r["answer"] for r in rows["train"] + rows["eval"])
    assert all(
        r["answer"] == completion(r["metadata"]["solution"], r["metadata"]["answer"]) for r in rows["sft"]
    )
    assert len(load_dataset(small_data / "train.jsonl").samples) == 64


EXPECTED = {
    "angle": lambda p: str(180 - p[0] - p[1]),
    "area": lambda p: str(p[0] * p[1]),
    "perimeter": lambda p: str(2 * (p[0] + p[1])),
    "circle": lambda p: f"${p[0] ** 2}\\pi$",
    "bar_max": lambda p: "ABC"[p.index(max(p))],
    "bar_value": lambda p: str(p[p[3]]),
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_answer_follows_from_its_figure(kind):
    rng = random.Random(11)
    for _ in range(20):
        _, fig = make_figure(rng, kind)
        ans = fig["answer"]
        assert ans == EXPECTED[kind](fig["params"])
        meta = {"choices": fig["choices"]} if "choices" in fig else {}
        target = completion(fig["solution"], ans)
        assert _score(target, ans, **meta).score == 1.0
        x = RewardInput(id="geo-f", response=target, reference=ans)
        assert format_think_answer([x])[0].score == 1.0


def test_reward_routes_choices_to_mc_letter_and_numbers_to_math_verify():
    abc = {"choices": ["A", "B", "C"]}
    assert _score("<think>A=1 B=4 C=2</think><answer>B</answer>", "B", **abc).score == 1.0
    assert _score("<answer>C</answer>", "B", **abc).score == 0.0
    assert _score("<answer>$9\\pi$</answer>", "$9\\pi$").score == 1.0
    assert _score("<answer>9</answer>", "$9\\pi$").score == 0.0
    assert _score("<answer>$4\\pi$</answer>", "$9\\pi$").score == 0.0
    assert _score("<answer>60</answer>", "60").parts == {"format": 1.0, "correct": 1.0}
    # a mixed batch keeps each result at its sample's position
    batch = [
        RewardInput(id="a", response="<answer>12</answer>", reference="12"),
        RewardInput(id="b", response="<answer>A</answer>", reference="B", metadata=abc),
        RewardInput(id="c", response="<answer>8</answer>", reference="12"),
        RewardInput(id="d", response="<answer>B</answer>", reference="B", metadata=abc),
    ]
    assert [r.score for r in REWARD(batch)] == [1.0, 0.0, 0.0, 1.0]


def test_convert_geometry3k_real_problem_folders(tmp_path):
    out = convert_geometry3k(GEO3K, tmp_path / "g3k" / "train.jsonl")
    rows = _rows(out)
    assert [r["id"] for r in rows] == ["geometry3k-train-11", "geometry3k-train-12", "geometry3k-train-13"]
    assert [r["answer"] for r in rows] == ["D", "B", "A"]
    assert rows[1]["metadata"]["choices"] == ["12", "13", "14", "15"]
    assert rows[1]["metadata"]["problem_type_graph"] == ["Circle"]
    assert "Find x. Choices: A. 12 B. 13 C. 14 D. 15." in rows[1]["prompt"]
    for r, pid in zip(rows, (11, 12, 13)):
        copied = (out.parent / r["images"][0]).read_bytes()
        assert copied == (GEO3K / "train" / str(pid) / "img_diagram.png").read_bytes()
    samples = load_dataset(out).samples
    assert len(samples) == 3 and Path(samples[0].images[0]).is_file()
    meta = rows[0]["metadata"]
    assert _score("<answer>D</answer>", "D", **meta).score == 1.0
    assert _score("<answer>80</answer>", "D", **meta).score == 1.0  # option D's text
    assert _score("<answer>60</answer>", "D", **meta).score == 0.0
    # one problem folder, or a split folder, converts the same way
    one = _rows(convert_geometry3k(GEO3K / "train" / "12", tmp_path / "one.jsonl"))
    assert one[0]["answer"] == "B" and one[0]["metadata"]["source_id"] == "12"


def test_convert_geometry3k_names_the_bad_folder(tmp_path):
    bad = tmp_path / "train" / "7"
    shutil.copytree(GEO3K / "train" / "12", bad)
    data = json.loads((bad / "data.json").read_text())
    (bad / "data.json").write_text(json.dumps({**data, "answer": "E"}))
    with pytest.raises(ConvertError, match=r"7/data.json: answer 'E' is not a letter among the 4 choices"):
        convert_geometry3k(tmp_path, tmp_path / "out.jsonl")
    (bad / "data.json").write_text(json.dumps({k: v for k, v in data.items() if k != "choices"}))
    with pytest.raises(ConvertError, match="missing choices"):
        convert_geometry3k(tmp_path, tmp_path / "out.jsonl")
    (bad / "data.json").write_text(json.dumps(data))
    (bad / "img_diagram.png").unlink()
    with pytest.raises(ConvertError, match="img_diagram.png not found"):
        convert_geometry3k(tmp_path, tmp_path / "out.jsonl")
    with pytest.raises(ConvertError, match="no Geometry3k problem folders"):
        convert_geometry3k(tmp_path / "train" / "7" / "...", tmp_path / "out.jsonl")


@pytest.mark.parametrize(
    "variant, prompts, logged",
    [("tiny-mssr", 32, "mssr/rho"), ("tiny-vade", 4, "vade/p_mean")],
    ids=["mssr", "vade"],
)
def test_tiny_variant_smoke(variant, prompts, logged, small_data, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the configs name their reward file relative to the repository root
    run = tmp_path / "run"
    args = [
        "train",
        str(ROOT / "recipes" / "geometry" / f"{variant}.yaml"),
        "--output-dir",
        str(run),
        "--max-steps",
        "2",
        f"data.train={small_data / 'train.jsonl'}",
        f"data.eval={small_data / 'eval.jsonl'}",
        f"train.prompts_per_step={prompts}",
        "eval.max_samples=8",
        "eval.every=1",
        "train.progress=false",
    ]
    assert main(args) == 0
    rows = _rows(
        run / "metrics.jsonl"
    )  # every line: MSSR logs its tracker's init pass as a second step-0 row
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 1, 2]
    steps = [r for r in rows if r["step"] > 0 and "reward/mean" in r]
    assert len(steps) == 2 and all(logged in r and "rollout/groups_with_signal" in r for r in steps)
    assert all(r["reward/format_think_answer"] > 0 for r in steps)  # the warm start writes the format
    assert _rows(run / "rollouts.jsonl")
    assert (run / "report.html").is_file()
    assert "held-out accuracy: start" in capsys.readouterr().out
