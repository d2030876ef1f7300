"""The GPU check's path tests (tests/gpu_paths.py) on the CPU: the same bodies tests/test_gpu.py runs on CUDA, so a
failure there is a GPU failure, not a broken path. Left out here, as CUDA-only: the judge's GPU memory after offload
(``torch.cuda.memory_allocated``), and the device probe's total against ``torch.cuda.mem_get_info`` and its CUDA
contexts (no device: pre-flight plans nothing, the probe's script still runs in its own process)."""

import pytest
from gpu_paths import device_probe, image_check_sees_media, judge_agrees_with_cpu, multi_turn_logprobs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_multi_turn_logprobs_per_turn(dtype, tmp_path):
    worst = multi_turn_logprobs("cpu", dtype, tmp_path)
    print(dtype, worst)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_judge_agrees_with_the_cpu_judge(dtype):
    print(dtype, judge_agrees_with_cpu("cpu", dtype))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_image_check_sees_media(dtype, tmp_path):
    print(dtype, image_check_sees_media("cpu", dtype, tmp_path))


def test_device_probe_script_runs(tmp_path):
    assert device_probe("cpu", tmp_path)["gib"] is None
