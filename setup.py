"""The package list, found rather than written by hand: every folder with an `__init__.py` under
sarathi_lab/, and under kernels/ and configs/, which ship as sarathi_lab.kernels and
sarathi_lab.configs (pyproject's package-dir maps them). `[tool.setuptools.packages.find]` alone
cannot give a found package a prefix, so the list is made here; everything else about the
project is in pyproject.toml. tests/test_packaging.py builds the wheel and checks it."""
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def found(folder: str, name: str) -> list[str]:
    """`name` (the package in `folder`) and every package below it, named under `name`."""
    return [name] + [f"{name}.{p}" for p in find_packages(str(ROOT / folder))]


setup(packages=found("sarathi_lab", "sarathi_lab") + found("kernels", "sarathi_lab.kernels")
      + found("configs", "sarathi_lab.configs"))
