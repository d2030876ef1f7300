"""What a lent GPU machine runs with (the `device` tool's bare image, scripts/gpu-image-packages.txt) plus what
scripts/gpu-wheels.sh packs for it: every dependency mmrl declares is on the image, packed, or left out by name (and
then unimportable on the GPU check's path: tests/test_gpu_step_benchmark.py); nothing the image has is packed again
except transformers (the image's 5.17 predates mm_encoder_outputs); TRL travels for the mmrl-vs-TRL benchmark."""

import importlib.metadata
import re
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "scripts" / "gpu-wheels.sh").read_text()
# import names of the left-out distributions (openslide-python imports as openslide)
LEFT_OUT_MODULES = ("decord", "av", "pypdfium2", "openslide", "openslide_bin", "playwright")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _array(name: str) -> set[str]:
    body = re.search(rf"^{name}=\((.*?)\)", SCRIPT, re.S | re.M)
    assert body, f"scripts/gpu-wheels.sh defines no {name}=(...)"
    return {_norm(x) for x in body.group(1).split()}


def _declared() -> set[str]:
    """mmrl's dependencies (the installed metadata of pyproject.toml's list), whatever the platform, no extras."""
    reqs = [Requirement(r) for r in importlib.metadata.requires("mmrl") or []]
    return {_norm(r.name) for r in reqs if "extra" not in str(r.marker or "")}


def test_every_dependency_is_on_the_image_packed_or_left_out_by_name():
    lines = (ROOT / "scripts" / "gpu-image-packages.txt").read_text().splitlines()
    image = {_norm(x) for x in lines if x and not x.startswith("#")}
    packed, left = _array("PACKAGES"), _array("LEFT_OUT")
    assert {"torch", "transformers", "accelerate", "peft"} <= image
    unaccounted = _declared() - image - packed - left
    assert not unaccounted, (
        f"add these to PACKAGES or LEFT_OUT in scripts/gpu-wheels.sh: {sorted(unaccounted)}"
    )
    assert packed & image == {"transformers"} and not packed & left
    assert {"trl", "datasets", "rapidfuzz"} <= packed
    assert {_norm(m) for m in LEFT_OUT_MODULES} >= left - {"openslide-python"}
