"""Loading a study's script (experiments/<name>/run.py, not a package) as a module for its test."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_study(name: str):
    spec = importlib.util.spec_from_file_location(f"study_{name}",
                                                  REPO / "experiments" / name / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
