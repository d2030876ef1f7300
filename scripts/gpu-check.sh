#!/usr/bin/env bash
# The GPU check (issues 17 §3 and 19), on a machine with CUDA and torch, transformers, accelerate and peft installed
# (vLLM and flash-attn may be absent): every CUDA-only test (-m gpu), the Qwen2.5-VL-3B-architecture step benchmark
# before/after the throughput work and without activation checkpointing (planner beside each measured peak), the
# packing benchmark, the log-prob memory benchmark and mmrl vs TRL, all on CUDA (benchmarks/gpu_check.py).
# Writes benchmarks/results/gpu-<date>.json (or --out) and prints a table.
#
#   bash scripts/gpu-check.sh [--budget-s 520] [--out $OUT/gpu-check.json]
#
# mmrl is imported from this checkout (installed if it is not). .gpu-site/site.tar.xz (scripts/gpu-wheels.sh:
# transformers at the tested version, mmrl's dependencies a bare GPU image lacks, TRL) is unpacked to
# /tmp/mmrl-gpu-site and put first on PYTHONPATH. On the `device` tool's machines (15 minutes a session, starts included):
#   bash scripts/gpu-wheels.sh      # here, once
#   run(carry=[".gpu-site"], timeout_s=600,
#       command="bash scripts/gpu-check.sh --budget-s 520 --out $OUT/gpu-check.json")
# (520 s for the parts leaves the unpacking and install below, about 30 s, and the results' return inside the call's
# 600 s; with a machine's start, about 12 of the 15 minutes. The JSON is rewritten after every part.)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SITE=${GPU_SITE:-.gpu-site/site.tar.xz}  # another archive (GPU_SITE=...) for a rehearsal with another Python
case " $* " in
  *" --device cpu "*) ;;  # a rehearsal of the whole path on a CPU (with --small)
  *) if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
       echo "gpu-check: no CUDA device visible to $PY (torch.cuda.is_available() is False)" >&2
       exit 2
     fi ;;
esac
if [ -f "$SITE" ]; then
  rm -rf /tmp/mmrl-gpu-site && mkdir -p /tmp/mmrl-gpu-site && tar -C /tmp/mmrl-gpu-site -xJf "$SITE" || exit 2
  export PYTHONPATH=/tmp/mmrl-gpu-site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$PY" -c 'import mmrl.processors' 2>/dev/null; then  # the installed layout (a bare checkout lacks it)
  # offline machines: no dependency resolution, the checkout itself only (its dependencies must be present)
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu_check.py "$@"
