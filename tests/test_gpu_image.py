"""What a lent GPU machine runs with (the `device` tool's bare image, scripts/gpu-image-packages.txt) plus what
scripts/gpu-wheels.sh packs for it: every dependency mmrl declares, core and the extras the check imports, is on the
image, packed, or left out by name (and then unimportable on the GPU check's path: tests/test_gpu_step_benchmark.py);
nothing the image has is packed again except transformers (the image's 5.17 predates mm_encoder_outputs); TRL travels
for the mmrl-vs-TRL benchmark."""

import re
from pathlib import Path

import tomllib
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


# the extras the check's path imports (its pytest run collects every test module): all but the trackers, which it
# never imports, vLLM (not on the image) and dev (what it needs of dev, PACKAGES names)
GPU_EXTRAS = ("render", "gui", "pathology", "server", "data", "video")


def _declared() -> set[str]:
    """mmrl's dependencies and those of GPU_EXTRAS (pyproject.toml's lists, read as written: the installed metadata
    may be an older egg-info in the checkout), whatever the platform."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    (everything,) = extras["all"]  # mmrl[a,b,...]
    assert set(GPU_EXTRAS) <= Requirement(everything).extras
    reqs = [*project["dependencies"], *(r for e in GPU_EXTRAS for r in extras[e])]
    return {_norm(Requirement(r).name) for r in reqs}


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
