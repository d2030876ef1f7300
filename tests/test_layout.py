"""The package's shape (docs/development.md, Layout): no import cycle, no import pointing up the layout, no module
importing another's private names, and a non-editable install that imports and finds its shipped files."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import import_graph  # noqa: E402
import seeded_equality  # noqa: E402


def test_no_cycle_and_no_upward_import():
    mods = import_graph.module_files()
    edges = import_graph.imports(mods)
    graph = {m: set() for m in mods}
    for a, b, _ in edges:
        graph[a].add(b)
    assert import_graph.cycles(graph) == []
    assert import_graph.upward(edges) == []


def test_a_cycle_and_an_upward_import_are_found():
    """The checker itself: a two-module cycle and a model -> train import are reported."""
    graph = {"mmrl.model.a": {"mmrl.model.b"}, "mmrl.model.b": {"mmrl.model.a"}, "mmrl.train.c": set()}
    assert import_graph.cycles(graph) == [["mmrl.model.a", "mmrl.model.b"]]
    up = import_graph.upward(
        [("mmrl.model.a", "mmrl.train.c", False), ("mmrl.train.c", "mmrl.model.a", True)]
    )
    assert up == [("mmrl.model.a", "mmrl.train.c")]


def test_no_module_imports_another_modules_private_names():
    found = []
    for mod, path in import_graph.module_files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmrl"):
                found += [
                    f"{mod}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")
                ]
    assert found == []


@pytest.mark.slow
def test_a_non_editable_install_imports_and_finds_its_shipped_files(tmp_path):
    """pip install (no -e) into a folder: every package is listed in pyproject.toml, and the files found from
    ``__file__`` (the planner's shipped configs, the recipes' YAMLs) are installed with it."""
    site = tmp_path / "site"
    seeded_equality.install(seeded_equality.checkout(str(ROOT), tmp_path / "src"), sys.executable, site)
    code = (
        "import pkgutil, importlib, mmrl\n"
        "import sys; assert mmrl.__file__.startswith(sys.argv[1]), mmrl.__file__\n"
        "names = [m.name for m in pkgutil.walk_packages(mmrl.__path__, 'mmrl.')]\n"
        "for n in names:\n"
        "    if n.split('.')[-1] != '__main__': importlib.import_module(n)\n"
        "from mmrl.plan.memory import config_folder\n"
        "print(len(names), config_folder('Qwen/Qwen2.5-VL-3B-Instruct'))\n"
        "import mmrl.recipes, pathlib\n"
        "assert (pathlib.Path(mmrl.recipes.__file__).parent / 'shapes' / 'tiny.yaml').is_file()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(site)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    count, folder = out.stdout.split()
    assert int(count) > 100 and folder.startswith(str(site)) and (Path(folder) / "config.json").is_file()
