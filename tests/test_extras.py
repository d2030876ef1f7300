"""Optional dependencies (mmrl/extras.py, pyproject.toml's extras): the plain path runs without any of them, and a run
that needs a missing one is refused at pre-flight with one line naming the extra.

The subprocess tests make every optional package unimportable with a ``sys.meta_path`` finder installed by a
``sitecustomize`` on PYTHONPATH (so worker processes the run starts get it too)."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from mmrl.envs.base import ENVS
from mmrl.eval.base import BENCHMARKS
from mmrl.extras import EXTRAS, MissingExtra, import_module, require
from mmrl.registry import Builtin, Registry
from mmrl.rewards.base import BUILTIN_REWARDS

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "assets" / "tiny-qwen2.5-vl")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# every extra's imports, and qwen-vl-utils (a dev dependency: the tests' reference)
BLOCKED = (
    "playwright", "openslide", "fastapi", "uvicorn", "httpx", "pypdfium2", "apted", "lxml", "scipy", "rapidfuzz",
    "math_verify", "datasets", "pyarrow", "decord", "wandb", "mlflow", "swanlab", "qwen_vl_utils",
)  # fmt: skip
SITECUSTOMIZE = f"""
import sys

BLOCKED = {set(BLOCKED)!r}
# As when they are not installed: importing one raises ModuleNotFoundError and importlib.util.find_spec (what
# availability checks call, transformers' among them) returns None for it, which a None in sys.modules gives.
for name in BLOCKED:
    sys.modules[name] = None


class _Uninstalled:  # and should an entry be dropped from sys.modules, the import still fails
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Uninstalled())
"""


def _pip_names(extra: str) -> set[str]:
    return {Requirement(r).name.lower() for r in PYPROJECT["optional-dependencies"][extra]}


def test_the_extras_table_matches_pyproject():
    extras = PYPROJECT["optional-dependencies"]
    (everything,) = extras["all"]
    assert Requirement(everything).extras == set(extras) - {"all", "vllm", "dev", "tensorboard"}
    assert set(EXTRAS) <= set(extras)
    import importlib.metadata as md

    dists = md.packages_distributions()
    for extra, modules in EXTRAS.items():
        for module in modules:  # each import comes from a distribution the extra lists (where installed here)
            if module in dists:
                assert {d.lower() for d in dists[module]} & _pip_names(extra), (extra, module)
    core = {Requirement(r).name.lower() for r in PYPROJECT["dependencies"]}
    assert not core & {n for e in EXTRAS for n in _pip_names(e)}, "a core package is also an extra's"
    # every built-in's extra and imports are the table's
    for registry in (BUILTIN_REWARDS, ENVS._builtins, BENCHMARKS._builtins):
        for name, b in registry.items():
            if b.extra is not None:
                assert set(b.needs or ()) <= set(EXTRAS[b.extra]), name


def test_missing_extra_names_the_extra_and_the_module():
    with pytest.raises(MissingExtra) as e:
        require("render", "reward 'x'", ("no_such_module_mmrl",))
    assert str(e.value) == (
        "reward 'x': needs the 'render' extra (pip install 'mmrl[render]'): No module named 'no_such_module_mmrl'"
    )
    assert e.value.reason.startswith("needs the 'render' extra") and isinstance(e.value, ImportError)
    assert str(pickle.loads(pickle.dumps(e.value))) == str(e.value)
    require("render", "ok", ("json",))  # found: nothing raised
    with pytest.raises(ValueError, match="unknown extra 'nope'"):
        require("nope", "x")
    with pytest.raises(ModuleNotFoundError):  # a module no extra provides is not an extra's
        import_module("no_such_module_mmrl", "x")


def test_a_lazy_registry_lists_builtins_without_importing_and_guards_their_names(tmp_path, monkeypatch):
    (tmp_path / "mmrl_lazy_example.py").write_text(
        "from tests_registry import R\n\n@R.register('a')\ndef a():\n    return 1\n"
    )
    (tmp_path / "tests_registry.py").write_text(
        "from mmrl.registry import Builtin, Registry\n\n"
        "R = Registry('thing', {'a': Builtin('mmrl_lazy_example'), "
        "'b': Builtin('mmrl_lazy_example', 'render', ('no_such_module_mmrl',))})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("tests_registry", "mmrl_lazy_example"):  # imported below: gone again after the test
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, name)
    import tests_registry

    registry: Registry = tests_registry.R
    assert registry.names() == ["a", "b"] and "a" in registry and "mmrl_lazy_example" not in sys.modules
    with pytest.raises(ValueError, match="already registered"):  # a built-in's name, from another module
        registry.register("a")(lambda: 2)
    assert registry.get("a")() == 1 and "mmrl_lazy_example" in sys.modules
    assert registry.loaded() == {"a": registry.get("a")}
    with pytest.raises(MissingExtra, match="thing 'b': needs the 'render' extra"):
        registry.get("b")
    with pytest.raises(KeyError, match=r"unknown thing 'bb'; did you mean 'b'\? \(known: a, b\)"):
        registry.get("bb")
    assert Builtin("m").extra is None


def _env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "uninstalled"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    pythonpath = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _run(args: list[str], tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600
    )


PREFLIGHT = """
import json, sys

