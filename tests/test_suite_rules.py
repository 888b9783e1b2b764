"""Rules of the test suite itself: no test module imports another (an imported test module runs
its module-level code in the importer, an imported autouse fixture applies there unseen, and
two test files become one to edit; what tests share lives in conftest.py, helpers.py,
hf_oracle.py, plugins.py or study_scripts.py), and every marker a test uses is declared."""
import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from helpers import patience

TESTS = Path(__file__).resolve().parent
RUFF = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format=concise"]


def imported_modules(path: Path) -> set[str]:
    """The top-level names of every module `path` imports, in functions too."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_no_test_module_imports_another():
    modules = {p.stem for p in TESTS.glob("test_*.py")}
    bad = {p.name: sorted(imported_modules(p) & modules) for p in sorted(TESTS.glob("*.py"))}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"test modules importing test modules (move what they share to a helper): {bad}"


def test_the_rule_sees_an_import_of_a_test_module(tmp_path):
    """The scan above would pass vacuously if it missed imports: it finds them at the top and in
    a function."""
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom test_cli import cli\n\ndef g():\n    import test_model.x\n")
    assert {"os", "test_cli", "test_model"} <= imported_modules(f)


def test_every_marker_used_is_declared():
    declared = {m.split(":")[0] for m in tomllib.loads(
        (TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]}
    # pytest's own and pytest-xdist's (a dev extra) need no declaration
    builtin = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings",
               "xdist_group"}
    used = {m for p in TESTS.glob("*.py")
            for m in re.findall(r"pytest\.mark\.(\w+)", p.read_text())}
    assert used - builtin <= declared, sorted(used - builtin - declared)
    assert "slow" in used   # the fast tier exists: some tests are marked slow


def test_no_test_skips_for_a_missing_package():
    """The project's dependencies and the extras the README installs are imported, not
    `importorskip`ped: a broken install then errors instead of passing as skips."""
    calls = [f"{p.name}:{n.lineno}" for p in sorted(TESTS.glob("*.py"))
             for n in ast.walk(ast.parse(p.read_text(), str(p)))
             if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("importorskip")]
    assert not calls, f"importorskip (import the package instead): {calls}"


def test_ruff_finds_nothing():
    """pyproject's [tool.ruff]: import order, unused and undefined names, syntax errors. Sort
    the imports with `ruff check --fix --select I sarathi_lab tests experiments kernels`."""
    r = subprocess.run([*RUFF, "sarathi_lab", "tests", "experiments", "kernels"],
                       cwd=TESTS.parent, capture_output=True, text=True, timeout=patience(120))
    assert r.returncode == 0, (r.stdout[-6000:] + r.stderr + "\nimports out of order: "
                               "python -m ruff check --fix --select I " + " ".join(r.args[-4:]))


def test_ruff_reads_the_projects_settings(tmp_path):
    """The check above is the project's: run with pyproject.toml it flags imports out of order
    and an unused name, which ruff's defaults would not both flag."""
    f = tmp_path / "m.py"
    f.write_text("import sys\nimport os\n\nprint(os.sep)\n")
    r = subprocess.run([*RUFF, "--config", str(TESTS.parent / "pyproject.toml"), str(f)],
                       capture_output=True, text=True, timeout=patience(120))
    assert r.returncode == 1 and "I001" in r.stdout and "F401" in r.stdout, r.stdout + r.stderr
