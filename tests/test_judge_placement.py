"""Where a vLLM judge asks vLLM to run (rewards/judge.py ``vllm_placement``), checked on a stand-in ``vllm.LLM`` that
records its arguments, with CUDA and the launcher's environment simulated. vLLM 0.32 takes no device: its in-process
executor runs on device 0, its ``external_launcher`` executor on ``LOCAL_RANK``'s, and ``device_ids`` maps device 0
elsewhere for a whole process. The real judge beside the real policy engine under torchrun is
tests/test_vllm_judge_torchrun.py."""

import sys
import types

import pytest
import torch

from mmrl.rewards import judge as judge_module

JUDGE = "assets/tiny-judge"
LAUNCHER = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


class FakeLLM:
    calls: list[dict] = []

    def __init__(self, **kwargs):
        FakeLLM.calls.append(kwargs)

    def sleep(self, level: int) -> None:
        self.slept = level  # offload puts the judge to sleep right after it is built


@pytest.fixture
def fake_vllm(monkeypatch):
    """A ``vllm`` package whose LLM records its arguments, and vLLM's process-wide groups (none yet, or a policy
    engine's of ``groups["tp"]``)."""
    groups = {"tp": None}
    parallel_state = types.ModuleType("vllm.distributed.parallel_state")
    parallel_state.model_parallel_is_initialized = lambda: groups["tp"] is not None
    parallel_state.get_tensor_model_parallel_world_size = lambda: groups["tp"]
    distributed = types.ModuleType("vllm.distributed")
    distributed.parallel_state = parallel_state
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.distributed = FakeLLM, distributed
    for name, module in (
        ("vllm", vllm),
        ("vllm.distributed", distributed),
        ("vllm.distributed.parallel_state", parallel_state),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    # unset here, and restored after the test whatever the code under test sets
    for key in (*LAUNCHER, "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    FakeLLM.calls = []
    return groups


def _build(device: str, offload: bool = False) -> dict:
    j = judge_module.VLLMJudge(JUDGE, device, "float32", use_image=False, offload=offload, gpu_memory=0.2)
    j._pool.shutdown()
    return FakeLLM.calls[-1]


def _placement(kwargs: dict) -> dict:
    keys = ("distributed_executor_backend", "tensor_parallel_size", "device_ids")
    return {k: kwargs[k] for k in keys if k in kwargs}


def test_alone_on_the_cpu_vllm_runs_in_process(fake_vllm):
    kwargs = _build("auto")
    assert _placement(kwargs) == {} and kwargs["kv_cache_memory_bytes"] == 1 << 28


def test_under_a_launcher_the_judge_joins_the_ranks_group_as_the_policy_engine(fake_vllm, monkeypatch):
    """Rank 1 of 2 on a CPU and on a GPU machine: vLLM's external_launcher executor (which takes LOCAL_RANK's device),
    one rank per judge; before, the in-process executor put every rank's judge on cuda:0."""
    for key, value in LAUNCHER.items():
        monkeypatch.setenv(key, value)
    expected = {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1}
    assert _placement(_build("auto")) == expected
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for device in ("auto", "cuda", "cuda:1"):
        kwargs = _build(device, offload=True)
        assert _placement(kwargs) == expected, device
        assert kwargs["gpu_memory_utilization"] == 0.2 and kwargs["enable_sleep_mode"]
    with pytest.raises(
        ValueError, match=r"device='cuda:0' on local rank 1.*mmrl reward serve.*`remote` reward"
    ):
        _build("cuda:0")
    fake_vllm["tp"] = 2  # a policy engine spanning both ranks made vLLM's groups first
    with pytest.raises(ValueError, match=r"tensor-parallel vLLM policy engine \(tensor_parallel_size 2\)"):
        _build("auto")


def test_alone_on_a_gpu_device_n_is_mapped_only_for_an_engine_in_its_own_process(fake_vllm, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _placement(_build("cuda:0")) == {} and _placement(_build("cuda")) == {}
    assert _placement(_build("cuda:1")) == {"device_ids": [1]}
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the policy's vLLM engine runs in this process
    with pytest.raises(ValueError, match=r"device='cuda:1': vLLM runs in this process.*mmrl reward serve"):
        _build("cuda:1")
    with pytest.raises(ValueError, match="vLLM runs on this machine's GPU only"):
        _build("cpu")
