import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    """``tiny_family(NAME)``: a tiny random checkpoint of a VLM family (``mmrl build-tiny --family NAME``), built once
    per test session; the shipped tiny Qwen2.5-VL for ``qwen2_5_vl``."""
    from pathlib import Path

    from mmrl.tiny import build_tiny

    root, built = tmp_path_factory.mktemp("families"), {}

    def get(family: str) -> Path:
        if family == "qwen2_5_vl":
            return Path(__file__).resolve().parents[1] / "assets" / "tiny-qwen2.5-vl"
        if family not in built:
            built[family] = build_tiny(root / family, seed=0, family=family)
        return built[family]

    return get