import mmrl.cli, mmrl.train.trainer  # noqa: E401
from mmrl.config import ConfigError, load_config
from mmrl.eval import EvalError, get_benchmark
from mmrl.train.checks import check_data, check_env, check_rewards

out = {"imported": sorted(m for m, v in sys.modules.items() if m.partition(".")[0] in %r and v is not None)}
for name, check in (("remote", check_rewards), ("browser", check_env), ("parquet", check_data)):
    try:
        check(load_config(f"{name}.yaml"))
    except ConfigError as e:
        out[name] = str(e)
try:
    get_benchmark("table")
except EvalError as e:
    out["table"] = str(e)
print(json.dumps(out))
"""


def test_the_plain_path_runs_without_any_optional_package(tmp_path):
    from mmrl.recipes.shapes.data import build

    env = _env(tmp_path)
    blocked = _run(["-c", "import lxml"], tmp_path, env)
    assert blocked.returncode == 1 and "ModuleNotFoundError" in blocked.stderr

    # (1) the trainer and the CLI import; every pre-flight names the extra a missing package belongs to
    build(tmp_path / "data", n_train=8, n_eval=4, seed=0)
    (tmp_path / "data" / "train.parquet").write_bytes(b"")
    base = (
        f"model: {{path: {TINY}, min_pixels: 3136, max_pixels: 3136}}\n"
        "rollout: {n: 2, max_new_tokens: 2, batch_size: 4}\n"
        "train: {prompts_per_step: 2, progress: false, seed: 0}\n"
    )
    plain = "data: {train: data/train.jsonl, eval: data/eval.jsonl}\nrewards: [{name: exact_match}]\n"
    (tmp_path / "plain.yaml").write_text(base + plain + "eval: {every: 2, max_samples: 4}\n")
    (tmp_path / "latex.yaml").write_text(
        base + "data: {train: data/train.jsonl}\nrewards: [{name: exact_match}, {name: latex_table}]\n"
    )
    (tmp_path / "remote.yaml").write_text(
        base + "data: {train: data/train.jsonl}\nrewards: [{name: remote}]\n"
    )
    (tmp_path / "browser.yaml").write_text(
        base.replace("rollout: {", "rollout: {env: browser_app, episode: {max_turns: 2}, ") + plain
    )
    (tmp_path / "parquet.yaml").write_text(base + plain.replace("train.jsonl", "train.parquet"))
    r = _run(["-c", PREFLIGHT % (BLOCKED,)], tmp_path, env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out.pop("imported") == []

    def needs(extra: str, module: str) -> str:
        return f"needs the {extra!r} extra (pip install 'mmrl[{extra}]'): No module named {module!r}"

    assert out == {
        "remote": f"rewards[0] ('remote'): {needs('server', 'httpx')}",
        "browser": f"rollout.env 'browser_app': {needs('gui', 'playwright')}",
        "parquet": f"data.train (data/train.parquet): {needs('data', 'pyarrow')}",
        "table": f"benchmark 'table': {needs('render', 'lxml')}",
    }

    # (2) mmrl list names every built-in reward
    r = _run(["-m", "mmrl", "list"], tmp_path, env)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("rewards (rewards[].name): ")]
    assert line.split(": ", 1)[1].split(", ") == sorted(BUILTIN_REWARDS)

    # (4) a reward whose package is missing: one line naming the extra, before any model loads
    r = _run(["-m", "mmrl", "train", "latex.yaml", "--output-dir", "latex-run"], tmp_path, env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"error: rewards[1] ('latex_table'): {needs('render', 'pypdfium2')}\n"
    assert not (tmp_path / "latex-run").exists()

    # (3) a 2-step GRPO run with the plain reward, its held-out evaluation and report
    r = _run(["-m", "mmrl", "train", "plain.yaml", "--output-dir", "run", "--max-steps", "2"], tmp_path, env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if "reward/mean" in x] == [1, 2]
    assert (tmp_path / "run" / "report.md").is_file()
