"""The wheel ships the whole source tree: every package (a folder with an `__init__.py` under
sarathi_lab/, kernels/ and configs/) and every data file beside the code. The editable install
of the README and CI hides a package missing from the build (it imports from the tree), so the
wheel is built, as a user would, from a copy of the tree that git would hand out."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import slow_fixture
from helpers import patience

ROOT = Path(__file__).resolve().parents[1]
# where each folder of the tree lands in the wheel (pyproject.toml's package-dir)
SHIPPED = {"sarathi_lab": "sarathi_lab", "kernels": "sarathi_lab/kernels",
           "configs": "sarathi_lab/configs"}
# the build metadata the copy needs beside the shipped folders
BUILD_FILES = ("pyproject.toml", "README.md")



def source_files() -> list[Path]:
    """The files of the tree a fresh clone has: tracked, or new and not ignored (git's rules
    leave out __pycache__, build outputs and the like), that still exist."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z",
                          "--", *SHIPPED, *BUILD_FILES],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted(p for p in map(Path, filter(None, out.split("\0"))) if (ROOT / p).is_file())


def in_wheel(path: Path) -> str:
    """The name a source file has inside the wheel."""
    top, *rest = path.parts
    return "/".join([SHIPPED[top], *rest])


def expected(files: list[Path]) -> tuple[set[str], set[str]]:
    """The packages (dotted) and the data files (wheel paths) the wheel must hold."""
    packages = {in_wheel(p.parent).replace("/", ".") for p in files
                if p.name == "__init__.py" and p.parts[0] in SHIPPED}
    data = {in_wheel(p) for p in files if p.parts[0] in SHIPPED and p.suffix != ".py"}
    return packages, data


@slow_fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel, built from a copy of the tree (building in place would leave build/ and stale
    modules in the checkout, and could hide a file that only the checkout has)."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for p in source_files():
        (src / p).parent.mkdir(parents=True, exist_ok=True)
        (src / p).write_bytes((ROOT / p).read_bytes())
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", "-w", str(dist), str(src)],
                         capture_output=True, text=True, timeout=patience(600))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (whl,) = dist.glob("sarathi_lab-*.whl")
    return zipfile.ZipFile(whl)


def test_the_tree_has_what_the_check_counts_on():
    """The expectations come from the tree, so a tree read wrongly would make the wheel test
    vacuous: the packages and data files known to exist today must be among them."""
    packages, data = expected(source_files())
    assert {"sarathi_lab", "sarathi_lab.schedulers", "sarathi_lab.plots", "sarathi_lab.report",
            "sarathi_lab.kernels", "sarathi_lab.configs"} <= packages
    assert {"sarathi_lab/DESIGN.md", "sarathi_lab/configs/config.yaml",
            "sarathi_lab/configs/cluster/disagg.yaml"} <= data
    assert any(d.startswith("sarathi_lab/data/traces/") for d in data)
    assert not any("__pycache__" in d or d.endswith(".pyc") for d in data)


def test_pyproject_lists_every_package_of_the_tree():
    """Fast: the hand list in pyproject.toml names every package of the tree (a new folder with
    an `__init__.py` left out would be missing from every built wheel), and nothing else."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    packages, _ = expected(source_files())
    assert not packages - listed, \
        f"add to [tool.setuptools] packages in pyproject.toml: {sorted(packages - listed)}"
    assert not listed - packages, f"not packages of the tree: {sorted(listed - packages)}"


@pytest.mark.slow   # a setuptools build: ~10-20 s
def test_the_wheel_holds_every_package_and_data_file(wheel):
    packages, data = expected(source_files())
    names = set(wheel.namelist())
    found = {n[:-len("/__init__.py")].replace("/", ".") for n in names
             if n.endswith("/__init__.py")}
    assert not packages - found, f"packages missing from the wheel: {sorted(packages - found)}"
    assert not data - names, f"data files missing from the wheel: {sorted(data - names)}"
    # and every module of every package, not only its __init__.py
    modules = {in_wheel(p) for p in source_files() if p.parts[0] in SHIPPED and p.suffix == ".py"}
    assert not modules - names, f"modules missing from the wheel: {sorted(modules - names)}"


@pytest.mark.slow
def test_the_wheel_declares_the_commands_and_plugins(wheel):
    """The console scripts and the plug-in entry points are in the wheel's metadata."""
    (ep,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(ep).decode()
    for line in ("sarathi-lab = sarathi_lab.cli.main:main",
                 "sarathi-lab-report = sarathi_lab.report:main",
                 "[sarathi_lab.schedulers]", "sarathi = sarathi_lab.schedulers.sarathi:Sarathi"):
        assert line in text, f"{line!r} not in the wheel's entry_points.txt:\n{text}"
