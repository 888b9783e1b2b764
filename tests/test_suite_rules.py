"""Rules of the test suite itself: no test module imports another (an imported test module runs
its module-level code in the importer, an imported autouse fixture applies there unseen, and
two test files become one to edit; what tests share lives in conftest.py, helpers.py,
hf_oracle.py, plugins.py or study_scripts.py), and every marker a test uses is declared."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import tomllib
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


def _decorator_names(node) -> list[str]:
    return [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list]


def _marked_slow(node) -> bool:
    return any("mark.slow" in ast.unparse(d) for d in node.decorator_list)


def slow_fixture_users(files: dict[str, str]) -> list[str]:
    """The tests (module::name) that use a fixture declared with slow_fixture, directly or
    through other fixtures (their own module's, conftest.py's, or one a module imports by name
    from a shared module), and are not marked slow (on the test, its class or the module's
    pytestmark). `files`: module name -> source."""
    trees = {m: ast.parse(src) for m, src in files.items()}
    fixtures: dict[str, dict[str, tuple[bool, list[str], bool]]] = {}   # module -> name -> ...
    imported: dict[str, dict[str, str]] = {}   # module -> name -> the module it comes from
    for m, tree in trees.items():
        fixtures[m], imported[m] = {}, {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module in trees:
                imported[m].update({a.asname or a.name: node.module for a in node.names})
            if isinstance(node, ast.FunctionDef):
                names = _decorator_names(node)
                if any(n.endswith(("pytest.fixture", "slow_fixture")) for n in names):
                    autouse = any("autouse=True" in ast.unparse(d) for d in node.decorator_list)
                    fixtures[m][node.name] = ("slow_fixture" in names,
                                              [a.arg for a in node.args.args], autouse)

    def find(m: str, name: str) -> tuple[str, tuple] | None:
        for where in (m, imported[m].get(name), "conftest"):
            if where in fixtures and name in fixtures[where]:
                return where, fixtures[where][name]
        return None

    def slow(m: str, name: str, seen=()) -> bool:
        found = find(m, name)
        if found is None or (found[0], name) in seen:
            return False
        where, (declared, args, _) = found
        return declared or any(slow(where, a, seen + ((where, name),)) for a in args)

    bad = []
    for m, tree in trees.items():
        if not m.startswith("test_"):
            continue
        module_slow = any(isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n.targets[0])
                          and "mark.slow" in ast.unparse(n.value) for n in tree.body)
        autouse = [n for n, (_, _, auto) in fixtures[m].items() if auto]
        autouse += [n for n in imported[m] if (find(m, n) or (0, (0, 0, False)))[1][2]]
        tests = [(n, False) for n in tree.body if isinstance(n, ast.FunctionDef)]
        tests += [(f, _marked_slow(c)) for c in tree.body if isinstance(c, ast.ClassDef)
                  for f in c.body if isinstance(f, ast.FunctionDef)]
        for fn, class_slow in tests:
            if not fn.name.startswith("test") or module_slow or class_slow or _marked_slow(fn):
                continue
            used = [a.arg for a in fn.args.args] + autouse + re.findall(
                r"usefixtures\(([^)]*)\)", " ".join(ast.unparse(d) for d in fn.decorator_list))
            used = [u.strip(" '\"") for x in used for u in x.split(",")]
            if any(slow(m, u) for u in used):
                bad.append(f"{m}::{fn.name}")
    return bad


def test_every_test_using_a_slow_fixture_is_marked_slow():
    """The fast tier (-m "not slow") runs no study, command line, server or measurement, not even
    through a fixture: a fixture that does is declared with slow_fixture (tests/conftest.py,
    which also fails a fast test whose fixture takes more than SLOW_SETUP_CPU_S to set up)."""
    files = {p.stem: p.read_text() for p in sorted(TESTS.glob("*.py"))}
    assert sum("@slow_fixture" in src for m, src in files.items() if m.startswith("test_")) > 5
    bad = slow_fixture_users(files)
    assert not bad, f"tests using a slow fixture, not marked slow: {bad}"


def test_the_slow_fixture_rule_sees_its_cases():
    shared = ("from conftest import slow_fixture\nimport pytest\n"
              "@slow_fixture(scope='module')\ndef study():\n    return 1\n"
              "@pytest.fixture\ndef table(study):\n    return study\n")
    test = ("import pytest\nfrom shared import table\n"
            "def test_direct(study): pass\n"          # conftest's fixture, by its name
            "def test_through(table): pass\n"         # through an imported fixture
            "@pytest.mark.usefixtures('study')\ndef test_used(): pass\n"
            "@pytest.mark.slow\ndef test_marked(study): pass\n"
            "def test_plain(tmp_path): pass\n"
            "class TestC:\n    def test_method(self, table): pass\n")
    conftest = ("import pytest\ndef slow_fixture(*a, **k): ...\n"
                "@slow_fixture\ndef study():\n    return 1\n")
    files = {"conftest": conftest, "shared": shared, "test_m": test}
    assert slow_fixture_users(files) == ["test_m::test_direct", "test_m::test_through",
                                         "test_m::test_used", "test_m::test_method"]
    marked = {**files, "test_m": "import pytest\npytestmark = pytest.mark.slow\n" + test}
    assert slow_fixture_users(marked) == []
