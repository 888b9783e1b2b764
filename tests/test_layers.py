"""The layer contract (sarathi_lab/DESIGN.md, "Layers"; pyproject.toml, [tool.importlinter]):
imports point down, also those inside functions, and every module is in a layer.

import-linter reads the package's import graph (grimp: every import statement, at any depth in
the code) and checks the contract; the test runs it in a subprocess on the source tree, and on a
copy with one upward import added, which must fail it."""
from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

try:
    import tomllib
except ImportError:   # Python 3.10; import-linter itself needs tomli there
    import tomli as tomllib
from helpers import patience

from sarathi_lab import registry

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
# Package __init__ modules that only gather their package's names; the linter still checks
# every chain of imports that passes through them.
UNLAYERED = {"sarathi_lab", "sarathi_lab.report", "sarathi_lab.report.__main__"}


def contracts() -> dict[str, dict]:
    with open(PYPROJECT, "rb") as f:
        return {c["id"]: c for c in tomllib.load(f)["tool"]["importlinter"]["contracts"]}


def named(contract: dict) -> list[tuple[str, bool]]:
    """(module, optional) for every module a contract names in a layer, under its container if
    it has one; an optional one is written `(module)` and may not exist yet."""
    (container,) = contract.get("containers", [""])
    names = [name.strip() for layer in contract["layers"]
             for name in layer.replace(":", "|").split("|")]
    return [((f"{container}." if container else "") + name.strip("()"), name.startswith("("))
            for name in names]


def layer_modules(contract: dict) -> list[str]:
    return [module for module, _ in named(contract)]


def lint(package_parent: Path) -> subprocess.CompletedProcess:
    """lint-imports on the `sarathi_lab` found first under `package_parent`."""
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(PYPROJECT)!r}, no_cache=True, "
            "no_logo=True))")
    return subprocess.run([sys.executable, "-c", code], cwd=package_parent, env=env,
                          capture_output=True, text=True, timeout=patience(300))


def unlayered(modules, layers) -> list[str]:
    """The modules in no layer (a layer holds a module and everything under it)."""
    return sorted(m for m in modules if m not in UNLAYERED
                  and not any(m == top or m.startswith(top + ".") for top in layers))


def test_the_source_tree_keeps_the_layers():
    run = lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "KEPT" in run.stdout


def test_an_import_inside_a_function_that_points_up_breaks_them(tmp_path):
    # a copy of the package (its Python files) with settings, the bottom layer, importing the
    # runner inside a function: the linter must see it and fail
    shutil.copytree(ROOT / "sarathi_lab", tmp_path / "sarathi_lab",
                    ignore=lambda d, names: [n for n in names if not (
                        n.endswith(".py") or (Path(d) / n).is_dir()) or n == "__pycache__"])
    settings = tmp_path / "sarathi_lab" / "settings.py"
    settings.write_text(settings.read_text() + "\n\ndef _upward():\n"
                        "    from sarathi_lab.run.runner import run\n    return run\n")
    run = lint(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "sarathi_lab.settings is not allowed to import sarathi_lab.run:" in run.stdout
    assert "BROKEN" in run.stdout


def test_every_module_is_in_a_layer():
    graph = grimp.build_graph("sarathi_lab", cache_dir=None)
    layers = layer_modules(contracts()["layers"])
    assert unlayered(graph.modules, layers) == []
    # and the check itself finds one that is not
    assert unlayered(graph.modules | {"sarathi_lab.newcomer"}, layers) == ["sarathi_lab.newcomer"]
    # the trace package's own contract names each of its modules
    traces = {m for m in graph.modules if m.startswith("sarathi_lab.traces.")}
    assert traces == set(layer_modules(contracts()["traces"]))


def test_every_layer_module_exists():
    # a module renamed without its layer entry would leave its new name unchecked; optional
    # entries `(...)` are modules still to come (the topology package)
    graph = grimp.build_graph("sarathi_lab", cache_dir=None)
    for contract in contracts().values():
        missing = [m for m, optional in named(contract) if not optional and m not in graph.modules]
        assert missing == [], contract["id"]
        assert [m for m, optional in named(contract) if optional] in (
            [], ["sarathi_lab.topology"]), contract["id"]


def test_the_kernels_import_nothing_of_the_project():
    # kernels/ ships as sarathi_lab.kernels from a folder of its own, outside the graph the
    # linter reads; it sits beside the models, below the executors that use it
    for path in sorted((ROOT / "kernels").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not (name.startswith("sarathi_lab") and
                            not name.startswith("sarathi_lab.kernels")), (path.name, name)


def test_the_registry_names_each_contract_by_a_path_that_loads():
    # the registry names the contracts by dotted path so as to import nothing of the project;
    # a contract that moves must take its entry along
    for what, target in registry.CONTRACTS.items():
        module, _, name = target.partition(":")
        assert isinstance(getattr(importlib.import_module(module), name), type), what
    assert set(registry.CONTRACTS) == set(registry.GROUPS)
