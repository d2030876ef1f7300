"""What a benchmark ran on, printed as its first line, so that a ratio measured on one machine can be set against
another's: the CPU model, the instruction set torch's kernels dispatched to (``torch.backends.cpu``), the BLAS and
oneDNN torch was built with, the torch version and its thread count. Two 2-core machines "of the same kind" can
differ here (an AVX-512 host against an AVX2 one changes every matrix product's speed, but not Python's)."""

from __future__ import annotations

import platform
import re
import statistics

import torch


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe() -> str:
    """One line: CPU, ISA level, BLAS, torch and threads."""
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    mkldnn = "oneDNN" if "USE_MKLDNN=ON" in config or "USE_MKLDNN=1" in config else "no oneDNN"
    isa = torch.backends.cpu.get_cpu_capability()
    return (
        f"machine: {_cpu_model()}; torch CPU capability {isa}; BLAS {blas.group(1) if blas else 'unknown'}, {mkldnn}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    )


def spread(ratios: list[float]) -> str:
    """``median X (min-max over N rounds)`` of per-round ratios."""
    return f"median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} rounds)"
