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
    cmd = [sys.executable, "-c", "from sarathi_lab.cli.main import main; main()", "-m",
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


def scaled_main(doc: str, name: str, scales, study, add_args=None) -> Path:
    """The command line of an in-process study with `--scale` (one of `scales`, default full)
    and `--out` (default results/NAME): runs `study(out, scale)`, returns `out`. `add_args(ap)`
    adds a study's own options, passed to `study` by name."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--scale", choices=sorted(scales), default="full")
    ap.add_argument("--out", default=None)
    own = set()
    if add_args is not None:
        before = {x.dest for x in ap._actions}
        add_args(ap)
        own = {x.dest for x in ap._actions} - before
    a = ap.parse_args()
    out = Path(a.out or Path(__file__).resolve().parents[1] / "results" / name)
    study(out, a.scale, **{k: getattr(a, k) for k in own})
    return out


def compose(overrides: list[str]) -> dict:
    """The resolved config of `sarathi-lab OVERRIDES...` as a plain dict (no `hydra` node): for
    scripts that build runs in-process."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import OmegaConf

    from sarathi_lab.sweeps.bookkeeping import register_resolvers
    register_resolvers()
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = hydra_compose("config", overrides=overrides)
    c = OmegaConf.to_container(cfg, resolve=True)
    c.pop("hydra", None)
    return c


def host_profile(model: list[str], out: Path, grid: str, repeats: int, executor=(),
                 profile: str | Path | None = None, progress: bool = True):
    """A profile of the real (torch) executor on this machine, one torch thread, for the
    simulator's profiled cost model: measured with `sarathi-lab-profile`'s code into
    OUT/profile.parquet (or `profile`, reused). Writes OUT/profile_check.csv (its held-out mixed
    iterations, predicted against measured). Returns (path, metadata, hardware preset)."""
    import pandas as pd

    from sarathi_lab import profiler
    if profile is None:
        profile = profiler.profile([*model, "executor.device=cpu", "executor.dtype=float32",
                                    *executor], Path(out) / "profile.parquet", grid, repeats, 1,
                                   threads=1, progress=progress)
    profile = Path(profile)
    meta = profiler.profile_meta(profile)
    hardware = profiler.host_hardware(meta["device"])
    pd.DataFrame(profiler.check(profile, profiler.model_of(meta), hardware)).to_csv(
        Path(out) / "profile_check.csv", index=False)
    return profile, meta, hardware


def _git(*args) -> str | None:
    r = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parents[1],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def start_info() -> dict:
    """What a study runs on, taken when it starts: the commit, whether tracked files differ
    from it, the time."""
    import time
    return {"commit": _git("rev-parse", "--short", "HEAD"),
            "uncommitted_changes": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "started": time.time()}


def write_run_info(out: Path, start: dict, script: str, argv) -> dict:
    """OUT/run_info.json, for the study's README: `start_info()`'s commit, the load averages at
    the end, the wall time and the command."""
    import json
    import time
    info = {"commit": start["commit"], "uncommitted_changes": start["uncommitted_changes"],
            "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
            "wall_time_s": round(time.time() - start["started"], 1),
            "command": " ".join(["python", script, *argv])}
    (Path(out) / "run_info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def show(*tables) -> None:
    """Print a study's tables in full."""
    import pandas as pd
    with pd.option_context("display.width", 220, "display.max_columns", 60):
        for t in tables:
            print(t.to_string(index=False, float_format="%.3g"))


def seed_spread(df, keys: list[str], values: list[str]):
    """Mean and spread over seeds: per group of `keys`, for each column in `values`, its mean,
    standard deviation (ddof 1; NaN for one seed), min, max and the number of seeds. A stand-in
    for sarathi-lab-report's seed aggregation (mean, 95% interval, min-max per configuration),
    which can replace it once it lands."""
    g = df.groupby(keys, sort=False, dropna=False)[values]
    out = g.agg(["mean", "std", "min", "max", "count"])
    out.columns = [f"{v}_{stat if stat != 'count' else 'seeds'}" for v, stat in out.columns]
    return out.reset_index()


def mean_range(row, value: str, scale: float = 1.0, digits: int = 2) -> str:
    """A seed_spread row's `value` as "mean [min-max]" (times `scale`), the mean alone for one
    seed or a range too narrow to show at `digits`."""
    v, lo, hi = (row[f"{value}_{s}"] * scale for s in ("mean", "min", "max"))
    if row[f"{value}_seeds"] > 1 and abs(hi - lo) > 10 ** -digits:
        return f"{v:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"
    return f"{v:.{digits}f}"
