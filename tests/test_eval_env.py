"""Env benchmarks (mmrl/eval/episodic.py: ``zoom``, ``gui_agent``) through ``mmrl eval`` and ``mmrl compare``, and
in-training validation with ``rollout.env`` (mmrl/train/validation.py).

The tiny model answers with near-random text, so its runs check that the metrics are what the rows written say
(success, pooled step accuracy, turns, returns, ends) and that resume regenerates only the missing items. Exact
numbers come from a scripted engine: each turn's completion is a given text (the env's oracle actions, or wrong
ones), so the env's own judgement of known actions must come out as accuracy and step accuracy 1 or 0.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

import mmrl.eval.runner as runner
from mmrl.cli import main
from mmrl.config import Config, EpisodeConfig, ModelConfig, from_dict
from mmrl.data import load_dataset
from mmrl.distributed import Dist
from mmrl.eval.episodic import episode_summary
from mmrl.model.policy import Policy
from mmrl.rollout.base import Completion, RolloutEngine
from mmrl.rollout.episodes import ENDS
from mmrl.rollout.hf import HFEngine
from mmrl.rollout.observations import end_of_turn
from mmrl.train.collect import Collector
from mmrl.train.validation import Validator

TINY = str(Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl")
PIXELS = ["min_pixels=3136", "max_pixels=3136"]  # the zoom recipe's tiny budget: 56 x 56 model pixels
MODEL = ["--model", TINY, "--no-progress", "device=cpu", *PIXELS]
WRONG = ["hello", "hello", "<answer>zz</answer>"]  # two invalid actions and a wrong answer (codes are digits)


class ScriptEngine(RolloutEngine):
    """An engine that writes given texts: ``scripts[sample id][k]`` is turn k of that sample's episodes. The episodes
    of one sample run the same script in step, so one generate call is one turn of each sample it names."""

    def __init__(self, policy: Policy, scripts: dict[str, list[str]]):
        self.tokenizer, self.marker = policy.tokenizer, end_of_turn(policy)[0]
        self.scripts, self.turns = scripts, Counter()

    def generate(self, prompts, params):
        turn = {}
        for p in prompts:
            if p.sample_id not in turn:
                turn[p.sample_id] = self.turns[p.sample_id]
                self.turns[p.sample_id] += 1
        out = []
        for p in prompts:
            text = self.scripts[p.sample_id][turn[p.sample_id]]
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.marker]
            out.append([Completion(ids, text, [0.0] * len(ids), "stop") for _ in range(params.n)])
        return out

    def sync_weights(self) -> None:
        return None


@pytest.fixture(scope="module")
def zoom_data(tmp_path_factory) -> Path:
    from mmrl.recipes.zoom.data import build_tiny

    return build_tiny(tmp_path_factory.mktemp("zoom"), n_train=1, n_eval=4)["eval"]


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.from_pretrained(ModelConfig(path=TINY, device="cpu", min_pixels=3136, max_pixels=3136))


def _oracle(policy: Policy, sample) -> list[str]:
    """Zoom on the red box (its target box in the model's pixels, 2 px larger), then the right answer."""
    encoded = policy.encode(sample)
    s = encoded.model_image_sizes[0][0] / encoded.image_sizes[0][0]
    x1, y1, x2, y2 = sample.metadata["target_box"]
    box = [round(x1 * s) - 2, round(y1 * s) - 2, round(x2 * s) + 2, round(y2 * s) + 2]
    return [f"zoom({', '.join(map(str, box))})", f"<answer>{sample.answer}</answer>"]


@pytest.fixture(scope="module")
def scripts(policy, zoom_data) -> dict[str, list[str]]:
    """The first two records answered by the oracle, the last two by WRONG."""
    samples = load_dataset(zoom_data).samples
    return {s.id: _oracle(policy, s) if i < 2 else WRONG for i, s in enumerate(samples)}


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def _metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def _zoom(data: Path, out: Path, *extra: str) -> int:
    return main(
        ["eval", "--benchmark", "zoom", "--data", str(data), "--output-dir", str(out), *MODEL, *extra]
    )


def _recomputed(rows: list[dict]) -> dict[str, float]:
    """The metrics recomputed from the rows by hand (one episode per item)."""
    hits = [t["target_hit"] for r in rows for t in r["turns"] if t["target_hit"] is not None]
    out = {
        "accuracy": sum(r["return"] > 0 for r in rows) / len(rows),
        "turns_mean": sum(len(r["turns"]) for r in rows) / len(rows),
        "return_mean": sum(r["return"] for r in rows) / len(rows),
        "success": sum(r["correct"] for r in rows) / len(rows),
        "invalid_frac": sum(bool(t["info"].get("invalid")) for r in rows for t in r["turns"])
        / max(1, sum(len(r["turns"]) for r in rows)),
        "errors": float(sum(r["end"] == "error" for r in rows)),
    }
    out |= {f"end/{e}": sum(r["end"] == e for r in rows) / len(rows) for e in ENDS}
    return out | ({"step_accuracy": sum(hits) / len(hits)} if hits else {})


@pytest.fixture
def asked(monkeypatch):
    """The sample ids the HF engine is asked to generate for, every turn."""
    seen: list[str] = []
    original = HFEngine.generate

    def spy(self, prompts, params):
        seen.extend(p.sample_id for p in prompts)
        return original(self, prompts, params)

    monkeypatch.setattr(HFEngine, "generate", spy)
    return seen


def _scripted(monkeypatch, scripts: dict[str, list[str]]) -> None:
    monkeypatch.setattr(runner, "make_engine", lambda name, policy, batch_size: ScriptEngine(policy, scripts))


# ---------------------------------------------------------------------------------------------- mmrl eval


def test_zoom_with_the_tiny_model_reports_what_its_rows_say(zoom_data, tmp_path, capsys, asked):
    """Greedy episodes of the tiny model: the rows hold each item's turns, and every metric is what they say;
    a killed run resumes with only the missing items (a runtime option may change), other options may not."""
    out = tmp_path / "zoom"
    assert _zoom(zoom_data, out, "max_new_tokens=12", "max_turns=3", "env_workers=1") == 0
    rows, m = _rows(out), _metrics(out)
    ids = [s.id for s in load_dataset(zoom_data).samples]
    assert [r["id"] for r in rows] == ids and m["items"] == 4 and m["benchmark"] == "zoom"
    for r in rows:
        assert r["correct"] == (r["return"] > 0) and 1 <= len(r["turns"]) <= 3 and r["end"] in ENDS
        assert r["end"] != "max_turns" or len(r["turns"]) == 3
        for t in r["turns"]:
            assert set(t) == {
                "action",
                "reward",
                "state_key",
                "target_hit",
                "finish_reason",
                "images",
                "info",
            }
            assert t["target_hit"] in (True, False) and "target_hit" not in t["info"]
            assert all((out / p).is_file() for p in t["images"])  # relative to the output folder
    expected = _recomputed(rows)
    assert m["accuracy"] == pytest.approx(expected.pop("accuracy"))
    assert m["summary"] == pytest.approx(expected) and "step_accuracy" in m["summary"]
    assert "| step_accuracy |" in (out / "metrics.md").read_text()
    assert f"zoom: accuracy {m['accuracy']:.4f} on 4 items  step_accuracy" in capsys.readouterr().out
    assert set(asked[:4]) == set(ids)  # the first turn of every item in one call

    full = (out / "predictions.jsonl").read_text().splitlines(keepends=True)
    (out / "predictions.jsonl").write_text("".join(full[:2]) + full[2][:30])  # killed while writing row 3
    asked.clear()
    assert _zoom(zoom_data, out, "max_new_tokens=12", "max_turns=3", "env_workers=0") == 0
    assert set(asked) == set(ids[2:])  # only the missing items, on every turn
    assert (out / "predictions.jsonl").read_text().splitlines(keepends=True) == full  # greedy: the same rows
    assert _metrics(out)["settings"]["options"]["env_workers"] == 0
    capsys.readouterr()
    assert _zoom(zoom_data, out, "max_new_tokens=12", "max_turns=2", "env_workers=1") == 2
    assert "holds an evaluation with different options" in capsys.readouterr().err


def test_oracle_actions_score_one_and_wrong_ones_zero(zoom_data, scripts, tmp_path, monkeypatch, capsys):
    """Known actions through the env: the oracle's items succeed with every step on target, WRONG's fail with none;
    step accuracy is pooled over steps (4 of 10 here, where the mean over items would be 0.5). ``mmrl compare``
    pairs the items by id."""
    _scripted(monkeypatch, scripts)
    both = tmp_path / "both"
    assert _zoom(zoom_data, both, "env_workers=1") == 0
    rows, m = _rows(both), _metrics(both)
    assert [r["correct"] for r in rows] == [True, True, False, False]
    assert [[t["target_hit"] for t in r["turns"]] for r in rows] == [[True, True]] * 2 + [[False] * 3] * 2
    assert [r["return"] for r in rows] == [1.0, 1.0, 0.0, 0.0] and {r["end"] for r in rows} == {"done"}
    assert [t["info"]["action"] for t in rows[0]["turns"]] == ["zoom", "answer"]
    assert len(rows[0]["turns"][0]["images"]) == 1 and rows[0]["turns"][1]["images"] == []
    assert m["accuracy"] == 0.5
    assert m["summary"] == pytest.approx(
        {"success": 0.5, "step_accuracy": 0.4, "turns_mean": 2.5, "return_mean": 0.5, "invalid_frac": 0.4}
        | {"errors": 0.0, "end/done": 1.0}
        | {f"end/{e}": 0.0 for e in ENDS if e != "done"}
    )

    right = tmp_path / "right" / "zoom"  # the first two items: the oracle's
    assert _zoom(zoom_data, right, "env_workers=1", "--limit", "2") == 0
    assert _metrics(right)["accuracy"] == 1.0 and _metrics(right)["summary"]["step_accuracy"] == 1.0
    _scripted(monkeypatch, dict.fromkeys(scripts, WRONG))
    wrong = tmp_path / "wrong" / "zoom"
    assert _zoom(zoom_data, wrong, "env_workers=1", "--limit", "2") == 0
    assert _metrics(wrong)["accuracy"] == 0.0 and _metrics(wrong)["summary"]["step_accuracy"] == 0.0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "right"), str(tmp_path / "wrong"), "--resamples", "200"]) == 0
    overall = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| zoom | all |"))
    assert [c.strip() for c in overall.strip("|").split("|")][2:6] == ["2", "1.0000", "0.0000", "-1.0000*"]


