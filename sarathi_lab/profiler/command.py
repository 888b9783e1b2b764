"""The `sarathi-lab-profile` command: the executor from Hydra overrides, the grid measured, the
profile written and checked."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from sarathi_lab.profiler.check import check
from sarathi_lab.profiler.files import metadata, model_of, profile_meta, write
from sarathi_lab.profiler.grids import GRIDS
from sarathi_lab.profiler.harness import Harness
from sarathi_lab.profiler.measure import STATISTICS, WARM_STEPS, profile_rows, rounds


def host_hardware(name: str) -> dict:
    """A hardware preset for simulating the profiled host: the profiled cost model takes every
    operator from the profile; the roofline behind it (memory sizing, operators a profile lacks)
    gets nominal numbers, so runs on it should set scheduler.num_kv_blocks."""
    from importlib.resources import files

    import yaml
    base = yaml.safe_load(files("sarathi_lab.configs").joinpath("hardware", "h200.yaml")
                          .read_text())
    return {**base, "name": name}


def build_executor(overrides: list[str]):
    """The torch executor and model preset of `sarathi-lab executor=torch <overrides>`."""
    from sarathi_lab.run.config import resolve
    from sarathi_lab.settings import ConfigError
    from sarathi_lab.sweeps.bookkeeping import compose_config
    c = compose_config(["executor=torch", *overrides])
    r = resolve(c, ["executor=torch", *overrides])
    if r.executor_cls.__name__ != "TorchExecutor":
        raise ConfigError("sarathi-lab-profile measures the torch executor (executor=torch)")
    return r.executor_cls(r.executor_cfg, r.model, None), r.model


def profile(overrides: list[str], out, grid: str = "cpu", repeats: int = 5, warmup: int = 1,
            threads: int | None = None, progress: bool = True,
            statistic: str = "median", also: dict | None = None,
            warm: int = WARM_STEPS) -> Path:
    """Measure the executor of `overrides` over a named grid and write the profile to `out`;
    `also` ({statistic: path}): further profiles of other statistics from the same rounds;
    `warm`: the decode steps run before each decode batch is timed (`measure.WARM_STEPS`)."""
    import torch
    if grid not in GRIDS:
        raise ValueError(f"--grid {grid!r}: one of {', '.join(GRIDS)}")
    if Path(out).suffix != ".parquet":
        raise ValueError(f"--out {out}: the profile is written as a .parquet file")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads {threads}: must be >= 1")
        torch.set_num_threads(threads)
    executor, model = build_executor(overrides)
    harness = Harness(executor)
    for stat in (statistic, *(also or {})):
        if stat not in STATISTICS:
            raise ValueError(f"statistic={stat!r}: one of {', '.join(STATISTICS)}")
    measured = rounds(harness, GRIDS[grid], repeats, warmup, progress, warm)
    for stat, path in (also or {}).items():
        write(profile_rows(*measured, stat), metadata(executor, model, grid, repeats, warmup,
                                                      stat, warm), path)
    return write(profile_rows(*measured, statistic),
                 metadata(executor, model, grid, repeats, warmup, statistic, warm), out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="sarathi-lab-profile", description=__doc__.split("\n\n")[0],
        epilog="Overrides are those of `sarathi-lab executor=torch`, e.g. model=tiny-llama, "
               "model.path=DIR model.name=smollm2, executor.dtype=float32.")
    p.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    p.add_argument("--out", required=True, help="the profile, a .parquet file")
    p.add_argument("--grid", default="cpu", choices=sorted(GRIDS))
    p.add_argument("--repeats", type=int, default=5, help="rounds over the grid (median)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up passes over the grid")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's own); recorded in the profile")
    p.add_argument("--statistic", default="median", choices=STATISTICS,
                   help="of the rounds: median (a typical iteration), min (noise removed) or "
                        "mean (what sums of iterations, such as latencies, expect)")
    p.add_argument("--warm-steps", type=int, default=WARM_STEPS,
                   help="decode steps of the same requests run, unmeasured, before each decode "
                        "batch is timed (and repeats of each linear point's prompt), as in a "
                        "run's steady stream of decodes; 0: one step that brings the requests "
                        "to their contexts, the profiles before this setting")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    from sarathi_lab.costmodels.profiles import ProfileError
    from sarathi_lab.settings import ConfigError
    try:
        t0 = time.perf_counter()
        path = profile(a.overrides, a.out, a.grid, a.repeats, a.warmup, a.threads,
                       not a.no_progress, a.statistic, warm=a.warm_steps)
        meta = profile_meta(path)
        res = check(path, model_of(meta), host_hardware(meta["device"]))
    except (ConfigError, ProfileError, ValueError, FileNotFoundError) as e:
        sys.exit(f"sarathi-lab-profile: {e}")
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
    if res:
        errs = np.abs([r["error"] for r in res])
        print(f"held-out mixed iterations: |predicted/measured - 1| median {np.median(errs):.1%},"
              f" max {errs.max():.1%} over {len(res)}")
