"""Asynchronous rollouts (rollout.max_staleness, mmrl.train.producer; docs/async.md#asynchronous-rollouts): an
in-flight weight copy between two decoding steps (tokens after it carry the new version and were drawn from the new
weights, tokens before it from the old); a k = 1 run trains on batches one version old, logs its staleness and
idle times, and a run killed with SIGKILL mid-update resumes drawing exactly the prompts of the uninterrupted run (none
lost, none twice); what the producer cannot do yet is refused at pre-flight."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from multiproc import ahead_then_killed_and_resumed, launch, rollout_ids, shapes_run_config
from PIL import Image

from mmrl.config import ConfigError, ModelConfig, RewardEntry, load_config
from mmrl.model.policy import Policy
from mmrl.rollout import HFEngine, SamplingParams
from mmrl.run.metrics import read_metrics
from mmrl.train.checks import check_async
from mmrl.types import Sample

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"


class _SyncAt:
    """A logits processor that, at decoding step ``at``, moves the trained weights and has the engine copy them in:
    an update landing between two decoding steps of a running request."""

    def __init__(self, engine: HFEngine, at: int):
        self.engine, self.at, self.calls = engine, at, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == self.at:
            with torch.no_grad():
                for p in self.engine.policy.model.parameters():
                    p.mul_(0.5)
            self.engine.sync_weights()
        return scores


def test_tokens_after_an_in_flight_update_carry_the_new_version_and_its_log_probs(tmp_path):
    pol = Policy.from_pretrained(ModelConfig(path=str(TINY), min_pixels=3136, max_pixels=3136))
    old = Policy.from_pretrained(ModelConfig(path=str(TINY), min_pixels=3136, max_pixels=3136))
    engine = HFEngine(pol, batch_size=2, own_weights=True)
    img = tmp_path / "i.png"
    Image.new("RGB", (56, 56), (200, 30, 30)).save(img)
    s = Sample(
        "q", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}], [img]
    )
    prompt = pol.encode(s)
    at = (
        4  # the weights change after the 4th forward: tokens 0-3 come from version 0, the rest from version 1
    )
    chain = engine._processors

    def no_eos(input_ids, scores):  # after the recorder, before the draw: 10 tokens, log-probs unchanged
        scores[:, pol.eos_ids] = float("-inf")
        return scores

    def with_sync(params):
        procs, recorder = chain(params)
        return [_SyncAt(engine, at), *procs[:-1], no_eos, procs[-1]], recorder

    engine._processors = with_sync
    torch.manual_seed(0)
    (c,) = engine.generate([prompt], SamplingParams(1, 1.0, 1.0, 0, 10))[0]
    assert len(c.token_ids) == 10 and c.versions == [0] * at + [1] * (10 - at), c.versions
    assert engine.version == 1
    with torch.no_grad():  # the behaviour log-probs before the copy are the old weights' (teacher-forced)
        before = old.logprobs([prompt], [c.token_ids])[0][0, : len(c.token_ids)]
    got = torch.tensor(c.logprobs)
    assert torch.allclose(got[:at], before[:at], atol=1e-5), (got[:at], before[:at])
    assert (got[at:] - before[at:]).abs().max() > 1e-2  # after it, the new weights drew them
    # the trained weights were halved, the engine's copy followed, the old policy did not
    p_new, p_eng, p_old = (next(m.parameters()) for m in (pol.model, engine.model, old.model))
    assert torch.equal(p_new, p_eng) and not torch.equal(p_new, p_old)


def _train(out: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable]
    cmd += [str(ROOT / "tests" / "fault_launch.py"), fault, "--"] if fault else ["-m", "mmrl"]
    cmd += ["train", "recipes/shapes/tiny.yaml", "--output-dir", str(out), *args]
    cmd += ["rollout.max_staleness=2", "algo.old_logprobs=recompute", "algo.rollout_correction=tis_token"]
    cmd += ["train.save_every=2", "eval.every=0", "eval.max_samples=8"]
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**env, **_env()}, timeout=600)


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


@pytest.mark.slow
def test_a_run_ahead_by_two_versions_resumes_after_sigkill_with_no_prompt_lost_or_twice(tmp_path):
    full = _train(tmp_path / "full", "--max-steps", "6")
    assert full.returncode == 0, full.stderr[-3000:]
    rows = [r for r in read_metrics(tmp_path / "full" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for r in rows:  # never more than k = 2 versions old; the producer was ahead once it could be
        assert 0 <= r["async/staleness_mean"] <= r["async/staleness_max"] <= 2
        assert "time/train_idle" in r and "time/rollout_idle" in r
    assert max(r["async/staleness_max"] for r in rows) == 2
    # SIGKILL in step 5's update: batches 5 and 6 (maybe 7's would-be) were produced, the checkpoint is step 4
    killed = _train(tmp_path / "split", "--max-steps", "6", fault="kill:0:5")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (tmp_path / "split" / "checkpoints" / "step-4").is_dir()
    resumed = _train(tmp_path / "split", "--max-steps", "6", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # every step trained the prompts the uninterrupted run trained: the checkpoint's sampler state is from before
    # the oldest batch produced and not trained
    assert rollout_ids(tmp_path / "split") == rollout_ids(tmp_path / "full")


def test_what_runs_asynchronously_today_is_checked_at_pre_flight(monkeypatch):
    base = ["rollout.max_staleness=1", "algo.old_logprobs=recompute"]
    check_async(load_config(None, base))  # one process, the hf engine, pi_prox recomputed
    check_async(
        load_config(None, ["rollout.max_staleness=0", "rollout.engine=vllm"])
    )  # synchronous: anything
    with pytest.raises(ConfigError, match="algo.old_logprobs: recompute"):
        check_async(load_config(None, ["rollout.max_staleness=1"]))
    check_async(load_config(None, [*base, "rollout.engine=vllm"]))  # vLLM pauses its steps for the reload
    for key in ("sleep_mode", "async_scheduling"):  # refused before any model loads, not by the engine after
        with pytest.raises(ConfigError, match=f"engine_options.{key}: true"):
            check_async(
                load_config(None, [*base, "rollout.engine=vllm", f"rollout.engine_options.{key}=true"])
            )
    judged = load_config(None, [*base, "rollout.engine=vllm"])
    judged.rewards = [RewardEntry("medix", 1.0, {"judge": {"model": "assets/tiny-judge", "engine": "vllm"}})]
    with pytest.raises(ConfigError, match=r"vLLM judge of reward\(s\) \['medix'\]"):
        check_async(judged)
    judged.rewards[0].options["judge"]["engine"] = "hf"
    check_async(judged)
    with pytest.raises(ConfigError, match="only the hf and vllm engines"):
        check_async(load_config(None, [*base, "rollout.engine=latr"]))
    with pytest.raises(ConfigError, match=">= 0"):
        check_async(load_config(None, ["rollout.max_staleness=-1"]))
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_async(load_config(None, base))  # several colocated processes with the hf engine
    with pytest.raises(ConfigError, match="whole unsharded copy"):
        check_async(load_config(None, [*base, "train.fsdp=true"]))
    check_async(load_config(None, [*base, "train.fsdp=true", "rollout.placement=separate"]))
    with pytest.raises(ConfigError, match="2 colocated processes and rollout.engine 'vllm'"):
        check_async(load_config(None, [*base, "rollout.engine=vllm"]))
    check_async(load_config(None, [*base, "rollout.placement=separate"]))  # one trains, one generates
    with pytest.raises(ConfigError, match="at least one must train"):
        check_async(load_config(None, [*base, "rollout.placement=separate", "rollout.rollout_processes=2"]))
    monkeypatch.setenv("WORLD_SIZE", "3")  # one trains, two generate: each an equal share of a batch's groups
    two = [*base, "rollout.placement=separate", "rollout.rollout_processes=2"]
    check_async(load_config(None, [*two, "train.prompts_per_step=4"]))
    with pytest.raises(ConfigError, match="multiple of 2"):
        check_async(load_config(None, [*two, "train.prompts_per_step=3"]))
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_async(
        load_config(None, ["rollout.placement=separate", "rollout.engine=vllm"])
    )  # vLLM in its own process
    with pytest.raises(ConfigError, match="runs the hf or the vllm engine"):
        check_async(load_config(None, ["rollout.placement=separate", "rollout.engine=latr"]))
    with pytest.raises(ConfigError, match="one vLLM engine on one device"):
        check_async(
            load_config(
                None,
                [
                    "rollout.placement=separate",
                    "rollout.engine=vllm",
                    "rollout.engine_options.tensor_parallel_size=2",
                ],
            )
        )
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match="at least 2 processes"):
        check_async(load_config(None, ["rollout.placement=separate"]))


@pytest.mark.slow
def test_zoom_episodes_run_ahead_with_each_turns_versions(tmp_path):
    """The multi-turn zoom world runs in the producer (images in every turn): each turn's tokens carry their version,
    an episode may span a weight copy (its turns from two versions), none is more than k = 1 version old."""
    from mmrl.cli import main

    out = tmp_path / "run"
    args = ["train", "recipes/zoom/tiny.yaml", "--output-dir", str(out), "--max-steps", "4"]
    args += ["rollout.max_staleness=1", "algo.old_logprobs=recompute", "algo.rollout_correction=tis_token"]
    args += ["train.prompts_per_step=4", "eval.max_samples=4", "eval.every=0", "train.progress=false"]
    import os

    cwd = os.getcwd()
    os.chdir(ROOT)  # the recipe's data and model paths are relative to the checkout
    try:
        assert main(args) == 0
    finally:
        os.chdir(cwd)
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["async/staleness_max"] <= 1 and 0 <= r["async/version_span"] <= 1
        assert r["episode/errors"] == 0 and r["episode/turns_mean"] >= 1
    assert rows[0]["async/staleness_max"] == 0 and max(r["async/staleness_max"] for r in rows) == 1


@pytest.mark.slow
def test_two_colocated_processes_run_ahead_and_resume_after_sigkill(tmp_path):
    """torchrun, 2 colocated processes with k = 1: each rank's producer thread gathers its batches over a gloo group
    of its own while the trainer's thread runs the update's and the held-out evaluation's collectives on the
    training group; the batches stay within one version, evaluation runs every 2 steps, and a run killed with
    SIGKILL in step 5's update and resumed draws every step's prompts as the uninterrupted run did."""
    cfg = shapes_run_config(tmp_path, micro_batch_size=4)
    args = ["--max-steps", "6", "rollout.max_staleness=1", "sampler.name=uniform"]
    args += ["algo.old_logprobs=recompute", "algo.rollout_correction=tis_token"]
    rows = ahead_then_killed_and_resumed(launch, 2, cfg, tmp_path, args)
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2, 4, 6]
    assert json.loads((tmp_path / "full" / "resolved.json").read_text())["processes"] == 2
