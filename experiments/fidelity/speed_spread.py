"""The simulation averaged over the machine's speed, for a study `run.py` kept.

    python experiments/fidelity/speed_spread.py [DIR]

Reads a study kept in DIR (default results/fidelity: its runs/ folder with the profile's parts,
its merged profile, fidelity.json), measures how far the machine's speed moved between the
profile's parts (`part_levels`), simulates the study's trace under every policy on the
profile at the speeds of a Gauss-Hermite quadrature over that spread (`speed_spread`; both in
fidelity_lib/speed.py) and
writes DIR/speed_spread.md: the verdict of the averaged simulation against the kept real runs
(bias, its interval, figures inside), beside the plain simulation's. A study run since this
script existed has the same variant ("speed") in its own table; this recomputes it for the
studies before.

Why: a latency is convex in the step time where requests queue, so real runs on a machine whose
speed moves from one run to the next average above the simulation at the typical speed, which
is all a deterministic simulation on one profile gives. The spread is the profile's (measured
minutes apart over the study), not the real runs': a prediction, not a fit.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_lib import ROOT  # noqa: E402
from fidelity_lib.bias import bias_rows  # noqa: E402
from fidelity_lib.kept import reread  # noqa: E402
from fidelity_lib.report import table_markdown  # noqa: E402
from fidelity_lib.speed import SPEED_NODES, part_levels, speed_spread  # noqa: E402


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", nargs="?", default=str(ROOT / "results" / "fidelity"))
    a = p.parse_args(argv)
    out = Path(a.dir)
    parts = sorted((out / "runs" / "profile_parts").glob("*/profile.parquet"),
                   key=lambda x: int(x.parent.name))
    try:
        info = json.loads((out / "fidelity.json").read_text())
        kept = reread(out)
    except FileNotFoundError as e:
        sys.exit(f"{out}: not a kept fidelity study ({e.filename} missing; run "
                 "experiments/fidelity/run.py --out DIR first)")
    if len(parts) < 2:
        sys.exit(f"{out}: its profile was not measured in parts (runs/profile_parts/<i>/"
                 "profile.parquet): the speed's spread needs >= 2 of them")
    from sarathi_lab import profiler
    profile = out / "profile.parquet"
    hardware = profiler.host_hardware(profiler.profile_meta(profile)["device"])
    levels = part_levels(parts)
    sigma = float(np.std(levels, ddof=1))
    real = kept["real"]
    sims = {"profiled": kept["sims"]["profiled"],
            "speed": speed_spread(info["scale"], info["policies"], profile, sigma,
                                  hardware, out / "runs")}
    rows = [r for v, sim in sims.items() for r in bias_rows(real, sim, simulation=v)]
    md = (f"The machine's speed in each of the profile's {len(parts)} parts against their "
          f"typical speed (`part_levels`): "
          + ", ".join(f"{np.exp(x):.3f}" for x in levels)
          + f"; log-sd {sigma:.3f}. The simulation averaged over that spread "
          f"({SPEED_NODES}-point Gauss-Hermite), and the plain one, against the "
          f"{len(next(iter(real.values())))} real runs per policy kept in {out}:\n\n"
          + table_markdown(pd.DataFrame(rows), {"bias": "+.1%", "error_sd": ".1%"}))
    (out / "speed_spread.md").write_text(md)
    print(md)
    return md


if __name__ == "__main__":
    main()
