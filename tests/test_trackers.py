"""Experiment trackers (mmrl/run/trackers.py): a real tiny training logs to TensorBoard, W&B (offline), MLflow (its local
SQLite store) and SwanLab (offline), and what each wrote, read back with the library's own readers and record
formats, holds the numbers of metrics.jsonl and the logged rollouts' images; a resume continues each tracker's run;
an unknown or uninstalled tracker is refused at pre-flight in one line naming the fix."""

import importlib.util
import json
import re
import struct
from pathlib import Path

import pytest
from PIL import Image

from mmrl.cli import main
from mmrl.config import ConfigError, load_config
from mmrl.run import trackers
from mmrl.run.metrics import MetricsLogger, read_metrics, rollout_images
from mmrl.train.checks import check_config

TINY = Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl"
ALL = ["tensorboard", "wandb", "mlflow", "swanlab"]
KEYS = ("reward/mean", "loss", "lr")


@pytest.fixture(autouse=True)
def local_only(tmp_path, monkeypatch):
    """Nothing reaches a server or the home directory, whatever the machine's environment says."""
    for var in ("WANDB_MODE", "WANDB_API_KEY", "SWANLAB_MODE", "SWANLAB_API_KEY", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "SWANLAB_SAVE_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home" / var.lower()))


@pytest.fixture
def recipe(tmp_path):
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=8, n_eval=4, seed=5)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl}}
rollout: {{n: 2, max_new_tokens: 3, batch_size: 4}}
optim: {{lr: 0.01, warmup_steps: 2, micro_batch_size: 4}}
rewards: [{{name: exact_match}}]
train: {{prompts_per_step: 2, progress: false, seed: 3}}
"""
    )
    return cfg


def _records(path: Path) -> list[bytes]:
    """The records of a W&B (``.wandb``) or SwanLab (``.swanlab``) run file. Both write LevelDB's log format after a
    7-byte file header: 32 KiB blocks of chunks, each with a 7-byte header (crc, length, type: full, first, middle,
    last); their sync commands read them back the same way."""
    block, data, pos, out, part = 32768, path.read_bytes(), 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        part += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            out.append(part)
            part = b""
    return out


def _wandb_history(out: Path) -> dict[int, dict]:
    from wandb.proto.wandb_internal_pb2 import Record

    [run_file] = sorted(out.glob("wandb/offline-run-*/run-*.wandb"))
    history: dict[int, dict] = {}
    for data in _records(run_file):
        rec = Record()
        rec.ParseFromString(data)
        if rec.HasField("history"):
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            history.setdefault(int(row["_step"]), {}).update(row)
    return history


def _swanlab_log(out: Path) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, list[str]]]]:
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    [run_file] = sorted(out.glob("swanlog/run-*/run-*.swanlab"))
    scalars: dict[int, dict[str, float]] = {}
    media: dict[int, dict[str, list[str]]] = {}
    for data in _records(run_file):
        rec = Record()
        rec.ParseFromString(data)
        if rec.HasField("scalar"):
            scalars.setdefault(rec.scalar.step, {})[rec.scalar.key] = rec.scalar.value.number
        elif rec.HasField("media"):
            media.setdefault(rec.media.step, {})[rec.media.key] = [i.caption for i in rec.media.value.items]
    return scalars, media


def test_a_tiny_training_logs_the_same_numbers_and_the_rollout_images_to_every_tracker(recipe, tmp_path):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    args = ["train", str(recipe), "--output-dir", str(out), "--max-steps", "2", f"train.trackers={ALL}"]
    assert main(args) == 0
    rows = {r["step"]: r for r in read_metrics(out / "metrics.jsonl")}
    assert sorted(rows) == [1, 2]
    ids = json.loads((out / "trackers.json").read_text())
    assert sorted(ids) == ["mlflow", "swanlab", "wandb"]
    captions: dict[int, str] = {}  # each step's first logged group, shown as rollouts/0
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        captions.setdefault(json.loads(line)["step"], json.loads(line)["id"])

    tb = EventAccumulator(str(out / "tensorboard"), size_guidance={"images": 0, "tensors": 0})
    tb.Reload()
    for key in KEYS:  # TensorBoard keeps float32
        assert [(e.step, e.value) for e in tb.Scalars(key)] == [
            (s, pytest.approx(rows[s][key], rel=1e-6)) for s in (1, 2)
        ]
    assert {"rollouts/0/input", "rollouts/1/input"} <= set(tb.Tags()["images"])
    assert [(e.step, e.width, e.height) for e in tb.Images("rollouts/0/input")] == [(1, 56, 56), (2, 56, 56)]
    texts = tb.Tensors("rollouts/0/input/caption/text_summary")  # torch's add_text appends /text_summary
    assert [(e.step, e.tensor_proto.string_val[0].decode().split(" | ")[0]) for e in texts] == list(
        captions.items()
    )

    history = _wandb_history(out)
    assert sorted(history) == [1, 2] and history[1]["_step"] == 1
    for s in (1, 2):
        assert {k: history[s][k] for k in KEYS} == {k: rows[s][k] for k in KEYS}  # exact: both are doubles
        assert history[s]["rollouts/0/input/_type"] == "image-file"
        assert history[s]["rollouts/0/input/caption"].startswith(captions[s] + " | answer: ")
        [media] = out.glob(f"wandb/offline-run-*/files/{history[s]['rollouts/0/input/path']}")
        assert Image.open(media).size == (56, 56)

    client = MlflowClient(f"sqlite:///{out / 'mlflow' / 'mlflow.db'}")
    run = client.get_run(ids["mlflow"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    for key in KEYS:
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] == [
            (s, rows[s][key]) for s in (1, 2)
        ]
    pngs = [a.path for a in client.list_artifacts(run.info.run_id, "images") if a.path.endswith(".png")]
    for s in (1, 2):
        assert [p for p in pngs if p.startswith(f"images/rollouts~0~input+step+{s}+")]
    assert (out / "mlflow" / "artifacts").is_dir()  # inside the run directory

    scalars, media = _swanlab_log(out)
    assert sorted(scalars) == [1, 2]
    for s in (1, 2):
        assert {k: scalars[s][k] for k in KEYS} == {k: rows[s][k] for k in KEYS}
        [caption] = media[s]["rollouts/0/input"]
        assert caption.startswith(captions[s] + " | answer: ")


def test_resume_continues_each_trackers_run_and_tensorboard_has_no_step_twice(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def run(steps, purge_step):
        log = MetricsLogger(tmp_path, ALL, purge_step=purge_step, config={"train": {"seed": 0}})
        for s in steps:
            log.log({"step": s, "reward/mean": s / 10})
        log.close()

    run([1, 2, 3], None)  # crashed after logging step 3, with its last checkpoint at step 2
    first = json.loads((tmp_path / "trackers.json").read_text())
    run([3, 4], 3)
    assert json.loads((tmp_path / "trackers.json").read_text()) == first
    tb = EventAccumulator(str(tmp_path / "tensorboard"))
    tb.Reload()
    assert [e.step for e in tb.Scalars("reward/mean")] == [1, 2, 3, 4]
    wandb_runs = sorted(
        tmp_path.glob("wandb/offline-run-*")
    )  # offline, a resumed run is a second part, same id
    assert len(wandb_runs) == 2 and all(p.name.endswith("-" + first["wandb"]) for p in wandb_runs)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    # MLflow keeps a point once logged: step 3 is there from both parts (a seeded resume logs the same value)
    assert [m.step for m in client.get_metric_history(first["mlflow"], "reward/mean")] == [1, 2, 3, 3, 4]
    assert [p.name for p in sorted(tmp_path.glob("swanlog/run-*"))][-1].endswith(first["swanlab"])


def test_a_failed_run_is_marked_failed(tmp_path):
    from mlflow.tracking import MlflowClient

    log = MetricsLogger(tmp_path, ["mlflow"])
    with pytest.raises(RuntimeError):
        try:
            log.log({"step": 1, "loss": 1.0})
            raise RuntimeError("the update diverged")
        finally:
            log.close()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    assert (
        client.get_run(json.loads((tmp_path / "trackers.json").read_text())["mlflow"]).info.status == "FAILED"
    )


def test_rollout_images_are_the_inputs_and_the_kept_renders_of_the_best_and_worst_response(tmp_path):
    Image.new("RGB", (800, 400), "red").save(tmp_path / "in.png")
    for j in range(
        3
    ):  # where a rendering reward keeps them: renders/step-N/<stem>-<j>/<stem>-{response,reference}.png
        folder = tmp_path / "renders" / "step-5" / f"t_1-{j}"
        folder.mkdir(parents=True)
        Image.new("RGB", (100, 50), (j * 100, 0, 0)).save(folder / "t_1-response.png")
        Image.new("RGB", (100, 50), "white").save(folder / "t_1-reference.png")
    responses = [
        {"text": "a" * 500, "reward": 0.5},
        {"text": "best", "reward": 0.9},
        {"text": "x", "reward": None},
    ]
    rows = [
        {
            "id": "t/1",
            "answer": "\\begin{tabular}",
            "images": [str(tmp_path / "in.png")],
            "responses": responses,
        },
        {"id": "gone", "answer": {"x": 1}, "images": ["missing.png"], "responses": responses[:1]},
    ]
    images = {im.key: im for im in rollout_images(tmp_path, 5, rows)}
    assert sorted(images) == [
        "rollouts/0/best_render",
        "rollouts/0/input",
        "rollouts/0/target_render",
        "rollouts/0/worst_render",
    ]  # the second group's image file is gone and it kept no renders: nothing to show
    assert images["rollouts/0/input"].image.size == (384, 192)  # a thumbnail
    assert images["rollouts/0/input"].caption == (
        "t/1 | answer: \\begin{tabular} | rewards: 0.50 0.90 -inf | best response 1 (reward 0.900): best"
    )
    assert images["rollouts/0/best_render"].image.getpixel((0, 0)) == (100, 0, 0)
    assert images["rollouts/0/worst_render"].image.getpixel((0, 0)) == (200, 0, 0)  # no reward ranks last
    assert images["rollouts/0/worst_render"].caption == "t/1: response 2 (reward -inf): x"


def test_tracker_names_options_and_packages_are_checked_before_anything_loads(
    recipe, tmp_path, monkeypatch, capsys
):
    def cfg(*overrides):
        return load_config(recipe, list(overrides))

    assert trackers.wanted(cfg("train.tensorboard=true", "train.trackers=[wandb]").train) == [
        "wandb",
        "tensorboard",
    ]
    check_config(cfg(f"train.trackers={ALL}", "train.tracker_options.wandb.project=p"))
    bad = {
        "train.trackers=[wandbb]": "train.trackers: unknown tracker 'wandbb'; did you mean 'wandb'?",
        "train.trackers=[mlflow, mlflow]": "train.trackers: a tracker is listed twice",
        "train.tracker_options.wandb.projct=p": "train.tracker_options.wandb: unknown option 'projct'; did you mean",
        "train.tracker_options.swanlab.mode=offline": "train.tracker_options.swanlab: 'swanlab' is not in train.trackers",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            check_config(cfg("train.trackers=[wandb]", override) if "options" in override else cfg(override))

    real = importlib.util.find_spec
    absent = {"wandb", "sqlalchemy"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in absent else real(name, *a)
    )
    with pytest.raises(ConfigError) as e:
        check_config(cfg("train.trackers=[wandb]"))
    assert str(e.value) == (
        "train.trackers: 'wandb' needs the Python package wandb: pip install wandb "
        "(every tracker's: pip install 'mmrl[trackers]')"
    )
    with pytest.raises(
        ConfigError, match=r"'mlflow' needs the Python package sqlalchemy: pip install sqlalchemy"
    ):
        check_config(cfg("train.trackers=[mlflow]"))
    check_config(
        cfg("train.trackers=[mlflow]", "train.tracker_options.mlflow.tracking_uri=http://mlflow:5000")
    )
    with pytest.raises(ImportError, match="pip install wandb"):  # opened without the pre-flight check
        MetricsLogger(tmp_path / "direct", ["wandb"])
    out = tmp_path / "run"
    assert main(["train", str(recipe), "--output-dir", str(out), "train.trackers=[tensorboard, wandb]"]) == 2
    err = capsys.readouterr().err
    assert "pip install wandb" in err and len(err.strip().splitlines()) == 1
    assert not (out / "metrics.jsonl").exists()
