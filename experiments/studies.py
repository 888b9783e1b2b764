"""What the study scripts share: running a preset's Hydra multirun as a child process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def short(p: Path) -> Path:
    """`p` relative to the working directory when below it (reports name their inputs)."""
    try:
        return p.relative_to(Path.cwd())
    except ValueError:
        return p


def sweep(experiment: str, root: Path, name: str, overrides: list[str]) -> Path:
    """`sarathi-lab -m experiment=EXPERIMENT results_root=ROOT name=NAME OVERRIDES...`; its
    sweep directory. Stops the script if a job fails."""
    cmd = [sys.executable, "-c", "from sarathi_lab.cli import main; main()", "-m",
           f"experiment={experiment}", f"results_root={root}", f"name={name}", *overrides]
    r = subprocess.run(cmd, env={**os.environ, "WANDB_MODE": "disabled"})
    if r.returncode:
        raise SystemExit(f"{experiment}: sweep {name} failed ({' '.join(cmd[3:])})")
    return short(root / "sweeps" / name)


def study_args(doc: str, name: str, requests: int):
    """The arguments of a study that runs sweeps: --root (their results_root), --out (default
    results/NAME), --requests (per run or probe, default `requests`) and Hydra overrides; the
    study adds its own to the parser it gets back."""
    import argparse
    repo = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--root", default=str(repo / "outputs"), help="results_root of the sweeps")
    ap.add_argument("--out", default=str(repo / "results" / name))
    ap.add_argument("--requests", type=int, default=requests, help="requests per probe and run")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every sweep")
    return ap


def compose(overrides: list[str]) -> dict:
    """The resolved config of `sarathi-lab OVERRIDES...` as a plain dict (no `hydra` node): for
    scripts that build runs in-process."""
    from hydra import compose as hydra_compose, initialize_config_module
    from omegaconf import OmegaConf
    from sarathi_lab.sweeps import register_resolvers
    register_resolvers()
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = hydra_compose("config", overrides=overrides)
    c = OmegaConf.to_container(cfg, resolve=True)
    c.pop("hydra", None)
    return c
