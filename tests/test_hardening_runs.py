"""Runs, errors and data (issue 6, items 6-9 and 13): run directories that never mix or duplicate rows, pre-flight
errors in one line, checkpoints that always leave a complete copy, the logged learning rate, the prompt cache, exact
micro-batch accumulation; and the presets' estimator state surviving --resume exactly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmrl.cli import main
from mmrl.run.checkpoint import latest_checkpoint, save_checkpoint
from mmrl.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"


@pytest.fixture
def recipe(tmp_path):
    from mmrl.recipes.shapes.data import build

    build(tmp_path / "data", n_train=12, n_eval=4, seed=5)
    with (tmp_path / "data" / "train.jsonl").open("a") as f:
        f.write(json.dumps({"id": "broken", "prompt": "x <image>", "images": ["missing.png"]}) + "\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""
model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}
data: {{train: data/train.jsonl, on_bad_record: skip}}
rollout: {{n: 4, max_new_tokens: 3, batch_size: 8}}
optim: {{lr: 0.01, warmup_steps: 2, micro_batch_size: 8}}
rewards: [{{name: exact_match}}]
train: {{prompts_per_step: 2, save_every: 2, keep_checkpoints: 0, progress: false, seed: 3, tensorboard: true}}
"""
    )
    return cfg


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def test_existing_run_is_refused_unless_resumed_or_overwritten(recipe, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(recipe), "--output-dir", str(out), "--max-steps", "1"]) == 0
    capsys.readouterr()
    assert main(["train", str(recipe), "--output-dir", str(out), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert _steps(out / "metrics.jsonl") == [1]
    (out / "notes.txt").write_text("mine")
    assert main(["train", str(recipe), "--output-dir", str(out), "--max-steps", "1", "--overwrite"]) == 0
    assert _steps(out / "metrics.jsonl") == [1] and (out / "notes.txt").read_text() == "mine"


def test_resume_after_a_crash_has_no_duplicate_rows_and_a_finished_run_exits_0(recipe, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert main(["train", str(recipe), "--output-dir", str(out), "--max-steps", "3"]) == 0
    first = read_metrics(out / "metrics.jsonl")
    # a crash after step 3 was logged but before its checkpoint was written
    import shutil

    shutil.rmtree(out / "checkpoints" / "step-3")
    assert main(["train", str(recipe), "--output-dir", str(out), "--max-steps", "3", "--resume"]) == 0
    assert _steps(out / "metrics.jsonl") == [1, 2, 3]
    assert _steps(out / "rollouts.jsonl") == [1, 1, 2, 2, 3, 3]
    assert _steps(out / "discarded" / "metrics.jsonl") == [3]  # kept aside, never deleted
    again = read_metrics(out / "metrics.jsonl")
    assert again[2]["reward/mean"] == first[2]["reward/mean"] and again[2]["loss"] == first[2]["loss"]
    skipped = (out / "skipped.jsonl").read_text().splitlines()
    assert len(skipped) == 1 and json.loads(skipped[0])["id"] == "broken"
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2, 3]
    capsys.readouterr()
    assert main(["train", str(recipe), "--output-dir", str(out), "--max-steps", "3", "--resume"]) == 0
    assert "already finished at step 3" in capsys.readouterr().out
    assert _steps(out / "metrics.jsonl") == [1, 2, 3]


def test_logged_lr_is_the_rate_used_at_that_step(recipe, tmp_path):
    out = tmp_path / "run"
    assert main(["train", str(recipe), "--output-dir", str(out), "--max-steps", "3"]) == 0
    assert [r["lr"] for r in read_metrics(out / "metrics.jsonl")] == pytest.approx([0.005, 0.01, 0.01])


def test_wrong_reward_name_is_one_line_exit_2_before_torch(recipe, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(recipe.read_text().replace("exact_match", "exact_mtch"))
    code = (
        "import sys; from mmrl.cli import main; "
        f"rc = main(['train', {str(bad)!r}, '--output-dir', {str(tmp_path / 'r')!r}]); "
        "print('torch imported:', 'torch' in sys.modules); sys.exit(rc)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "did you mean 'exact_match'" in r.stderr
    assert "torch imported: False" in r.stdout
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sampler.options.pool=3", "sampler.options (uniform): unknown option 'pool'"),
        ("algo.advantage=grpoo", "algo.advantage: unknown advantage estimator 'grpoo'; did you mean 'grpo'?"),
        ("algo.loss_options.clip_lo=0.1", "unknown option 'clip_lo'; did you mean 'clip_low'?"),
        ("rollout.n=1", "needs at least 2 responses per prompt"),
        ("algo.loss_agg=token_mean", "did you mean 'token-mean'?"),
        ("algo.preset=mssrr", "unknown preset 'mssrr'; did you mean 'mssr'?"),
        ("rollout.engine=hff", "unknown rollout engine 'hff'"),
        ("model.path=/nope/model", "model.path not found: /nope/model"),
    ],
)
def test_config_errors_are_one_line_before_any_model_loads(recipe, tmp_path, capsys, override, message):
    out = tmp_path / "r"
    assert main(["train", str(recipe), "--output-dir", str(out), override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err
    assert not out.exists()  # refused before the run directory, data or model were touched


class _Saved:
    def save(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "weights").write_text("new")


def test_resaving_a_step_never_leaves_it_missing(tmp_path, monkeypatch):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    kw = dict(policy=_Saved(), optimizer=opt, scheduler=sched, state={"sampler": {}})
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 2, **kw)
    real = os.replace

    def crash_on_install(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_install)
    with pytest.raises(OSError):
        save_checkpoint(root, 2, **kw)
    monkeypatch.setattr(os, "replace", real)
    ck = latest_checkpoint(root)  # the previous copy, put back from step-2.old
    assert ck == root / "step-2" and (ck / "model" / "weights").read_text() == "new"
    assert json.loads((ck / "state.json").read_text())["step"] == 2


def test_prompt_cache_keys_by_content_and_is_bounded_in_bytes(tmp_path):
    from mmrl.rollout.prompt_cache import PromptCache, nbytes
    from mmrl.types import Sample

    def sample(colour, name):
        p = tmp_path / name
        Image.new("RGB", (28, 28), colour).save(p)
        return Sample("same-id", [{"role": "user", "content": [{"type": "image"}]}], [str(p)])

    calls = []

    def build(s):
        calls.append(s.images[0])
        return {"pixels": torch.full((256,), float(len(calls)))}  # 1 KiB

    cache = PromptCache(max_bytes=2048)
    a, b = sample((255, 0, 0), "a.png"), sample((0, 0, 255), "b.png")
    ea, eb = cache.get(a, build), cache.get(b, build)
    assert not torch.equal(ea["pixels"], eb["pixels"])  # one id, two contents: two entries
    assert cache.get(a, build) is ea and len(calls) == 2
    cache.get(sample((0, 255, 0), "c.png"), build)  # a third KiB evicts the least recently used (b)
    assert cache.bytes <= 2048 and len(cache) == 2
    cache.get(b, build)
    assert len(calls) == 4 and nbytes(ea) == 1024


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_accumulation_equals_the_full_mini_batch_gradient(tmp_path, agg):
    from mmrl.config import load_config
    from mmrl.model.policy import Policy
    from mmrl.train.update import PolicyUpdate, RolloutBatch
    from mmrl.types import Sample

    Image.new("RGB", (56, 56), (9, 99, 199)).save(tmp_path / "i.png")
    s = Sample(
        "q",
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}],
        [str(tmp_path / "i.png")],
    )
    comps = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15], [16, 17, 18, 19], [20]]
    grads = []
    for micro in (6, 2, 1):
        cfg = load_config(
            None,
            [
                f"model.path={TINY}",
                "model.max_pixels=3136",
                f"algo.loss_agg={agg}",
                f"optim.micro_batch_size={micro}",
                "algo.kl_coef=0.1",
                "algo.entropy_coef=0.01",
            ],
        )
        torch.manual_seed(0)
        pol = Policy.from_pretrained(cfg.model)
        ref = Policy.from_pretrained(cfg.model, trainable=False)
        p = pol.encode(s)
        opt = torch.optim.SGD(pol.model.parameters(), lr=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
        with torch.no_grad():
            old = pol.logprobs([p] * 6, comps)[0] + 0.05  # a policy that moved: ratios != 1, clipping active
            ref_lp = ref.logprobs([p] * 6, comps)[0] - 0.1
        batch = RolloutBatch.one_turn(
            [p] * 6, comps, 3, old, ref_logp=ref_lp, advantages=torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.0])
        )
        # the gradient the optimizer steps with (the update frees gradients after the step)
        params = list(pol.model.parameters())
        opt.register_step_pre_hook(
            lambda o, args, kwargs, params=params: grads.append(
                torch.cat([q.grad.flatten() for q in params if q.grad is not None])
            )
        )
        with pol.training():
            PolicyUpdate(cfg, pol, opt, sched, 1.0)(batch)
        assert all(q.grad is None for q in pol.model.parameters())  # freed after the optimizer step
    assert grads[0].abs().max() > 0
    for g in grads[1:]:
        assert torch.allclose(g, grads[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("preset", ["mssr", "dapo"])
def test_presets_train_and_resume_exactly(recipe, tmp_path, preset):
    """The estimator's state (MSSR's Beta tracker and KL window) and DAPO's dynamic sampling resume exactly."""
    extra = [
        f"algo.preset={preset}",
        "rollout.n=4" if preset == "dapo" else "rollout.n=1",
        "train.prompts_per_step=4",
        f"rewards=[{{name: {ROOT / 'tests' / 'reward_plugin_example.py'}:plain_length, options: {{scale: 0.1}}}}]",
        "train.tensorboard=false",
    ]
    if preset == "dapo":
        extra.append("algo.max_sampling_tries=20")
    full, split = tmp_path / "full", tmp_path / "split"
    assert main(["train", str(recipe), "--output-dir", str(full), "--max-steps", "4", *extra]) == 0
    assert (
        main(
            [
                "train",
                str(recipe),
                "--output-dir",
                str(split),
                "--max-steps",
                "2",
                "optim.schedule_steps=4",
                *extra,
            ]
        )
        == 0
    )
    assert (
        main(["train", str(recipe), "--output-dir", str(split), "--max-steps", "4", "--resume", *extra]) == 0
    )
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("time/", "sys/"))} for r in rows]  # noqa: E731
    a, b = strip(read_metrics(full / "metrics.jsonl")), strip(read_metrics(split / "metrics.jsonl"))
    assert a == b
    if preset == "mssr":
        assert a[0]["init/prompts"] == 12 and all("mssr/rho" in r for r in a[1:])
        state = json.loads((full / "checkpoints" / "step-4" / "state.json").read_text())
        assert state["advantage"] and state["last_kl"] is not None
    else:
        assert all(r["rollout/groups_with_signal"] == 1.0 for r in a)  # only informative groups kept


def test_rendering_rewards_without_landlock_are_refused_before_training(
    recipe, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("MMRL_SANDBOX_DISABLE_LANDLOCK", "1")
    monkeypatch.delenv("MMRL_ALLOW_UNCONFINED_RENDER", raising=False)
    out = tmp_path / "r"
    assert main(["train", str(recipe), "--output-dir", str(out), "rewards=[{name: latex_table}]"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "MMRL_ALLOW_UNCONFINED_RENDER=1" in err and "rewards[0] ('latex_table')" in err
    assert not out.exists()