def test_samples_give_lists_per_item(zoom_data, scripts, tmp_path, monkeypatch):
    """--samples 2: two episodes per item, each per-episode key a list of two; pass@k over successes."""
    _scripted(monkeypatch, scripts)
    out = tmp_path / "k2"
    assert _zoom(zoom_data, out, "env_workers=1", "--samples", "2") == 0
    rows, m = _rows(out), _metrics(out)
    assert all(len(r[k]) == 2 for r in rows for k in ("correct", "return", "end", "turns"))
    assert [r["correct"] for r in rows] == [[True, True]] * 2 + [[False, False]] * 2
    assert m["accuracy"] == 0.5 and m["pass@k"]["pass@2"] == 0.5
    assert m["summary"]["step_accuracy"] == pytest.approx(0.4) and m["summary"]["turns_mean"] == 2.5


@pytest.mark.parametrize(
    "extra, message",
    [
        (["env_options={max_cals: 2}"], "zoom option env_options: env 'zoom': unknown option 'max_cals'"),
        (["max_turns=0"], "zoom option max_turns must be at least 1"),
        (["--predictions", "p.jsonl"], "give --model PATH"),
    ],
)
def test_env_benchmark_errors_are_one_line(zoom_data, tmp_path, capsys, extra, message):
    assert _zoom(zoom_data, tmp_path / "o", *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_bad_record_names_its_line(tmp_path, capsys):
    (tmp_path / "eval.jsonl").write_text(
        json.dumps({"id": "q", "prompt": "<image>?", "images": ["no.png"]}) + "\n"
    )
    args = [
        "eval",
        "--benchmark",
        "zoom",
        "--data",
        str(tmp_path / "eval.jsonl"),
        "--output-dir",
        str(tmp_path / "o"),
    ]
    assert main([*args, *MODEL]) == 2
    err = capsys.readouterr().err
    assert "sample 'q': image file not found" in err and f"{tmp_path / 'eval.jsonl'}:1" in err


def test_summary_pools_steps_and_keeps_unknown_ends():
    """Steps without target_hit do not count; an episode without turns counts in turns_mean; lists of K."""
    turn = {"action": "a", "reward": 0.0, "finish_reason": "stop", "images": [], "info": {}}
    rows = [
        {"id": "a", "correct": [True, False], "return": [1.0, 0.0], "end": ["done", "error"],
         "turns": [[turn | {"target_hit": True}, turn | {"target_hit": None}], []]},
        {"id": "b", "correct": [False, False], "return": [0.0, 0.0], "end": ["max_turns", "odd"],
         "turns": [[turn | {"target_hit": False}] * 3, [turn | {"target_hit": None}]]},
    ]  # fmt: skip
    s = episode_summary(rows)
    assert s["step_accuracy"] == 0.25 and s["turns_mean"] == 1.5 and s["return_mean"] == 0.25
    assert s["success"] == 0.25 and s["errors"] == 1.0 and s["invalid_frac"] == 0.0
    assert [s[f"end/{e}"] for e in (*ENDS, "odd")] == [0.25, 0.25, 0.25, 0.0, 0.0, 0.25]
    no_hits = [
        {"id": "c", "correct": False, "return": 0.0, "end": "done", "turns": [turn | {"target_hit": None}]}
    ]
    assert "step_accuracy" not in episode_summary(no_hits)


def test_a_prediction_file_cannot_be_judged_without_the_env(zoom_data, tmp_path, capsys):
    args = ["eval", "--benchmark", "zoom", "--data", str(zoom_data), "--output-dir", str(tmp_path / "o")]
    assert main([*args, "--predictions", str(tmp_path / "p.jsonl")]) == 2
    assert "is judged by its env 'zoom' during episodes" in capsys.readouterr().err


@pytest.mark.chromium
def test_gui_agent_oracle_episodes_succeed(tmp_path, monkeypatch, capsys):
    """Two generated apps: the env's oracle actions (teacher-forced episodes give their texts) played back by the
    scripted engine succeed with every step the oracle's; breakdowns by app kind and task."""
    from mmrl.envs import EnvPool
    from mmrl.recipes.gui_agent.data import build
    from mmrl.rollout import SamplingParams
    from mmrl.rollout.episodes import run_episodes

    data = build(tmp_path / "data", n_train=0, n_eval=2, n_sft=0)["eval"]
    samples = load_dataset(data).samples
    pixels = ["min_pixels=3136", "max_pixels=50176"]
    pol = Policy.from_pretrained(ModelConfig(path=TINY, device="cpu", min_pixels=3136, max_pixels=50176))
    with EnvPool(tmp_path / "teacher", workers=1, timeout_s=60) as pool:
        trajs = run_episodes(
            pol,
            None,
            samples,
            SamplingParams(),
            pool=pool,
            env_name="browser_app",
            settings=EpisodeConfig(max_turns=8),
            teacher="oracle",
        )
    scripts = {s.id: [step.action for step in row[0].steps] for s, row in zip(samples, trajs)}
    assert all(row[0].end == "done" and row[0].episode_return == 1.0 for row in trajs)
    _scripted(monkeypatch, scripts)
    out = tmp_path / "gui"
    args = [
        "eval",
        "--benchmark",
        "gui_agent",
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--model",
        TINY,
    ]
    assert main([*args, "--no-progress", "device=cpu", *pixels, "env_workers=1"]) == 0
    rows, m = _rows(out), _metrics(out)
    assert [len(r["turns"]) for r in rows] == [len(scripts[s.id]) for s in samples]
    assert all(t["target_hit"] and t["info"]["valid"] for r in rows for t in r["turns"])
    assert m["accuracy"] == 1.0 and m["summary"]["step_accuracy"] == 1.0 and m["summary"]["end/done"] == 1.0
    assert set(m["breakdowns"]) == {"app", "task"}
    assert sorted(m["breakdowns"]["app"]) == sorted(s.metadata["app"] for s in samples)


# ---------------------------------------------------------------------------------------------- validation


def _config(**sections) -> Config:
    model = {"path": TINY, "device": "cpu", "min_pixels": 3136, "max_pixels": 3136}
    return from_dict(Config, {"model": model, **sections})


def _validator(cfg: Config, policy: Policy, engine, samples, out: Path | None, dist=None) -> Validator:
    collector = Collector(cfg, [], policy, engine, None, None, None, dist or Dist())
    return Validator(cfg, samples, collector, out_dir=out)


def test_validator_runs_env_episodes(zoom_data, policy, scripts, tmp_path):
    """rollout.env: one greedy episode per held-out record in a pool under DIR/episodes-eval, the metrics of mmrl
    eval's env benchmarks; each evaluation replaces the previous one's files; close() stops the pool."""
    cfg = _config(
        rollout={"env": "zoom", "episode": {"max_turns": 5, "env_workers": 1}, "max_new_tokens": 16},
        eval={"group_by": "code"},
    )
    samples = load_dataset(zoom_data).samples
    v = _validator(cfg, policy, ScriptEngine(policy, scripts), samples, tmp_path)
    m = v()
    assert m == pytest.approx(
        {"eval/accuracy": 0.5, "eval/step_accuracy": 0.4, "eval/turns_mean": 2.5, "eval/return_mean": 0.5}
        | {"eval/success": 0.5, "eval/invalid_frac": 0.4, "eval/errors": 0.0}  # WRONG's two invalid actions
        | {f"eval/end/{e}": float(e == "done") for e in ENDS}
        | {f"eval/accuracy/{s.metadata['code']}": float(i < 2) for i, s in enumerate(samples)}
    )
    crops = sorted((tmp_path / "episodes-eval").rglob("*.png"))
    assert len(crops) == 2  # the oracle's two zooms
    v.collector.engine = ScriptEngine(policy, scripts)
    assert v() == m
    assert sorted((tmp_path / "episodes-eval").rglob("*.png")) != crops  # new episode folders, old ones gone
    assert len(list((tmp_path / "episodes-eval").rglob("*.png"))) == 2
    pool = v.pool
    v.close()
    assert v.pool is None
    with pytest.raises(RuntimeError, match="closed"):
        pool.step({})


class _RankOf2:
    """Rank ``rank`` of two processes; rank 0's gather receives ``theirs`` as rank 1's object."""

    world = 2
    split = Dist.split

    def __init__(self, rank: int, theirs=None):
        self.rank, self.theirs, self.sent = rank, theirs, None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather(self, obj):
        self.sent = obj
        return [obj, self.theirs] if self.rank == 0 else [[], obj]  # rank 0's part unused on rank 1


def test_validator_shares_records_over_ranks(zoom_data, policy, scripts, tmp_path):
    """Two ranks: each runs its contiguous share in its own pool folder; rank 0's metrics over the gathered rows
    equal one process's, rank 1 returns {}."""
    cfg = _config(
        rollout={"env": "zoom", "episode": {"max_turns": 5, "env_workers": 0}, "max_new_tokens": 16}
    )
    samples = load_dataset(zoom_data).samples
    second = _validator(cfg, policy, ScriptEngine(policy, scripts), samples, tmp_path, _RankOf2(1))
    assert second() == {}
    rows = second.collector.dist.sent
    assert [r["id"] for r in rows] == [s.id for s in samples[2:]]
    first = _validator(cfg, policy, ScriptEngine(policy, scripts), samples, tmp_path, _RankOf2(0, rows))
    alone = _validator(cfg, policy, ScriptEngine(policy, scripts), samples, tmp_path / "alone")
    assert first() == alone() and first.collector.dist.sent[0]["id"] == samples[0].id
    assert {p.name for p in (tmp_path / "episodes-eval").iterdir()} == {"rank-0", "rank-1"}
    for v in (first, second, alone):
        v.close()


def test_validator_equals_mmrl_eval(zoom_data, policy, tmp_path):
    """The tiny model's greedy episodes: validation with rollout.env, and with eval.benchmark: zoom, log the
    numbers mmrl eval reports for the same records and settings."""
    out = tmp_path / "eval"
    assert _zoom(zoom_data, out, "max_new_tokens=12", "max_turns=3", "env_workers=1") == 0
    m = _metrics(out)
    expected = {"eval/accuracy": m["accuracy"]} | {f"eval/{k}": v for k, v in m["summary"].items()}
    samples = load_dataset(zoom_data).samples
    engine = HFEngine(policy)
    env = _config(
        rollout={"env": "zoom", "episode": {"max_turns": 3, "env_workers": 1}, "max_new_tokens": 12}
    )
    bench = _config(
        rollout={"max_new_tokens": 12},
        eval={"benchmark": "zoom", "benchmark_data": str(zoom_data), "benchmark_options": {"max_turns": 3}},
    )
    for cfg in (env, bench):
        v = _validator(cfg, policy, engine, samples, None)
        assert v() == pytest.approx(expected)
        root = v.pool.root
        v.close()
        assert not root.exists()  # the temporary folder of a validator without a run folder is removed
