#!/usr/bin/env bash
# Set up a fresh Debian machine for mmrl: TeX Live + poppler + Chromium (rendering rewards) from Debian, then PyTorch
# (CPU-capable build pinned to the wheels this project is tested with) and mmrl itself with every extra (`all`: the
# rendering rewards, the browser, pathology slides, the reward server, parquet/HF datasets, decord, the trackers) and
# dev: the README's commands and the whole test suite need them all.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v pdflatex >/dev/null || ! command -v pdftoppm >/dev/null || ! command -v chromium >/dev/null \
  || ! dpkg -s cm-super >/dev/null 2>&1; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
    texlive-latex-base texlive-latex-recommended texlive-latex-extra cm-super poppler-utils chromium
fi
PY=${PYTHON:-python3}
$PY -m pip install -q torch==2.14.1 torchvision==0.29.1
$PY -m pip install -q -e ".[all,dev]"  # all includes trackers: W&B, MLflow, SwanLab (~15 s), tested offline
