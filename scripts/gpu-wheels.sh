#!/usr/bin/env bash
# Packages for a lent GPU machine (the `device` tool's image: Python 3.12, torch, transformers 5.17, accelerate, peft,
# no network), built here into .gpu-site/site.tar.xz (git-ignored; about 9 MB) for `carry`:
#   - transformers at this machine's version (the image's 5.17 predates `mm_encoder_outputs`, so vision would be
#     encoded per row there, not once per prompt: not what the check measures);
#   - mmrl's dependencies the image lacks that the check's path imports (rapidfuzz, qwen-vl-utils, math-verify, ...),
#     and TRL with datasets for benchmarks/grpo_vs_trl.py.
# The wheels are unpacked for CPython 3.12 on x86-64 and packed as one solid xz archive: python sources compress about
# 10x that way against about 1.5x as wheels, and the tree (~50 MB) with what it carries must stay under 64 MiB.
# Left out: decord and av (video), pypdfium2 and openslide (the LaTeX and pathology rewards), playwright (needs
# Chromium): none is on the check's path. scripts/gpu-check.sh unpacks it to /tmp/mmrl-gpu-site first.
#
#   bash scripts/gpu-wheels.sh     # then: run(carry=[".gpu-site"], command="bash scripts/gpu-check.sh ...")
#   GPU_PYTHON=3.11 GPU_SITE=/tmp/site311.tar.xz bash scripts/gpu-wheels.sh   # for another Python, elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${GPU_PYTHON:-3.12}
ARCHIVE=${GPU_SITE:-.gpu-site/site.tar.xz}
PACKAGES=(transformers rapidfuzz qwen-vl-utils math-verify latex2sympy2_extended antlr4-python3-runtime apted
  num2words datasets dill multiprocess fastapi starlette pydantic pydantic-core annotated-types typing-inspection
  uvicorn trl)
# mmrl's dependencies the image lacks and the archive leaves out (size): nothing on the check's path imports them
# (tests/test_gpu_step_benchmark.py runs the check with each of them unimportable)
LEFT_OUT=(decord av pypdfium2 openslide-python openslide-bin playwright)
grep -qx '/.gpu-site/' .git/info/exclude 2>/dev/null || echo '/.gpu-site/' >> .git/info/exclude
pins=()
for p in "${PACKAGES[@]}"; do
  v=$(python3 -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$p" 2>/dev/null || true)
  pins+=("$p${v:+==$v}")
done
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --target "$site" "${pins[@]}"
mkdir -p "$(dirname "$ARCHIVE")" && rm -f "$ARCHIVE"
tar -C "$site" -cJf "$ARCHIVE" .
echo "gpu-wheels: ${pins[*]} for Python $PYVER -> $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1));" \
  "tree and archive: $(( ($(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) \
  + $(stat -c %s "$ARCHIVE")) / 1048576 )) MiB of the 64 a call carries"
