#!/usr/bin/env bash
# The GPU check (issue 17 §3), on a machine with CUDA and torch, transformers, accelerate and peft installed (vLLM and
# flash-attn may be absent): every CUDA-only test (-m gpu), the Qwen2.5-VL-3B-architecture step benchmark with and
# without activation checkpointing (planner beside each measured peak), the log-prob memory benchmark on CUDA.
# Writes benchmarks/results/gpu-<date>.json and prints a table; about 10-15 minutes on one H100/H200.
#
#   bash scripts/gpu-check.sh            # mmrl is imported from this checkout (installed if it is not)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu-check: no CUDA device visible to $PY (torch.cuda.is_available() is False)" >&2
  exit 2
fi
if ! "$PY" -c 'import mmrl.trainer' 2>/dev/null; then
  # offline machines: no dependency resolution, the checkout itself only (its dependencies must be present)
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu_check.py "$@"
