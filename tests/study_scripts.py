"""Loading a study's script (experiments/<name>/run.py or another script beside it, not a
package) as a module for its test, and putting a study's library (a package beside its scripts,
as experiments/fidelity/fidelity_lib/) where its scripts import it from."""
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_study(name: str, script: str = "run.py"):
    stem = Path(script).stem
    spec = importlib.util.spec_from_file_location(
        f"study_{name}" if stem == "run" else f"study_{name}_{stem}",
        REPO / "experiments" / name / script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def library_on_path(name: str) -> None:
    """experiments/<name>/ on sys.path, as the study's scripts put it, so that a test imports the
    study's library by the same name they do (one copy of its modules for both)."""
    folder = str(REPO / "experiments" / name)
    if folder not in sys.path:
        sys.path.insert(0, folder)
